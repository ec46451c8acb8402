//! Importers: sessions from other agents' files, as
//! [`ImportSession`](crate::store::exchange::ImportSession)s that
//! [`import_from`](crate::store::exchange::import_from) writes all or
//! nothing. The command-line tool only calls these.

pub mod pi;
