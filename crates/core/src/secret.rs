//! A setting that must not reach a log line or an error: a password, a token, a key.

/// Text kept secret: `Debug` shows only that there is one.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The secret itself, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_text() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "Secret(..)");
        assert_eq!(s.expose(), "hunter2");
    }
}
