//! `spool replay`: rebuild the derived indexes and snapshots from the log
//! alone, or show a session as it was at an earlier version.
//!
//! # Rebuild (`spool replay`)
//!
//! 1. Open the store as its owner with its current index, which catches it
//!    up with the log, and close it. An unreadable index is noted, not
//!    fatal: that is what a rebuild is for.
//! 2. Open it again with an empty index in `DIR/index.rebuild`: the engine
//!    builds every index from the log. Then load every session once,
//!    which checks that it folds and writes the snapshots the load policy
//!    asks for (the snapshot cache starts empty).
//! 3. Compare the rebuilt index entry by entry with the old one
//!    ([`spool_engine::Index::entries`]: stream heads, positions, commit
//!    ids, session headers; one entry of each at a time, so memory does not
//!    grow with the index), then swap the directories (`index` → `index.old`, `index.rebuild` →
//!    `index`) and remove the old one. The index is a cache: a crash at any
//!    point leaves either index usable, or none, which the next open
//!    rebuilds.
//!
//! Exit code 1 when the old index disagreed with the log or a session
//! failed to fold (the rebuilt index is installed either way).
//!
//! # Time travel (`spool replay ID --at-version N`)
//!
//! Folds the session's events up to version N (read-only) and prints it
//! like `show`; `--json` adds the transcript and the model context at
//! that version.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use spool_engine::{Index, Store, INDEX_CACHE_BYTES_BULK, INDEX_DIR};
use spool_runtime::session::SessionStatus;
use spool_runtime::store::log::is_erased_entry;
use spool_runtime::store::{LogStore, LogStoreOptions};
use spool_runtime::transcript::{Entry, ModelContext};
use spool_runtime::{ListQuery, SessionStore};

use crate::cmd::export::session_bar;
use crate::cmd::require_existing_store;
use crate::cmd::show::{print_text, Shown};
use crate::out::{human_time_ms, print_doc, Result, Table, ToolError, EXIT_PROBLEM};
use crate::session_open::{parse_id, read_only};

/// Name of the directory the rebuilt index is built in.
pub(crate) const REBUILD_DIR: &str = "index.rebuild";
/// Name the old index is moved to while swapping.
pub(crate) const OLD_DIR: &str = "index.old";
/// At most this many differing index keys are listed.
const DIFFS_LISTED_MAX: usize = 20;

pub fn run(dir: &Path, id: Option<&str>, at_version: Option<u64>, json: bool) -> Result<ExitCode> {
    match (id, at_version) {
        (None, _) => rebuild(dir, json),
        (Some(id), Some(v)) => at(dir, id, v, json),
        (Some(_), None) => Err(ToolError::new("replay ID needs --at-version N")
            .hint("e.g. `spool --store DIR replay ID --at-version 1`; see versions with `spool --store DIR log --stream ID`")),
    }
}

// ---------------------------------------------------------------------------
// Time travel
// ---------------------------------------------------------------------------

#[derive(Serialize)]
struct AtVersion<'a> {
    at_version: u64,
    head_version: u64,
    /// Entries of this version whose content an erasing `compact --gc`
    /// removed (a later rewrite superseded it); they are shown as
    /// placeholders of custom type `spool.erased`.
    erased_entries: u64,
    session: Shown<'a>,
    transcript: TranscriptJson<'a>,
    context: ModelContext,
}

#[derive(Serialize)]
struct TranscriptJson<'a> {
    leaf: Option<String>,
    entries: &'a [Entry],
}

fn at(dir: &Path, id: &str, version: u64, json: bool) -> Result<ExitCode> {
    let id = parse_id(id)?;
    let (store, _rt) = read_only(dir)?;
    let head = store
        .header(&id)
        .map_err(|e| ToolError::with_source(format!("reading session {id} failed"), e))?
        .ok_or_else(|| {
            ToolError::new(format!("no session {id} in this store"))
                .hint("list sessions with `spool --store DIR sessions`")
        })?
        .version;
    if version == 0 || version > head {
        return Err(ToolError::new(format!(
            "session {id} has versions 1..={head}, not {version}"
        ))
        .hint("see its versions with `spool --store DIR log --stream ID`"));
    }
    let s = store
        .load_at(&id, Some(version))
        .map_err(|e| ToolError::with_source(format!("replaying session {id} failed"), e))?
        .ok_or_else(|| ToolError::new(format!("session {id} has no version {version}")))?;
    let transcript = &s.state().transcript;
    let erased = transcript
        .entries()
        .iter()
        .filter(|e| is_erased_entry(e))
        .count() as u64;
    let context = transcript
        .context()
        .map_err(|e| ToolError::with_source("building the context failed", e))?;
    if json {
        print_doc(&AtVersion {
            at_version: version,
            head_version: head,
            erased_entries: erased,
            session: Shown::of(&s),
            transcript: TranscriptJson {
                leaf: transcript.leaf().map(|l| l.to_string()),
                entries: transcript.entries(),
            },
            context,
        })?;
        return Ok(ExitCode::SUCCESS);
    }
    crate::outln!(
        "as of version {version} of {head} (saved {})",
        human_time_ms(s.info().updated_at_ms)
    );
    if erased > 0 {
        crate::outln!(
            "erased: the content of {erased} of the {} entries of this version was erased by `compact --gc` (a later rewrite superseded it); they show as placeholders",
            transcript.len()
        );
    }
    crate::outln!();
    print_text(&Shown::of(&s))?;
    crate::outln!("context   {} messages at the leaf", context.messages.len());
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------
// Rebuild
// ---------------------------------------------------------------------------

#[derive(Serialize, Default)]
struct Rebuild {
    commits: u64,
    streams: u64,
    sessions: u64,
    sessions_by_status: std::collections::BTreeMap<&'static str, u64>,
    entries: u64,
    snapshots: u64,
    index_entries: u64,
    /// Whether the old index gave exactly the rebuilt answers.
    old_index_matched: bool,
    /// Why the old index could not be read, if it could not.
    old_index_error: Option<String>,
    differing_entries: u64,
    differing_keys: Vec<String>,
    failed_sessions: Vec<String>,
    rebuild_ms: u64,
    load_ms: u64,
    total_ms: u64,
}

fn open_err(dir: &Path, e: impl std::error::Error + Send + Sync + 'static) -> ToolError {
    let locked = crate::out::is_locked(&e);
    let err = ToolError::with_source(format!("opening {} as its owner failed", dir.display()), e);
    if locked {
        err.hint("replay needs exclusive ownership: stop the process that owns the store")
    } else {
        err.hint_from_cause(None)
    }
}

fn key_text(k: &[u8]) -> String {
    k.iter()
        .map(|&b| {
            if b.is_ascii_graphic() {
                (b as char).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect()
}

/// Compares the rebuilt index of `engine` with the old index at `old_dir` (none: only
/// count the rebuilt one's entries), entry by entry, into `r` (the rebuilt index's entry
/// count, the differing entries); false when there was no old index to compare with or
/// it could not be read (`r.old_index_error` says why).
fn compare_with_old(
    engine: &Store,
    dir: &Path,
    old_dir: Option<&Path>,
    r: &mut Rebuild,
) -> Result<bool> {
    let old = match old_dir.map(|d| Index::open_existing(d, dir, INDEX_CACHE_BYTES_BULK)) {
        None => None,
        Some(Ok(Some(old))) => Some(old),
        Some(Ok(None)) => {
            r.old_index_error = Some("it has another format".into());
            None
        }
        Some(Err(e)) => {
            r.old_index_error = Some(crate::out::chain_text(&e));
            None
        }
    };
    let note = |k: &[u8], r: &mut Rebuild| {
        r.differing_entries += 1;
        if r.differing_keys.len() < DIFFS_LISTED_MAX {
            r.differing_keys.push(key_text(k));
        }
    };
    // The old index's entries, until one fails to read (the error is then noted).
    let mut olds = old.as_ref().map(|o| o.entries().peekable());
    for b in engine.index().entries() {
        let (key, value) =
            b.map_err(|e| ToolError::with_source("reading the rebuilt index failed", e))?;
        r.index_entries += 1;
        let Some(old_entries) = olds.as_mut() else {
            continue;
        };
        // The old entries before this key are not in the rebuild; this key, unless the
        // old index has it too, is not in the old one.
        loop {
            match old_entries.peek() {
                Some(Ok((k, _))) if *k < key => {
                    note(k, r);
                    old_entries.next();
                }
                Some(Ok((k, v))) if *k == key => {
                    if *v != value {
                        note(&key, r);
                    }
                    old_entries.next();
                    break;
                }
                Some(Ok(_)) | None => {
                    note(&key, r);
                    break;
                }
                Some(Err(_)) => {
                    if let Some(Err(e)) = old_entries.next() {
                        r.old_index_error = Some(crate::out::chain_text(&e));
                    }
                    olds = None;
                    break;
                }
            }
        }
    }
    let Some(rest) = olds else {
        return Ok(false);
    };
    for a in rest {
        match a {
            Ok((k, _)) => note(&k, r),
            Err(e) => {
                r.old_index_error = Some(crate::out::chain_text(&e));
                return Ok(false);
            }
        }
    }
    Ok(true)
}

fn spinner(msg: &str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

fn rebuild(dir: &Path, json: bool) -> Result<ExitCode> {
    require_existing_store(dir)?;
    let started = Instant::now();
    let mut r = Rebuild::default();

    // 1. The old index, caught up with the log.
    let old_readable = match LogStore::open(dir, LogStoreOptions::default()) {
        Ok(store) => {
            store
                .close()
                .map_err(|e| ToolError::with_source("closing the store failed", e))?;
            true
        }
        Err(e) if crate::out::is_locked(&e) => return Err(open_err(dir, e)),
        Err(e) => {
            r.old_index_error = Some(crate::out::chain_text(&e));
            false
        }
    };

    // 2. A fresh index from the log alone.
    let rebuild_dir = dir.join(REBUILD_DIR);
    if rebuild_dir.exists() {
        std::fs::remove_dir_all(&rebuild_dir).map_err(|e| {
            ToolError::with_source(format!("removing {} failed", rebuild_dir.display()), e)
        })?;
    }
    let t = Instant::now();
    let sp = spinner("rebuilding the indexes from the log");
    let engine = Store::open(
        dir,
        LogStoreOptions::default()
            .engine_options()
            .index_dir(&rebuild_dir)
            // From the log alone, and no checkpoint written while the old index, a
            // delta over the newest one, is still to be read.
            .index_from_log(true)
            .checkpoint_commits_min(0),
    )
    .map_err(|e| open_err(dir, e))?;
    sp.finish_and_clear();
    r.rebuild_ms = t.elapsed().as_millis() as u64;
    let store = LogStore::from_engine(engine);

    let t = Instant::now();
    let list = store
        .list_headers(&ListQuery::all().including_deleted())
        .map_err(|e| ToolError::with_source("listing sessions failed", e))?;
    let pb = session_bar(list.headers.len() as u64, "loading sessions");
    for h in &list.headers {
        *r.sessions_by_status.entry(h.status.as_str()).or_default() += 1;
        match store.load(&h.id) {
            Ok(Some(s)) => r.entries += s.state().transcript.len() as u64,
            Ok(None) => r
                .failed_sessions
                .push(format!("{}: listed but absent", h.id)),
            Err(e) => r
                .failed_sessions
                .push(format!("{}: {}", h.id, crate::out::chain_text(&e))),
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    for s in &list.skipped {
        r.failed_sessions
            .push(format!("{}: {}", s.location, s.reason));
    }
    r.load_ms = t.elapsed().as_millis() as u64;
    r.sessions = list.headers.len() as u64;
    let engine = store
        .engine()
        .map_err(|e| ToolError::with_source("opening the engine failed", e))?;
    r.commits = engine.last_seq();
    r.streams = engine
        .streams()
        .map_err(|e| ToolError::with_source("listing streams failed", e))?
        .len() as u64;
    r.snapshots = store
        .cached_snapshots()
        .map_err(|e| ToolError::with_source("counting snapshots failed", e))?;
    // 3. Compare (while the rebuild's owner holds the store), then swap the directories.
    let old_dir = old_readable.then(|| dir.join(INDEX_DIR));
    let compared = compare_with_old(&engine, dir, old_dir.as_deref(), &mut r)?;
    // Let go of the engine before closing: close waits for every holder.
    drop(engine);
    store
        .close()
        .map_err(|e| ToolError::with_source("closing the store failed", e))?;
    r.old_index_matched = compared && r.differing_entries == 0;
    let live = dir.join(INDEX_DIR);
    let old_dir = dir.join(OLD_DIR);
    let swap = || -> std::io::Result<()> {
        if old_dir.exists() {
            std::fs::remove_dir_all(&old_dir)?;
        }
        if live.exists() {
            std::fs::rename(&live, &old_dir)?;
        }
        std::fs::rename(&rebuild_dir, &live)?;
        if old_dir.exists() {
            std::fs::remove_dir_all(&old_dir)?;
        }
        Ok(())
    };
    swap().map_err(|e| {
        ToolError::with_source("installing the rebuilt index failed", e)
            .hint("the store stays usable: its next open rebuilds a missing index from the log")
    })?;
    r.total_ms = started.elapsed().as_millis() as u64;

    let problem = !r.old_index_matched || !r.failed_sessions.is_empty();
    if json {
        print_doc(&r)?;
    } else {
        crate::outln!(
            "rebuilt the indexes of {} from the log: {} commits, {} streams, {} sessions, {} entries, {} snapshots",
            dir.display(),
            r.commits,
            r.streams,
            r.sessions,
            r.entries,
            r.snapshots
        );
        let mut t = Table::new(&["STATUS", "SESSIONS"]).right(1);
        for st in [
            SessionStatus::Active,
            SessionStatus::Suspended,
            SessionStatus::Completed,
            SessionStatus::Failed,
            SessionStatus::Deleted,
        ] {
            let n = r.sessions_by_status.get(st.as_str()).copied().unwrap_or(0);
            t.row(vec![st.as_str().to_string(), n.to_string()]);
        }
        t.print()?;
        crate::outln!(
            "time: {} ms indexes, {} ms sessions, {} ms total",
            r.rebuild_ms,
            r.load_ms,
            r.total_ms
        );
        match (&r.old_index_error, r.old_index_matched) {
            (Some(e), _) => crate::outln!("the old index could not be read ({e}); it was replaced"),
            (None, true) => crate::outln!(
                "the old index matched the log exactly ({} entries)",
                r.index_entries
            ),
            (None, false) => {
                crate::outln!(
                    "the old index differed from the log in {} entries; it was replaced. First keys:",
                    r.differing_entries
                );
                for k in &r.differing_keys {
                    crate::outln!("  {k}");
                }
            }
        }
        for f in &r.failed_sessions {
            crate::outln!("session failed to load: {f}");
        }
    }
    Ok(if problem {
        ExitCode::from(EXIT_PROBLEM)
    } else {
        ExitCode::SUCCESS
    })
}
