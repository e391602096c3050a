//! Bearer tokens, once for every listener: the facade (per link), gRPC (per link) and the admin
//! API (one operator token) read a request's `Authorization: Bearer <token>` with [`bearer`] and
//! compare it with a [`Token`] in constant time.

use subtle::ConstantTimeEq as _;

/// A secret bearer token. Its `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// The token `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// Whether `presented` is this token, compared in constant time.
    pub fn opens(&self, presented: &str) -> bool {
        bool::from(presented.as_bytes().ct_eq(self.0.as_bytes()))
    }

    /// The token itself (for a kubeconfig handed to a consumer).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// The token of an `Authorization` header value (`Bearer <token>`, scheme case-insensitive).
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_bearer_scheme_only() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("abc"), None);
    }

    #[test]
    fn opens_only_its_own_value_and_hides_it() {
        let t = Token::new("s3cret");
        assert!(t.opens("s3cret"));
        assert!(!t.opens("s3cre"));
        assert!(!format!("{t:?}").contains("s3cret"));
    }
}
