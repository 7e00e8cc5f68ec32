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

fn check_json(bytes: &[u8]) -> Result<(), ContentError> {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
        .map(|_| ())
        .map_err(|e| ContentError {
            format: Format::Json,
            message: format!("invalid JSON: {e}"),
        })
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
