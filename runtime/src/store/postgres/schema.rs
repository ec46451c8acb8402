//! The versioned schema of the PostgreSQL store and its migrations.
//!
//! Migrations run on first use ([`migrate`], called by
//! `PostgresStore::connect`) in ONE transaction that first takes a
//! transaction-scoped advisory lock, so many processes starting at once
//! against an empty database apply each migration exactly once and the
//! others wait, then see it applied. `spool_schema_version` holds one row
//! per applied migration.

use postgres::Client;

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// Key of the advisory lock taken while migrating (`b"spoolsch"` as a
/// big-endian i64). Advisory locks are per database, so stores in other
/// schemas of the same database serialize their migrations too, which is
/// harmless.
pub const MIGRATION_LOCK_KEY: i64 = i64::from_be_bytes(*b"spoolsch");

/// One migration: the version it brings the schema to and its DDL.
struct Migration {
    version: i32,
    sql: &'static str,
}

/// Every migration, in order; `MIGRATIONS[i].version == i + 1`.
const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    // Ids compare bytewise (COLLATE "C") so `ORDER BY id` matches the
    // order of `SessionId` in Rust, which listing and cursors rely on.
    sql: r#"
CREATE TABLE spool_sessions (
    id            text COLLATE "C" PRIMARY KEY,
    parent_id     text COLLATE "C",
    status        text   NOT NULL,
    version       bigint NOT NULL CHECK (version >= 1),
    agent_name    text   NOT NULL,
    label         text   NOT NULL,
    created_at_ms bigint NOT NULL,
    updated_at_ms bigint NOT NULL
);
CREATE INDEX spool_sessions_updated ON spool_sessions (updated_at_ms, id);
CREATE INDEX spool_sessions_created ON spool_sessions (created_at_ms, id);
CREATE INDEX spool_sessions_status  ON spool_sessions (status, updated_at_ms, id);
CREATE INDEX spool_sessions_agent   ON spool_sessions (agent_name, updated_at_ms, id);
CREATE INDEX spool_sessions_parent  ON spool_sessions (parent_id, id)
    WHERE parent_id IS NOT NULL;

CREATE TABLE spool_commits (
    session_id    text COLLATE "C" NOT NULL
                  REFERENCES spool_sessions (id) ON DELETE CASCADE,
    version       bigint NOT NULL CHECK (version >= 1),
    commit_id     uuid   NOT NULL,
    created_at_ms bigint NOT NULL,
    kinds         text[]  NOT NULL,
    payloads      bytea[] NOT NULL,
    CONSTRAINT spool_commits_pkey PRIMARY KEY (session_id, version),
    CONSTRAINT spool_commits_commit_id_key UNIQUE (commit_id),
    CONSTRAINT spool_commits_batch CHECK (cardinality(kinds) = cardinality(payloads))
);

CREATE TABLE spool_snapshots (
    session_id    text COLLATE "C" PRIMARY KEY
                  REFERENCES spool_sessions (id) ON DELETE CASCADE,
    version       bigint NOT NULL,
    commit_id     uuid   NOT NULL,
    updated_at_ms bigint NOT NULL,
    bytes         bytea  NOT NULL
);
"#,
}];

/// Why the schema could not be brought to [`SCHEMA_VERSION`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    #[error("schema migration to version {version}: {source}")]
    Migration {
        version: i32,
        #[source]
        source: postgres::Error,
    },
    #[error("reading the schema version: {0}")]
    Read(#[source] postgres::Error),
    #[error(
        "the database holds spool schema version {found}, newer than this build's {supported}"
    )]
    TooNew { found: i32, supported: i32 },
}

/// Brings the schema to [`SCHEMA_VERSION`]; returns the version found
/// before migrating (0 for an empty database).
pub fn migrate(client: &mut Client) -> Result<i32, SchemaError> {
    debug_assert!(MIGRATIONS
        .iter()
        .enumerate()
        .all(|(i, m)| m.version == i as i32 + 1));
    debug_assert_eq!(MIGRATIONS.len() as i32, SCHEMA_VERSION);
    let mut tx = client.transaction().map_err(SchemaError::Read)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY])
        .map_err(SchemaError::Read)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS spool_schema_version (
             version       integer PRIMARY KEY,
             applied_at_ms bigint  NOT NULL
         )",
    )
    .map_err(SchemaError::Read)?;
    let found: i32 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM spool_schema_version",
            &[],
        )
        .and_then(|row| row.try_get(0))
        .map_err(SchemaError::Read)?;
    if found > SCHEMA_VERSION {
        return Err(SchemaError::TooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > found) {
        let fail = |source| SchemaError::Migration {
            version: m.version,
            source,
        };
        tx.batch_execute(m.sql).map_err(fail)?;
        tx.execute(
            "INSERT INTO spool_schema_version (version, applied_at_ms)
             VALUES ($1, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)",
            &[&m.version],
        )
        .map_err(fail)?;
    }
    tx.commit().map_err(|source| SchemaError::Migration {
        version: SCHEMA_VERSION,
        source,
    })?;
    Ok(found)
}
