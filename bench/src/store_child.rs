//! The child mode of the `store` workload: one question answered by one
//! subject in a fresh process, as the command a user runs would answer
//! it.
//!
//! The parent re-executes its own binary as
//! `spool-bench __store-child SUBJECT QUESTION DIR [ARG]` and measures
//! the child's wall time. The child prints its answer as one
//! line on stdout (the parent checks it), a tab and its own peak RSS
//! (VmHWM, read just before it exits), and exits 0; on failure it
//! prints the error on stderr and exits 2.
//!
//! Subjects: `spool` through the public library API (what `spool
//! sessions`, `context`, `show`, an owner open and `import` do), `sqlite`
//! with the schema a user would write, `jsonl` a pi-style directory of one
//! JSONL file per session (first line the session header).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;
use spool_runtime::hooks::SessionHookStack;
use spool_runtime::observer::NullSink;
use spool_runtime::session::SessionId;
use spool_runtime::store::exchange::{import_from, ExportFile, ImportOptions};
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
use spool_runtime::{ListQuery, SessionRuntime};

/// The first argument that selects the child mode (not a documented
/// option: only the `store` workload passes it).
pub const CHILD_ARG: &str = "__store-child";

/// Sessions `sessions --limit` lists.
pub const LIST_LIMIT: usize = 20;

/// The SQLite database file inside a SQLite subject's directory.
pub const SQLITE_FILE: &str = "store.db";

type ChildResult = Result<String, Box<dyn std::error::Error>>;

/// Runs the child mode when the process was started as one; `None`
/// otherwise.
pub fn run_if_child() -> Option<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some(CHILD_ARG) {
        return None;
    }
    let code = match answer(&args[1..]) {
        Ok(line) => {
            // The peak resident set of this whole process, read last: the
            // parent reports it beside the wall time.
            let rss = crate::report::peak_rss_bytes().unwrap_or(0);
            println!("{line}\t{rss}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    };
    Some(code)
}

fn answer(args: &[String]) -> ChildResult {
    let [subject, question, dir, rest @ ..] = args else {
        return Err("usage: __store-child SUBJECT QUESTION DIR [ARG]".into());
    };
    let dir = Path::new(dir);
    let arg = rest.first().map(String::as_str).unwrap_or("");
    match (subject.as_str(), question.as_str()) {
        ("spool", "list") => spool_list(dir),
        ("spool", "context") => spool_context(dir, arg),
        ("spool", "show") => spool_show(dir, arg),
        ("spool", "open") => spool_open(dir),
        ("spool", "import") => spool_import(dir, Path::new(arg)),
        ("sqlite", "list") => sqlite_list(dir),
        ("sqlite", "context") => sqlite_context(dir, arg),
        ("sqlite", "show") => sqlite_show(dir, arg),
        ("sqlite", "open") => sqlite_open(dir),
        ("sqlite", "import") => sqlite_import(dir, Path::new(arg)),
        ("jsonl", "list") => jsonl_list(dir),
        ("jsonl", "context") => jsonl_context(dir, arg),
        ("jsonl", "show") => jsonl_show(dir, arg),
        ("jsonl", "open") => jsonl_open(dir),
        ("jsonl", "import") => jsonl_import(dir, Path::new(arg)),
        (s, q) => Err(format!("unknown subject/question {s}/{q}").into()),
    }
}

/// The answer to a listing: the `updated_at` values listed, in order
/// (ties between sessions may list either first, so ids are not compared).
pub fn list_answer(updated: impl IntoIterator<Item = i64>) -> String {
    let v: Vec<String> = updated.into_iter().map(|u| u.to_string()).collect();
    format!("updated={}", v.join(","))
}

/// The answer to `context` and `show`: entries on the path / in the session.
pub fn entries_answer(n: u64) -> String {
    format!("entries={n}")
}

/// The answer to an import: sessions and entries now in the store.
pub fn import_answer(sessions: u64, entries: u64) -> String {
    format!("sessions={sessions} entries={entries}")
}

/// The answer to an owner open.
pub const OPEN_ANSWER: &str = "opened";

// ---------------------------------------------------------------------------
// spool
// ---------------------------------------------------------------------------

fn read_only_runtime(dir: &Path) -> Result<SessionRuntime, Box<dyn std::error::Error>> {
    let store = Arc::new(LogStore::open_read_only(dir)?);
    Ok(SessionRuntime::new(
        store as Arc<dyn SessionStore>,
        Arc::new(NullSink),
        SessionHookStack::empty(),
    ))
}

/// `spool sessions --limit 20`.
fn spool_list(dir: &Path) -> ChildResult {
    let rt = read_only_runtime(dir)?;
    let list = rt.list_sessions(&ListQuery::all().limit(LIST_LIMIT as u64))?;
    Ok(list_answer(list.headers.iter().map(|h| h.updated_at_ms)))
}

/// `spool context ID`: the model context from the session's leaf.
fn spool_context(dir: &Path, id: &str) -> ChildResult {
    let rt = read_only_runtime(dir)?;
    let s = rt.get_session(&SessionId::parse(id)?)?;
    let ctx = s.state().transcript.context()?;
    Ok(entries_answer(ctx.messages.len() as u64))
}

/// `spool show ID`: header, definition and a state summary.
fn spool_show(dir: &Path, id: &str) -> ChildResult {
    let store = Arc::new(LogStore::open_read_only(dir)?);
    let id = SessionId::parse(id)?;
    // As `show` reads it: the session folded without its transcript and
    // the transcript's head, at one version (else a full load).
    let backend = store.transcript_backend().ok_or("no transcript backend")?;
    let head = backend.head(&id)?.ok_or("no such session")?;
    let s = backend.settings(&id)?.ok_or("no such session")?;
    if s.version() != head.header.version {
        return Err("the session moved between two reads".into());
    }
    let shown = serde_json::json!({
        "id": s.info().id.to_string(),
        "status": s.info().status.as_str(),
        "version": s.info().version,
        "updated_at": s.info().updated_at_ms,
        "definition": s.definition(),
        "entries": head.entries,
        "leaf": head.leaf.as_ref().map(|l| l.to_string()),
        "generation": head.version.generation,
    });
    std::hint::black_box(serde_json::to_string(&shown)?);
    Ok(entries_answer(head.entries))
}

/// The store opened by its owner (as `delete` or an application does),
/// then closed.
fn spool_open(dir: &Path) -> ChildResult {
    let store = LogStore::open(dir, LogStoreOptions::default())?;
    store.close()?;
    Ok(OPEN_ANSWER.to_string())
}

/// `spool import FILE` into the (fresh) store at `dir`, as the command
/// does it: the file read once, one commit at a time (a check pass that
/// keeps the encoded commits in a temporary file, then the writes),
/// buffered appends and one sync before success, the bulk-load index cache.
fn spool_import(dir: &Path, file: &Path) -> ChildResult {
    let store = LogStore::open(dir, LogStoreOptions::bulk_load())?;
    let imported = import_from(
        &store,
        &mut ExportFile::new(file),
        &ImportOptions::default(),
        &mut |_| {},
    )?;
    store.close()?;
    let entries = imported.iter().map(|s| s.entries).sum();
    Ok(import_answer(imported.len() as u64, entries))
}

// ---------------------------------------------------------------------------
// The export file, as a peer's import reads it
// ---------------------------------------------------------------------------

/// One session of an export file, as the peers store it.
#[derive(Default)]
struct PeerSession {
    id: String,
    parent_id: Option<String>,
    status: String,
    version: u64,
    agent_name: String,
    label: String,
    created_at: i64,
    updated_at: i64,
    definition: String,
    /// (entry id, parent id, the entry's JSON).
    entries: Vec<(String, Option<String>, String)>,
}

impl PeerSession {
    fn leaf(&self) -> Option<&str> {
        self.entries.last().map(|(id, _, _)| id.as_str())
    }

    fn header_json(&self) -> String {
        serde_json::json!({
            "type": "session",
            "id": self.id,
            "parent_id": self.parent_id,
            "status": self.status,
            "version": self.version,
            "agent_name": self.agent_name,
            "label": self.label,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "definition": serde_json::from_str::<Value>(&self.definition).unwrap_or(Value::Null),
        })
        .to_string()
    }
}

fn str_field(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or("").to_string()
}

/// Reads the export file session by session, calling `each` with every
/// complete session (the commits of a session are consecutive).
fn for_each_export_session(
    file: &Path,
    mut each: impl FnMut(PeerSession) -> Result<(), Box<dyn std::error::Error>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut cur: Option<PeerSession> = None;
    for line in BufReader::new(File::open(file)?).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line)?;
        let Some(session) = v.get("session").and_then(Value::as_str) else {
            continue; // header or end line
        };
        if cur.as_ref().is_none_or(|c| c.id != session) {
            if let Some(done) = cur.take() {
                each(done)?;
            }
            cur = Some(PeerSession {
                id: session.to_string(),
                status: "active".into(),
                ..PeerSession::default()
            });
        }
        let s = cur.as_mut().ok_or("no session")?;
        let ts = v.get("timestamp_ms").and_then(Value::as_i64).unwrap_or(0);
        s.version = v.get("version").and_then(Value::as_u64).unwrap_or(0);
        s.updated_at = ts;
        let ev = &v["event"];
        match ev.get("type").and_then(Value::as_str).unwrap_or("") {
            "created" => {
                s.parent_id = ev
                    .get("parent_id")
                    .and_then(Value::as_str)
                    .map(String::from);
                s.agent_name = str_field(ev, "agent_name");
                s.label = str_field(ev, "label");
                s.created_at = ev
                    .get("created_at_ms")
                    .and_then(Value::as_i64)
                    .unwrap_or(ts);
                s.definition = ev["definition"].to_string();
            }
            "entry_appended" => {
                let e = &ev["entry"];
                s.entries.push((
                    str_field(e, "id"),
                    e.get("parent_id").and_then(Value::as_str).map(String::from),
                    e.to_string(),
                ));
            }
            "status_changed" => s.status = str_field(ev, "to"),
            _ => {}
        }
    }
    if let Some(done) = cur.take() {
        each(done)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// SQLite
// ---------------------------------------------------------------------------

const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    parent_id TEXT,
    status TEXT NOT NULL,
    version INTEGER NOT NULL,
    agent_name TEXT NOT NULL,
    label TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    leaf_id TEXT,
    definition TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_updated ON sessions (updated_at);
CREATE TABLE IF NOT EXISTS entries (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    id TEXT NOT NULL,
    parent_id TEXT,
    content TEXT NOT NULL,
    PRIMARY KEY (session, seq)
);
CREATE UNIQUE INDEX IF NOT EXISTS entries_id ON entries (session, id);
";

fn sqlite_conn(dir: &Path) -> Result<Connection, Box<dyn std::error::Error>> {
    let c = Connection::open(dir.join(SQLITE_FILE))?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.pragma_update(None, "synchronous", "FULL")?;
    Ok(c)
}

fn sqlite_list(dir: &Path) -> ChildResult {
    let c = sqlite_conn(dir)?;
    let mut st = c.prepare(
        "SELECT id, status, version, agent_name, label, parent_id, updated_at \
         FROM sessions ORDER BY updated_at DESC LIMIT ?1",
    )?;
    let rows = st.query_map([LIST_LIMIT as i64], |r| r.get::<_, i64>(6))?;
    let updated: Vec<i64> = rows.collect::<Result<_, _>>()?;
    Ok(list_answer(updated))
}

fn sqlite_context(dir: &Path, id: &str) -> ChildResult {
    let c = sqlite_conn(dir)?;
    let leaf: Option<String> = c
        .query_row("SELECT leaf_id FROM sessions WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .optional()?
        .ok_or("no such session")?;
    let Some(leaf) = leaf else {
        return Ok(entries_answer(0));
    };
    let mut st = c.prepare(
        "WITH RECURSIVE path(id, parent_id, content, depth) AS ( \
           SELECT id, parent_id, content, 0 FROM entries WHERE session = ?1 AND id = ?2 \
           UNION ALL \
           SELECT e.id, e.parent_id, e.content, p.depth + 1 FROM entries e \
             JOIN path p ON e.session = ?1 AND e.id = p.parent_id) \
         SELECT content FROM path ORDER BY depth DESC",
    )?;
    let mut n = 0u64;
    let mut rows = st.query(params![id, leaf])?;
    while let Some(r) = rows.next()? {
        // The context holds the parsed entries, root first.
        let content: String = r.get(0)?;
        std::hint::black_box(serde_json::from_str::<Value>(&content)?);
        n += 1;
    }
    Ok(entries_answer(n))
}

fn sqlite_show(dir: &Path, id: &str) -> ChildResult {
    let c = sqlite_conn(dir)?;
    let (header, definition): (String, String) = c
        .query_row(
            "SELECT id || status || version || agent_name || label || updated_at || \
             coalesce(leaf_id, ''), definition FROM sessions WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?
        .ok_or("no such session")?;
    std::hint::black_box((header, serde_json::from_str::<Value>(&definition)?));
    let n: i64 = c.query_row(
        "SELECT count(*) FROM entries WHERE session = ?1",
        [id],
        |r| r.get(0),
    )?;
    Ok(entries_answer(n as u64))
}

/// Opened as the writer would: the connection, its pragmas and the write
/// lock taken once.
fn sqlite_open(dir: &Path) -> ChildResult {
    let c = sqlite_conn(dir)?;
    c.execute_batch("BEGIN IMMEDIATE; COMMIT;")?;
    c.close().map_err(|(_, e)| e)?;
    Ok(OPEN_ANSWER.to_string())
}

/// The export file loaded in one transaction (WAL, synchronous=FULL).
fn sqlite_import(dir: &Path, file: &Path) -> ChildResult {
    std::fs::create_dir_all(dir)?;
    let mut c = sqlite_conn(dir)?;
    c.execute_batch(SQLITE_SCHEMA)?;
    let tx = c.transaction()?;
    let (mut sessions, mut entries) = (0u64, 0u64);
    {
        let mut ins_s = tx.prepare(
            "INSERT INTO sessions (id, parent_id, status, version, agent_name, label, \
             created_at, updated_at, leaf_id, definition) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        )?;
        let mut ins_e = tx.prepare(
            "INSERT INTO entries (session, seq, id, parent_id, content) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for_each_export_session(file, |s| {
            ins_s.execute(params![
                s.id,
                s.parent_id,
                s.status,
                s.version as i64,
                s.agent_name,
                s.label,
                s.created_at,
                s.updated_at,
                s.leaf(),
                s.definition
            ])?;
            for (seq, (eid, parent, content)) in s.entries.iter().enumerate() {
                ins_e.execute(params![s.id, seq as i64, eid, parent, content])?;
            }
            sessions += 1;
            entries += s.entries.len() as u64;
            Ok(())
        })?;
    }
    tx.commit()?;
    c.close().map_err(|(_, e)| e)?;
    Ok(import_answer(sessions, entries))
}

// ---------------------------------------------------------------------------
// The pi-style JSONL directory
// ---------------------------------------------------------------------------

fn jsonl_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.jsonl"))
}

/// Every file's first line (the session header), newest update first.
fn jsonl_list(dir: &Path) -> ChildResult {
    let mut headers: Vec<(i64, String)> = Vec::new();
    let mut line = String::new();
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        if path.extension().and_then(|x| x.to_str()) != Some("jsonl") {
            continue;
        }
        line.clear();
        BufReader::new(File::open(&path)?).read_line(&mut line)?;
        let h: Value = serde_json::from_str(&line)?;
        headers.push((
            h.get("updated_at").and_then(Value::as_i64).unwrap_or(0),
            str_field(&h, "id"),
        ));
    }
    headers.sort_unstable_by(|a, b| b.cmp(a));
    headers.truncate(LIST_LIMIT);
    Ok(list_answer(headers.into_iter().map(|(u, _)| u)))
}

/// Reads one session file: its header and its entries.
fn jsonl_read(dir: &Path, id: &str) -> Result<(Value, Vec<Value>), Box<dyn std::error::Error>> {
    let mut lines = BufReader::new(File::open(jsonl_path(dir, id))?).lines();
    let header: Value = serde_json::from_str(&lines.next().ok_or("empty session file")??)?;
    let mut entries = Vec::new();
    for l in lines {
        let l = l?;
        if !l.trim().is_empty() {
            entries.push(serde_json::from_str(&l)?);
        }
    }
    Ok((header, entries))
}

/// One file read; the root-to-leaf path walked from the last entry.
fn jsonl_context(dir: &Path, id: &str) -> ChildResult {
    let (_, entries) = jsonl_read(dir, id)?;
    let by_id: HashMap<&str, &Value> = entries
        .iter()
        .filter_map(|e| Some((e.get("id")?.as_str()?, e)))
        .collect();
    let mut n = 0u64;
    let mut cur = entries.last();
    while let Some(e) = cur {
        n += 1;
        if n > entries.len() as u64 {
            return Err("a cycle in the parent links".into());
        }
        cur = e
            .get("parent_id")
            .and_then(Value::as_str)
            .and_then(|p| by_id.get(p).copied());
    }
    Ok(entries_answer(n))
}

fn jsonl_show(dir: &Path, id: &str) -> ChildResult {
    let (header, entries) = jsonl_read(dir, id)?;
    std::hint::black_box(&header);
    Ok(entries_answer(entries.len() as u64))
}

/// An owner's open of the directory: its lock file taken, the sessions
/// listed.
fn jsonl_open(dir: &Path) -> ChildResult {
    let lock = File::create(dir.join("owner.lock"))?;
    lock.try_lock()?;
    let n = std::fs::read_dir(dir)?.count();
    std::hint::black_box(n);
    drop(lock);
    Ok(OPEN_ANSWER.to_string())
}

/// The export file written as one file per session (header line, then
/// one line per entry), each synced, then the directory.
fn jsonl_import(dir: &Path, file: &Path) -> ChildResult {
    std::fs::create_dir_all(dir)?;
    let (mut sessions, mut entries) = (0u64, 0u64);
    for_each_export_session(file, |s| {
        let f = File::create(jsonl_path(dir, &s.id))?;
        let mut w = BufWriter::new(f);
        writeln!(w, "{}", s.header_json())?;
        for (_, _, content) in &s.entries {
            writeln!(w, "{content}")?;
        }
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_data()?;
        sessions += 1;
        entries += s.entries.len() as u64;
        Ok(())
    })?;
    File::open(dir)?.sync_all()?;
    Ok(import_answer(sessions, entries))
}
