//! The path language of templates (`context`, `val`) and descriptors (`geometry.xpath`): the
//! XPath subset that row extraction over JSON uses.
//!
//! - `/` the document root; `/a/b` child steps from it; `a/b` steps from the context node.
//! - `.` the node itself; `..` its parent; `*` every child.
//! - `//name` every descendant named `name` (at any depth); `a//b` the same below `a`.
//! - `name[n]` the n-th (1-based) of the nodes a step selects.
//! - `node('any name')` for names with characters a plain step cannot hold.
//!
//! As in the peer system's JSON model, a step onto a property whose value is an array
//! selects the array's items, so `/features` yields each feature and `/features[2]` the
//! second, and `..` from an item goes to the object holding the array.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Test {
    Name(String),
    Any,
    SelfNode,
    Parent,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Step {
    /// Reached through `//` (descendant-or-self) rather than `/`.
    descendant: bool,
    test: Test,
    /// 1-based position among the nodes this step selects.
    position: Option<usize>,
}

/// A parsed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    text: String,
    absolute: bool,
    steps: Vec<Step>,
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// A node during evaluation: the value, with its ancestors (for `..`).
#[derive(Clone)]
struct Node<'a> {
    value: &'a Value,
    /// Ancestor objects/arrays, root first; array levels are skipped by `..`.
    ancestors: Vec<&'a Value>,
}

fn bad(text: &str, message: impl std::fmt::Display) -> String {
    format!("malformed path {text:?}: {message}")
}

impl Path {
    pub fn parse(text: &str) -> Result<Path, String> {
        let t = text.trim();
        if t.is_empty() {
            return Err(bad(text, "it is empty"));
        }
        let mut steps = Vec::new();
        let mut rest = t;
        let absolute = rest.starts_with('/');
        if rest == "/" {
            return Ok(Path {
                text: text.to_string(),
                absolute: true,
                steps,
            });
        }
        let mut first = true;
        while !rest.is_empty() {
            let descendant;
            if let Some(r) = rest.strip_prefix("//") {
                descendant = true;
                rest = r;
            } else if let Some(r) = rest.strip_prefix('/') {
                descendant = false;
                rest = r;
            } else if first {
                descendant = false;
            } else {
                return Err(bad(text, format!("expected '/' before {rest:?}")));
            }
            first = false;
            let (test, after) = parse_test(text, rest)?;
            rest = after;
            let mut position = None;
            if let Some(r) = rest.strip_prefix('[') {
                let end = r.find(']').ok_or_else(|| bad(text, "'[' without ']'"))?;
                let n: usize = r[..end].trim().parse().map_err(|_| {
                    bad(text, format!("[{}] is not a positive position", &r[..end]))
                })?;
                if n == 0 {
                    return Err(bad(text, "positions start at 1"));
                }
                position = Some(n);
                rest = &r[end + 1..];
            }
            steps.push(Step {
                descendant,
                test,
                position,
            });
        }
        Ok(Path {
            text: text.to_string(),
            absolute,
            steps,
        })
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// The nodes the path selects, from `context` (and the document `root` for absolute
    /// paths), in document order, each once. `Err` when selecting them would take more than
    /// [`MAX_PATH_WORK`] (a path such as `//*//*//*` over a large document).
    pub fn select<'a>(
        &self,
        root: &'a Value,
        context: ContextNode<'a>,
    ) -> Result<Vec<ContextNode<'a>>, PathTooCostly> {
        let start = if self.absolute {
            Node {
                value: root,
                ancestors: Vec::new(),
            }
        } else {
            context.0
        };
        let mut work = 0usize;
        let mut current = vec![start];
        for step in &self.steps {
            let mut next = Vec::new();
            for node in &current {
                let mut selected = Vec::new();
                if step.descendant {
                    descend(node, &step.test, &mut selected, &mut work);
                } else {
                    apply(node, &step.test, &mut selected, &mut work);
                }
                if work > MAX_PATH_WORK {
                    return Err(PathTooCostly {
                        path: self.text.clone(),
                    });
                }
                match step.position {
                    Some(n) => {
                        if let Some(s) = selected.into_iter().nth(n - 1) {
                            next.push(s);
                        }
                    }
                    None => next.extend(selected),
                }
            }
            // A node reached twice (through two `//` steps, or `..` from two children) is
            // selected once, where it was first reached.
            if next.len() > 1 {
                let mut seen = std::collections::HashSet::with_capacity(next.len());
                next.retain(|n| seen.insert(std::ptr::from_ref(n.value)));
            }
            current = next;
            if current.is_empty() {
                break;
            }
        }
        Ok(current.into_iter().map(ContextNode).collect())
    }

    /// The first value the path selects from the document root.
    pub fn first<'a>(&self, root: &'a Value) -> Result<Option<&'a Value>, PathTooCostly> {
        Ok(self
            .select(root, ContextNode::root(root))?
            .into_iter()
            .next()
            .map(|n| n.value()))
    }
}

/// Most work one selection may take: nodes visited, each weighed by its depth (the
/// ancestors it carries for `..`). Real templates take a few per node of the document.
pub const MAX_PATH_WORK: usize = 4_000_000;

/// A path whose selection would take more than [`MAX_PATH_WORK`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTooCostly {
    pub path: String,
}

impl std::fmt::Display for PathTooCostly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the path {} selects more of the document than a path may ({MAX_PATH_WORK} node \
             visits)",
            self.path
        )
    }
}

/// A node that a context path selected, from which column paths are evaluated.
#[derive(Clone)]
pub struct ContextNode<'a>(Node<'a>);

impl<'a> ContextNode<'a> {
    pub fn root(root: &'a Value) -> ContextNode<'a> {
        ContextNode(Node {
            value: root,
            ancestors: Vec::new(),
        })
    }

    pub fn value(&self) -> &'a Value {
        self.0.value
    }
}

fn parse_test<'t>(text: &str, rest: &'t str) -> Result<(Test, &'t str), String> {
    if let Some(r) = rest.strip_prefix("node(") {
        let quote = r.chars().next().filter(|c| *c == '\'' || *c == '"');
        let Some(q) = quote else {
            return Err(bad(text, "node( needs a quoted name"));
        };
        let body = &r[1..];
        let end = body
            .find(q)
            .ok_or_else(|| bad(text, "unterminated quoted name"))?;
        let after = body[end + 1..]
            .strip_prefix(')')
            .ok_or_else(|| bad(text, "node('...') needs ')'"))?;
        return Ok((Test::Name(body[..end].to_string()), after));
    }
    let end = rest.find(['/', '[']).unwrap_or(rest.len());
    let name = rest[..end].trim();
    let after = &rest[end..];
    let test = match name {
        "" => return Err(bad(text, "empty step")),
        "." => Test::SelfNode,
        ".." => Test::Parent,
        "*" => Test::Any,
        n if n.contains(['(', ')', '@', '=', '\'', '"', '$', ' ', ',', ':']) => {
            return Err(bad(
                text,
                format!(
                    "step {n:?} is not a name (functions, axes and predicates other than [n] are not supported)"
                ),
            ));
        }
        n => Test::Name(n.to_string()),
    };
    Ok((test, after))
}

/// Add what making `node` costs to `work`: the node and the ancestors it carries.
fn charge(work: &mut usize, node: &Node<'_>) {
    *work = work.saturating_add(node.ancestors.len() + 1);
}

/// Children of `node` named `name` (or all, for `None`), arrays expanded into items. Stops
/// adding once `work` is past [`MAX_PATH_WORK`].
fn children<'a>(node: &Node<'a>, name: Option<&str>, out: &mut Vec<Node<'a>>, work: &mut usize) {
    let Value::Object(map) = node.value else {
        return;
    };
    let mut ancestors = node.ancestors.clone();
    ancestors.push(node.value);
    let mut push = |v: &'a Value| {
        let items = match v {
            Value::Array(items) => &items[..],
            other => std::slice::from_ref(other),
        };
        for item in items {
            if *work > MAX_PATH_WORK {
                return;
            }
            let n = Node {
                value: item,
                ancestors: ancestors.clone(),
            };
            charge(work, &n);
            out.push(n);
        }
    };
    match name {
        Some(n) => {
            if let Some(v) = map.get(n) {
                push(v);
            }
        }
        None => map.values().for_each(push),
    }
}

fn apply<'a>(node: &Node<'a>, test: &Test, out: &mut Vec<Node<'a>>, work: &mut usize) {
    match test {
        Test::SelfNode => {
            charge(work, node);
            out.push(node.clone());
        }
        Test::Parent => {
            if let Some((parent, rest)) = node.ancestors.split_last() {
                let n = Node {
                    value: parent,
                    ancestors: rest.to_vec(),
                };
                charge(work, &n);
                out.push(n);
            }
        }
        Test::Any => children(node, None, out, work),
        Test::Name(n) => children(node, Some(n), out, work),
    }
}

/// `//test`: the test applied to the node and every descendant, in document order. Stops
/// once `work` is past [`MAX_PATH_WORK`].
fn descend<'a>(node: &Node<'a>, test: &Test, out: &mut Vec<Node<'a>>, work: &mut usize) {
    apply(node, test, out, work);
    if *work > MAX_PATH_WORK {
        return;
    }
    let mut kids = Vec::new();
    match node.value {
        Value::Object(_) => children(node, None, &mut kids, work),
        Value::Array(items) => {
            // An array reached as a value (an array inside an array): visit its items.
            for item in items {
                let mut ancestors = node.ancestors.clone();
                ancestors.push(node.value);
                let n = Node {
                    value: item,
                    ancestors,
                };
                charge(work, &n);
                kids.push(n);
                if *work > MAX_PATH_WORK {
                    return;
                }
            }
        }
        _ => {}
    }
    for k in &kids {
        if matches!(test, Test::Parent | Test::SelfNode) {
            continue;
        }
        descend(k, test, out, work);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vals(path: &str, doc: &Value) -> Vec<Value> {
        let p = Path::parse(path).unwrap();
        p.select(doc, ContextNode::root(doc))
            .unwrap()
            .into_iter()
            .map(|n| n.value().clone())
            .collect()
    }

    #[test]
    fn steps_parent_positions_descendants() {
        let doc = json!({
            "envelope": {"feature": {"geometry": {"type": "Point"}, "properties": {"OBJECTID": 7, "tags": ["a", "b"]}}},
            "list": [{"n": 1}, {"n": 2}, {"n": 3}],
        });
        assert_eq!(
            vals("/envelope/feature/properties/OBJECTID", &doc),
            vec![json!(7)]
        );
        assert_eq!(
            vals("envelope/feature/properties/tags", &doc),
            vec![json!("a"), json!("b")]
        );
        assert_eq!(
            vals("/envelope/feature/properties/tags[2]", &doc),
            vec![json!("b")]
        );
        assert_eq!(vals("/list/n", &doc), vec![json!(1), json!(2), json!(3)]);
        assert_eq!(vals("/list[2]/n", &doc), vec![json!(2)]);
        assert_eq!(vals("//geometry", &doc), vec![json!({"type": "Point"})]);
        assert_eq!(vals("//n", &doc), vec![json!(1), json!(2), json!(3)]);
        assert_eq!(vals("/envelope//OBJECTID", &doc), vec![json!(7)]);
        assert_eq!(
            vals("/envelope/feature/properties/../geometry/type", &doc),
            vec![json!("Point")]
        );
        assert_eq!(vals("/", &doc), vec![doc.clone()]);
        assert_eq!(vals("/nothing/here", &doc), Vec::<Value>::new());
        assert_eq!(vals("/list[1]/node('n')", &doc), vec![json!(1)]);
    }

    #[test]
    fn relative_to_a_context() {
        let doc = json!({"envelope": {"instance": {"X": 1.5, "Y": 2.5}, "headers": {"src": "s"}}});
        let ctx = Path::parse("/envelope/instance").unwrap();
        let node = ctx.select(&doc, ContextNode::root(&doc)).unwrap().remove(0);
        let x = Path::parse("X").unwrap();
        assert_eq!(
            x.select(&doc, node.clone()).unwrap()[0].value(),
            &json!(1.5)
        );
        let up = Path::parse("../headers/src").unwrap();
        assert_eq!(
            up.select(&doc, node.clone()).unwrap()[0].value(),
            &json!("s")
        );
        let dot = Path::parse(".").unwrap();
        assert_eq!(
            dot.select(&doc, node).unwrap()[0].value(),
            &json!({"X": 1.5, "Y": 2.5})
        );
    }

    /// A node reached along two ways is selected once (`//a//b` finds a `b` below two `a`s
    /// from both); a selection past its budget is an error, not a runaway.
    #[test]
    fn selections_are_sets_and_bounded() {
        let doc = json!({"a": {"a": {"b": 1}}, "c": [{"d": 1}, {"d": 2}]});
        assert_eq!(vals("//a//b", &doc), vec![json!(1)]);
        assert_eq!(vals("//d/..", &doc), vec![json!({"d": 1}), json!({"d": 2})]);
        assert_eq!(vals("/c/d/../..", &doc).len(), 1);
        // A wide, deep document: `//*//*//*` would visit each node once per ancestor, per
        // step; it stops at the budget.
        let mut wide = json!(0);
        for _ in 0..100 {
            wide = json!({"x": wide, "y": [1, 2, 3, 4, 5, 6, 7, 8]});
        }
        let p = Path::parse("//*//*//*").unwrap();
        let e = p.select(&wide, ContextNode::root(&wide)).err().unwrap();
        assert_eq!(e.path, "//*//*//*");
        assert!(e.to_string().contains("node visits"));
        // A cheap path on the same document is fine.
        assert_eq!(vals("/x/x/y[3]", &wide), vec![json!(3)]);
    }

    #[test]
    fn malformed_paths() {
        for p in [
            "",
            "a[",
            "a[0]",
            "a[x]",
            "fn:concat(a,b)",
            "a/@b",
            "a//",
            "node(a)",
            "a b",
        ] {
            assert!(Path::parse(p).is_err(), "{p:?} should not parse");
        }
    }
}
