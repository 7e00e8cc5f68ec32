//! `multipart/mixed` bodies: the bulk form of the documents API and the one-part form some
//! clients use for geoQueryService.

use memchr::memmem;

/// One part: its headers (lowercased names) and its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part<'a> {
    pub headers: Vec<(String, String)>,
    pub body: &'a [u8],
}

impl Part<'_> {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A parameter of `Content-Disposition` (`filename`, `category`, `format`), unquoted.
    pub fn disposition(&self, param: &str) -> Option<String> {
        let d = self.header("content-disposition")?;
        d.split(';').skip(1).find_map(|p| {
            let (k, v) = p.trim().split_once('=')?;
            k.trim()
                .eq_ignore_ascii_case(param)
                .then(|| v.trim().trim_matches('"').to_string())
        })
    }
}

/// The boundary of a `multipart/*` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    content_type.split(';').map(str::trim).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_string())
    })
}

/// Split a body into parts. `Err` names what is malformed.
pub fn parse<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<Part<'a>>, String> {
    let delimiter = format!("--{boundary}");
    let finder = memmem::Finder::new(delimiter.as_bytes());
    let mut starts: Vec<usize> = finder.find_iter(body).collect();
    if starts.is_empty() {
        return Err(format!("the body has no part delimited by {delimiter:?}"));
    }
    // Only delimiters at the start of a line count.
    starts.retain(|&i| i == 0 || body[..i].ends_with(b"\n"));
    let mut parts = Vec::new();
    for w in starts.windows(2) {
        let (a, b) = (w[0] + delimiter.len(), w[1]);
        let mut chunk = &body[a..b];
        chunk = chunk
            .strip_prefix(b"\r\n")
            .or_else(|| chunk.strip_prefix(b"\n"))
            .unwrap_or(chunk);
        // The line break before the next delimiter belongs to it.
        chunk = chunk
            .strip_suffix(b"\r\n")
            .or_else(|| chunk.strip_suffix(b"\n"))
            .unwrap_or(chunk);
        let (head, content) = match memmem::find(chunk, b"\r\n\r\n") {
            Some(i) => (&chunk[..i], &chunk[i + 4..]),
            None => match memmem::find(chunk, b"\n\n") {
                Some(i) => (&chunk[..i], &chunk[i + 2..]),
                None => {
                    return Err(format!(
                        "part {} has no blank line after its headers",
                        parts.len() + 1
                    ));
                }
            },
        };
        let head = std::str::from_utf8(head)
            .map_err(|_| format!("part {} has headers that are not UTF-8", parts.len() + 1))?;
        let headers = head
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let (k, v) = l.split_once(':').unwrap_or((l, ""));
                (k.trim().to_ascii_lowercase(), v.trim().to_string())
            })
            .collect();
        parts.push(Part {
            headers,
            body: content,
        });
    }
    let last = *starts.last().unwrap_or(&0) + delimiter.len();
    if !body[last..].starts_with(b"--") {
        return Err("the body does not end with the closing delimiter".into());
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_and_dispositions() {
        let body = b"--b\r\nContent-Type: application/json\r\nContent-Disposition: inline; category=metadata\r\n\r\n{\"collections\":[\"c\"]}\r\n--b\r\nContent-Type: application/json\r\nContent-Disposition: attachment; filename=\"/a.json\"; category=content\r\n\r\n{\"a\":1}\r\n--b--\r\n";
        let parts = parse(body, "b").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(
            parts[0].disposition("category").as_deref(),
            Some("metadata")
        );
        assert_eq!(parts[1].disposition("filename").as_deref(), Some("/a.json"));
        assert_eq!(parts[1].body, b"{\"a\":1}");
        assert_eq!(
            boundary("multipart/mixed; boundary=\"b\"").as_deref(),
            Some("b")
        );
        assert!(
            parse(b"--b\r\nX: y\r\n\r\nbody\r\n--b", "b").is_err(),
            "no closing delimiter"
        );
        assert!(parse(b"nothing", "b").is_err());
    }
}
