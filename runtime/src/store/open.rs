//! Opening a store from a location string (`spool --store`, library users).

use std::sync::Arc;

use super::{LogStore, LogStoreOptions, SessionStore, StoreError};

/// Whether `location` names a PostgreSQL database (a `postgres://` or
/// `postgresql://` URL) rather than a directory.
pub fn is_postgres_location(location: &str) -> bool {
    let lower = location.get(..13).unwrap_or(location).to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

/// Opens the store `location` names: a `postgres://…` or `postgresql://…`
/// URL opens a `PostgresStore` (when the
/// `postgres` feature is on), anything else is the directory of a
/// [`LogStore`] with default options.
pub fn open_store(location: &str) -> Result<Arc<dyn SessionStore>, StoreError> {
    if is_postgres_location(location) {
        return open_postgres(location);
    }
    Ok(Arc::new(LogStore::open(
        location,
        LogStoreOptions::default(),
    )?))
}

#[cfg(feature = "postgres")]
fn open_postgres(location: &str) -> Result<Arc<dyn SessionStore>, StoreError> {
    Ok(Arc::new(super::postgres::PostgresStore::connect(location)?))
}

#[cfg(not(feature = "postgres"))]
fn open_postgres(_location: &str) -> Result<Arc<dyn SessionStore>, StoreError> {
    Err(feature_off())
}

/// The error for a PostgreSQL location in a build without the store.
#[cfg_attr(feature = "postgres", allow(dead_code))]
fn feature_off() -> StoreError {
    StoreError::Backend(
        "a postgres:// store needs the cargo feature `postgres` of spool-runtime, which is off \
         in this build (it is off by default: enable it with \
         `spool-runtime = { version = \"…\", features = [\"postgres\"] }`)"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole chain of `e`, as the CLI prints it.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut cur = e.source();
        while let Some(s) = cur {
            out.push_str(" | ");
            out.push_str(&s.to_string());
            cur = s.source();
        }
        out
    }

    #[test]
    fn feature_off_error_names_the_feature() {
        let msg = chain(&feature_off());
        assert!(msg.contains("feature `postgres`"), "{msg}");
        assert!(msg.contains("spool-runtime"), "{msg}");
    }

    #[test]
    fn postgres_locations_are_recognised() {
        assert!(is_postgres_location("postgres://u@h/db"));
        assert!(is_postgres_location("PostgreSQL://h"));
        assert!(!is_postgres_location("./postgres"));
        assert!(!is_postgres_location("host=h dbname=d"));
    }

    /// Malformed URLs are refused before anything connects, and no part
    /// of the error shows the password.
    #[cfg(feature = "postgres")]
    #[test]
    fn malformed_url_errors_do_not_echo_the_password() {
        for url in [
            "postgres://alice:s3cr3tpw@localhost:notaport/db",
            "postgres://alice:s3cr3tpw@localhost/db?sslmode=verify_everything",
            "postgres://alice:s3cr3tpw@localhost/db?nosuchoption=s3cr3tpw",
            "postgres://alice:s3cr3tpw@localhost/db?connect_timeout=s3cr3tpw",
            "postgres://alice:s3cr3tpw@[::1/db",
            "postgresql://alice:s3cr3tpw@localhost/db?sslrootcert=system&sslmode=require",
        ] {
            let e = match open_store(url) {
                Ok(_) => panic!("{url} opened"),
                Err(e) => e,
            };
            let msg = chain(&e);
            assert!(!msg.contains("s3cr3tpw"), "{url}: {msg}");
            assert!(msg.contains("invalid PostgreSQL"), "{url}: {msg}");
        }
    }
}
