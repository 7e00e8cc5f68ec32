//! Checks that content is what its format says: JSON that parses, XML that is well-formed.

use quick_xml::events::Event;

use super::Format;

/// Why content does not match its format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentError {
    pub format: Format,
    pub message: String,
}

pub fn check(format: Format, bytes: &[u8]) -> Result<(), ContentError> {
    match format {
        Format::Json => check_json(bytes),
        Format::Xml => check_xml(bytes),
        Format::Text => std::str::from_utf8(bytes)
            .map(|_| ())
            .map_err(|e| ContentError {
                format,
                message: format!("text is not UTF-8: {e}"),
            }),
        Format::Binary => Ok(()),
    }
}

/// JSON as it will be read back: valid UTF-8 throughout (serde's `IgnoredAny` skips strings
/// without checking them), every number within `f64` range (`1e400` is not), and nesting
/// within serde_json's limit of 128 levels, so that every later parse of the document into a
/// tree (views, flows) succeeds.
fn check_json(bytes: &[u8]) -> Result<(), ContentError> {
    let fail = |message: String| ContentError {
        format: Format::Json,
        message,
    };
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(fail(format!(
            "invalid JSON: not UTF-8 at byte {}",
            e.valid_up_to()
        )));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde::Deserialize::deserialize(&mut de)
        .and_then(|Checked| de.end())
        .map_err(|e| {
            let text = e.to_string();
            if text.starts_with("recursion limit exceeded") {
                fail(format!(
                    "invalid JSON: nested deeper than 128 levels (line {}, column {})",
                    e.line(),
                    e.column()
                ))
            } else {
                fail(format!("invalid JSON: {text}"))
            }
        })
}

/// A JSON value read whole and dropped: strings decoded (so checked), numbers converted.
struct Checked;

impl<'de> serde::Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CheckVisitor)
    }
}

struct CheckVisitor;

impl<'de> serde::de::Visitor<'de> for CheckVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<Checked, E> {
        if f.is_finite() {
            Ok(Checked)
        } else {
            Err(E::custom("number out of range"))
        }
    }

    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

/// One root element, balanced and matching tags, no text outside the root.
fn check_xml(bytes: &[u8]) -> Result<(), ContentError> {
    let err = |message: String| ContentError {
        format: Format::Xml,
        message,
    };
    let mut reader = quick_xml::Reader::from_reader(bytes);
    reader.config_mut().check_end_names = true;
    let mut depth: usize = 0;
    let mut roots = 0usize;
    let mut buf = Vec::new();
    loop {
        let pos = reader.buffer_position();
        let event = reader
            .read_event_into(&mut buf)
            .map_err(|e| err(format!("XML is not well-formed at byte {pos}: {e}")))?;
        match event {
            Event::Start(_) => {
                roots += usize::from(depth == 0);
                depth += 1;
            }
            Event::End(_) => depth = depth.saturating_sub(1),
            Event::Empty(_) => roots += usize::from(depth == 0),
            Event::Text(t) if depth == 0 && !t.chars().all(char::is_whitespace) => {
                return Err(err(format!("text outside the root element at byte {pos}")));
            }
            Event::CData(_) | Event::GeneralRef(_) if depth == 0 => {
                return Err(err(format!(
                    "content outside the root element at byte {pos}"
                )));
            }
            Event::Eof => break,
            _ => {}
        }
        if roots > 1 {
            return Err(err(format!("more than one root element (at byte {pos})")));
        }
        buf.clear();
    }
    if depth != 0 {
        return Err(err("XML ends inside an element".into()));
    }
    if roots == 0 {
        return Err(err("XML has no root element".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json() {
        assert!(check(Format::Json, b"{\"a\":[1,2,{}]}").is_ok());
        assert!(check(Format::Json, b"{\"a\":").is_err());
        assert!(check(Format::Json, b"").is_err());
        assert!(check(Format::Json, b"{} x").is_err());
        assert!(check(Format::Json, b"{\"a\":[1e308,-2.5e-300,18446744073709551615,-9223372036854775808,\"\\u00e9\\ud83d\\ude00\",null,true]}").is_ok());
    }

    #[test]
    fn json_is_checked_as_it_will_be_read() {
        let msg = |b: &[u8]| check(Format::Json, b).unwrap_err().message;
        // Invalid UTF-8 in a string, in a key, and a lone surrogate escape.
        assert!(msg(b"{\"a\":\"\xff\"}").contains("not UTF-8 at byte 6"));
        assert!(msg(b"{\"\xc3\":1}").contains("not UTF-8"));
        assert!(check(Format::Json, b"{\"a\":\"\\ud800\"}").is_err());
        // Numbers beyond f64.
        assert!(msg(b"{\"n\":1e400}").contains("number out of range"));
        assert!(msg(b"[-1e400]").contains("number out of range"));
        // Nesting past serde_json's limit, which every later parse has.
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(check(Format::Json, deep(127).as_bytes()).is_ok());
        assert!(msg(deep(129).as_bytes()).contains("nested deeper than 128 levels"));
        assert!(msg(deep(10_000_000).as_bytes()).contains("nested deeper than 128 levels"));
        // What passes here parses into a tree.
        for ok in [&b"{\"a\":{\"b\":[1.5,\"x\"]}}"[..], deep(127).as_bytes()] {
            assert!(serde_json::from_slice::<serde_json::Value>(ok).is_ok());
        }
    }

    #[test]
    fn xml() {
        assert!(
            check(
                Format::Xml,
                b"<?xml version=\"1.0\"?>\n<a x=\"1\"><b/>t</a>\n"
            )
            .is_ok()
        );
        assert!(check(Format::Xml, b"<a><b></a>").is_err());
        assert!(check(Format::Xml, b"<a></a><b/>").is_err());
        assert!(check(Format::Xml, b"<a>").is_err());
        assert!(check(Format::Xml, b"text").is_err());
        assert!(check(Format::Xml, b"").is_err());
        assert!(check(Format::Xml, b"<a></b>").is_err());
    }

    #[test]
    fn text_and_binary() {
        assert!(check(Format::Text, "héllo".as_bytes()).is_ok());
        assert!(check(Format::Text, &[0xff, 0xfe]).is_err());
        assert!(check(Format::Binary, &[0xff, 0xfe]).is_ok());
    }
}
