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
    /// paths), in document order.
    pub fn select<'a>(&self, root: &'a Value, context: ContextNode<'a>) -> Vec<ContextNode<'a>> {
        let start = if self.absolute {
            Node {
                value: root,
                ancestors: Vec::new(),
            }
        } else {
            context.0
        };
        let mut current = vec![start];
        for step in &self.steps {
            let mut next = Vec::new();
            for node in &current {
                let mut selected = Vec::new();
                if step.descendant {
                    descend(node, &step.test, &mut selected);
                } else {
                    apply(node, &step.test, &mut selected);
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
            current = next;
            if current.is_empty() {
                break;
            }
        }
        current.into_iter().map(ContextNode).collect()
    }

    /// The first value the path selects from the document root.
    pub fn first<'a>(&self, root: &'a Value) -> Option<&'a Value> {
        self.select(root, ContextNode::root(root))
            .into_iter()
            .next()
            .map(|n| n.value())
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

/// Children of `node` named `name` (or all, for `None`), arrays expanded into items.
fn children<'a>(node: &Node<'a>, name: Option<&str>, out: &mut Vec<Node<'a>>) {
    let Value::Object(map) = node.value else {
        return;
    };
    let mut ancestors = node.ancestors.clone();
    ancestors.push(node.value);
    let mut push = |v: &'a Value| match v {
        Value::Array(items) => {
            for item in items {
                out.push(Node {
                    value: item,
                    ancestors: ancestors.clone(),
                });
            }
        }
        other => out.push(Node {
            value: other,
            ancestors: ancestors.clone(),
        }),
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

fn apply<'a>(node: &Node<'a>, test: &Test, out: &mut Vec<Node<'a>>) {
    match test {
        Test::SelfNode => out.push(node.clone()),
        Test::Parent => {
            if let Some((parent, rest)) = node.ancestors.split_last() {
                out.push(Node {
                    value: parent,
                    ancestors: rest.to_vec(),
                });
            }
        }
        Test::Any => children(node, None, out),
        Test::Name(n) => children(node, Some(n), out),
    }
}

/// `//test`: the test applied to the node and every descendant, in document order.
fn descend<'a>(node: &Node<'a>, test: &Test, out: &mut Vec<Node<'a>>) {
    apply(node, test, out);
    let mut kids = Vec::new();
    match node.value {
        Value::Object(_) => children(node, None, &mut kids),
        Value::Array(items) => {
            // An array reached as a value (an array inside an array): visit its items.
            for item in items {
                let mut ancestors = node.ancestors.clone();
                ancestors.push(node.value);
                kids.push(Node {
                    value: item,
                    ancestors,
                });
            }
        }
        _ => {}
    }
    for k in &kids {
        if matches!(test, Test::Parent | Test::SelfNode) {
            continue;
        }
        descend(k, test, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vals(path: &str, doc: &Value) -> Vec<Value> {
        let p = Path::parse(path).unwrap();
        p.select(doc, ContextNode::root(doc))
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
        let node = ctx.select(&doc, ContextNode::root(&doc)).remove(0);
        let x = Path::parse("X").unwrap();
        assert_eq!(x.select(&doc, node.clone())[0].value(), &json!(1.5));
        let up = Path::parse("../headers/src").unwrap();
        assert_eq!(up.select(&doc, node.clone())[0].value(), &json!("s"));
        let dot = Path::parse(".").unwrap();
        assert_eq!(
            dot.select(&doc, node)[0].value(),
            &json!({"X": 1.5, "Y": 2.5})
        );
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
