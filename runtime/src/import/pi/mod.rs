//! Reading pi-style coding-agent session files (JSONL, versions 1, 2, 3).
//!
//! A file is a header line `{"type":"session","version":N,"id":..,
//! "timestamp":..,"cwd":..}` (version 1 has no `version`) followed by one
//! entry per line. The file's versions differ as pi's own loader migrates
//! them, and this reader mirrors those migrations:
//!
//! * **v1 → v2**: v1 entries have no `id`/`parentId`; they form a linear
//!   chain. Each entry gets a fresh 8-hex-digit id and the previous entry
//!   as parent; a compaction's `firstKeptEntryIndex` (an index into the
//!   file's entries, the header being 0) becomes the `firstKeptEntryId` of
//!   the entry at that index.
//! * **v2 → v3**: message entries with role `hookMessage` become role
//!   `custom`.
//!
//! The leaf is the last entry (as pi sets it on load). Entries map onto
//! [`EntryKind`] one to one: `message` (user / assistant / toolResult;
//! `custom` messages become custom-message entries, `branchSummary`
//! messages branch-summary entries), `model_change`,
//! `thinking_level_change`, `compaction`, `branch_summary`, `custom`,
//! `custom_message`, `label`, `session_info`. A `bashExecution` message
//! becomes a custom message of type `pi.bashExecution` carrying the text
//! pi sends to the model (or, when excluded from the context, a custom
//! entry), and a `compactionSummary` message a custom message of type
//! `pi.compactionSummary`. So the context built from the leaf is the one
//! pi's `buildSessionContext` shows, message for message (spool
//! additionally pairs tool calls with results and leaves out errored
//! assistant turns, as pi's provider layer does before sending). What a
//! replay to the provider needs is kept: thinking blocks keep their
//! `thinkingSignature` and `redacted` flag, tool calls their
//! `thoughtSignature`.
//!
//! pi's loader skips a line that is not JSON (e.g. two objects glued
//! together on one line), and so does this reader: each skipped line's
//! number is reported in [`PiSession::skipped_lines`]. Everything else that
//! pi would accept silently with a loss is refused, because an import must
//! not silently lose data: an unknown entry type or message role, an
//! invalid or duplicate id, and a parent id that no earlier line defines
//! (pi would show such an entry as an extra root) are refused with the
//! line number. Blank lines are skipped. Not kept: compaction and
//! branch-summary `details`/`fromHook` (extension data that never reaches
//! the model), assistant `api`, `responseId` and cost figures, and text
//! blocks' `textSignature`.
//!
//! Memory: a line is read as objects whose fields stay JSON text until
//! they are used; opaque payloads (a tool call's arguments, a
//! custom entry's data, a custom message's details) go from that text to
//! a [`Json`] without a tree. So a line takes a few times its length at
//! most, whatever it holds. [`read_pi`] then holds every entry of the
//! session (several times the file); [`PiFile`] reads the file once more
//! than its import does and holds one commit at a time and nothing per
//! entry (see [`PiFile`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::hash::BuildHasher;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use uuid::Uuid;

use crate::session::encoded_event_len;
use crate::session::{AgentDefinition, AgentState, ModelConfig, SessionEvent, SessionId};
use crate::store::exchange::{
    read_line_bounded, Check, Denied, ExchangeError, IdChecks, ImportCommit, ImportSession,
    CHUNK_BYTES_MAX,
};
use crate::transcript::{
    ContentBlock, Entry, EntryId, EntryKind, Json, Message, PathMarker, StopReason, Usage,
};

/// Newest pi session format version this reader understands.
pub const PI_VERSION_MAX: u64 = 3;
/// Longest line accepted (bytes).
pub const PI_LINE_BYTES_MAX: usize = 64 << 20;
/// An import commit carries at most this many events...
pub const PI_COMMIT_EVENTS_MAX: usize = 1024;
/// ...and at most about this many encoded bytes (a single larger entry
/// still gets a commit of its own).
pub const PI_COMMIT_BYTES_MAX: usize = 4 << 20;
/// The agent name imported sessions get.
pub const PI_AGENT_NAME: &str = "pi";

/// A pi file could not be read. `line` is 1-based (0: the file as a whole).
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {reason}")]
#[non_exhaustive]
pub struct PiError {
    pub line: u64,
    pub reason: String,
}

fn err(line: u64, reason: impl Into<String>) -> PiError {
    PiError {
        line,
        reason: reason.into(),
    }
}

/// What was read, besides the session itself.
#[derive(Debug)]
#[non_exhaustive]
pub struct PiSession {
    pub import: ImportSession,
    pub file_version: u64,
    /// Lines skipped as pi skips them (not JSON), 1-based, in file order.
    pub skipped_lines: Vec<u64>,
}

/// Reads a pi session file into one session to import. `source` names the
/// file in the session's description.
///
/// Holds every entry of the session at once; [`PiFile`] reads a file on
/// disk one commit at a time instead. Both read each line the same way.
pub fn read_pi<R: BufRead>(r: R, source: &str) -> Result<PiSession, PiError> {
    let seed = Seed::random();
    let (mut pass, header) = Pass::start(r, seed, Reading::First)?;
    let mut facts = Facts::default();
    let mut entries: Vec<Mapped> = Vec::new();
    while let Some(m) = pass.next_checked()? {
        facts.add(&m);
        entries.push(m);
    }
    let at_leaf = match facts.of_chain() {
        Some(n) => n,
        None => walk_entries(&entries)?,
    };
    let leaf = facts.finish(at_leaf);
    let mut chunker = Chunker::new(seed, &header, Some(created_event(&header, &leaf, source)));
    let mut commits: Vec<ImportCommit> = Vec::new();
    for m in entries {
        if let Some((c, _)) = chunker.push(m)? {
            commits.push(c);
        }
    }
    commits.push(chunker.finish().0);
    Ok(PiSession {
        import: ImportSession {
            id: header.id,
            commits,
        },
        file_version: header.version,
        skipped_lines: pass.skipped,
    })
}

/// A pi session file read as a stream of commits, as often as the import
/// needs (a store directory's import reads its source once, a PostgreSQL
/// import twice: once to check, once to write).
///
/// [`PiFile::open`] reads the file once and keeps what the first commit
/// needs before the last line is read (the settings in force at the leaf,
/// the session's name); [`PiFile::for_each_commit`] reads it again for the
/// entries. So an import holds one commit of the session at a time, not
/// the session, and memory that does not grow with it: the first
/// reading's checks of the entry ids hold up to a few MiB of them and
/// answer the rest from a temporary file; the settings at the leaf are the
/// latest read while the entries form a chain, and otherwise found by
/// walking the leaf's path over the file's lines from its end (one more
/// reading of at most the file, holding one line). A later reading keeps
/// no ids; a version 1 file's are made up from the entry's number.
///
/// The ids this reader makes up (every commit's id; a version 1 file's
/// entry ids) come from a seed drawn once per `PiFile`, so every reading
/// yields the same commits, ids included; another `PiFile` over the same
/// file makes up other ids.
pub struct PiFile {
    path: PathBuf,
    source: String,
    header: Header,
    leaf: Leaf,
    skipped_lines: Vec<u64>,
    seed: Seed,
    /// The hash of each commit's lines (numbers and bytes) in the first
    /// reading: a later reading that would yield another commit (the file
    /// changed in between) fails instead, naming the commit's first line.
    commit_hashes: Vec<u64>,
}

impl PiFile {
    /// Reads `path` once, checking every line as [`read_pi`] does (same
    /// errors, same line numbers, so a bad file fails before an import
    /// writes anything), and keeps only what the session's first commit
    /// and later readings need: the header's fields, the file version, the
    /// skipped lines, the session name, the model/thinking settings in
    /// force at the leaf (the last entry), a hash per commit and the seed
    /// of the ids it makes up. It keeps nothing per entry (see
    /// [`PiFile`]). `source` names the file in the session's description.
    pub fn open(path: &Path, source: &str) -> Result<PiFile, PiError> {
        let seed = Seed::random();
        let file = open_buffered(path)
            .map_err(|e| err(0, format!("cannot open {}: {e}", path.display())))?;
        let (mut pass, header) = Pass::start(file, seed, Reading::First)?;
        let mut facts = Facts::default();
        // Only measures each entry's event (the commit boundaries and the
        // encoding errors are those of `read_pi`), keeps none.
        let mut chunker = Chunker::new(seed, &header, None);
        let mut commit_hashes = Vec::new();
        while let Some(m) = pass.next_checked()? {
            facts.add(&m);
            let pushed = chunker.push(m).map_err(|e| pass.first_of(e));
            if let Some((_, hash)) = pushed? {
                commit_hashes.push(hash);
            }
        }
        commit_hashes.push(chunker.finish().1);
        let at_leaf = match facts.of_chain() {
            Some(n) => n,
            None => walk_file(path, pass.consumed, header.version)?,
        };
        let leaf = facts.finish(at_leaf);
        Ok(PiFile {
            path: path.to_path_buf(),
            source: source.to_string(),
            header,
            leaf,
            skipped_lines: pass.skipped,
            seed,
            commit_hashes,
        })
    }

    /// The file's format version (1..=[`PI_VERSION_MAX`]).
    pub fn file_version(&self) -> u64 {
        self.header.version
    }

    /// Lines skipped as pi skips them (not JSON), 1-based, in file order.
    pub fn skipped_lines(&self) -> &[u64] {
        &self.skipped_lines
    }

    /// The session's id (the header's `id`).
    pub fn session_id(&self) -> &SessionId {
        &self.header.id
    }

    /// Reads the file again and calls `f` on each commit, in version order,
    /// holding one commit (and one line) at a time. Every call yields
    /// exactly the same commits: the same chunking, the same commit ids,
    /// the same generated v1 entry ids. A file that changed since
    /// [`PiFile::open`] fails with [`ExchangeError::Malformed`] naming a
    /// line: the line that no longer reads, or the first line of the first
    /// commit that came out different (checked before `f` sees it, so `f`
    /// only ever sees commits of the file as it was opened). Stops at `f`'s
    /// first error and returns it.
    pub fn for_each_commit(
        &mut self,
        f: &mut dyn FnMut(&SessionId, &ImportCommit) -> Result<(), ExchangeError>,
    ) -> Result<(), ExchangeError> {
        let file = open_buffered(&self.path).map_err(|source| ExchangeError::Io {
            context: format!("opening {} again", self.path.display()),
            source,
        })?;
        // The header as read now: its line's hash goes into the first
        // commit's, which tells whether it changed. The `created` event is
        // that of the first reading (it needs the whole file).
        let (mut pass, now) = Pass::start(file, self.seed, Reading::Later).map_err(changed)?;
        let created = created_event(&self.header, &self.leaf, &self.source);
        let mut chunker = Chunker::new(self.seed, &now, Some(created));
        let id = &self.header.id;
        let hashes = &self.commit_hashes;
        let mut done = 0usize;
        let mut emit = |c: ImportCommit, hash: u64| -> Result<(), ExchangeError> {
            if hashes.get(done) != Some(&hash) {
                let first = c.lines.first().copied().unwrap_or(0);
                let last = c.lines.last().copied().unwrap_or(first);
                return Err(ExchangeError::Malformed {
                    line: first,
                    reason: format!(
                        "the file changed since it was opened: lines {first}..={last} \
                         no longer read as they did"
                    ),
                });
            }
            done += 1;
            f(id, &c)
        };
        while let Some(m) = pass.next_entry().map_err(changed)? {
            if let Some((c, hash)) = chunker.push(m).map_err(changed)? {
                emit(c, hash)?;
            }
        }
        let (c, hash) = chunker.finish();
        emit(c, hash)?;
        if done != hashes.len() {
            return Err(ExchangeError::Malformed {
                line: pass.line_no,
                reason: "the file changed since it was opened: it ends earlier".into(),
            });
        }
        Ok(())
    }
}

impl crate::store::exchange::ImportSource for PiFile {
    fn for_each_commit(
        &mut self,
        f: &mut dyn FnMut(&SessionId, &ImportCommit) -> Result<(), ExchangeError>,
    ) -> Result<(), ExchangeError> {
        PiFile::for_each_commit(self, f)
    }
}

/// A line's error in a later reading of a [`PiFile`]: the first reading
/// found none, so the file changed in between (or could not be read).
fn changed(e: PiError) -> ExchangeError {
    ExchangeError::Malformed {
        line: e.line,
        reason: format!(
            "{} (reading the file again: it changed since it was opened)",
            e.reason
        ),
    }
}

/// `path` opened for reading, with a 64 KiB buffer.
fn open_buffered(path: &Path) -> std::io::Result<BufReader<File>> {
    File::open(path).map(|f| BufReader::with_capacity(1 << 16, f))
}

/// The header line's fields.
struct Header {
    line: u64,
    /// [`line_hash`] of the header line.
    hash: u64,
    version: u64,
    id: SessionId,
    timestamp_ms: Option<i64>,
    cwd: String,
    parent_session: Option<String>,
}

/// One entry as read from its line.
struct Mapped {
    line: u64,
    /// [`line_hash`] of the entry's line.
    hash: u64,
    entry: Entry,
}

/// The hash of a line's number and bytes. Fixed (not seeded per process):
/// it only tells whether a later reading of a file read the same lines.
fn line_hash(line: u64, text: &str) -> u64 {
    const STATE: foldhash::fast::FixedState = foldhash::fast::FixedState::with_seed(0);
    STATE.hash_one((line, text))
}

/// Which reading of a file a [`Pass`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reading {
    /// The only one ([`read_pi`]) or the first of a [`PiFile`]: every check.
    First,
    /// A [`PiFile`]'s reading after its first. The checks that need every
    /// earlier entry's id (an id used twice, a parent defined on an
    /// earlier line) were made on the same lines by the first reading, as
    /// the commits' hashes show, so they are not made again (an import's
    /// check pass makes its own).
    Later,
}

/// One reading of a pi file: its lines in order, each checked, migrated to
/// version 3 and mapped to an entry (see the module docs). [`read_pi`] and
/// both readings of a [`PiFile`] go through it, so they agree line for
/// line.
struct Pass<R> {
    r: R,
    /// The line being read (taken by the line that is JSON).
    buf: Vec<u8>,
    /// Number of the last line read (1-based; 0 before the first).
    line_no: u64,
    /// Bytes of the file read so far, newlines included.
    consumed: u64,
    /// Lines skipped as pi skips them (not JSON), in file order.
    skipped: Vec<u64>,
    version: u64,
    /// The checks of the entries' ids (a file's first reading, from
    /// version 2 on: a version 1 file's ids are made up distinct): none
    /// used twice, every parent defined on an earlier line.
    checks: Option<IdChecks>,
    /// Where the version 1 ids come from, how many were made up, and the
    /// last one (the next entry's parent).
    seed: Seed,
    draws: u64,
    last_v1: Option<EntryId>,
    /// The time of the last entry read (an entry without one gets it).
    last_ts: i64,
}

impl<R: BufRead> Pass<R> {
    /// Reads up to the header, which it checks and returns.
    fn start(r: R, seed: Seed, reading: Reading) -> Result<(Self, Header), PiError> {
        let mut pass = Pass {
            r,
            buf: Vec::new(),
            line_no: 0,
            consumed: 0,
            skipped: Vec::new(),
            version: 0,
            checks: None,
            seed,
            draws: 0,
            last_v1: None,
            last_ts: 0,
        };
        let Some((hline, htext)) = pass.next_line()? else {
            return Err(err(0, "empty file: no pi session header"));
        };
        let header = parse_obj(&htext).ok_or_else(|| err(hline, "not a JSON object"))?;
        if str_of(&header, "type").as_deref() != Some("session") {
            return Err(err(
                hline,
                "the first line is not a pi session header ({\"type\":\"session\",...})",
            ));
        }
        let version = match header.get("version").filter(|v| v.get() != "null") {
            None => 1,
            Some(v) => serde_json::from_str::<u64>(v.get())
                .ok()
                .filter(|v| (1..=PI_VERSION_MAX).contains(v))
                .ok_or_else(|| {
                    err(
                        hline,
                        format!("pi session version {v} is not supported (this build reads 1..={PI_VERSION_MAX})"),
                    )
                })?,
        };
        let sid =
            str_of(&header, "id").ok_or_else(|| err(hline, "the header has no session id"))?;
        let id = SessionId::parse(&sid)
            .map_err(|e| err(hline, format!("session id {sid:?} cannot be used: {e}")))?;
        let timestamp_ms = header.get("timestamp").and_then(|t| parse_time_raw(t));
        pass.version = version;
        if reading == Reading::First && version >= 2 {
            let (held, chunk) = checks_holding();
            pass.checks = Some(IdChecks::new(held, chunk, None));
        }
        pass.last_ts = timestamp_ms.unwrap_or(0);
        let header = Header {
            line: hline,
            hash: line_hash(hline, &htext),
            version,
            id,
            timestamp_ms,
            cwd: str_of(&header, "cwd").unwrap_or_default(),
            parent_session: str_of(&header, "parentSession"),
        };
        Ok((pass, header))
    }

    /// The next non-blank line that is JSON, with its number.
    fn next_line(&mut self) -> Result<Option<(u64, String)>, PiError> {
        loop {
            let had = read_line_bounded(&mut self.r, &mut self.buf, PI_LINE_BYTES_MAX)
                .map_err(|e| err(self.line_no + 1, e.to_string()))?;
            let Some(newline) = had else {
                return Ok(None);
            };
            self.consumed += self.buf.len() as u64 + u64::from(newline);
            self.line_no += 1;
            let line_no = self.line_no;
            let text = std::str::from_utf8(&self.buf)
                .map_err(|e| err(line_no, format!("not UTF-8: {e}")))?;
            if text.trim().is_empty() {
                continue;
            }
            // pi's loader skips what JSON.parse refuses (checked without
            // building anything, with serde_json's nesting limit).
            if serde_json::from_str::<IgnoredAny>(text).is_err() {
                self.skipped.push(line_no);
                continue;
            }
            // The line's bytes, taken (not copied): its objects are
            // read in place.
            let text = String::from_utf8(std::mem::take(&mut self.buf))
                .map_err(|e| err(line_no, format!("not UTF-8: {e}")))?;
            return Ok(Some((line_no, text)));
        }
    }

    /// The next entry: its line migrated to v3 as pi does, mapped, and its
    /// JSON dropped. `None` at the end of the file.
    fn next_entry(&mut self) -> Result<Option<Mapped>, PiError> {
        let Some((line, text)) = self.next_line()? else {
            return Ok(None);
        };
        let hash = line_hash(line, &text);
        let mut m = parse_obj(&text).ok_or_else(|| err(line, "not a JSON object"))?;
        if self.version < 2 {
            let new_id = self.seed.entry_id(self.draws).map_err(|e| err(line, e))?;
            self.draws += 1;
            m.insert("id".into(), raw(new_id.as_str()).map_err(|e| err(line, e))?);
            let parent = self.last_v1.replace(new_id);
            m.insert(
                "parentId".into(),
                raw(&parent.as_ref().map(EntryId::as_str)).map_err(|e| err(line, e))?,
            );
            if str_of(&m, "type").as_deref() == Some("compaction") {
                if let Some(idx) = u64_of(&m, "firstKeptEntryIndex") {
                    // pi resolves the index among the file's entries
                    // (header = 0); only earlier ones have ids yet.
                    let target = idx
                        .checked_sub(1)
                        .filter(|&t| t + 1 < self.draws)
                        .map(|t| self.seed.entry_id(t))
                        .transpose()
                        .map_err(|e| err(line, e))?;
                    if let Some(t) = target {
                        m.insert(
                            "firstKeptEntryId".into(),
                            raw(t.as_str()).map_err(|e| err(line, e))?,
                        );
                    }
                    m.remove("firstKeptEntryIndex");
                }
            }
        }
        let ty = str_of(&m, "type").ok_or_else(|| err(line, "the entry has no \"type\""))?;
        if ty == "session" {
            return Err(err(line, "a second session header"));
        }
        let raw_id =
            str_of(&m, "id").ok_or_else(|| err(line, format!("the {ty} entry has no id")))?;
        let eid =
            EntryId::parse(&raw_id).map_err(|e| err(line, format!("entry id {raw_id:?}: {e}")))?;
        if let Some(c) = &mut self.checks {
            c.absent(eid.as_str(), (0, line))
                .map_err(|d| id_err(line, d, &eid))?;
        }
        let parent_id = match m.get("parentId").filter(|p| p.get() != "null") {
            None => None,
            Some(p) if p.get().starts_with('"') => {
                let p: String =
                    serde_json::from_str(p.get()).map_err(|e| err(line, e.to_string()))?;
                let pid =
                    EntryId::parse(&p).map_err(|e| err(line, format!("parent id {p:?}: {e}")))?;
                if pid == eid {
                    return Err(err(line, format!("entry {eid} is its own parent")));
                }
                if let Some(c) = &mut self.checks {
                    c.require(pid.as_str(), Check::Parent, (0, line))
                        .map_err(|d| id_err(line, d, &pid))?;
                }
                Some(pid)
            }
            Some(other) => return Err(err(line, format!("parentId {other} is not a string"))),
        };
        let ts = m
            .get("timestamp")
            .and_then(|t| parse_time_raw(t))
            .or_else(|| {
                // The message's own timestamp, read without the rest.
                #[derive(Deserialize)]
                struct Stamped<'a> {
                    #[serde(borrow)]
                    timestamp: Option<&'a RawValue>,
                }
                m.get("message")
                    .and_then(|msg| serde_json::from_str::<Stamped<'_>>(msg.get()).ok())
                    .and_then(|s| s.timestamp)
                    .and_then(parse_time_raw)
            })
            .unwrap_or(self.last_ts);
        self.last_ts = ts;
        let kind = map_entry(&ty, &mut m, &eid, self.version).map_err(|r| err(line, r))?;
        if let Some(c) = &mut self.checks {
            c.define_absent(eid.as_str())
                .map_err(|d| id_err(line, d, &eid))?;
        }
        Ok(Some(Mapped {
            line,
            hash,
            entry: Entry {
                id: eid,
                parent_id,
                timestamp_ms: ts,
                kind,
            },
        }))
    }

    /// The next entry, as [`Pass::next_entry`]; an error, or the end of the
    /// file, first hears the id checks the reading deferred (a long
    /// session's), whose refusal comes from an earlier line or the same.
    fn next_checked(&mut self) -> Result<Option<Mapped>, PiError> {
        match self.next_entry() {
            Ok(Some(m)) => Ok(Some(m)),
            Ok(None) => match self.deferred_refusal() {
                Some(e) => Err(e),
                None => Ok(None),
            },
            Err(e) => Err(self.first_of(e)),
        }
    }

    /// `e`, or the refusal the deferred id checks met first (on an earlier
    /// line or the same): the error to report when `e` stops the reading.
    fn first_of(&mut self, e: PiError) -> PiError {
        self.deferred_refusal().unwrap_or(e)
    }

    /// What the id checks deferred refuse first, if anything.
    fn deferred_refusal(&mut self) -> Option<PiError> {
        let c = self.checks.as_mut()?;
        match c.settle() {
            Ok(None) => None,
            Ok(Some(r)) => Some(match EntryId::parse(&r.id) {
                Ok(id) => id_err(r.line, Denied::Check(r.check), &id),
                Err(e) => err(r.line, format!("an entry id read back: {e}")),
            }),
            Err(e) => Some(err(
                0,
                format!("keeping the entry ids in a temporary file failed: {e}"),
            )),
        }
    }
}

/// How many bytes of a pi file's entry ids its first reading holds in
/// memory; past that, they go to a temporary file (see [`IdChecks`]).
const CHECKED_IDS_BYTES_MAX: usize = 4 << 20;

#[cfg(test)]
thread_local! {
    /// What the id checks of a first reading on this thread hold in memory
    /// and write in a chunk, when a test sets it (to reach the temporary
    /// file with a few entries).
    static HOLDING: std::cell::Cell<Option<(usize, usize)>> =
        const { std::cell::Cell::new(None) };
}

/// The bytes of ids a first reading's checks hold, and their chunk.
fn checks_holding() -> (usize, usize) {
    #[cfg(test)]
    if let Some(h) = HOLDING.get() {
        return h;
    }
    (CHECKED_IDS_BYTES_MAX, CHUNK_BYTES_MAX)
}

/// A refused id check of line `line` as the reading's error (`id`: the one
/// checked).
fn id_err(line: u64, d: Denied, id: &EntryId) -> PiError {
    match d {
        Denied::Check(Check::Appended) => err(line, format!("entry id {id} is used twice")),
        Denied::Check(_) => err(
            line,
            format!("the parent {id} is not defined on an earlier line"),
        ),
        Denied::Limit(reason) => err(line, reason),
        Denied::Io(e) => err(
            line,
            format!("keeping the entry ids in a temporary file failed: {e}"),
        ),
    }
}

/// The settings in force at the leaf: the model and thinking-level
/// changes nearest it on its path, as `path_settings` finds them.
#[derive(Default)]
struct Nearest {
    model: Option<(String, String)>,
    thinking: Option<String>,
}

impl Nearest {
    /// Takes `e`'s setting when it is the first of its kind met walking up
    /// from the leaf (`replace`: the latest met walking down a chain).
    fn meet(&mut self, e: &Entry, replace: bool) {
        match PathMarker::of(e) {
            PathMarker::Model { provider, model_id } if replace || self.model.is_none() => {
                self.model = Some((provider, model_id));
            }
            PathMarker::ThinkingLevel { thinking_level } if replace || self.thinking.is_none() => {
                self.thinking = Some(thinking_level);
            }
            _ => {}
        }
    }

    fn both(&self) -> bool {
        self.model.is_some() && self.thinking.is_some()
    }
}

/// What a reading keeps of the entries to find the session's name and the
/// settings in force at the leaf (the last entry), which the first commit
/// carries: nothing per entry. While every entry is the child of the one
/// before (a chain, as every version 1 file and most others are), the
/// leaf's path is every entry and the settings in force are the latest
/// read; otherwise the path is walked up from the leaf once the file is
/// read ([`read_pi`]: over its entries; [`PiFile`]: over the file's lines,
/// last first).
#[derive(Default)]
struct Facts {
    entries: u64,
    /// Whether the entries so far form a chain from a root.
    chain: bool,
    /// The last entry's id.
    last: Option<EntryId>,
    /// The settings in force at the last entry, while the entries form a
    /// chain.
    latest: Nearest,
    session_name: Option<String>,
    first_ts: Option<i64>,
}

/// What the first commit needs of the entries.
struct Leaf {
    session_name: Option<String>,
    model: Option<(String, String)>,
    thinking: Option<String>,
    /// The first entry's time (the session's, if the header has none).
    first_ts: Option<i64>,
}

impl Facts {
    fn add(&mut self, m: &Mapped) {
        let e = &m.entry;
        self.chain = match self.entries {
            0 => e.parent_id.is_none(),
            _ => self.chain && e.parent_id.is_some() && e.parent_id == self.last,
        };
        self.entries += 1;
        self.last = Some(e.id.clone());
        if self.chain {
            self.latest.meet(e, true);
        }
        if let EntryKind::SessionInfo { name: Some(n) } = &e.kind {
            if !n.trim().is_empty() {
                self.session_name = Some(n.trim().to_string());
            }
        }
        self.first_ts.get_or_insert(e.timestamp_ms);
    }

    /// The settings at the leaf, when the entries form a chain.
    fn of_chain(&self) -> Option<Nearest> {
        (self.chain || self.entries == 0).then(|| Nearest {
            model: self.latest.model.clone(),
            thinking: self.latest.thinking.clone(),
        })
    }

    fn finish(self, at_leaf: Nearest) -> Leaf {
        Leaf {
            session_name: self.session_name,
            model: at_leaf.model,
            thinking: at_leaf.thinking,
            first_ts: self.first_ts,
        }
    }
}

/// The settings at the leaf (the last of `entries`) over its path, walked
/// up by the parents' ids.
fn walk_entries(entries: &[Mapped]) -> Result<Nearest, PiError> {
    let at: HashMap<&EntryId, usize> = entries
        .iter()
        .enumerate()
        .map(|(i, m)| (&m.entry.id, i))
        .collect();
    let mut nearest = Nearest::default();
    let mut next = entries.len().checked_sub(1);
    while let Some(i) = next {
        if nearest.both() {
            break;
        }
        let e = &entries[i].entry;
        nearest.meet(e, false);
        next = match e.parent_id.as_ref().map(|p| at.get(p).copied()) {
            None => None,
            // A parent is defined on an earlier line.
            Some(Some(p)) if p < i => Some(p),
            Some(_) => return Err(err(0, "the entries' parent links form a cycle")),
        };
    }
    Ok(nearest)
}

/// The settings at the leaf of the file at `path`, whose first `end` bytes a
/// first reading read, walking those lines from the last: the last entry is
/// the leaf, and each entry on its path is the parent the one after names,
/// on an earlier line. Holds one line, and up to twice its length while
/// reading it.
fn walk_file(path: &Path, end: u64, version: u64) -> Result<Nearest, PiError> {
    let again = |e: String| {
        err(
            0,
            format!("reading the file again for the leaf's path: {e}"),
        )
    };
    let file = File::open(path).map_err(|e| again(e.to_string()))?;
    let mut lines = LinesBack::new(file, end);
    let mut nearest = Nearest::default();
    // The id of the next entry up the path (`None` before the leaf).
    let mut wanted: Option<EntryId> = None;
    while let Some(bytes) = lines.next().map_err(|e| again(e.to_string()))? {
        let Ok(text) = std::str::from_utf8(&bytes) else {
            return Err(again("a line is no longer UTF-8".into()));
        };
        if text.trim().is_empty() || serde_json::from_str::<IgnoredAny>(text).is_err() {
            continue;
        }
        let mut m = parse_obj(text).ok_or_else(|| again("a line is no longer an object".into()))?;
        let ty = str_of(&m, "type").unwrap_or_default();
        if ty == "session" {
            break;
        }
        let raw_id = str_of(&m, "id").unwrap_or_default();
        let Ok(id) = EntryId::parse(&raw_id) else {
            return Err(again(format!("entry id {raw_id:?} no longer reads")));
        };
        if wanted.as_ref().is_some_and(|w| *w != id) {
            continue;
        }
        let parent_id = str_of(&m, "parentId")
            .map(|p| EntryId::parse(&p))
            .transpose()
            .map_err(|e| again(e.to_string()))?;
        let kind = map_entry(&ty, &mut m, &id, version).map_err(again)?;
        let entry = Entry {
            id,
            parent_id,
            timestamp_ms: 0,
            kind,
        };
        nearest.meet(&entry, false);
        match entry.parent_id {
            Some(p) if !nearest.both() => wanted = Some(p),
            _ => break,
        }
    }
    Ok(nearest)
}

/// A file's lines, last first (without their `\n`).
struct LinesBack {
    file: File,
    /// Where the bytes not yet read start.
    pos: u64,
    /// The read bytes not yet returned: the file's bytes from `pos` on.
    buf: Vec<u8>,
    done: bool,
}

impl LinesBack {
    /// The lines of `file`'s first `end` bytes.
    fn new(file: File, end: u64) -> Self {
        LinesBack {
            file,
            pos: end,
            buf: Vec::new(),
            done: false,
        }
    }

    fn next(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        use std::os::unix::fs::FileExt;
        loop {
            if let Some(i) = memchr::memrchr(b'\n', &self.buf) {
                let line = self.buf.split_off(i + 1);
                self.buf.truncate(i);
                return Ok(Some(line));
            }
            if self.pos == 0 {
                if self.done {
                    return Ok(None);
                }
                self.done = true;
                return Ok(Some(std::mem::take(&mut self.buf)));
            }
            if self.buf.len() > PI_LINE_BYTES_MAX {
                return Err(std::io::Error::other(format!(
                    "a line over {PI_LINE_BYTES_MAX} bytes"
                )));
            }
            // At least as much as is held: a long line is read in doubling
            // steps, each copying what is held once.
            let n = (self.buf.len().max(64 << 10) as u64).min(self.pos);
            let mut block = Vec::with_capacity(n as usize + self.buf.len());
            block.resize(n as usize, 0);
            self.pos -= n;
            self.file.read_exact_at(&mut block, self.pos)?;
            block.extend_from_slice(&self.buf);
            self.buf = block;
        }
    }
}

/// The session's `created` event, with the settings in force at the leaf,
/// and its time.
fn created_event(header: &Header, leaf: &Leaf, source: &str) -> (SessionEvent, i64) {
    let cwd = header.cwd.as_str();
    let model = leaf
        .model
        .clone()
        .map(|(p, m)| ModelConfig::new(p, m))
        .unwrap_or_default();
    let mut definition = AgentDefinition::new(
        PI_AGENT_NAME,
        format!("pi coding-agent session imported from {source}"),
        "",
    )
    .with_label(leaf.session_name.clone().unwrap_or_else(|| {
        if cwd.is_empty() {
            "pi session".to_string()
        } else {
            format!("pi session in {cwd}")
        }
    }));
    definition.model = model.clone();
    let mut state = AgentState::new().with_model(model);
    state.metadata.insert(
        "pi.session_version".into(),
        Value::from(header.version).into(),
    );
    if !cwd.is_empty() {
        state
            .metadata
            .insert("pi.cwd".into(), Value::from(cwd).into());
    }
    if let Some(p) = &header.parent_session {
        state
            .metadata
            .insert("pi.parent_session".into(), Value::from(p.as_str()).into());
    }
    if let Some(t) = &leaf.thinking {
        state
            .metadata
            .insert("pi.thinking_level".into(), Value::from(t.as_str()).into());
    }
    let created_at_ms = header.timestamp_ms.or(leaf.first_ts).unwrap_or(0);
    let created = SessionEvent::Created {
        id: header.id.clone(),
        parent_id: None,
        agent_name: PI_AGENT_NAME.to_string(),
        label: definition.effective_label(),
        created_at_ms,
        definition: Box::new(definition),
        state: Box::new(state),
    };
    (created, created_at_ms)
}

/// Cuts the session's events into commits: the `created` event, then one
/// `entry_appended` per entry (the last is the leaf), at most
/// [`PI_COMMIT_EVENTS_MAX`] events and about [`PI_COMMIT_BYTES_MAX`]
/// encoded bytes a commit. Also hashes each commit's lines, so a later
/// reading can tell it read the same ones.
struct Chunker {
    seed: Seed,
    /// Whether the events are kept: a reading that only checks measures
    /// each event and drops it.
    keep: bool,
    cur: ImportCommit,
    /// Events in `cur`, kept or not.
    events: usize,
    /// Encoded bytes of `cur`'s entries.
    bytes: usize,
    /// The hash of `cur`'s lines.
    hash: u64,
}

impl Chunker {
    /// The first commit starts with `created` (and its time); without it,
    /// nothing is kept.
    fn new(seed: Seed, header: &Header, created: Option<(SessionEvent, i64)>) -> Self {
        let keep = created.is_some();
        let (events, timestamp_ms) = match created {
            Some((ev, at)) => (vec![ev], at),
            None => (Vec::new(), 0),
        };
        Chunker {
            seed,
            keep,
            cur: ImportCommit {
                version: 1,
                commit_id: seed.commit_id(1),
                timestamp_ms,
                events,
                lines: if keep { vec![header.line] } else { Vec::new() },
            },
            events: 1,
            bytes: 0,
            hash: header.hash,
        }
    }

    /// Adds the next entry; returns the commit it closes (with its lines'
    /// hash) when it starts the next one.
    fn push(&mut self, m: Mapped) -> Result<Option<(ImportCommit, u64)>, PiError> {
        let ts = m.entry.timestamp_ms;
        let ev = SessionEvent::EntryAppended { entry: m.entry };
        let bytes = encoded_event_len(&ev)
            .map_err(|e| err(m.line, format!("cannot encode the entry: {e}")))?;
        let mut closed = None;
        if self.events > 0
            && (self.events >= PI_COMMIT_EVENTS_MAX
                || self.bytes.saturating_add(bytes) > PI_COMMIT_BYTES_MAX)
        {
            let version = self.cur.version + 1;
            let next = ImportCommit {
                version,
                commit_id: self.seed.commit_id(version),
                timestamp_ms: ts,
                events: Vec::new(),
                lines: Vec::new(),
            };
            closed = Some((std::mem::replace(&mut self.cur, next), self.hash));
            self.events = 0;
            self.bytes = 0;
            self.hash = 0;
        }
        if self.keep {
            self.cur.events.push(ev);
            self.cur.lines.push(m.line);
        }
        self.cur.timestamp_ms = ts;
        self.events += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        self.hash = mix64(self.hash.rotate_left(1) ^ m.hash);
        Ok(closed)
    }

    /// The last commit, with its lines' hash.
    fn finish(self) -> (ImportCommit, u64) {
        (self.cur, self.hash)
    }
}

/// SplitMix64's output function: a bijection on `u64` that spreads every
/// input bit over the output.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Where a reading's made-up ids come from: 128 random bits, drawn once
/// per [`read_pi`] call or [`PiFile`], from which the `n`th id is computed
/// (not drawn), so every reading with the same seed makes up the same ids.
#[derive(Clone, Copy)]
struct Seed([u64; 2]);

impl Seed {
    fn random() -> Self {
        let (a, b) = Uuid::new_v4().as_u64_pair();
        Seed([a, b])
    }

    /// The `n`th number of stream `stream` from half `half` of the seed:
    /// distinct `n` give distinct numbers (SplitMix64 steps).
    fn draw(&self, half: usize, stream: u64, n: u64) -> u64 {
        const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
        let base = mix64(self.0[half & 1] ^ mix64(stream));
        mix64(base.wrapping_add(n.wrapping_mul(GOLDEN)))
    }

    /// The id of a version 1 file's `n`th entry (from 0): 8 lowercase hex
    /// digits, as [`EntryId::generate`] makes them. A permutation of the 32
    /// bit numbers keyed by the seed (a four-round Feistel network), so
    /// distinct entries get distinct ids without a record of the earlier
    /// ones; at most 4 Gi entries.
    fn entry_id(&self, n: u64) -> Result<EntryId, String> {
        let n = u32::try_from(n)
            .map_err(|_| "a version 1 file of more than 4 Gi entries".to_string())?;
        let (mut left, mut right) = ((n >> 16) as u16, n as u16);
        for round in 0..4u64 {
            let f = self.draw(0, 1, (round << 16) | u64::from(right)) as u16;
            (left, right) = (right, left ^ f);
        }
        let bits = (u32::from(left) << 16) | u32::from(right);
        EntryId::parse(&format!("{bits:08x}")).map_err(|e| e.to_string())
    }

    /// The id of the commit that creates `version`: a version 4 UUID of
    /// 122 bits from both halves of the seed.
    fn commit_id(&self, version: u64) -> Uuid {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.draw(0, 2, version).to_le_bytes());
        bytes[8..].copy_from_slice(&self.draw(1, 3, version).to_le_bytes());
        uuid::Builder::from_random_bytes(bytes).into_uuid()
    }
}

mod map;

use map::*;

#[cfg(test)]
mod tests;
