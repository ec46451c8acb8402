//! The versioned schema of the PostgreSQL store and its migrations.
//!
//! Migrations run on first use ([`migrate`], called by
//! `PostgresStore::connect`) in ONE transaction that first takes a
//! transaction-scoped advisory lock, so many processes starting at once
//! against an empty database apply each migration exactly once and the
//! others wait, then see it applied. `spool_schema_version` holds one row
//! per applied migration.
//!
//! | version | brings |
//! | --- | --- |
//! | 1 | sessions, commits, snapshots |
//! | 2 | the transcript index (see the `transcript` module of the PostgreSQL store): `spool_entries`, `spool_custom_types`, the `tx_*` columns of `spool_sessions`; built for existing sessions by replaying their commits |

use postgres::{Client, Transaction};

use super::transcript::IndexFault;

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i32 = 2;

/// Key of the advisory lock taken while migrating (`b"spoolsch"` as a
/// big-endian i64). Advisory locks are per database, so stores in other
/// schemas of the same database serialize their migrations too, which is
/// harmless.
pub const MIGRATION_LOCK_KEY: i64 = i64::from_be_bytes(*b"spoolsch");

/// Data work run after a migration's DDL, in the same transaction.
type Backfill = fn(&mut Transaction<'_>) -> Result<(), IndexFault>;

/// One migration: the version it brings the schema to, its DDL and the
/// data work that follows it.
struct Migration {
    version: i32,
    sql: &'static str,
    backfill: Option<Backfill>,
}

/// Every migration, in order; `MIGRATIONS[i].version == i + 1`.
const MIGRATIONS: &[Migration] = &[
    Migration {
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
        backfill: None,
    },
    Migration {
        version: 2,
        // Entry rows of the current transcript generation, one per entry;
        // custom ordinals per type and among all types (never reused, so
        // pages after an ordinal stay stable); label target and value of
        // label entries (the last by seq wins).
        sql: r#"
ALTER TABLE spool_sessions
    ADD COLUMN tx_generation    bigint NOT NULL DEFAULT 0,
    ADD COLUMN tx_raw_seq       bigint NOT NULL DEFAULT 0,
    ADD COLUMN tx_updated_at_ms bigint NOT NULL DEFAULT 0,
    ADD COLUMN tx_leaf          text COLLATE "C",
    ADD COLUMN tx_entries       bigint NOT NULL DEFAULT 0,
    ADD COLUMN tx_next_seq      bigint NOT NULL DEFAULT 0,
    ADD COLUMN tx_custom_next   bigint NOT NULL DEFAULT 0;

CREATE TABLE spool_entries (
    session_id     text COLLATE "C" NOT NULL
                   REFERENCES spool_sessions (id) ON DELETE CASCADE,
    entry_id       text COLLATE "C" NOT NULL,
    seq            bigint NOT NULL CHECK (seq >= 0),
    parent_id      text COLLATE "C",
    kind           text   NOT NULL,
    marker         bytea  NOT NULL,
    facts          bytea  NOT NULL,
    size_bytes     bigint NOT NULL CHECK (size_bytes >= 0),
    custom_type    text COLLATE "C",
    custom_ordinal bigint,
    custom_all     bigint,
    label_target   text COLLATE "C",
    label          text,
    summary        text   NOT NULL,
    payload        bytea  NOT NULL,
    CONSTRAINT spool_entries_pkey PRIMARY KEY (session_id, entry_id),
    CONSTRAINT spool_entries_custom CHECK (
        (custom_type IS NULL) = (custom_ordinal IS NULL)
        AND (custom_type IS NULL) = (custom_all IS NULL))
);
CREATE INDEX spool_entries_children ON spool_entries (session_id, parent_id, seq);
CREATE INDEX spool_entries_custom_type ON spool_entries (session_id, custom_type, custom_ordinal)
    WHERE custom_type IS NOT NULL;
CREATE INDEX spool_entries_custom_all ON spool_entries (session_id, custom_all)
    WHERE custom_all IS NOT NULL;
CREATE INDEX spool_entries_labels ON spool_entries (session_id, label_target, seq)
    WHERE label_target IS NOT NULL;

CREATE TABLE spool_custom_types (
    session_id   text COLLATE "C" NOT NULL
                 REFERENCES spool_sessions (id) ON DELETE CASCADE,
    custom_type  text COLLATE "C" NOT NULL,
    next_ordinal bigint NOT NULL,
    PRIMARY KEY (session_id, custom_type)
);
"#,
        backfill: Some(super::transcript::backfill),
    },
];

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
    /// Building a migration's derived data from the stored commits.
    #[error("schema migration to version {version}: {source}")]
    Backfill {
        version: i32,
        #[source]
        source: IndexFault,
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
        if let Some(backfill) = m.backfill {
            backfill(&mut tx).map_err(|e| match e {
                IndexFault::Pg(source) => SchemaError::Migration {
                    version: m.version,
                    source,
                },
                other => SchemaError::Backfill {
                    version: m.version,
                    source: other,
                },
            })?;
        }
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
