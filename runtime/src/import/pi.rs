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
//! session (several times the file); [`PiFile`] reads the file twice and
//! holds one commit at a time, plus about 20 bytes per entry for the ids
//! (see [`PiFile`]).

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
use crate::store::exchange::{read_line_bounded, ExchangeError, ImportCommit, ImportSession};
use crate::transcript::{
    path_settings, ContentBlock, Entry, EntryId, EntryKind, Json, Message, PathMarker, StopReason,
    Usage,
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
    let (mut pass, header) = Pass::start(r, seed)?;
    let mut facts = Facts::default();
    let mut entries: Vec<Mapped> = Vec::new();
    while let Some(m) = pass.next_entry()? {
        facts.add(&m);
        entries.push(m);
    }
    let leaf = facts.finish()?;
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
/// needs (an import reads its source twice: once to check, once to write).
///
/// [`PiFile::open`] reads the file once and keeps what the first commit
/// needs before the last line is read (the settings in force at the leaf,
/// the session's name); [`PiFile::for_each_commit`] reads it again for the
/// entries. So an import holds one commit of the session at a time, plus
/// 20 to 40 bytes per entry while a reading is under way (its id in a
/// compact hash table and, in the first reading, its parent's index and
/// its settings change), not the session: a 200,000-entry session takes
/// a few MiB, not a few hundred.
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
    /// of the ids it makes up. It never keeps an entry's content: while
    /// reading, per entry its id, its parent's index and its settings
    /// change if it is one (as an index into the distinct settings seen).
    /// `source` names the file in the session's description.
    pub fn open(path: &Path, source: &str) -> Result<PiFile, PiError> {
        let seed = Seed::random();
        let file = open_buffered(path)
            .map_err(|e| err(0, format!("cannot open {}: {e}", path.display())))?;
        let (mut pass, header) = Pass::start(file, seed)?;
        let mut facts = Facts::default();
        // Only measures each entry's event (the commit boundaries and the
        // encoding errors are those of `read_pi`), keeps none.
        let mut chunker = Chunker::new(seed, &header, None);
        let mut commit_hashes = Vec::new();
        while let Some(m) = pass.next_entry()? {
            facts.add(&m);
            if let Some((_, hash)) = chunker.push(m)? {
                commit_hashes.push(hash);
            }
        }
        commit_hashes.push(chunker.finish().1);
        let leaf = facts.finish()?;
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
        let (mut pass, now) = Pass::start(file, self.seed).map_err(changed)?;
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
    /// The parent's index among the entries read before (the parent must
    /// be defined on an earlier line).
    parent: Option<u32>,
}

/// The hash of a line's number and bytes. Fixed (not seeded per process):
/// it only tells whether a later reading of a file read the same lines.
fn line_hash(line: u64, text: &str) -> u64 {
    const STATE: foldhash::fast::FixedState = foldhash::fast::FixedState::with_seed(0);
    STATE.hash_one((line, text))
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
    /// Lines skipped as pi skips them (not JSON), in file order.
    skipped: Vec<u64>,
    version: u64,
    /// The ids of the entries read so far, by index.
    ids: IdIndex,
    /// Where the version 1 ids come from, and how many were drawn.
    seed: Seed,
    draws: u64,
    /// The time of the last entry read (an entry without one gets it).
    last_ts: i64,
}

impl<R: BufRead> Pass<R> {
    /// Reads up to the header, which it checks and returns.
    fn start(r: R, seed: Seed) -> Result<(Self, Header), PiError> {
        let mut pass = Pass {
            r,
            buf: Vec::new(),
            line_no: 0,
            skipped: Vec::new(),
            version: 0,
            ids: IdIndex::new(),
            seed,
            draws: 0,
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
            if had.is_none() {
                return Ok(None);
            }
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
            let new_id = loop {
                let g = self.seed.entry_id(self.draws).map_err(|e| err(line, e))?;
                self.draws += 1;
                // Every earlier entry's id is in `ids` (the previous one's
                // too).
                if self.ids.find(g.as_str()).is_none() {
                    break g;
                }
            };
            m.insert("id".into(), raw(new_id.as_str()).map_err(|e| err(line, e))?);
            m.insert(
                "parentId".into(),
                raw(&self.ids.last()).map_err(|e| err(line, e))?,
            );
            if str_of(&m, "type").as_deref() == Some("compaction") {
                if let Some(idx) = u64_of(&m, "firstKeptEntryIndex") {
                    // pi resolves the index among the file's entries
                    // (header = 0); only earlier ones have ids yet.
                    let target = usize::try_from(idx)
                        .ok()
                        .and_then(|t| t.checked_sub(1))
                        .and_then(|t| self.ids.get(t));
                    if let Some(t) = target {
                        m.insert("firstKeptEntryId".into(), raw(t).map_err(|e| err(line, e))?);
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
        if self.ids.find(eid.as_str()).is_some() {
            return Err(err(line, format!("entry id {eid} is used twice")));
        }
        let (parent_id, parent) = match m.get("parentId").filter(|p| p.get() != "null") {
            None => (None, None),
            Some(p) if p.get().starts_with('"') => {
                let p: String =
                    serde_json::from_str(p.get()).map_err(|e| err(line, e.to_string()))?;
                let pid =
                    EntryId::parse(&p).map_err(|e| err(line, format!("parent id {p:?}: {e}")))?;
                if pid == eid {
                    return Err(err(line, format!("entry {eid} is its own parent")));
                }
                let Some(at) = self.ids.find(pid.as_str()) else {
                    return Err(err(
                        line,
                        format!(
                            "the parent {pid} of entry {eid} is not defined on an earlier line"
                        ),
                    ));
                };
                (Some(pid), Some(at))
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
        self.ids.push(eid.as_str()).map_err(|r| err(line, r))?;
        Ok(Some(Mapped {
            line,
            hash,
            entry: Entry {
                id: eid,
                parent_id,
                timestamp_ms: ts,
                kind,
            },
            parent,
        }))
    }
}

/// The ids of the entries read so far, by index, with a hash table over
/// them: what the parent and duplicate checks, the version 1 ids and
/// `firstKeptEntryIndex` need. Held as bytes end to end, so an 8-character
/// id takes about 20 bytes here (a `HashMap<EntryId, u32>` takes about 40).
/// At most `u32::MAX - 1` entries and 4 GiB of ids (beyond, an error).
struct IdIndex {
    /// Every id's bytes, end to end.
    bytes: Vec<u8>,
    /// Where each id ends in `bytes`.
    ends: Vec<u32>,
    /// Open addressing with linear probing: an entry's index + 1, 0 for a
    /// free slot. A power of two long, at most half full.
    slots: Vec<u32>,
    /// Seeded per process, so a file cannot be made to collide.
    hasher: foldhash::fast::RandomState,
}

impl IdIndex {
    fn new() -> Self {
        IdIndex {
            bytes: Vec::new(),
            ends: Vec::new(),
            slots: vec![0; 16],
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// The id of entry `i`.
    fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)? as usize;
        let start = match i.checked_sub(1) {
            Some(p) => *self.ends.get(p)? as usize,
            None => 0,
        };
        std::str::from_utf8(self.bytes.get(start..end)?).ok()
    }

    /// The id of the last entry read.
    fn last(&self) -> Option<&str> {
        self.ends.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// The index of the entry with this id.
    fn find(&self, id: &str) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut at = self.hasher.hash_one(id) as usize & mask;
        // Ends: at least half the slots are free.
        loop {
            match self.slots[at] {
                0 => return None,
                s if self.get(s as usize - 1) == Some(id) => return Some(s - 1),
                _ => at = (at + 1) & mask,
            }
        }
    }

    /// Adds the next entry's id (not in the index yet); returns its index.
    fn push(&mut self, id: &str) -> Result<u32, String> {
        let too_many = || "the file has more entries than a session read from one can hold";
        let n = u32::try_from(self.ends.len())
            .ok()
            .filter(|&n| n < u32::MAX - 1)
            .ok_or_else(too_many)?;
        let end = u32::try_from(self.bytes.len() + id.len()).map_err(|_| too_many())?;
        if (self.ends.len() + 1) * 2 > self.slots.len() {
            self.slots = vec![0; self.slots.len() * 2];
            for i in 0..n {
                self.place(i);
            }
        }
        self.bytes.extend_from_slice(id.as_bytes());
        self.ends.push(end);
        self.place(n);
        Ok(n)
    }

    /// Puts entry `i` in a free slot.
    fn place(&mut self, i: u32) {
        let mask = self.slots.len() - 1;
        let mut at = self
            .get(i as usize)
            .map_or(0, |id| self.hasher.hash_one(id)) as usize
            & mask;
        while self.slots[at] != 0 {
            at = (at + 1) & mask;
        }
        self.slots[at] = i + 1;
    }
}

/// A setting an entry changes, as [`PathMarker::of`] reads it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Setting {
    Model(String, String),
    Thinking(String),
}

/// No parent, or no setting, in [`Facts::links`].
const NONE: u32 = u32::MAX;

/// What a reading keeps of each entry to find the session's name and the
/// settings in force at the leaf, which the first commit carries.
#[derive(Default)]
struct Facts {
    /// Per entry: its parent's index and its setting's index in `settings`
    /// ([`NONE`] for none). 8 bytes an entry.
    links: Vec<(u32, u32)>,
    /// The distinct settings changes seen, with their index (a session
    /// names a few models over thousands of assistant messages).
    settings: HashMap<Setting, u32>,
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
        let setting = match PathMarker::of(&m.entry) {
            PathMarker::Model { provider, model_id } => Some(Setting::Model(provider, model_id)),
            PathMarker::ThinkingLevel { thinking_level } => Some(Setting::Thinking(thinking_level)),
            _ => None,
        };
        let setting = setting.map_or(NONE, |s| {
            // Fewer distinct settings than entries, which `IdIndex` bounds
            // below `u32::MAX`.
            let next = self.settings.len() as u32;
            *self.settings.entry(s).or_insert(next)
        });
        self.links.push((m.parent.unwrap_or(NONE), setting));
        if let EntryKind::SessionInfo { name: Some(n) } = &m.entry.kind {
            if !n.trim().is_empty() {
                self.session_name = Some(n.trim().to_string());
            }
        }
        self.first_ts.get_or_insert(m.entry.timestamp_ms);
    }

    /// The settings in force at the leaf (the last entry), by
    /// [`path_settings`] over the leaf's path. Only the change of each
    /// setting nearest the leaf can count (the latest of each is in
    /// force), so the path is walked up from the leaf until both are found
    /// and `path_settings` gets those two, not the thousands of entries
    /// between.
    fn finish(self) -> Result<Leaf, PiError> {
        let mut by_index: Vec<Option<&Setting>> = vec![None; self.settings.len()];
        for (s, &n) in &self.settings {
            if let Some(slot) = by_index.get_mut(n as usize) {
                *slot = Some(s);
            }
        }
        // The nearest change of each setting, leaf first.
        let mut nearest: Vec<&Setting> = Vec::with_capacity(2);
        let (mut model, mut thinking) = (false, false);
        let mut at = self.links.len().checked_sub(1);
        while let Some(i) = at {
            if model && thinking {
                break;
            }
            let (parent, setting) = self.links[i];
            match by_index.get(setting as usize).copied().flatten() {
                Some(s @ Setting::Model(..)) if !model => {
                    model = true;
                    nearest.push(s);
                }
                Some(s @ Setting::Thinking(_)) if !thinking => {
                    thinking = true;
                    nearest.push(s);
                }
                _ => {}
            }
            at = match parent {
                NONE => None,
                // A parent is defined on an earlier line.
                p if (p as usize) < i => Some(p as usize),
                _ => return Err(err(0, "the entries' parent links form a cycle")),
            };
        }
        let id = EntryId::parse("setting").map_err(|e| err(0, e.to_string()))?;
        let path: Vec<Entry> = nearest
            .iter()
            .rev()
            .map(|s| {
                let marker = match s {
                    Setting::Model(provider, model_id) => PathMarker::Model {
                        provider: provider.clone(),
                        model_id: model_id.clone(),
                    },
                    Setting::Thinking(t) => PathMarker::ThinkingLevel {
                        thinking_level: t.clone(),
                    },
                };
                marker.stand_in_entry(id.clone(), None)
            })
            .collect();
        let (model, thinking) = path_settings(&path.iter().collect::<Vec<_>>());
        Ok(Leaf {
            session_name: self.session_name,
            model,
            thinking,
            first_ts: self.first_ts,
        })
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

    /// The `n`th candidate for a version 1 entry id: 8 lowercase hex
    /// digits, as [`EntryId::generate`] makes them (the caller skips one
    /// already taken).
    fn entry_id(&self, n: u64) -> Result<EntryId, String> {
        let bits = self.draw(0, 1, n) >> 32;
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

/// A JSON object whose fields are kept as their JSON text, in place in
/// the line, and parsed only when read (a repeated key keeps its last
/// value, as in a `serde_json::Value` map). A field set by a migration
/// is owned.
type Obj<'a> = BTreeMap<String, Cow<'a, RawValue>>;

/// The object `text` holds, read in place.
fn parse_obj(text: &str) -> Option<Obj<'_>> {
    let m: BTreeMap<String, &RawValue> = serde_json::from_str(text).ok()?;
    Some(m.into_iter().map(|(k, v)| (k, Cow::Borrowed(v))).collect())
}

/// A field that is a string.
fn str_of(m: &Obj, key: &str) -> Option<String> {
    m.get(key)
        .filter(|v| v.get().starts_with('"'))
        .and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is a boolean.
fn bool_of(m: &Obj, key: &str) -> Option<bool> {
    m.get(key).and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is a non-negative integer.
fn u64_of(m: &Obj, key: &str) -> Option<u64> {
    m.get(key).and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is an integer.
fn i64_of(m: &Obj, key: &str) -> Option<i64> {
    m.get(key).and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is a number, as a float.
fn f64_of(m: &Obj, key: &str) -> Option<f64> {
    m.get(key)
        .filter(|v| {
            v.get()
                .starts_with(|c: char| c == '-' || c.is_ascii_digit())
        })
        .and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is an object, taken out of `m` (a migration sets no
/// objects).
fn take_obj<'a>(m: &mut Obj<'a>, key: &str) -> Option<Obj<'a>> {
    match m.remove(key)? {
        Cow::Borrowed(v) => parse_obj(v.get()),
        Cow::Owned(_) => None,
    }
}

/// A field taken out of `m` as an opaque payload.
fn take_json(m: &mut Obj, key: &str) -> Result<Option<Json>, String> {
    m.remove(key)
        .map(|v| Json::from_text(v.get()).map_err(|e| format!("\"{key}\": {e}")))
        .transpose()
}

/// The whole object as an opaque payload.
fn obj_json(m: Obj) -> Result<Json, String> {
    let mut text = String::from("{");
    for (i, (k, v)) in m.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&serde_json::to_string(k).map_err(|e| e.to_string())?);
        text.push(':');
        text.push_str(v.get());
    }
    text.push('}');
    drop(m);
    Json::from_text(&text).map_err(|e| e.to_string())
}

/// A value as a field's JSON text.
fn raw<T: serde::Serialize + ?Sized>(v: &T) -> Result<Cow<'static, RawValue>, String> {
    serde_json::value::to_raw_value(v)
        .map(Cow::Owned)
        .map_err(|e| e.to_string())
}

fn get_str(m: &Obj, key: &str) -> Result<String, String> {
    str_of(m, key).ok_or_else(|| format!("\"{key}\" is missing or not a string"))
}

/// Maps one (migrated) pi entry to an entry kind.
fn map_entry(ty: &str, m: &mut Obj, own_id: &EntryId, version: u64) -> Result<EntryKind, String> {
    Ok(match ty {
        "message" => {
            let mut msg =
                take_obj(m, "message").ok_or("the message entry has no \"message\" object")?;
            map_message(&mut msg, version)?
        }
        "model_change" => EntryKind::ModelChange {
            provider: get_str(m, "provider")?,
            model_id: get_str(m, "modelId")?,
        },
        "thinking_level_change" => EntryKind::ThinkingLevelChange {
            thinking_level: get_str(m, "thinkingLevel")?,
        },
        "compaction" => EntryKind::Compaction {
            summary: get_str(m, "summary")?,
            // pi keeps nothing before the compaction when its first kept
            // entry is not found; pointing at the compaction itself gives
            // the same context here.
            first_kept_entry_id: str_of(m, "firstKeptEntryId")
                .and_then(|s| EntryId::parse(&s).ok())
                .unwrap_or_else(|| own_id.clone()),
            tokens_before: u64_of(m, "tokensBefore").unwrap_or(0),
        },
        "branch_summary" => EntryKind::BranchSummary {
            from_id: str_of(m, "fromId").and_then(|s| EntryId::parse(&s).ok()),
            summary: get_str(m, "summary")?,
        },
        "custom" => EntryKind::Custom {
            custom_type: get_str(m, "customType")?,
            data: take_json(m, "data")?.unwrap_or_default(),
        },
        "custom_message" => EntryKind::CustomMessage {
            custom_type: get_str(m, "customType")?,
            content: content(m.remove("content"))?,
            display: bool_of(m, "display").unwrap_or(false),
            details: take_json(m, "details")?.filter(|d| !d.is_null()),
        },
        "label" => {
            let target = get_str(m, "targetId")?;
            EntryKind::Label {
                target_id: EntryId::parse(&target)
                    .map_err(|e| format!("label target {target:?}: {e}"))?,
                label: str_of(m, "label"),
            }
        }
        "session_info" => EntryKind::SessionInfo {
            name: str_of(m, "name").map(|n| n.trim().to_string()),
        },
        other => return Err(format!("unknown entry type {other:?}")),
    })
}

fn map_message(msg: &mut Obj, version: u64) -> Result<EntryKind, String> {
    let role = str_of(msg, "role").ok_or("the message has no \"role\"")?;
    // v2 -> v3: the hookMessage role was renamed to custom.
    let role = if role == "hookMessage" && version < 3 {
        "custom"
    } else {
        role.as_str()
    };
    let message = |message| EntryKind::Message { message };
    Ok(match role {
        "user" => message(Message::User {
            content: content(msg.remove("content"))?,
        }),
        "assistant" => {
            let provider = str_of(msg, "provider").unwrap_or_default();
            let model = str_of(msg, "model").unwrap_or_default();
            let model = match (provider.is_empty(), model.is_empty()) {
                (false, false) => Some(format!("{provider}/{model}")),
                (true, false) => Some(model),
                _ => None,
            };
            let stop_reason = match str_of(msg, "stopReason").as_deref() {
                None | Some("stop") => StopReason::Stop,
                Some("length") => StopReason::Length,
                Some("toolUse") => StopReason::ToolUse,
                Some("error") => StopReason::Error,
                Some("aborted") => StopReason::Aborted,
                Some(other) => return Err(format!("unknown stopReason {other:?}")),
            };
            let u = take_obj(msg, "usage").unwrap_or_default();
            let tokens = |k: &str| {
                f64_of(&u, k)
                    .filter(|t| t.is_finite() && *t >= 0.0)
                    .map_or(0, |t| t as u64)
            };
            let usage = Usage {
                input_tokens: tokens("input"),
                output_tokens: tokens("output"),
                cache_read_tokens: tokens("cacheRead"),
                cache_write_tokens: tokens("cacheWrite"),
            };
            message(Message::Assistant {
                content: content(msg.remove("content"))?,
                stop_reason,
                usage,
                model,
                error_message: str_of(msg, "errorMessage"),
            })
        }
        "toolResult" => message(Message::ToolResult {
            tool_call_id: get_str(msg, "toolCallId")?,
            tool_name: str_of(msg, "toolName").unwrap_or_default(),
            content: content(msg.remove("content"))?,
            is_error: bool_of(msg, "isError").unwrap_or(false),
        }),
        "custom" => EntryKind::CustomMessage {
            custom_type: get_str(msg, "customType")?,
            content: content(msg.remove("content"))?,
            display: bool_of(msg, "display").unwrap_or(false),
            details: take_json(msg, "details")?.filter(|d| !d.is_null()),
        },
        "branchSummary" => EntryKind::BranchSummary {
            from_id: str_of(msg, "fromId").and_then(|s| EntryId::parse(&s).ok()),
            summary: get_str(msg, "summary")?,
        },
        "compactionSummary" => EntryKind::CustomMessage {
            custom_type: "pi.compactionSummary".into(),
            content: vec![ContentBlock::text(get_str(msg, "summary")?)],
            display: true,
            details: None,
        },
        "bashExecution" => {
            let excluded = bool_of(msg, "excludeFromContext").unwrap_or(false);
            let text = (!excluded).then(|| bash_execution_text(msg));
            let whole = obj_json(std::mem::take(msg))?;
            if let Some(text) = text {
                EntryKind::CustomMessage {
                    custom_type: "pi.bashExecution".into(),
                    content: vec![ContentBlock::text(text)],
                    display: true,
                    details: Some(whole),
                }
            } else {
                EntryKind::Custom {
                    custom_type: "pi.bashExecution".into(),
                    data: whole,
                }
            }
        }
        other => return Err(format!("unknown message role {other:?}")),
    })
}

/// The text pi sends to the model for a bash execution.
fn bash_execution_text(msg: &Obj) -> String {
    let command = str_of(msg, "command").unwrap_or_default();
    let output = str_of(msg, "output").unwrap_or_default();
    let mut text = format!("Ran `{command}`\n");
    if output.is_empty() {
        text.push_str("(no output)");
    } else {
        text.push_str(&format!("```\n{output}\n```"));
    }
    let flag = |k: &str| bool_of(msg, k).unwrap_or(false);
    if flag("cancelled") {
        text.push_str("\n\n(command cancelled)");
    } else if let Some(code) = i64_of(msg, "exitCode") {
        if code != 0 {
            text.push_str(&format!("\n\nCommand exited with code {code}"));
        }
    }
    if flag("truncated") {
        if let Some(p) = str_of(msg, "fullOutputPath") {
            text.push_str(&format!("\n\n[Output truncated. Full output: {p}]"));
        }
    }
    text
}

/// Message content: a string (one text block) or an array of blocks.
fn content(v: Option<Cow<'_, RawValue>>) -> Result<Vec<ContentBlock>, String> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    match v.get().as_bytes().first() {
        Some(b'n') => Ok(Vec::new()),
        Some(b'"') => Ok(vec![ContentBlock::text(
            serde_json::from_str::<String>(v.get()).map_err(|e| e.to_string())?,
        )]),
        Some(b'[') => {
            let blocks: Vec<&RawValue> =
                serde_json::from_str(v.get()).map_err(|e| e.to_string())?;
            blocks.into_iter().map(block).collect()
        }
        _ => Err(format!(
            "content {} is neither text nor a list of blocks",
            json_kind(&v)
        )),
    }
}

fn json_kind(v: &RawValue) -> &'static str {
    match v.get().as_bytes().first() {
        Some(b'n') => "null",
        Some(b't' | b'f') => "a boolean",
        Some(b'"') => "a string",
        Some(b'[') => "an array",
        Some(b'{') => "an object",
        _ => "a number",
    }
}

fn take_str(m: &mut Obj, key: &str) -> Result<String, String> {
    let s = get_str(m, key);
    m.remove(key);
    s
}

fn take_opt_str(m: &mut Obj, key: &str) -> Option<String> {
    let s = str_of(m, key);
    m.remove(key);
    s
}

fn block(b: &RawValue) -> Result<ContentBlock, String> {
    let Some(mut m) = parse_obj(b.get()) else {
        return Err("a content block is not an object".into());
    };
    let ty = take_str(&mut m, "type")?;
    Ok(match ty.as_str() {
        "text" => ContentBlock::Text {
            text: take_str(&mut m, "text")?,
        },
        "thinking" => ContentBlock::Thinking {
            thinking: take_str(&mut m, "thinking")?,
            signature: take_opt_str(&mut m, "thinkingSignature"),
            redacted: bool_of(&m, "redacted").unwrap_or(false),
        },
        "toolCall" => ContentBlock::ToolCall {
            id: take_str(&mut m, "id")?,
            name: take_str(&mut m, "name")?,
            arguments: take_json(&mut m, "arguments")?.unwrap_or_default(),
            signature: take_opt_str(&mut m, "thoughtSignature"),
        },
        "image" => ContentBlock::Image {
            mime_type: take_str(&mut m, "mimeType")?,
            data: take_str(&mut m, "data")?,
        },
        other => return Err(format!("unknown content block type {other:?}")),
    })
}

/// A time field's JSON text (see [`parse_time`]); only a number or a
/// string is parsed.
fn parse_time_raw(v: &RawValue) -> Option<i64> {
    let t = v.get();
    if !t.starts_with(|c: char| c == '"' || c == '-' || c.is_ascii_digit()) {
        return None;
    }
    serde_json::from_str::<Value>(t)
        .ok()
        .as_ref()
        .and_then(parse_time)
}

/// A time: milliseconds since the epoch (a number) or an RFC 3339 /
/// ISO 8601 string such as `2025-01-02T03:04:05.678Z` or
/// `2025-01-02T05:04:05+02:00`.
pub(crate) fn parse_time(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => parse_rfc3339_ms(s),
        _ => None,
    }
}

fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if part.is_empty() || !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut ms = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        let mut end = start;
        while b.get(end).is_some_and(u8::is_ascii_digit) {
            end += 1;
        }
        if end == start {
            return None;
        }
        // Milliseconds from the first three fraction digits.
        let frac = s.get(start..end.min(start + 3))?;
        ms = frac.parse::<i64>().ok()? * 10i64.pow(3 - frac.len() as u32);
        i = end;
    }
    let offset_s = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) if b.len() == i + 6 && b[i + 3] == b':' => {
            let oh = num(i + 1..i + 3)?;
            let om = num(i + 4..i + 6)?;
            let o = oh * 3600 + om * 60;
            if sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    secs.checked_mul(1000)?.checked_add(ms)
}

/// Howard Hinnant's civil-to-days algorithm (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_like_javascript_dates() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ms("2026-11-30T07:35:12Z"),
            Some(1_796_024_112_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-30T09:35:12.5+02:00"),
            Some(1_796_024_112_500)
        );
        assert_eq!(parse_rfc3339_ms("2026-11-30"), None);
        assert_eq!(parse_rfc3339_ms("2026-13-30T07:35:12Z"), None);
        assert_eq!(parse_time(&Value::from(42)), Some(42));
    }

    #[test]
    fn v1_is_a_linear_chain_with_compaction_index_resolved() {
        let file = concat!(
            r#"{"type":"session","id":"s1","timestamp":"2025-01-01T00:00:00.000Z","cwd":"/w"}"#,
            "\n",
            r#"{"type":"message","timestamp":"2025-01-01T00:00:01.000Z","message":{"role":"user","content":"a"}}"#,
            "\n",
            r#"{"type":"message","timestamp":"2025-01-01T00:00:02.000Z","message":{"role":"assistant","content":[{"type":"text","text":"b"}],"provider":"p","model":"m","stopReason":"stop"}}"#,
            "\n",
            r#"{"type":"compaction","timestamp":"2025-01-01T00:00:03.000Z","summary":"s","firstKeptEntryIndex":2,"tokensBefore":5}"#,
            "\n"
        );
        let s = read_pi(file.as_bytes(), "t").unwrap();
        assert_eq!(s.file_version, 1);
        let evs: Vec<&SessionEvent> = s.import.commits.iter().flat_map(|c| &c.events).collect();
        let entries: Vec<&Entry> = evs
            .iter()
            .filter_map(|e| match e {
                SessionEvent::EntryAppended { entry } => Some(entry),
                _ => None,
            })
            .collect();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].parent_id, None);
        assert_eq!(entries[1].parent_id.as_ref(), Some(&entries[0].id));
        assert_eq!(entries[2].parent_id.as_ref(), Some(&entries[1].id));
        match &entries[2].kind {
            EntryKind::Compaction {
                first_kept_entry_id,
                ..
            } => assert_eq!(first_kept_entry_id, &entries[1].id),
            k => panic!("{k:?}"),
        }
        assert_eq!(entries[0].timestamp_ms, 1_735_689_601_000);
    }

    #[test]
    fn long_sessions_are_split_into_bounded_commits_that_fold() {
        let mut file = String::from(
            r#"{"type":"session","version":3,"id":"long","timestamp":"2025-01-01T00:00:00Z","cwd":""}"#,
        );
        file.push('\n');
        let n = PI_COMMIT_EVENTS_MAX * 2 + 10;
        for i in 0..n {
            let parent = if i == 0 {
                "null".to_string()
            } else {
                format!("\"e{}\"", i - 1)
            };
            file.push_str(&format!(
                r#"{{"type":"custom","id":"e{i}","parentId":{parent},"timestamp":"2025-01-01T00:00:01Z","customType":"c","data":{i}}}"#
            ));
            file.push('\n');
        }
        let s = read_pi(file.as_bytes(), "t").unwrap();
        let commits = &s.import.commits;
        assert_eq!(commits.len(), 3);
        for (i, c) in commits.iter().enumerate() {
            assert_eq!(c.version, i as u64 + 1);
            assert!(c.events.len() <= PI_COMMIT_EVENTS_MAX);
            assert_eq!(c.events.len(), c.lines.len());
        }
        let folded = s.import.validate().unwrap();
        assert_eq!(folded.state().transcript.len(), n);
        let last = format!("e{}", n - 1);
        assert_eq!(
            folded.state().transcript.leaf().map(|l| l.as_str()),
            Some(last.as_str())
        );
    }

    const HEAD: &str = r#"{"type":"session","version":3,"id":"sig","timestamp":"2025-01-01T00:00:00Z","cwd":"/w"}"#;

    fn entries_of(s: &PiSession) -> Vec<&Entry> {
        s.import
            .commits
            .iter()
            .flat_map(|c| &c.events)
            .filter_map(|e| match e {
                SessionEvent::EntryAppended { entry } => Some(entry),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn thinking_and_tool_call_signatures_are_kept() {
        let user = r#"{"type":"message","id":"u1","parentId":null,"timestamp":"2025-01-01T00:00:01Z","message":{"role":"user","content":"hi"}}"#;
        let asst = r#"{"type":"message","id":"a1","parentId":"u1","timestamp":"2025-01-01T00:00:02Z","message":{"role":"assistant","provider":"anthropic","model":"claude","stopReason":"toolUse","content":[{"type":"thinking","thinking":"hm","thinkingSignature":"SIG1"},{"type":"thinking","thinking":"","thinkingSignature":"ENC","redacted":true},{"type":"toolCall","id":"c1","name":"read","arguments":{"path":"x"},"thoughtSignature":"TS"}]}}"#;
        let file = format!("{HEAD}\n{user}\n{asst}\n");
        let s = read_pi(file.as_bytes(), "t").unwrap();
        let entries = entries_of(&s);
        let EntryKind::Message {
            message: Message::Assistant { content, .. },
        } = &entries[1].kind
        else {
            panic!("{:?}", entries[1].kind)
        };
        assert_eq!(
            content,
            &vec![
                ContentBlock::Thinking {
                    thinking: "hm".into(),
                    signature: Some("SIG1".into()),
                    redacted: false
                },
                ContentBlock::Thinking {
                    thinking: String::new(),
                    signature: Some("ENC".into()),
                    redacted: true
                },
                ContentBlock::ToolCall {
                    id: "c1".into(),
                    name: "read".into(),
                    arguments: serde_json::json!({"path": "x"}).into(),
                    signature: Some("TS".into())
                },
            ]
        );
        // The signatures survive the store's codec.
        for c in &s.import.commits {
            for ev in &c.events {
                let back = crate::session::decode_event(&crate::session::encode_event(ev).unwrap())
                    .unwrap();
                assert_eq!(&back, ev);
            }
        }
    }

    #[test]
    fn lines_pi_skips_are_skipped_and_reported() {
        let a = r#"{"type":"custom","id":"a1","parentId":null,"timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
        let b = r#"{"type":"custom","id":"b1","parentId":"a1","timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
        // Two objects glued together on one line, as pi's own history
        // has them: JSON.parse refuses the line and pi skips it.
        let file = format!("{HEAD}\n{a}\n{a}{b}\n\n{b}\n{{\"type\":\n");
        let s = read_pi(file.as_bytes(), "t").unwrap();
        assert_eq!(s.skipped_lines, vec![3, 6]);
        let ids: Vec<&str> = entries_of(&s).iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, vec!["a1", "b1"]);
        s.import.validate().unwrap();
    }

    #[test]
    fn a_message_over_the_record_limit_writes_nothing() {
        use crate::store::exchange::{import_from, ExchangeError, ImportOptions};
        use crate::store::{LogStore, LogStoreOptions};
        let small = r#"{"type":"message","id":"u1","parentId":null,"timestamp":"2025-01-01T00:00:01Z","message":{"role":"user","content":"hi"}}"#;
        let big = format!(
            r#"{{"type":"message","id":"u2","parentId":"u1","timestamp":"2025-01-01T00:00:02Z","message":{{"role":"user","content":"{}"}}}}"#,
            "x".repeat(100_000)
        );
        let file = format!("{HEAD}\n{small}\n{big}\n");
        let s = read_pi(file.as_bytes(), "t").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(
            dir.path(),
            LogStoreOptions {
                durability: spool_engine::Durability::Buffered,
                record_bytes_max: Some(64 << 10),
                ..Default::default()
            },
        )
        .unwrap();
        let sessions = vec![s.import];
        let err = import_from(
            &store,
            &mut sessions.as_slice(),
            &ImportOptions::default(),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            matches!(err, ExchangeError::Unstorable { line: 3, .. }),
            "{err}"
        );
        assert_eq!(store.engine().unwrap().last_seq(), 0, "nothing written");
    }

    #[test]
    fn dangling_and_duplicate_ids_name_the_line() {
        let head = r#"{"type":"session","version":3,"id":"s","timestamp":"2025-01-01T00:00:00Z","cwd":""}"#;
        let a = r#"{"type":"custom","id":"a1","parentId":null,"timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
        let dangling = r#"{"type":"custom","id":"b1","parentId":"zz","timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
        let e = read_pi(format!("{head}\n{a}\n\n{dangling}\n").as_bytes(), "t").unwrap_err();
        assert_eq!(e.line, 4, "{e}");
        let e = read_pi(format!("{head}\n{a}\n{a}\n").as_bytes(), "t").unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        // A cut last line is not JSON: skipped, as pi skips it.
        let s = read_pi(format!("{head}\n{a}\n{{\"type\":").as_bytes(), "t").unwrap();
        assert_eq!(s.skipped_lines, vec![3]);
        let v4 = head.replace("\"version\":3", "\"version\":4");
        assert_eq!(read_pi(v4.as_bytes(), "t").unwrap_err().line, 1);
    }

    // ----- PiFile: the same commits as read_pi, a commit at a time -----

    /// `text` as a file of its own (gone with the directory).
    fn on_disk(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("session.jsonl");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    /// One reading of `f`, its commits collected.
    fn stream(f: &mut PiFile) -> Result<Vec<ImportCommit>, ExchangeError> {
        let want = f.session_id().clone();
        let mut out = Vec::new();
        f.for_each_commit(&mut |id, c| {
            assert_eq!(id, &want);
            out.push(c.clone());
            Ok(())
        })?;
        Ok(out)
    }

    /// `commits` without the ids a reading makes up: every commit id nil,
    /// and with `entry_ids` every entry id (and every reference to one)
    /// replaced by `n<index of the entry>`.
    fn normalised(commits: &[ImportCommit], entry_ids: bool) -> Vec<ImportCommit> {
        let mut names: HashMap<EntryId, EntryId> = HashMap::new();
        let mut out = commits.to_vec();
        for c in &mut out {
            c.commit_id = Uuid::nil();
            if !entry_ids {
                continue;
            }
            for ev in &mut c.events {
                let SessionEvent::EntryAppended { entry } = ev else {
                    continue;
                };
                let n = EntryId::parse(&format!("n{}", names.len())).unwrap();
                names.insert(entry.id.clone(), n);
                let rename = |id: &mut EntryId| {
                    if let Some(n) = names.get(id) {
                        *id = n.clone();
                    }
                };
                rename(&mut entry.id);
                if let Some(p) = entry.parent_id.as_mut() {
                    rename(p);
                }
                match &mut entry.kind {
                    EntryKind::Compaction {
                        first_kept_entry_id,
                        ..
                    } => rename(first_kept_entry_id),
                    EntryKind::Label { target_id, .. } => rename(target_id),
                    EntryKind::BranchSummary {
                        from_id: Some(f), ..
                    } => rename(f),
                    _ => {}
                }
            }
        }
        out
    }

    const V1: &str = concat!(
        r#"{"type":"session","id":"s1","timestamp":"2025-01-01T00:00:00.000Z","cwd":"/w"}"#,
        "\n",
        r#"{"type":"message","timestamp":"2025-01-01T00:00:01.000Z","message":{"role":"user","content":"a"}}"#,
        "\n",
        r#"{"type":"message","timestamp":"2025-01-01T00:00:02.000Z","message":{"role":"assistant","content":[{"type":"text","text":"b"}],"provider":"p","model":"m","stopReason":"stop"}}"#,
        "\n",
        r#"{"type":"thinking_level_change","timestamp":"2025-01-01T00:00:02.500Z","thinkingLevel":"high"}"#,
        "\n",
        "not json\n",
        r#"{"type":"compaction","timestamp":"2025-01-01T00:00:03.000Z","summary":"s","firstKeptEntryIndex":2,"tokensBefore":5}"#,
        "\n",
        r#"{"type":"compaction","summary":"t","firstKeptEntryIndex":99}"#,
        "\n",
        r#"{"type":"message","message":{"role":"user","content":"c","timestamp":1735689700000}}"#,
        "\n",
    );

    const V2: &str = concat!(
        r#"{"type":"session","version":2,"id":"s2","timestamp":"2025-01-01T00:00:00Z","cwd":"","parentSession":"p0"}"#,
        "\n",
        r#"{"type":"message","id":"a1","parentId":null,"timestamp":"2025-01-01T00:00:01Z","message":{"role":"user","content":"hi"}}"#,
        "\n",
        r#"{"type":"model_change","id":"b1","parentId":"a1","timestamp":"2025-01-01T00:00:02Z","provider":"side","modelId":"branch"}"#,
        "\n",
        r#"{"type":"thinking_level_change","id":"b2","parentId":"b1","timestamp":"2025-01-01T00:00:03Z","thinkingLevel":"low"}"#,
        "\n",
        "\n",
        r#"{"type":"model_change","id":"c0","parentId":"a1","timestamp":"2025-01-01T00:00:04Z","provider":"anthropic","modelId":"claude"}"#,
        "\n",
        r#"{"type":"message","id":"c1","parentId":"c0","timestamp":"2025-01-01T00:00:05Z","message":{"role":"hookMessage","customType":"h","content":"x","display":true}}"#,
        "\n",
        r#"{"type":"session_info","id":"c2","parentId":"c1","timestamp":"2025-01-01T00:00:06Z","name":" named "}"#,
        "\n",
        r#"{"type":"label","id":"c3","parentId":"c2","timestamp":"2025-01-01T00:00:07Z","targetId":"a1","label":"start"}"#,
        "\n",
        r#"{"type":"branch_summary","id":"c4","parentId":"c3","timestamp":"2025-01-01T00:00:08Z","fromId":"b2","summary":"gone"}"#,
        "\n",
    );

    /// A v3 file with skipped and blank lines and a bash execution.
    fn v3() -> String {
        let a = r#"{"type":"custom","id":"a1","parentId":null,"timestamp":"2025-01-01T00:00:00Z","customType":"x","data":{"k":[1,2]}}"#;
        let b = r#"{"type":"custom","id":"b1","parentId":"a1","timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
        let bash = r#"{"type":"message","id":"c1","parentId":"b1","timestamp":"2025-01-01T00:00:01Z","message":{"role":"bashExecution","command":"ls","output":"f","exitCode":1}}"#;
        let asst = r#"{"type":"message","id":"d1","parentId":"c1","timestamp":"2025-01-01T00:00:02Z","message":{"role":"assistant","provider":"openai","model":"gpt","stopReason":"toolUse","content":[{"type":"toolCall","id":"t1","name":"read","arguments":{"path":"x"}}],"usage":{"input":3,"output":4}}}"#;
        format!("{HEAD}\n{a}\n{a}{b}\n\n{b}\n{{\"type\":\n{bash}\n{asst}\n")
    }

    /// A linear v3 chain of `n` custom entries (v1 without ids).
    fn long(n: usize, v1: bool) -> String {
        let mut file = if v1 {
            String::from(r#"{"type":"session","id":"long","timestamp":"2025-01-01T00:00:00Z"}"#)
        } else {
            String::from(
                r#"{"type":"session","version":3,"id":"long","timestamp":"2025-01-01T00:00:00Z","cwd":""}"#,
            )
        };
        file.push('\n');
        for i in 0..n {
            if v1 {
                file.push_str(&format!(
                    r#"{{"type":"custom","timestamp":"2025-01-01T00:00:01Z","customType":"c","data":{i}}}"#
                ));
            } else {
                let parent = match i {
                    0 => "null".to_string(),
                    _ => format!("\"e{}\"", i - 1),
                };
                file.push_str(&format!(
                    r#"{{"type":"custom","id":"e{i}","parentId":{parent},"timestamp":"2025-01-01T00:00:01Z","customType":"c","data":{i}}}"#
                ));
            }
            file.push('\n');
        }
        file
    }

    /// Entries of about 1 MiB each: commits cut by bytes, not events.
    fn big_entries() -> String {
        let mut file = format!("{HEAD}\n");
        let text = "y".repeat(1 << 20);
        for i in 0..9 {
            let parent = match i {
                0 => "null".to_string(),
                _ => format!("\"u{}\"", i - 1),
            };
            file.push_str(&format!(
                r#"{{"type":"message","id":"u{i}","parentId":{parent},"timestamp":"2025-01-01T00:00:01Z","message":{{"role":"user","content":"{text}"}}}}"#
            ));
            file.push('\n');
        }
        file
    }

    fn samples() -> Vec<(&'static str, String)> {
        vec![
            ("v1", V1.to_string()),
            ("v2", V2.to_string()),
            ("v3", v3()),
            ("long v3", long(PI_COMMIT_EVENTS_MAX * 2 + 10, false)),
            ("long v1", long(PI_COMMIT_EVENTS_MAX + 5, true)),
            ("big entries", big_entries()),
        ]
    }

    #[test]
    fn a_pi_file_streams_the_commits_read_pi_makes() {
        for (name, text) in samples() {
            let whole = read_pi(text.as_bytes(), "t.jsonl").unwrap();
            let (_dir, path) = on_disk(&text);
            let mut f = PiFile::open(&path, "t.jsonl").unwrap();
            assert_eq!(f.file_version(), whole.file_version, "{name}");
            assert_eq!(f.skipped_lines(), whole.skipped_lines.as_slice(), "{name}");
            assert_eq!(f.session_id(), &whole.import.id, "{name}");
            let streamed = stream(&mut f).unwrap();
            let v1 = whole.file_version == 1;
            assert_eq!(
                normalised(&streamed, v1),
                normalised(&whole.import.commits, v1),
                "{name}"
            );
            // And the commits fold, as a session.
            let session = ImportSession {
                id: f.session_id().clone(),
                commits: streamed,
            };
            session.validate().unwrap();
        }
    }

    #[test]
    fn the_samples_cover_what_they_are_for() {
        let s = read_pi(V1.as_bytes(), "t").unwrap();
        assert_eq!(s.skipped_lines, vec![5]);
        let entries = entries_of(&s);
        // firstKeptEntryIndex 2 is the assistant message; 99 is no entry,
        // so the compaction keeps itself.
        let kept = |e: &Entry| match &e.kind {
            EntryKind::Compaction {
                first_kept_entry_id,
                ..
            } => first_kept_entry_id.clone(),
            k => panic!("{k:?}"),
        };
        assert_eq!(kept(entries[3]), entries[1].id);
        assert_eq!(kept(entries[4]), entries[4].id);
        let s = read_pi(big_entries().as_bytes(), "t").unwrap();
        assert!(s.import.commits.len() >= 3, "{}", s.import.commits.len());
        let s = read_pi(long(PI_COMMIT_EVENTS_MAX * 2 + 10, false).as_bytes(), "t").unwrap();
        assert_eq!(s.import.commits.len(), 3);
        let s = read_pi(long(PI_COMMIT_EVENTS_MAX + 5, true).as_bytes(), "t").unwrap();
        assert_eq!(s.import.commits.len(), 2);
    }

    #[test]
    fn the_settings_at_the_leaf_are_those_of_its_path() {
        let s = read_pi(V2.as_bytes(), "t").unwrap();
        let entries = entries_of(&s);
        // The leaf's path, root first, and path_settings over all of it.
        let by_id: HashMap<&EntryId, &Entry> = entries.iter().map(|e| (&e.id, *e)).collect();
        let mut path = vec![*entries.last().unwrap()];
        while let Some(p) = path.last().unwrap().parent_id.as_ref() {
            path.push(by_id[p]);
        }
        path.reverse();
        let (model, thinking) = path_settings(&path);
        assert_eq!(model, Some(("anthropic".into(), "claude".into())));
        assert_eq!(
            thinking, None,
            "the low thinking level is on another branch"
        );
        let SessionEvent::Created {
            definition,
            state,
            label,
            ..
        } = &s.import.commits[0].events[0]
        else {
            panic!()
        };
        assert_eq!(definition.model.model, "claude");
        assert_eq!(label, "named");
        assert!(!state.metadata.contains_key("pi.thinking_level"));
        assert!(state.metadata.contains_key("pi.parent_session"));
        // v1: a chain, so the file's last thinking level and model.
        let s = read_pi(V1.as_bytes(), "t").unwrap();
        let SessionEvent::Created {
            definition, state, ..
        } = &s.import.commits[0].events[0]
        else {
            panic!()
        };
        assert_eq!(definition.model.model, "m");
        assert_eq!(
            state.metadata.get("pi.thinking_level").map(|v| v.as_str()),
            Some(r#""high""#)
        );
    }

    #[test]
    fn every_reading_of_a_pi_file_makes_the_same_ids() {
        for text in [
            long(PI_COMMIT_EVENTS_MAX * 2 + 10, true),
            long(PI_COMMIT_EVENTS_MAX + 1, false),
        ] {
            let (_dir, path) = on_disk(&text);
            let mut f = PiFile::open(&path, "t").unwrap();
            let first = stream(&mut f).unwrap();
            let second = stream(&mut f).unwrap();
            assert_eq!(first, second);
            let ids: std::collections::HashSet<Uuid> = first.iter().map(|c| c.commit_id).collect();
            assert_eq!(ids.len(), first.len(), "distinct commit ids");
            for c in &first {
                assert_eq!(c.commit_id.get_version_num(), 4);
                assert_eq!(c.commit_id.get_variant(), uuid::Variant::RFC4122);
            }
            // Another PiFile over the same file makes up other ids.
            let other = stream(&mut PiFile::open(&path, "t").unwrap()).unwrap();
            assert_ne!(other[0].commit_id, first[0].commit_id);
        }
    }

    #[test]
    fn a_file_changed_after_open_fails_the_reading_without_a_panic() {
        let text = long(PI_COMMIT_EVENTS_MAX * 2 + 10, false);
        let lines: Vec<&str> = text.lines().collect();
        let with_line = |i: usize, new: &str| {
            let mut l = lines.clone();
            l[i] = new;
            l.join("\n") + "\n"
        };
        // Line 1500 is in the second commit (the first holds the header and
        // 1023 entries).
        let other_data = lines[1499].replace("\"data\":1498", "\"data\":-1");
        let cases: Vec<(&str, String, Option<u64>)> = vec![
            (
                "garbage",
                with_line(1499, r#"{"type":"bogus"}"#),
                Some(1500),
            ),
            ("other data", with_line(1499, &other_data), Some(1025)),
            ("cut", text[..text.len() / 2].to_string(), None),
            (
                "cut at a commit",
                lines[..1024].join("\n") + "\n",
                Some(1024),
            ),
            (
                "longer",
                format!("{text}{}\n", lines[1].replace("e0", "x0")),
                None,
            ),
            (
                "other header",
                text.replacen("\"cwd\":\"\"", "\"cwd\":\"/x\"", 1),
                Some(1),
            ),
            ("empty", String::new(), Some(0)),
        ];
        for (name, changed_text, line) in cases {
            let (_dir, path) = on_disk(&text);
            let mut f = PiFile::open(&path, "t").unwrap();
            let before = stream(&mut f).unwrap();
            std::fs::write(&path, &changed_text).unwrap();
            let mut seen = Vec::new();
            let e = f
                .for_each_commit(&mut |_, c| {
                    seen.push(c.clone());
                    Ok(())
                })
                .expect_err(name);
            match (&e, line) {
                (ExchangeError::Malformed { line: got, .. }, Some(want)) => {
                    assert_eq!(*got, want, "{name}: {e}")
                }
                (ExchangeError::Malformed { .. }, None) => {}
                _ => panic!("{name}: {e:?}"),
            }
            assert!(e.to_string().contains("changed"), "{name}: {e}");
            // Whatever was passed on before the error is what the file held.
            assert_eq!(seen[..], before[..seen.len()], "{name}");
        }
        // A file gone is an I/O error.
        let (dir, path) = on_disk(&text);
        let mut f = PiFile::open(&path, "t").unwrap();
        drop(dir);
        let e = f.for_each_commit(&mut |_, _| Ok(())).unwrap_err();
        assert!(matches!(e, ExchangeError::Io { .. }), "{e:?}");
        assert!(PiFile::open(&path, "t").is_err());
    }

    #[test]
    fn open_refuses_what_read_pi_refuses_on_the_same_line() {
        let head = r#"{"type":"session","version":3,"id":"s","timestamp":"2025-01-01T00:00:00Z","cwd":""}"#;
        let a = r#"{"type":"custom","id":"a1","parentId":null,"timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
        let with = |line: &str| format!("{head}\n{a}\n\n{line}\n");
        let bad = [
            String::new(),
            "\n\n".to_string(),
            format!("{a}\n"),
            "[1]\n".to_string(),
            head.replace("\"version\":3", "\"version\":4"),
            head.replace("\"id\":\"s\"", "\"id\":\"\""),
            head.replace("\"id\":\"s\"", "\"id\":7"),
            with(r#"{"type":"custom","id":"b1","parentId":"zz","customType":"x"}"#),
            with(a),
            with(head),
            with("[2]"),
            with(r#"{"id":"b1","parentId":"a1"}"#),
            with(r#"{"type":"custom","parentId":"a1","customType":"x"}"#),
            with(r#"{"type":"custom","id":"b 1","parentId":"a1","customType":"x"}"#),
            with(r#"{"type":"custom","id":"b1","parentId":"b1","customType":"x"}"#),
            with(r#"{"type":"custom","id":"b1","parentId":5,"customType":"x"}"#),
            with(r#"{"type":"nope","id":"b1","parentId":"a1"}"#),
            with(r#"{"type":"message","id":"b1","parentId":"a1","message":{"role":"robot"}}"#),
            with(
                r#"{"type":"message","id":"b1","parentId":"a1","message":{"role":"user","content":5}}"#,
            ),
            with(
                r#"{"type":"message","id":"b1","parentId":"a1","message":{"role":"assistant","stopReason":"tired"}}"#,
            ),
            with(r#"{"type":"label","id":"b1","parentId":"a1","targetId":"a b"}"#),
            with(r#"{"type":"model_change","id":"b1","parentId":"a1","provider":"p"}"#),
        ];
        for (i, text) in bad.iter().enumerate() {
            let want = read_pi(text.as_bytes(), "t").unwrap_err();
            let (_dir, path) = on_disk(text);
            let Err(got) = PiFile::open(&path, "t") else {
                panic!("case {i}: {text:?} was accepted");
            };
            assert_eq!(
                (got.line, &got.reason),
                (want.line, &want.reason),
                "case {i}"
            );
        }
        // Not UTF-8.
        let mut bytes = format!("{head}\n{a}\n").into_bytes();
        bytes.extend_from_slice(b"{\"x\":\"\xff\"}\n");
        let want = read_pi(bytes.as_slice(), "t").unwrap_err();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        std::fs::write(&path, &bytes).unwrap();
        let got = PiFile::open(&path, "t").err().unwrap();
        assert_eq!((got.line, got.reason), (want.line, want.reason));
        assert_eq!(want.line, 3);
    }

    #[test]
    fn the_id_index_finds_every_id_and_grows() {
        let mut ids = IdIndex::new();
        let n = 10_000u32;
        for i in 0..n {
            assert_eq!(ids.push(&format!("id{i}")).unwrap(), i);
        }
        for i in 0..n {
            assert_eq!(ids.find(&format!("id{i}")), Some(i));
            assert_eq!(ids.get(i as usize), Some(format!("id{i}").as_str()));
        }
        assert_eq!(ids.find("id10000"), None);
        assert_eq!(ids.get(n as usize), None);
        assert_eq!(ids.last(), Some("id9999"));
        assert!(ids.slots.len() >= 2 * n as usize);
    }
}
