//! Importers: sessions from other agents' files, as sources of commits
//! ([`ImportSource`](crate::store::exchange::ImportSource)) that
//! [`import_from`](crate::store::exchange::import_from) writes all or
//! nothing, or as whole [`ImportSession`](crate::store::exchange::ImportSession)s.
//! The command-line tool only calls these.

pub mod pi;
