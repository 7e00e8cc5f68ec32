//! The `where` clause: a parser and evaluator for the SQL subset feature-service clients send
//! (docs/contract.md §5): `=`, `<>`, `!=`, `<`, `<=`, `>`, `>=`, `AND`, `OR`, `NOT`, parentheses,
//! `[NOT] IN (...)`, `[NOT] LIKE` with `%` and `_` (and `ESCAPE`), `IS [NOT] NULL`,
//! `[NOT] BETWEEN ... AND ...`, `TIMESTAMP '...'` and `DATE '...'` literals, `TRUE`/`FALSE`,
//! `UPPER(...)`/`LOWER(...)`, and `1=1`.
//!
//! Columns are resolved when the clause is parsed (case-insensitively), so an unknown field
//! is an error with its position, before any row is read. Evaluation is three-valued, as in
//! SQL: a comparison with NULL is unknown, and only rows where the clause is true pass.
//!
//! A clause is bounded before it is parsed ([`WhereLimits`]): its length, and how deep
//! parentheses, `NOT`, `-` and functions nest, since the parser and the evaluator recurse
//! once a level. Chains of `AND` and `OR` are one node each, however long, so they add no
//! depth.

use std::borrow::Cow;
use std::cmp::Ordering;

use crate::time::parse_datetime;

/// A value during evaluation.
#[derive(Debug, Clone, PartialEq)]
pub enum Datum<'a> {
    Null,
    Int(i64),
    Float(f64),
    Str(Cow<'a, str>),
    Bool(bool),
    /// Milliseconds since the epoch.
    Date(i64),
}

/// What the evaluator reads: one row's value per column.
pub trait Row {
    fn get(&self, column: usize) -> Datum<'_>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Func {
    Upper,
    Lower,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    Lit(Datum<'static>),
    Col(usize),
    Func(Func, Box<Expr>),
    Neg(Box<Expr>),
    Cmp(Box<Expr>, CmpOp, Box<Expr>),
    /// A chain `a AND b AND ...`, at least two terms.
    And(Vec<Expr>),
    /// A chain `a OR b OR ...`, at least two terms.
    Or(Vec<Expr>),
    Not(Box<Expr>),
    IsNull(Box<Expr>, bool),
    In(Box<Expr>, Vec<Expr>, bool),
    Like(Box<Expr>, Like, bool),
    Between(Box<Expr>, Box<Expr>, Box<Expr>, bool),
}

/// A parsed clause.
#[derive(Debug, Clone, PartialEq)]
pub struct Where {
    expr: Option<Expr>,
}

/// How large a clause may be: each bound is a setting (`max_where_bytes`,
/// `max_where_depth`), and a clause past one is refused before any row is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WhereLimits {
    /// Longest clause, in bytes.
    pub max_bytes: usize,
    /// Deepest nesting of parentheses, `NOT`, unary `-` and function calls.
    pub max_depth: usize,
}

impl Default for WhereLimits {
    fn default() -> Self {
        WhereLimits {
            max_bytes: 64 * 1024,
            max_depth: 64,
        }
    }
}

/// A fault in a clause, with its 1-based character position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhereError {
    pub position: usize,
    pub message: String,
}

impl std::fmt::Display for WhereError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid where clause at position {}: {}",
            self.position, self.message
        )
    }
}

impl std::error::Error for WhereError {}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Quoted(String),
    Num(Datum<'static>),
    Str(String),
    Op(&'static str),
    LParen,
    RParen,
    Comma,
    Minus,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    /// 1-based character position.
    pos: usize,
}

fn tokenize(text: &str) -> Result<Vec<Token>, WhereError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let err = |pos: usize, message: String| WhereError {
        position: pos + 1,
        message,
    };
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let tok = if c == '\'' {
            let mut s = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err(err(start, "unterminated string".into())),
                    Some('\'') if chars.get(i + 1) == Some(&'\'') => {
                        s.push('\'');
                        i += 2;
                    }
                    Some('\'') => {
                        i += 1;
                        break;
                    }
                    Some(ch) => {
                        s.push(*ch);
                        i += 1;
                    }
                }
            }
            Tok::Str(s)
        } else if c == '"' {
            let end = chars[i + 1..]
                .iter()
                .position(|ch| *ch == '"')
                .ok_or_else(|| err(start, "unterminated quoted name".into()))?;
            let s: String = chars[i + 1..i + 1 + end].iter().collect();
            i += end + 2;
            Tok::Quoted(s)
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                let mut j = i + 1;
                if j < chars.len() && (chars[j] == '+' || chars[j] == '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    i = j;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                }
            }
            let s: String = chars[start..i].iter().collect();
            if let Ok(n) = s.parse::<i64>() {
                Tok::Num(Datum::Int(n))
            } else {
                Tok::Num(Datum::Float(
                    s.parse::<f64>()
                        .map_err(|_| err(start, format!("bad number {s}")))?,
                ))
            }
        } else if c.is_alphabetic() || c == '_' {
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '.')
            {
                i += 1;
            }
            Tok::Ident(chars[start..i].iter().collect())
        } else {
            i += 1;
            match c {
                '(' => Tok::LParen,
                ')' => Tok::RParen,
                ',' => Tok::Comma,
                '-' => Tok::Minus,
                '=' => Tok::Op("="),
                '<' if chars.get(i) == Some(&'>') => {
                    i += 1;
                    Tok::Op("<>")
                }
                '<' if chars.get(i) == Some(&'=') => {
                    i += 1;
                    Tok::Op("<=")
                }
                '<' => Tok::Op("<"),
                '>' if chars.get(i) == Some(&'=') => {
                    i += 1;
                    Tok::Op(">=")
                }
                '>' => Tok::Op(">"),
                '!' if chars.get(i) == Some(&'=') => {
                    i += 1;
                    Tok::Op("<>")
                }
                other => return Err(err(start, format!("unexpected character {other:?}"))),
            }
        };
        out.push(Token {
            tok,
            pos: start + 1,
        });
    }
    Ok(out)
}

struct Parser<'c> {
    toks: Vec<Token>,
    at: usize,
    /// Position just past the end, for "unexpected end" errors.
    end: usize,
    resolve: &'c dyn Fn(&str) -> Option<usize>,
    /// Levels entered so far: every recursion of the parser goes through [`Parser::nest`].
    depth: usize,
    max_depth: usize,
}

fn is_kw(t: &Tok, kw: &str) -> bool {
    matches!(t, Tok::Ident(s) if s.eq_ignore_ascii_case(kw))
}

const RESERVED: [&str; 14] = [
    "AND",
    "OR",
    "NOT",
    "IN",
    "LIKE",
    "IS",
    "NULL",
    "BETWEEN",
    "TIMESTAMP",
    "DATE",
    "TRUE",
    "FALSE",
    "ESCAPE",
    "UNKNOWN",
];

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at).map(|t| &t.tok)
    }

    fn pos(&self) -> usize {
        self.toks.get(self.at).map_or(self.end, |t| t.pos)
    }

    fn fail<T>(&self, message: impl Into<String>) -> Result<T, WhereError> {
        Err(WhereError {
            position: self.pos(),
            message: message.into(),
        })
    }

    fn eat_kw(&mut self, kw: &str) -> bool {
        if self.peek().is_some_and(|t| is_kw(t, kw)) {
            self.at += 1;
            return true;
        }
        false
    }

    fn expect_kw(&mut self, kw: &str) -> Result<(), WhereError> {
        if self.eat_kw(kw) {
            return Ok(());
        }
        self.unexpected(&format!("expected {kw}"))
    }

    fn unexpected<T>(&self, wanted: &str) -> Result<T, WhereError> {
        match self.toks.get(self.at) {
            None => self.fail(format!("{wanted}, found the end of the clause")),
            Some(t) => self.fail(format!("{wanted}, found {}", describe(&t.tok))),
        }
    }

    /// Run `f` one level deeper, or fail past `max_depth`, at the token just taken (the
    /// parenthesis, `NOT` or `-` that opens the level).
    fn nest(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<Expr, WhereError>,
    ) -> Result<Expr, WhereError> {
        if self.depth >= self.max_depth {
            return Err(WhereError {
                position: self.at.checked_sub(1).map_or(1, |i| self.toks[i].pos),
                message: format!(
                    "the clause nests deeper than max_where_depth ({})",
                    self.max_depth
                ),
            });
        }
        self.depth += 1;
        let e = f(self);
        self.depth -= 1;
        e
    }

    fn or(&mut self) -> Result<Expr, WhereError> {
        let first = self.and()?;
        if !self.peek().is_some_and(|t| is_kw(t, "OR")) {
            return Ok(first);
        }
        let mut terms = vec![first];
        while self.eat_kw("OR") {
            terms.push(self.and()?);
        }
        Ok(Expr::Or(terms))
    }

    fn and(&mut self) -> Result<Expr, WhereError> {
        let first = self.not()?;
        if !self.peek().is_some_and(|t| is_kw(t, "AND")) {
            return Ok(first);
        }
        let mut terms = vec![first];
        while self.eat_kw("AND") {
            terms.push(self.not()?);
        }
        Ok(Expr::And(terms))
    }

    fn not(&mut self) -> Result<Expr, WhereError> {
        if self.eat_kw("NOT") {
            return self.nest(|p| Ok(Expr::Not(Box::new(p.not()?))));
        }
        self.predicate()
    }

    fn predicate(&mut self) -> Result<Expr, WhereError> {
        let left = self.operand()?;
        if let Some(Tok::Op(op)) = self.peek() {
            let op = match *op {
                "=" => CmpOp::Eq,
                "<>" => CmpOp::Ne,
                "<" => CmpOp::Lt,
                "<=" => CmpOp::Le,
                ">" => CmpOp::Gt,
                _ => CmpOp::Ge,
            };
            self.at += 1;
            let right = self.operand()?;
            return Ok(Expr::Cmp(Box::new(left), op, Box::new(right)));
        }
        if self.eat_kw("IS") {
            let negated = self.eat_kw("NOT");
            self.expect_kw("NULL")?;
            return Ok(Expr::IsNull(Box::new(left), negated));
        }
        let save = self.at;
        let negated = self.eat_kw("NOT");
        if self.eat_kw("IN") {
            if self.peek() != Some(&Tok::LParen) {
                return self.unexpected("expected ( after IN");
            }
            self.at += 1;
            let mut items = vec![self.operand()?];
            while self.peek() == Some(&Tok::Comma) {
                self.at += 1;
                items.push(self.operand()?);
            }
            if self.peek() != Some(&Tok::RParen) {
                return self.unexpected("expected , or ) in the IN list");
            }
            self.at += 1;
            return Ok(Expr::In(Box::new(left), items, negated));
        }
        if self.eat_kw("LIKE") {
            let pos = self.pos();
            let Some(Tok::Str(pattern)) = self.peek().cloned() else {
                return self.unexpected("expected a string pattern after LIKE");
            };
            self.at += 1;
            let mut escape = None;
            if self.eat_kw("ESCAPE") {
                match self.peek().cloned() {
                    Some(Tok::Str(e)) if e.chars().count() == 1 => {
                        escape = e.chars().next();
                        self.at += 1;
                    }
                    _ => return self.unexpected("expected a one-character string after ESCAPE"),
                }
            }
            let like = Like::compile(&pattern, escape).map_err(|message| WhereError {
                position: pos,
                message,
            })?;
            return Ok(Expr::Like(Box::new(left), like, negated));
        }
        if self.eat_kw("BETWEEN") {
            let low = self.operand()?;
            self.expect_kw("AND")?;
            let high = self.operand()?;
            return Ok(Expr::Between(
                Box::new(left),
                Box::new(low),
                Box::new(high),
                negated,
            ));
        }
        if negated {
            self.at = save;
            return self.unexpected("expected IN, LIKE or BETWEEN after NOT");
        }
        Ok(left)
    }

    fn operand(&mut self) -> Result<Expr, WhereError> {
        let Some(t) = self.toks.get(self.at).cloned() else {
            return self.unexpected("expected a value or a field");
        };
        self.at += 1;
        match t.tok {
            Tok::LParen => {
                let e = self.nest(Self::or)?;
                if self.peek() != Some(&Tok::RParen) {
                    return self.unexpected("expected )");
                }
                self.at += 1;
                Ok(e)
            }
            Tok::Minus => self.nest(|p| Ok(Expr::Neg(Box::new(p.operand()?)))),
            Tok::Num(v) => Ok(Expr::Lit(v)),
            Tok::Str(s) => Ok(Expr::Lit(Datum::Str(Cow::Owned(s)))),
            Tok::Quoted(name) => self.column(&name, t.pos),
            Tok::Ident(word) => {
                let upper = word.to_ascii_uppercase();
                match upper.as_str() {
                    "NULL" => return Ok(Expr::Lit(Datum::Null)),
                    "TRUE" => return Ok(Expr::Lit(Datum::Bool(true))),
                    "FALSE" => return Ok(Expr::Lit(Datum::Bool(false))),
                    "TIMESTAMP" | "DATE" => {
                        let pos = self.pos();
                        let Some(Tok::Str(s)) = self.peek().cloned() else {
                            return self
                                .unexpected(&format!("expected a quoted value after {upper}"));
                        };
                        self.at += 1;
                        let ms = parse_datetime(&s).ok_or(WhereError {
                            position: pos,
                            message: format!("{s:?} is not a {}", upper.to_lowercase()),
                        })?;
                        return Ok(Expr::Lit(Datum::Date(ms)));
                    }
                    "UPPER" | "LOWER" if self.peek() == Some(&Tok::LParen) => {
                        self.at += 1;
                        let arg = self.nest(Self::or)?;
                        if self.peek() != Some(&Tok::RParen) {
                            return self.unexpected("expected )");
                        }
                        self.at += 1;
                        let f = if upper == "UPPER" {
                            Func::Upper
                        } else {
                            Func::Lower
                        };
                        return Ok(Expr::Func(f, Box::new(arg)));
                    }
                    _ => {}
                }
                if self.peek() == Some(&Tok::LParen) {
                    self.at -= 1;
                    return self.fail(format!("unsupported function {word}"));
                }
                if RESERVED.contains(&upper.as_str()) {
                    self.at -= 1;
                    return self.unexpected("expected a value or a field");
                }
                self.column(&word, t.pos)
            }
            other => {
                self.at -= 1;
                self.fail(format!(
                    "expected a value or a field, found {}",
                    describe(&other)
                ))
            }
        }
    }

    fn column(&self, name: &str, pos: usize) -> Result<Expr, WhereError> {
        (self.resolve)(name).map(Expr::Col).ok_or(WhereError {
            position: pos,
            message: format!("unknown field {name}"),
        })
    }
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Ident(s) => s.clone(),
        Tok::Quoted(s) => format!("\"{s}\""),
        Tok::Num(Datum::Int(i)) => i.to_string(),
        Tok::Num(v) => format!("{v:?}"),
        Tok::Str(s) => format!("'{s}'"),
        Tok::Op(o) => (*o).to_string(),
        Tok::LParen => "(".into(),
        Tok::RParen => ")".into(),
        Tok::Comma => ",".into(),
        Tok::Minus => "-".into(),
    }
}

impl Where {
    /// Parse a clause; `resolve` maps a field name to a column index. Empty = no filter.
    pub fn parse(
        text: &str,
        resolve: &dyn Fn(&str) -> Option<usize>,
        limits: WhereLimits,
    ) -> Result<Where, WhereError> {
        if text.len() > limits.max_bytes {
            return Err(WhereError {
                position: 1,
                message: format!(
                    "the clause is {} bytes, above max_where_bytes ({})",
                    text.len(),
                    limits.max_bytes
                ),
            });
        }
        let toks = tokenize(text)?;
        if toks.is_empty() {
            return Ok(Where { expr: None });
        }
        let mut p = Parser {
            end: text.chars().count() + 1,
            toks,
            at: 0,
            resolve,
            depth: 0,
            max_depth: limits.max_depth,
        };
        let e = p.or()?;
        if p.at < p.toks.len() {
            return p.unexpected("expected AND, OR or the end of the clause");
        }
        // `1=1` and its kin filter nothing: skip evaluation.
        let trivial = matches!(&e, Expr::Cmp(a, CmpOp::Eq, b)
            if matches!((a.as_ref(), b.as_ref()), (Expr::Lit(x), Expr::Lit(y)) if x == y && *x != Datum::Null));
        Ok(Where {
            expr: if trivial { None } else { Some(e) },
        })
    }

    /// Whether the row passes (the clause is true, not false or unknown).
    pub fn matches(&self, row: &dyn Row) -> bool {
        match &self.expr {
            None => true,
            Some(e) => truth(&eval(e, row)) == Some(true),
        }
    }
}

fn truth(v: &Datum<'_>) -> Option<bool> {
    match v {
        Datum::Bool(b) => Some(*b),
        Datum::Int(i) => Some(*i != 0),
        _ => None,
    }
}

fn bool_v(b: Option<bool>) -> Datum<'static> {
    b.map_or(Datum::Null, Datum::Bool)
}

fn num(v: &Datum<'_>) -> Option<f64> {
    match v {
        Datum::Int(i) => Some(*i as f64),
        Datum::Float(f) => Some(*f),
        Datum::Bool(b) => Some(f64::from(u8::from(*b))),
        Datum::Date(ms) => Some(*ms as f64),
        Datum::Str(s) => s.trim().parse().ok(),
        Datum::Null => None,
    }
}

/// SQL comparison; `None` when either side is NULL or the two cannot be compared.
pub fn compare(a: &Datum<'_>, b: &Datum<'_>) -> Option<Ordering> {
    match (a, b) {
        (Datum::Null, _) | (_, Datum::Null) => None,
        (Datum::Int(x), Datum::Int(y)) => Some(x.cmp(y)),
        (Datum::Str(x), Datum::Str(y)) => Some(x.as_ref().cmp(y.as_ref())),
        (Datum::Date(x), Datum::Date(y)) => Some(x.cmp(y)),
        (Datum::Date(x), Datum::Str(s)) => parse_datetime(s).map(|y| x.cmp(&y)),
        (Datum::Str(s), Datum::Date(y)) => parse_datetime(s).map(|x| x.cmp(y)),
        (Datum::Bool(x), Datum::Bool(y)) => Some(x.cmp(y)),
        _ => num(a)?.partial_cmp(&num(b)?),
    }
}

fn eval<'r>(e: &'r Expr, row: &'r dyn Row) -> Datum<'r> {
    match e {
        Expr::Lit(v) => v.clone(),
        Expr::Col(c) => row.get(*c),
        Expr::Neg(inner) => match eval(inner, row) {
            Datum::Int(i) => i
                .checked_neg()
                .map_or(Datum::Float(-(i as f64)), Datum::Int),
            Datum::Float(f) => Datum::Float(-f),
            _ => Datum::Null,
        },
        Expr::Func(f, inner) => match eval(inner, row) {
            Datum::Str(s) => Datum::Str(Cow::Owned(match f {
                Func::Upper => s.to_uppercase(),
                Func::Lower => s.to_lowercase(),
            })),
            Datum::Null => Datum::Null,
            other => other,
        },
        Expr::Cmp(a, op, b) => {
            let ord = compare(&eval(a, row), &eval(b, row));
            bool_v(ord.map(|o| match op {
                CmpOp::Eq => o == Ordering::Equal,
                CmpOp::Ne => o != Ordering::Equal,
                CmpOp::Lt => o == Ordering::Less,
                CmpOp::Le => o != Ordering::Greater,
                CmpOp::Gt => o == Ordering::Greater,
                CmpOp::Ge => o != Ordering::Less,
            }))
        }
        // False wins an AND, true an OR; otherwise any unknown term makes the chain unknown.
        Expr::And(terms) => chain(terms, row, false),
        Expr::Or(terms) => chain(terms, row, true),
        Expr::Not(a) => bool_v(truth(&eval(a, row)).map(|b| !b)),
        Expr::IsNull(a, negated) => Datum::Bool((eval(a, row) == Datum::Null) != *negated),
        Expr::In(a, items, negated) => {
            let v = eval(a, row);
            if v == Datum::Null {
                return Datum::Null;
            }
            let mut unknown = false;
            for item in items {
                match compare(&v, &eval(item, row)) {
                    Some(Ordering::Equal) => return Datum::Bool(!*negated),
                    None => unknown = true,
                    _ => {}
                }
            }
            if unknown {
                Datum::Null
            } else {
                Datum::Bool(*negated)
            }
        }
        Expr::Like(a, like, negated) => match eval(a, row) {
            Datum::Null => Datum::Null,
            Datum::Str(s) => Datum::Bool(like.matches(&s) != *negated),
            other => {
                let text = match other {
                    Datum::Int(i) => i.to_string(),
                    Datum::Float(f) => f.to_string(),
                    Datum::Bool(b) => b.to_string(),
                    _ => return Datum::Null,
                };
                Datum::Bool(like.matches(&text) != *negated)
            }
        },
        Expr::Between(a, lo, hi, negated) => {
            let v = eval(a, row);
            let ge = compare(&v, &eval(lo, row)).map(|o| o != Ordering::Less);
            let le = compare(&v, &eval(hi, row)).map(|o| o != Ordering::Greater);
            bool_v(match (ge, le) {
                (Some(x), Some(y)) => Some((x && y) != *negated),
                (Some(false), None) | (None, Some(false)) => Some(*negated),
                _ => None,
            })
        }
    }
}

/// An `AND` chain (`decisive` false) or an `OR` chain (`decisive` true), three-valued: the
/// first term whose truth is `decisive` decides; else unknown if any term is unknown.
fn chain(terms: &[Expr], row: &dyn Row, decisive: bool) -> Datum<'static> {
    let mut unknown = false;
    for t in terms {
        match truth(&eval(t, row)) {
            Some(b) if b == decisive => return Datum::Bool(decisive),
            Some(_) => {}
            None => unknown = true,
        }
    }
    if unknown {
        Datum::Null
    } else {
        Datum::Bool(!decisive)
    }
}

/// A compiled LIKE pattern.
#[derive(Debug, Clone, PartialEq)]
pub struct Like {
    parts: Vec<LikePart>,
}

#[derive(Debug, Clone, PartialEq)]
enum LikePart {
    Lit(char),
    One,
    Any,
}

impl Like {
    fn compile(pattern: &str, escape: Option<char>) -> Result<Like, String> {
        let mut parts = Vec::new();
        let mut chars = pattern.chars();
        while let Some(c) = chars.next() {
            if Some(c) == escape {
                match chars.next() {
                    Some(n) => parts.push(LikePart::Lit(n)),
                    None => return Err("LIKE pattern ends with the escape character".into()),
                }
            } else if c == '%' {
                if parts.last() != Some(&LikePart::Any) {
                    parts.push(LikePart::Any);
                }
            } else if c == '_' {
                parts.push(LikePart::One);
            } else {
                parts.push(LikePart::Lit(c));
            }
        }
        Ok(Like { parts })
    }

    /// Iterative wildcard matching with backtracking to the last `%`: linear in practice.
    pub fn matches(&self, text: &str) -> bool {
        let t: Vec<char> = text.chars().collect();
        let p = &self.parts;
        let (mut ti, mut pi) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while ti < t.len() {
            match p.get(pi) {
                Some(LikePart::Lit(c)) if *c == t[ti] => {
                    ti += 1;
                    pi += 1;
                }
                Some(LikePart::One) => {
                    ti += 1;
                    pi += 1;
                }
                Some(LikePart::Any) => {
                    star = Some((pi, ti));
                    pi += 1;
                }
                _ => match star {
                    Some((sp, st)) => {
                        pi = sp + 1;
                        ti = st + 1;
                        star = Some((sp, st + 1));
                    }
                    None => return false,
                },
            }
        }
        p[pi..].iter().all(|x| *x == LikePart::Any)
    }
}

#[cfg(test)]
mod tests;
