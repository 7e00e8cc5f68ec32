//! Query-string parameters: decoded once, repeatable, checked against what an endpoint knows.

use crate::error::{ApiError, ErrorCode};

/// The decoded parameters of one request, in the order sent.
#[derive(Debug, Default, Clone)]
pub(crate) struct Params {
    pairs: Vec<(String, String)>,
}

impl Params {
    pub fn parse(query: Option<&str>) -> Params {
        let pairs = match query {
            Some(q) => form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
            None => Vec::new(),
        };
        Params { pairs }
    }

    /// Every `(name, value)`, in the order sent.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.pairs
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn has(&self, name: &str) -> bool {
        self.pairs.iter().any(|(k, _)| k == name)
    }

    /// Parameters whose name starts with `prefix`, with the prefix removed.
    pub(crate) fn prefixed<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        self.pairs
            .iter()
            .filter_map(move |(k, v)| k.strip_prefix(prefix).map(|rest| (rest, v.as_str())))
    }

    pub fn required(&self, name: &str) -> Result<&str, ApiError> {
        match self.get(name) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(ApiError::new(
                ErrorCode::RequiredParam,
                format!("missing required parameter: {name}"),
            )),
        }
    }

    /// Refuse any parameter the endpoint does not know (`REST-UNSUPPORTEDPARAM`).
    pub fn only(&self, path: &str, known: impl Fn(&str) -> bool) -> Result<(), ApiError> {
        let unknown: Vec<&str> = self
            .pairs
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| !known(k))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::UnsupportedParam,
            format!("invalid parameters: {} for {path}", unknown.join(", ")),
        ))
    }
}

/// A number written as decimal digits only: no sign, no space, at most 19 digits (`+0`,
/// `-0` and ` 1` are not numbers in a path).
pub(crate) fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_and_repeats() {
        let p = Params::parse(Some(
            "uri=%2Fa%20b.json&collection=c1&collection=c+2&perm:rest-reader=read&trans:x=%7B%7D",
        ));
        assert_eq!(p.get("uri"), Some("/a b.json"));
        assert_eq!(p.all("collection").collect::<Vec<_>>(), vec!["c1", "c 2"]);
        assert_eq!(
            p.prefixed("perm:").collect::<Vec<_>>(),
            vec![("rest-reader", "read")]
        );
        assert_eq!(p.get("trans:x"), Some("{}"));
        assert!(p.required("missing").is_err());
        let e = p.only("/v1/documents", |k| k == "uri").unwrap_err();
        assert_eq!(e.code, ErrorCode::UnsupportedParam);
        assert!(e.message.contains("collection"), "{}", e.message);
    }

    #[test]
    fn digits_are_digits_only() {
        assert_eq!(super::digits("0"), Some(0));
        assert_eq!(super::digits("0042"), Some(42));
        for bad in [
            "",
            "+0",
            "-0",
            " 1",
            "1 ",
            "0x1",
            "1e3",
            "99999999999999999999",
        ] {
            assert_eq!(super::digits(bad), None, "{bad:?}");
        }
    }
}
