//! Unit tests of `where_clause`.

use super::*;

struct R(Vec<Datum<'static>>);
impl Row for R {
    fn get(&self, c: usize) -> Datum<'_> {
        self.0[c].clone()
    }
}

const COLS: [&str; 5] = ["OBJECTID", "name", "score", "born", "flag"];

fn w(text: &str) -> Result<Where, WhereError> {
    Where::parse(
        text,
        &|n| COLS.iter().position(|c| c.eq_ignore_ascii_case(n)),
        WhereLimits::default(),
    )
}

fn row() -> R {
    R(vec![
        Datum::Int(7),
        Datum::Str("O'Hara Falls".into()),
        Datum::Float(2.5),
        Datum::Date(parse_datetime("2017-05-24T06:00:00Z").unwrap()),
        Datum::Null,
    ])
}

fn check(text: &str) -> bool {
    w(text)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .matches(&row())
}

#[test]
fn evaluates() {
    let yes = [
        "1=1",
        "",
        "OBJECTID = 7",
        "objectid >= 7 AND score < 3",
        "OBJECTID <> 8 AND NOT (score > 3)",
        "name = 'O''Hara Falls'",
        "name LIKE 'O%Falls'",
        "name LIKE '_''Hara%'",
        "UPPER(name) LIKE '%FALLS'",
        "name NOT LIKE '%x%'",
        "OBJECTID IN (1, 7, 9)",
        "OBJECTID NOT IN (1, 2)",
        "flag IS NULL",
        "name IS NOT NULL",
        "score BETWEEN 2 AND 3",
        "score NOT BETWEEN 3 AND 4",
        "born > TIMESTAMP '2017-05-24 05:59:59'",
        "born >= DATE '2017-05-24'",
        "born < '2018-01-01'",
        "OBJECTID = 1 OR (score = 2.5 AND \"name\" <> 'x')",
        "score > -1",
        "flag IS NULL OR flag = 1",
        "score = 2.5e0",
    ];
    for t in yes {
        assert!(check(t), "{t} should be true");
    }
    let no = [
        "OBJECTID = 8",
        "flag = 1",
        "NOT flag = 1",
        "flag <> 1",
        "flag IN (1, 2)",
        "flag BETWEEN 0 AND 2",
        "name LIKE 'o%'",
        "OBJECTID IN (1, 2)",
        "born < DATE '2017-05-24'",
        "1=2",
    ];
    for t in no {
        assert!(!check(t), "{t} should not be true");
    }
}

#[test]
fn errors_have_positions() {
    let e = w("OBJECTID = 7 AND nope > 1").unwrap_err();
    assert_eq!(e.position, 18);
    assert!(e.message.contains("unknown field nope"));
    let e = w("OBJECTID = ").unwrap_err();
    assert_eq!(e.position, 12);
    assert!(e.message.contains("end of the clause"), "{}", e.message);
    let e = w("OBJECTID = 7 7").unwrap_err();
    assert_eq!(e.position, 14);
    let e = w("name = 'open").unwrap_err();
    assert_eq!(e.position, 8);
    let e = w("OBJECTID IN 1, 2").unwrap_err();
    assert!(e.message.contains("expected ( after IN"));
    let e = w("born > TIMESTAMP 'soon'").unwrap_err();
    assert_eq!(e.position, 18);
    let e = w("SUBSTRING(name, 1) = 'a'").unwrap_err();
    assert!(e.message.contains("unsupported function SUBSTRING"));
    let e = w("OBJECTID ; DROP TABLE x").unwrap_err();
    assert_eq!(e.position, 10);
    assert!(w("(OBJECTID = 7").is_err());
    assert!(w("OBJECTID = 7 AND").is_err());
    assert!(w("score NOT 5").is_err());
}

#[test]
fn chains_are_three_valued() {
    // `flag` is NULL: comparisons with it are unknown.
    assert!(check("flag = 1 OR OBJECTID = 7"));
    assert!(!check("flag = 1 AND OBJECTID = 7"));
    assert!(
        !check("NOT (flag = 1 AND OBJECTID = 7)"),
        "NOT unknown is unknown"
    );
    assert!(
        check("NOT (flag = 1 AND OBJECTID = 8)"),
        "unknown AND false is false"
    );
    assert!(
        !check("NOT (flag = 1 OR OBJECTID = 8)"),
        "unknown OR false is unknown"
    );
    assert!(check(
        "OBJECTID = 1 OR OBJECTID = 2 OR OBJECTID = 7 OR flag = 1"
    ));
    assert!(check(
        "OBJECTID = 7 AND score < 3 AND name LIKE 'O%' AND born IS NOT NULL"
    ));
    assert!(!check(
        "OBJECTID = 7 AND score < 3 AND name LIKE 'x%' AND born IS NOT NULL"
    ));
    assert!(check(
        "OBJECTID = 1 AND score = 0 OR OBJECTID = 7 AND score > 2"
    ));
}

fn limited(text: &str, max_bytes: usize, max_depth: usize) -> Result<Where, WhereError> {
    Where::parse(
        text,
        &|n| COLS.iter().position(|c| c.eq_ignore_ascii_case(n)),
        WhereLimits {
            max_bytes,
            max_depth,
        },
    )
}

#[test]
fn nesting_is_bounded() {
    let parens = |n: usize| format!("{}1=1{}", "(".repeat(n), ")".repeat(n));
    assert!(limited(&parens(64), 1 << 20, 64).is_ok());
    let e = limited(&parens(65), 1 << 20, 64).unwrap_err();
    assert!(e.message.contains("max_where_depth (64)"), "{}", e.message);
    assert_eq!(e.position, 65, "the parenthesis one past the bound");
    // The inputs: 2,000 parentheses, 100,000 NOTs.
    let e = limited(&parens(2000), 1 << 20, 64).unwrap_err();
    assert!(e.message.contains("max_where_depth"));
    let nots = format!("{}OBJECTID = 7", "NOT ".repeat(100_000));
    assert!(
        limited(&nots, 1 << 20, 64)
            .unwrap_err()
            .message
            .contains("max_where_depth")
    );
    let minus = format!("score > {}1", "-".repeat(100_000));
    assert!(limited(&minus, 1 << 20, 64).is_err());
    let upper = format!("{}name{} = 'x'", "UPPER(".repeat(1000), ")".repeat(1000));
    assert!(limited(&upper, 1 << 20, 64).is_err());
    // Within the bound, nesting evaluates as written.
    let nested = format!("{}OBJECTID = 7", "NOT NOT ".repeat(30));
    assert!(limited(&nested, 1 << 20, 64).unwrap().matches(&row()));
}

#[test]
fn long_chains_add_no_depth() {
    for op in ["AND", "OR"] {
        let n = 100_000;
        let terms: Vec<String> = (0..n)
            .map(|i| {
                if op == "AND" {
                    format!("OBJECTID <> {}", i + 100)
                } else {
                    format!("OBJECTID = {}", i + 100)
                }
            })
            .collect();
        let text = terms.join(&format!(" {op} "));
        let w = limited(&text, 1 << 24, 4).unwrap();
        // AND: 7 differs from every term's value; OR: 7 is none of them.
        assert_eq!(w.matches(&row()), op == "AND", "{op}");
        let with_seven = format!("{text} {op} OBJECTID = 7");
        assert!(
            limited(&with_seven, 1 << 24, 4).unwrap().matches(&row()),
            "{op}"
        );
    }
}

#[test]
fn length_is_bounded() {
    let long = format!("name = '{}'", "x".repeat(100));
    let e = limited(&long, 64, 64).unwrap_err();
    assert_eq!(e.position, 1);
    assert!(
        e.message.contains("above max_where_bytes (64)"),
        "{}",
        e.message
    );
    assert!(limited(&long, long.len(), 64).is_ok());
}

#[test]
fn like_patterns() {
    let l = |p: &str, t: &str| Like::compile(p, Some('\\')).unwrap().matches(t);
    assert!(l("%", ""));
    assert!(l("a%b%c", "aXXbYYc"));
    assert!(!l("a%b%c", "aXXbYY"));
    assert!(l("%ab", "aab"));
    assert!(l("100\\%", "100%"));
    assert!(!l("100\\%", "1000"));
    assert!(l("_", "é"));
}
