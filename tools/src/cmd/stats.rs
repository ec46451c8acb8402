//! `spool stats`: what the store holds and what a log compaction would
//! reclaim.
//!
//! One pass over the log (read-only). Every commit record is counted by
//! its framed size (frame header + payload) and classified:
//!
//! * **dead**: a record a log compaction does not copy: every record of
//!   the streams `LogStore::gc_dead_streams` names, the same set
//!   `compact --gc` removes: a session whose current incarnation is
//!   tombstoned (status `deleted`), and a purged session that was not
//!   created again (the purge marker included).
//! * **live**: everything else: every session that is not deleted, and
//!   every stream that is not a session. A compaction keeps a stream whole,
//!   so the records of a purged incarnation of a session that was created
//!   again are live; they are also counted in `purged_kept`.
//!
//! `live + dead` is the sum of all record bytes; segment files also hold
//! their headers and unused preallocated space (`file_bytes`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use spool_engine::format::SEGMENT_HEADER_BYTES;
use spool_engine::LogPosition;
use spool_runtime::session::{decode_event, SessionId, SessionStatus};
use spool_runtime::store::log::{PURGE_EVENT_KIND, SESSION_EVENT_PREFIX};
use spool_runtime::transcript::entry_summary;
use spool_runtime::{ListQuery, SessionEvent, SessionStore};

use crate::out::{ellipsize, human_bytes, print_doc, Result, Table, ToolError};
use crate::session_open::read_only;

const ENTRY_APPENDED: &str = "session.entry_appended";

#[derive(Default)]
struct StreamAcc {
    is_session: bool,
    total: u64,
    /// Bytes up to and including the last purge marker.
    purged: u64,
    /// Bytes after the last purge marker (the current incarnation).
    current: u64,
    current_commits: u64,
    /// Stream version of the last purge marker (0: none).
    base: u64,
}

#[derive(Serialize)]
struct SegmentRow {
    name: String,
    file_bytes: u64,
    used_bytes: u64,
    commits: u64,
}

#[derive(Serialize, Default)]
struct Bytes {
    /// All commit records (framed).
    records: u64,
    live: u64,
    dead: u64,
    /// Dead because the session is tombstoned.
    dead_deleted: u64,
    /// Dead because the records belong to a purged incarnation.
    dead_purged: u64,
    /// Live records of purged incarnations of sessions created again: a
    /// compaction keeps a stream whole, so it does not reclaim them.
    purged_kept: u64,
    /// Segment files on disk (headers and preallocated space included).
    file_bytes: u64,
}

#[derive(Serialize)]
struct SessionRow {
    id: String,
    status: &'static str,
    version: u64,
    commits: u64,
    bytes: u64,
}

#[derive(Serialize)]
struct EntryRow {
    session: String,
    /// Session version of the commit that appended it.
    version: u64,
    entry_id: String,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    summary: String,
    /// Size of the encoded event.
    bytes: u64,
    /// Kept by a compaction (`compact --gc` removes the `dead` ones).
    live: bool,
}

#[derive(Serialize)]
struct Stats {
    segments: u64,
    commits: u64,
    streams: u64,
    session_streams: u64,
    bytes: Bytes,
    sessions: u64,
    sessions_by_status: BTreeMap<&'static str, u64>,
    largest_sessions: Vec<SessionRow>,
    largest_entries: Vec<EntryRow>,
    segment_files: Vec<SegmentRow>,
}

fn segment_files(dir: &Path) -> Result<Vec<(u64, String, u64)>> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| ToolError::with_source(format!("reading {} failed", dir.display()), e))?;
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(id) = spool_engine::format::parse_segment_file_name(&name) {
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            out.push((id, name, len));
        }
    }
    out.sort();
    Ok(out)
}

pub fn run(dir: &Path, top: u32, json: bool) -> Result<ExitCode> {
    let (store, _rt) = read_only(dir)?;
    let dead_streams = store
        .gc_dead_streams()
        .map_err(|e| ToolError::with_source("reading the session index failed", e))?;
    let engine = store
        .engine()
        .map_err(|e| ToolError::with_source("opening the engine failed", e))?;
    let top = top as usize;
    let mut streams: HashMap<String, StreamAcc> = HashMap::new();
    let mut seg_used: HashMap<u64, (u64, u64)> = HashMap::new();
    // Min-heap of the largest entry events: (bytes, seq, event index, position).
    let mut largest: BinaryHeap<Reverse<(u64, u64, u32, LogPosition)>> = BinaryHeap::new();
    let mut commits = 0u64;
    let scan = engine
        .scan(1)
        .map_err(|e| ToolError::with_source("scanning the log failed", e))?;
    for c in scan {
        let c = c.map_err(|e| {
            ToolError::with_source("reading the log failed", e)
                .hint_from_cause(Some("run `spool --store DIR verify` to locate damage"))
        })?;
        commits += 1;
        let bytes = u64::from(c.record_bytes);
        let seg = seg_used.entry(c.info.position.segment).or_default();
        seg.0 += bytes;
        seg.1 += 1;
        let acc = streams.entry(c.info.stream.clone()).or_default();
        acc.total += bytes;
        if c.events.iter().any(|e| e.kind == PURGE_EVENT_KIND) {
            acc.is_session = true;
            acc.purged += acc.current + bytes;
            acc.current = 0;
            acc.current_commits = 0;
            acc.base = c.info.version;
            continue;
        }
        if c.events
            .iter()
            .any(|e| e.kind.starts_with(SESSION_EVENT_PREFIX))
        {
            acc.is_session = true;
        }
        acc.current += bytes;
        acc.current_commits += 1;
        if top > 0 {
            for (i, e) in c.events.iter().enumerate() {
                if e.kind != ENTRY_APPENDED {
                    continue;
                }
                let item = Reverse((
                    e.payload.len() as u64,
                    c.info.seq,
                    i as u32,
                    c.info.position,
                ));
                if largest.len() < top {
                    largest.push(item);
                } else if largest.peek().is_some_and(|m| item < *m) {
                    largest.pop();
                    largest.push(item);
                }
            }
        }
    }

    // Classify the bytes of every stream.
    let mut b = Bytes::default();
    let mut session_streams = 0u64;
    let mut sizes: Vec<SessionRow> = Vec::new();
    let mut base_of: HashMap<String, u64> = HashMap::new();
    for (name, acc) in &streams {
        b.records += acc.total;
        if !acc.is_session {
            b.live += acc.total;
            continue;
        }
        session_streams += 1;
        let header = SessionId::parse(name)
            .ok()
            .and_then(|id| store.header(&id).ok().flatten());
        base_of.insert(name.clone(), acc.base);
        let deleted = header
            .as_ref()
            .is_some_and(|h| h.status == SessionStatus::Deleted);
        if dead_streams.contains(name) {
            b.dead += acc.total;
            if deleted {
                b.dead_deleted += acc.current;
                b.dead_purged += acc.purged;
            } else {
                b.dead_purged += acc.total;
            }
        } else {
            b.live += acc.total;
            b.purged_kept += acc.purged;
        }
        if let Some(h) = header {
            sizes.push(SessionRow {
                id: name.clone(),
                status: h.status.as_str(),
                version: h.version,
                commits: acc.current_commits,
                bytes: acc.current,
            });
        }
    }
    debug_assert_eq!(b.live + b.dead, b.records);
    sizes.sort_by(|x, y| y.bytes.cmp(&x.bytes).then_with(|| x.id.cmp(&y.id)));
    sizes.truncate(top);

    let mut entries = Vec::new();
    let mut heap = largest.into_vec();
    // `Reverse` items: ascending order is largest first.
    heap.sort();
    for Reverse((bytes, _seq, idx, pos)) in heap {
        let c = engine.read_at(pos).map_err(|e| {
            ToolError::with_source(format!("reading the commit at {pos} failed"), e)
        })?;
        let Some(ev) = c.events.get(idx as usize) else {
            continue;
        };
        let Ok(SessionEvent::EntryAppended { entry }) = decode_event(&ev.payload) else {
            continue;
        };
        let base = base_of.get(&c.info.stream).copied().unwrap_or(0);
        // As the byte totals count it: dead when a compaction removes it.
        let live = !dead_streams.contains(&c.info.stream);
        let (summary, role) = entry_summary(&entry, 60);
        entries.push(EntryRow {
            session: c.info.stream.clone(),
            version: c.info.version.saturating_sub(base),
            entry_id: entry.id.to_string(),
            kind: entry.kind_name(),
            role,
            summary,
            bytes,
            live,
        });
    }

    let list = store
        .list_headers(&ListQuery::all().including_deleted())
        .map_err(|e| ToolError::with_source("listing sessions failed", e))?;
    let mut by_status = BTreeMap::new();
    for h in &list.headers {
        *by_status.entry(h.status.as_str()).or_insert(0u64) += 1;
    }

    let mut segs = Vec::new();
    for (id, name, len) in segment_files(dir)? {
        let (used, n) = seg_used.get(&id).copied().unwrap_or((0, 0));
        b.file_bytes += len;
        segs.push(SegmentRow {
            name,
            file_bytes: len,
            used_bytes: SEGMENT_HEADER_BYTES + used,
            commits: n,
        });
    }
    let stats = Stats {
        segments: segs.len() as u64,
        commits,
        streams: streams.len() as u64,
        session_streams,
        bytes: b,
        sessions: list.headers.len() as u64,
        sessions_by_status: by_status,
        largest_sessions: sizes,
        largest_entries: entries,
        segment_files: segs,
    };
    if json {
        print_doc(&stats)?;
        return Ok(ExitCode::SUCCESS);
    }
    print_text(&stats)?;
    Ok(ExitCode::SUCCESS)
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

fn print_text(s: &Stats) -> Result<()> {
    let b = &s.bytes;
    crate::outln!(
        "segments  {} files, {} on disk, {} in {} commits",
        s.segments,
        human_bytes(b.file_bytes),
        human_bytes(b.records),
        s.commits
    );
    crate::outln!(
        "live      {} ({})",
        human_bytes(b.live),
        pct(b.live, b.records)
    );
    crate::outln!(
        "dead      {} ({}): {} of deleted sessions, {} of purged ones; `compact --gc` reclaims it",
        human_bytes(b.dead),
        pct(b.dead, b.records),
        human_bytes(b.dead_deleted),
        human_bytes(b.dead_purged)
    );
    if b.purged_kept > 0 {
        crate::outln!(
            "kept      {} of purged incarnations of sessions created again: live, `compact --gc` keeps a session's stream whole",
            human_bytes(b.purged_kept)
        );
    }
    crate::outln!("streams   {} ({} sessions)", s.streams, s.session_streams);
    crate::outln!();
    let mut t = Table::new(&["STATUS", "SESSIONS"]).right(1);
    for st in [
        SessionStatus::Active,
        SessionStatus::Suspended,
        SessionStatus::Completed,
        SessionStatus::Failed,
        SessionStatus::Deleted,
    ] {
        let n = s.sessions_by_status.get(st.as_str()).copied().unwrap_or(0);
        t.row(vec![st.as_str().to_string(), n.to_string()]);
    }
    t.row(vec!["total".into(), s.sessions.to_string()]);
    t.print()?;
    if !s.largest_sessions.is_empty() {
        crate::outln!();
        crate::outln!("largest sessions");
        let mut t = Table::new(&["ID", "STATUS", "VERSION", "COMMITS", "SIZE"])
            .right(2)
            .right(3)
            .right(4);
        for r in &s.largest_sessions {
            t.row(vec![
                r.id.clone(),
                r.status.to_string(),
                r.version.to_string(),
                r.commits.to_string(),
                human_bytes(r.bytes),
            ]);
        }
        t.print()?;
    }
    if !s.largest_entries.is_empty() {
        crate::outln!();
        crate::outln!("largest entries");
        let mut t = Table::new(&["SESSION", "ENTRY", "KIND", "SIZE", "SUMMARY"]).right(3);
        for r in &s.largest_entries {
            let kind = match r.role {
                Some(role) => format!("{}:{role}", r.kind),
                None => r.kind.to_string(),
            };
            t.row(vec![
                r.session.clone(),
                r.entry_id.clone(),
                if r.live {
                    kind
                } else {
                    format!("{kind} (dead)")
                },
                human_bytes(r.bytes),
                ellipsize(&r.summary, 50),
            ]);
        }
        t.print()?;
    }
    Ok(())
}

/// `stats` on a PostgreSQL store: what its session listing tells (the
/// log-level figures, segments and live or dead bytes, exist only in a
/// store directory).
#[derive(Serialize)]
struct SessionStats {
    store: &'static str,
    sessions: u64,
    sessions_by_status: BTreeMap<&'static str, u64>,
    /// The sessions with the most saves (highest version) first.
    most_versions: Vec<VersionRow>,
}

#[derive(Serialize)]
struct VersionRow {
    id: String,
    status: &'static str,
    version: u64,
}

pub fn run_postgres(dir: &Path, top: u32, json: bool) -> Result<ExitCode> {
    let rt = crate::session_open::runtime_for(dir, false)?;
    let list = rt
        .list_sessions(&ListQuery::all().including_deleted())
        .map_err(|e| ToolError::with_source("listing sessions failed", e))?;
    let mut by_status: BTreeMap<&'static str, u64> = BTreeMap::new();
    for h in &list.headers {
        *by_status.entry(h.status.as_str()).or_default() += 1;
    }
    let mut rows: Vec<VersionRow> = list
        .headers
        .iter()
        .map(|h| VersionRow {
            id: h.id.to_string(),
            status: h.status.as_str(),
            version: h.version,
        })
        .collect();
    rows.sort_by(|a, b| b.version.cmp(&a.version).then_with(|| a.id.cmp(&b.id)));
    rows.truncate(top as usize);
    let stats = SessionStats {
        store: "postgresql",
        sessions: list.headers.len() as u64,
        sessions_by_status: by_status,
        most_versions: rows,
    };
    if json {
        print_doc(&stats)?;
        return Ok(ExitCode::SUCCESS);
    }
    let statuses: Vec<String> = stats
        .sessions_by_status
        .iter()
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    crate::outln!(
        "sessions  {} ({})",
        stats.sessions,
        if statuses.is_empty() {
            "none".to_string()
        } else {
            statuses.join(", ")
        }
    );
    crate::outln!("(a PostgreSQL store: segment and byte figures exist only in a store directory)");
    if !stats.most_versions.is_empty() {
        crate::outln!();
        crate::outln!("most versions:");
        let mut t = Table::new(&["SESSION", "STATUS", "VERSION"]).right(2);
        for r in &stats.most_versions {
            t.row(vec![
                r.id.clone(),
                r.status.to_string(),
                r.version.to_string(),
            ]);
        }
        t.print()?;
    }
    Ok(ExitCode::SUCCESS)
}
