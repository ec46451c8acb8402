//! `spool-export` files and a PostgreSQL store: the export of one
//! session's commits and an import in one transaction.
//!
//! The format and its guarantees are those of [`crate::store::exchange`].
//! What differs from the log store is only the all-or-nothing mechanism:
//! an import here is one transaction, so a failure at any point leaves
//! the database as it was (nothing to purge afterwards), and a concurrent
//! writer that takes an id or a commit id first makes the whole import
//! fail on a unique violation instead of half-landing.

use std::collections::HashSet;
use std::io::Write;

use postgres::Client;
use uuid::Uuid;

use super::transcript::TxIndex;
use super::{version_from_sql, version_to_sql, Fail, PostgresStore, HEADER_COLUMNS};
use crate::session::{decode_event, encode_event, SessionEvent, SessionId};
use crate::store::exchange::{
    for_each_session_commit, ExchangeError, ExportWriter, ImportCommit, ImportOptions,
    ImportProgress, ImportSource, ImportedSession, Planned, SessionFold,
};
use crate::store::{SessionStore, StoreError};

/// Commits read per query while exporting.
const EXPORT_BATCH_COMMITS: i64 = 256;

impl PostgresStore {
    /// Writes every commit of session `id` to `w` (see
    /// [`ExportWriter::session`] for the log store). Returns the number of
    /// commits written.
    pub fn export_session<W: Write>(
        &self,
        w: &mut ExportWriter<W>,
        id: &SessionId,
    ) -> Result<u64, ExchangeError> {
        let header = self
            .header(id)?
            .ok_or_else(|| ExchangeError::NotFound { id: id.clone() })?;
        // The header's version bounds the export: commits a concurrent
        // writer adds meanwhile are not part of it.
        let head = header.version;
        let mut from = 1u64;
        while from <= head {
            let rows = self.run("export", &format!("session {id}"), |client| {
                Ok(client.query(
                    "SELECT version, commit_id, created_at_ms, kinds, payloads
                     FROM spool_commits
                     WHERE session_id = $1 AND version >= $2 AND version <= $3
                     ORDER BY version LIMIT $4",
                    &[
                        &id.as_str(),
                        &version_to_sql(id, from).map_err(Fail::Store)?,
                        &version_to_sql(id, head).map_err(Fail::Store)?,
                        &EXPORT_BATCH_COMMITS,
                    ],
                )?)
            })?;
            if rows.is_empty() {
                break;
            }
            for row in &rows {
                let read = |e: postgres::Error| {
                    ExchangeError::Store(StoreError::Corrupt {
                        id: id.clone(),
                        reason: format!("commit row: {e}"),
                    })
                };
                let version = version_from_sql(id, row.try_get(0).map_err(read)?, "commit")?;
                if version != from {
                    return Err(ExchangeError::Store(StoreError::Corrupt {
                        id: id.clone(),
                        reason: format!("commit {from} is missing (the next is {version})"),
                    }));
                }
                let commit_id: Uuid = row.try_get(1).map_err(read)?;
                let stamp: i64 = row.try_get(2).map_err(read)?;
                let payloads: Vec<Vec<u8>> = row.try_get(4).map_err(read)?;
                let mut events = Vec::with_capacity(payloads.len());
                for (i, p) in payloads.iter().enumerate() {
                    events.push(decode_event(p).map_err(|source| {
                        ExchangeError::Store(StoreError::Encoding {
                            context: format!("session {id}, version {version}, event {i}"),
                            source,
                        })
                    })?);
                }
                w.commit(id, version, commit_id, stamp, events)?;
                from = version + 1;
            }
        }
        w.end_session();
        Ok(head)
    }

    /// Imports every session of `source` in one transaction: all of them
    /// or, on any failure, none. A first pass checks every session (it
    /// folds, its id and commit ids are free) without writing; the second
    /// writes each session's header, its commits with their original commit
    /// ids and times, and its transcript index. `source` is read twice, one
    /// commit at a time.
    pub fn import_from(
        &self,
        source: &mut (dyn ImportSource + Send),
        opts: &ImportOptions,
        progress: &mut (dyn FnMut(ImportProgress) + Send),
    ) -> Result<Vec<ImportedSession>, ExchangeError> {
        let mut plan: Vec<Planned> = Vec::new();
        let mut commit_ids = HashSet::new();
        let mut checked = 0u64;
        for_each_session_commit(
            source,
            &mut |id, _| {
                if self.header(id)?.is_some() {
                    return Err(ExchangeError::SessionExists { id: id.clone() });
                }
                Ok((SessionFold::new(id.clone(), true), Vec::new()))
            },
            &mut |(fold, ids), c| {
                fold.commit(c)?;
                if !opts.fresh_commit_ids {
                    ids.push((c.version, c.commit_id));
                }
                checked += 1;
                progress(ImportProgress::Checked { commits: checked });
                Ok(())
            },
            &mut |(mut fold, ids)| {
                fold.settle()?;
                self.check_commit_ids(fold.id(), &ids, &mut commit_ids)?;
                plan.push(Planned::from_fold(fold, 0)?);
                Ok(())
            },
            // An entry-id refusal of an earlier commit comes first.
            &mut |(fold, _), e| fold.settle().err().unwrap_or(e),
        )?;
        let total: u64 = plan.iter().map(|p| p.commits).sum();
        // The write pass may run again after a lost connection: it starts
        // over from the source's beginning in a new transaction.
        self.run("import", "import", |client| {
            write_all(client, source, &plan, opts, total, progress)
        })?
        .map(|()| plan.iter().map(Planned::imported).collect())
    }

    /// Fails with [`ExchangeError::CommitIdTaken`] when a commit id of
    /// session `id` (`(version, commit id)` pairs) is in the database or
    /// earlier in the same import.
    fn check_commit_ids(
        &self,
        id: &SessionId,
        commits: &[(u64, Uuid)],
        seen: &mut HashSet<Uuid>,
    ) -> Result<(), ExchangeError> {
        let taken_by = |c: Uuid| {
            let version = commits.iter().find(|x| x.1 == c).map_or(0, |x| x.0);
            ExchangeError::CommitIdTaken {
                id: id.clone(),
                version,
                commit_id: c,
            }
        };
        for (_, c) in commits {
            if !seen.insert(*c) {
                return Err(taken_by(*c));
            }
        }
        if commits.is_empty() {
            return Ok(());
        }
        let wanted: Vec<Uuid> = commits.iter().map(|c| c.1).collect();
        let taken = self.run("import check", &format!("session {id}"), |client| {
            let row = client.query_opt(
                "SELECT commit_id FROM spool_commits WHERE commit_id = ANY($1) LIMIT 1",
                &[&wanted],
            )?;
            Ok(row.map(|r| r.try_get::<_, Uuid>(0)).transpose()?)
        })?;
        match taken {
            Some(c) => Err(taken_by(c)),
            None => Ok(()),
        }
    }
}

/// The write pass of [`PostgresStore::import_from`] in one transaction. An
/// import error (the source changed between the passes) rolls the
/// transaction back and is returned inside `Ok`, so it is not retried.
fn write_all(
    client: &mut Client,
    source: &mut (dyn ImportSource + Send),
    plan: &[Planned],
    opts: &ImportOptions,
    total: u64,
    progress: &mut (dyn FnMut(ImportProgress) + Send),
) -> Result<Result<(), ExchangeError>, Fail> {
    let mut tx = client.transaction()?;
    let insert_header = tx.prepare(&format!(
        "INSERT INTO spool_sessions ({HEADER_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    ))?;
    let insert_commit = tx.prepare(
        "INSERT INTO spool_commits
             (session_id, version, commit_id, created_at_ms, kinds, payloads)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )?;
    let mut next = 0usize;
    let mut done = 0u64;
    // A database error inside the source's callback is carried out beside
    // it (the callback can only return an `ExchangeError`).
    let mut pg: Option<Fail> = None;
    let changed = |id: &SessionId| ExchangeError::ImportFailed {
        id: id.clone(),
        version: 0,
        reason: "the source changed between the check and the write".into(),
        rolled_back: true,
    };
    let refused = |id: &SessionId| ExchangeError::ImportFailed {
        id: id.clone(),
        version: 0,
        reason: "the database refused the write".into(),
        rolled_back: true,
    };
    let res = {
        let tx = &mut tx;
        let pg = &mut pg;
        for_each_session_commit(
            source,
            &mut |id, _| match plan.get(next) {
                Some(p) if p.id == *id => {
                    next += 1;
                    Ok((p, false))
                }
                _ => Err(changed(id)),
            },
            &mut |(p, started), c| {
                if c.version > p.commits {
                    return Err(changed(&p.id));
                }
                let mut write = || -> Result<(), Fail> {
                    if !*started {
                        write_header(tx, &insert_header, p)?;
                        *started = true;
                    }
                    write_commit(tx, &insert_commit, &p.id, c, opts)
                };
                write().map_err(|e| {
                    *pg = Some(e);
                    refused(&p.id)
                })?;
                done += 1;
                progress(ImportProgress::Written {
                    commits: done,
                    total,
                });
                Ok(())
            },
            &mut |_| Ok(()),
            &mut |_, e| e,
        )
    };
    if let Some(e) = pg {
        return Err(e);
    }
    // Every session the check saw, with every commit it saw.
    let res = res.and_then(|()| match plan.get(next) {
        Some(p) => Err(changed(&p.id)),
        None if done != total => Err(changed(&plan[plan.len() - 1].id)),
        None => Ok(()),
    });
    if let Err(e) = res {
        return Ok(Err(e));
    }
    tx.commit()?;
    Ok(Ok(()))
}

/// Inserts the header of imported session `p`, as the check folded it.
fn write_header(
    tx: &mut postgres::Transaction<'_>,
    insert_header: &postgres::Statement,
    p: &Planned,
) -> Result<(), Fail> {
    let info = &p.info;
    let last = version_to_sql(&p.id, p.commits).map_err(Fail::Store)?;
    let parent = info.parent_id.as_ref().map(|p| p.as_str());
    tx.execute(
        insert_header,
        &[
            &p.id.as_str(),
            &parent,
            &info.status.as_str(),
            &last,
            &info.agent_name,
            &info.label,
            &info.created_at_ms,
            &info.updated_at_ms,
        ],
    )?;
    Ok(())
}

/// Inserts one imported commit of session `id` and its transcript index.
fn write_commit(
    tx: &mut postgres::Transaction<'_>,
    insert_commit: &postgres::Statement,
    id: &SessionId,
    c: &ImportCommit,
    opts: &ImportOptions,
) -> Result<(), Fail> {
    let (kinds, payloads) = encode(id, c.version, &c.events)?;
    let commit_id = if opts.fresh_commit_ids {
        Uuid::new_v4()
    } else {
        c.commit_id
    };
    let version = version_to_sql(id, c.version).map_err(Fail::Store)?;
    tx.execute(
        insert_commit,
        &[
            &id.as_str(),
            &version,
            &commit_id,
            &c.timestamp_ms,
            &kinds,
            &payloads,
        ],
    )?;
    // The transcript index, in the same transaction, a commit at a time as
    // every other write maintains it.
    TxIndex::new(tx, id.as_str())
        .apply(&c.events, Some(&payloads), c.timestamp_ms)
        .map_err(|e| e.into_fail(id))?;
    Ok(())
}

/// The kinds and [`encode_event`] bytes of one imported commit, as
/// [`PostgresStore`] stores a commit.
fn encode(
    id: &SessionId,
    version: u64,
    events: &[SessionEvent],
) -> Result<(Vec<String>, Vec<Vec<u8>>), Fail> {
    let mut kinds = Vec::with_capacity(events.len());
    let mut payloads = Vec::with_capacity(events.len());
    for ev in events {
        payloads.push(encode_event(ev).map_err(|source| {
            Fail::Store(StoreError::Encoding {
                context: format!("session {id}, version {version}, event {}", ev.kind()),
                source,
            })
        })?);
        kinds.push(ev.kind().to_string());
    }
    Ok((kinds, payloads))
}
