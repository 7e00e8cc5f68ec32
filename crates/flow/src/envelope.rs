//! Envelopes (docs/contract.md §3): what an input flow stores, built from its content, headers and
//! triples.
//!
//! JSON: `{"envelope":{"headers":…,"triples":…,"instance":…,"attachments":…}}`, in that order.
//! When the content carries `$type` (and `$version`, `$attachments`), the instance becomes
//! `{"<Type>": {…the other properties}, "info": {"title": "<Type>", "version": "<version>"}}`
//! and `attachments` is the `$attachments` value.
//!
//! XML: `<envelope xmlns="http://marklogic.com/entity-services"><headers/><triples/>
//! <instance>…</instance><attachments/></envelope>`, written with quick-xml (never by string
//! concatenation). XML content is copied event by event; its root gets `xmlns=""` when it has
//! no namespace, so it does not fall into the envelope's namespace.

use std::io::Cursor;

use quick_xml::events::{BytesEnd, BytesStart, BytesText, Event};
use quick_xml::{Reader, Writer};
use serde_json::{Map, Value, json};

pub(crate) const ENVELOPE_NS: &str = "http://marklogic.com/entity-services";

/// The content a flow produced: parsed JSON, or XML text.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    Json(Value),
    Xml(String),
}

/// Split a `$type` entity instance: (type, version, attachments, properties).
fn entity_form(content: &Value) -> Option<(String, Value, Value, Map<String, Value>)> {
    let obj = content.as_object()?;
    let ty = obj.get("$type")?.as_str()?.to_string();
    let version = match obj.get("$version") {
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Number(n)) => Value::String(n.to_string()),
        _ => Value::Null,
    };
    let attachments = obj.get("$attachments").cloned().unwrap_or(Value::Null);
    let props: Map<String, Value> = obj
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "$type" | "$version" | "$attachments"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some((ty, version, attachments, props))
}

/// The JSON envelope.
pub(crate) fn json_envelope(content: &Value, headers: &Value, triples: &Value) -> Value {
    let (instance, attachments) = match entity_form(content) {
        Some((ty, version, attachments, props)) => {
            let mut inst = Map::new();
            inst.insert(ty.clone(), Value::Object(props));
            inst.insert("info".into(), json!({"title": ty, "version": version}));
            (Value::Object(inst), attachments)
        }
        None => (content.clone(), Value::Null),
    };
    json!({"envelope": {"headers": headers, "triples": triples, "instance": instance, "attachments": attachments}})
}

type W = Writer<Cursor<Vec<u8>>>;

fn xml_err(e: impl std::fmt::Display) -> String {
    format!("cannot write the XML envelope: {e}")
}

/// An XML name from a JSON key: invalid characters become `_`.
fn xml_name(key: &str) -> String {
    let mut out: String = key
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || !out.starts_with(|c: char| c.is_alphabetic() || c == '_') {
        out.insert(0, '_');
    }
    out
}

/// JSON as XML elements: objects become nested elements, arrays repeat their element.
fn write_json(w: &mut W, name: &str, v: &Value) -> Result<(), String> {
    match v {
        Value::Array(items) => {
            for item in items {
                write_json(w, name, item)?;
            }
            Ok(())
        }
        Value::Null => w
            .write_event(Event::Empty(BytesStart::new(name)))
            .map_err(xml_err),
        Value::Object(map) => {
            w.write_event(Event::Start(BytesStart::new(name)))
                .map_err(xml_err)?;
            for (k, child) in map {
                write_json(w, &xml_name(k), child)?;
            }
            w.write_event(Event::End(BytesEnd::new(name)))
                .map_err(xml_err)
        }
        scalar => {
            let text = match scalar {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            w.write_event(Event::Start(BytesStart::new(name)))
                .map_err(xml_err)?;
            w.write_event(Event::Text(BytesText::new(&text)))
                .map_err(xml_err)?;
            w.write_event(Event::End(BytesEnd::new(name)))
                .map_err(xml_err)
        }
    }
}

/// The root start tag with `xmlns=""` added when it has no namespace of its own.
fn with_empty_default_ns<'a>(s: &BytesStart<'a>) -> BytesStart<'static> {
    let name = s.name().as_ref().to_string();
    let mut out = BytesStart::new(name.clone());
    let mut has_default = false;
    for a in s.attributes().flatten() {
        if a.key.as_ref() == "xmlns" {
            has_default = true;
        }
        out.push_attribute(a);
    }
    if !has_default && !name.contains(':') {
        out.push_attribute(("xmlns", ""));
    }
    out
}

/// The XML envelope.
pub(crate) fn xml_envelope(
    content: &Content,
    headers: &Value,
    triples: &Value,
) -> Result<Vec<u8>, String> {
    let mut w = Writer::new(Cursor::new(Vec::new()));
    let mut env = BytesStart::new("envelope");
    env.push_attribute(("xmlns", ENVELOPE_NS));
    w.write_event(Event::Start(env)).map_err(xml_err)?;
    // headers
    match headers {
        Value::Object(m) if m.is_empty() => w
            .write_event(Event::Empty(BytesStart::new("headers")))
            .map_err(xml_err)?,
        Value::Null => w
            .write_event(Event::Empty(BytesStart::new("headers")))
            .map_err(xml_err)?,
        Value::String(s) if s.trim_start().starts_with('<') => {
            w.write_event(Event::Start(BytesStart::new("headers")))
                .map_err(xml_err)?;
            embed(&mut w, s)?;
            w.write_event(Event::End(BytesEnd::new("headers")))
                .map_err(xml_err)?;
        }
        other => write_json(&mut w, "headers", other)?,
    }
    // triples
    match triples {
        Value::Array(a) if a.is_empty() => w
            .write_event(Event::Empty(BytesStart::new("triples")))
            .map_err(xml_err)?,
        Value::Null => w
            .write_event(Event::Empty(BytesStart::new("triples")))
            .map_err(xml_err)?,
        Value::Array(items) => {
            w.write_event(Event::Start(BytesStart::new("triples")))
                .map_err(xml_err)?;
            for t in items {
                w.write_event(Event::Start(BytesStart::new("triple")))
                    .map_err(xml_err)?;
                w.write_event(Event::Text(BytesText::new(&t.to_string())))
                    .map_err(xml_err)?;
                w.write_event(Event::End(BytesEnd::new("triple")))
                    .map_err(xml_err)?;
            }
            w.write_event(Event::End(BytesEnd::new("triples")))
                .map_err(xml_err)?;
        }
        other => write_json(&mut w, "triples", other)?,
    }
    // instance and attachments
    let mut attachments = Value::Null;
    w.write_event(Event::Start(BytesStart::new("instance")))
        .map_err(xml_err)?;
    match content {
        Content::Xml(xml) => embed(&mut w, xml)?,
        Content::Json(v) => match entity_form(v) {
            Some((ty, version, att, props)) => {
                write_json(&mut w, &xml_name(&ty), &Value::Object(props))?;
                write_json(&mut w, "info", &json!({"title": ty, "version": version}))?;
                attachments = att;
            }
            None => match v {
                Value::Object(m) => {
                    for (k, child) in m {
                        write_json(&mut w, &xml_name(k), child)?;
                    }
                }
                Value::String(s) if s.trim_start().starts_with('<') => embed(&mut w, s)?,
                other => {
                    let text = match other {
                        Value::String(s) => s.clone(),
                        x => x.to_string(),
                    };
                    w.write_event(Event::Text(BytesText::new(&text)))
                        .map_err(xml_err)?;
                }
            },
        },
    }
    w.write_event(Event::End(BytesEnd::new("instance")))
        .map_err(xml_err)?;
    match &attachments {
        Value::Null => w
            .write_event(Event::Empty(BytesStart::new("attachments")))
            .map_err(xml_err)?,
        other => write_json(&mut w, "attachments", other)?,
    }
    w.write_event(Event::End(BytesEnd::new("envelope")))
        .map_err(xml_err)?;
    Ok(w.into_inner().into_inner())
}

/// Copy well-formed XML into the writer (skipping its declaration and doctype), giving a
/// namespace-less root element `xmlns=""`.
fn embed(w: &mut W, xml: &str) -> Result<(), String> {
    let mut reader = Reader::from_str(xml);
    reader.config_mut().check_end_names = true;
    let mut depth = 0usize;
    let mut roots = 0usize;
    loop {
        let ev = reader
            .read_event()
            .map_err(|e| format!("the content is not well-formed XML: {e}"))?;
        match ev {
            Event::Eof => break,
            Event::Decl(_) | Event::DocType(_) | Event::PI(_) if depth == 0 => {}
            Event::Text(t) if depth == 0 => {
                if !t.trim().is_empty() {
                    return Err("the content has text outside its root element".into());
                }
            }
            Event::Start(s) => {
                if depth == 0 {
                    roots += 1;
                    w.write_event(Event::Start(with_empty_default_ns(&s)))
                        .map_err(xml_err)?;
                } else {
                    w.write_event(Event::Start(s)).map_err(xml_err)?;
                }
                depth += 1;
            }
            Event::Empty(s) => {
                if depth == 0 {
                    roots += 1;
                    w.write_event(Event::Empty(with_empty_default_ns(&s)))
                        .map_err(xml_err)?;
                } else {
                    w.write_event(Event::Empty(s)).map_err(xml_err)?;
                }
            }
            Event::End(e) => {
                depth = depth.saturating_sub(1);
                w.write_event(Event::End(e)).map_err(xml_err)?;
            }
            other => w.write_event(other).map_err(xml_err)?,
        }
    }
    if depth != 0 || roots != 1 {
        return Err("the content must be one well-formed XML element".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_default_envelope_is_exact() {
        let env = json_envelope(&json!({"testing": 123}), &json!({}), &json!([]));
        assert_eq!(
            serde_json::to_string(&env).unwrap(),
            r#"{"envelope":{"headers":{},"triples":[],"instance":{"testing":123},"attachments":null}}"#
        );
    }

    #[test]
    fn json_entity_form() {
        let content = json!({"$type": "Mollusk", "$version": "0.0.1", "$attachments": {"raw": 1}, "id": 7, "name": "x"});
        let env = json_envelope(&content, &json!({}), &json!([]));
        assert_eq!(
            serde_json::to_string(&env).unwrap(),
            r#"{"envelope":{"headers":{},"triples":[],"instance":{"Mollusk":{"id":7,"name":"x"},"info":{"title":"Mollusk","version":"0.0.1"}},"attachments":{"raw":1}}}"#
        );
    }

    #[test]
    fn xml_default_envelope_is_exact() {
        let env = xml_envelope(
            &Content::Xml("<?xml version=\"1.0\"?>\n<testing>123</testing>".into()),
            &json!({}),
            &json!([]),
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(env).unwrap(),
            r#"<envelope xmlns="http://marklogic.com/entity-services"><headers/><triples/><instance><testing xmlns="">123</testing></instance><attachments/></envelope>"#
        );
    }

    #[test]
    fn xml_keeps_namespaces_and_escapes() {
        let env = xml_envelope(
            &Content::Xml(
                r#"<a:doc xmlns:a="urn:a"><a:x k="1 &amp; 2">&lt;y&gt;</a:x></a:doc>"#.into(),
            ),
            &json!({"source": "s&s"}),
            &json!([]),
        )
        .unwrap();
        let text = String::from_utf8(env).unwrap();
        assert!(text.contains(r#"<instance><a:doc xmlns:a="urn:a"><a:x k="1 &amp; 2">&lt;y&gt;</a:x></a:doc></instance>"#), "{text}");
        assert!(
            text.contains("<headers><source>s&amp;s</source></headers>"),
            "{text}"
        );
        assert!(crate::store::content::check(crate::store::Format::Xml, text.as_bytes()).is_ok());
        assert!(xml_envelope(&Content::Xml("<a><b></a>".into()), &json!({}), &json!([])).is_err());
    }
}
