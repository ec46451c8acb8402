//! Session identifiers.

use serde::{Deserialize, Serialize};

/// Maximum length of a session id in bytes.
pub const SESSION_ID_LEN_MAX: usize = 128;

/// The id of a session: 1..=[`SESSION_ID_LEN_MAX`] bytes of ASCII letters,
/// digits, `_` or `-`.
///
/// Generated ids are hyphenated UUID v4 strings. Every id that enters from
/// outside (a caller, a file name, a deserialized document) is validated, so
/// a `SessionId` is always safe to use as a file-name component.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SessionId(String);

/// A session id failed validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid session id {id:?}: {reason}")]
#[non_exhaustive]
pub struct InvalidSessionId {
    /// The rejected input, truncated to 64 bytes for display.
    pub id: String,
    pub reason: &'static str,
}

impl SessionId {
    /// A fresh random id (a hyphenated UUID v4).
    pub fn generate() -> Self {
        SessionId(uuid::Uuid::new_v4().hyphenated().to_string())
    }

    /// Validates and wraps an id.
    pub fn parse(s: &str) -> Result<Self, InvalidSessionId> {
        let reject = |reason| InvalidSessionId {
            id: s.chars().take(64).collect(),
            reason,
        };
        if s.is_empty() || s.len() > SESSION_ID_LEN_MAX {
            return Err(reject("length must be 1..=128 bytes"));
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(reject(
                "only ASCII letters, digits, '_' and '-' are allowed",
            ));
        }
        Ok(SessionId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SessionId {
    type Error = InvalidSessionId;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        SessionId::parse(&s)
    }
}

impl From<SessionId> for String {
    fn from(id: SessionId) -> String {
        id.0
    }
}

impl std::str::FromStr for SessionId {
    type Err = InvalidSessionId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SessionId::parse(s)
    }
}

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_validate() {
        let id = SessionId::generate();
        assert_eq!(SessionId::parse(id.as_str()).unwrap(), id);
    }

    #[test]
    fn rejects_path_components_and_bounds() {
        for bad in ["", "../x", "a/b", "a.json", "a b", "é", &"a".repeat(129)] {
            assert!(SessionId::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(SessionId::parse(&"a".repeat(128)).is_ok());
        assert!(SessionId::parse("A_z-09").is_ok());
    }

    #[test]
    fn deserialization_validates() {
        assert!(serde_json::from_str::<SessionId>("\"../etc\"").is_err());
        let id: SessionId = serde_json::from_str("\"ok-1\"").unwrap();
        assert_eq!(id.as_str(), "ok-1");
    }
}
