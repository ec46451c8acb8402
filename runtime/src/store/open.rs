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
/// URL opens a [`PostgresStore`](super::postgres::PostgresStore) (when the
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
    Err(StoreError::Backend(
        "this build has no PostgreSQL support (cargo feature `postgres` is off)".into(),
    ))
}
