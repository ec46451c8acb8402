//! Reading a `spool-export` file: bounded lines, the commit grouping and
//! the end line's totals, checked as the lines come.

use super::*;

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

/// Reads one line of at most `max` bytes into `buf` (without the newline).
/// `Ok(None)` at end of input; `Ok(Some(true))` when the line ended with a
/// newline, `Some(false)` when the input ended first.
pub(crate) fn read_line_bounded<R: BufRead>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    buf.clear();
    let mut any = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok(if any { Some(false) } else { None });
        }
        any = true;
        let (take, done) = match memchr::memchr(b'\n', chunk) {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if buf.len().saturating_add(take) > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line longer than {max} bytes"),
            ));
        }
        buf.extend_from_slice(&chunk[..take]);
        r.consume(if done { take + 1 } else { take });
        if done {
            return Ok(Some(true));
        }
    }
}

/// Any line after the header, parsed straight into its fields (no
/// intermediate JSON tree of the line): an end line has `end`, an event
/// line the rest.
#[derive(Deserialize)]
pub(super) struct BodyLine {
    end: Option<bool>,
    sessions: Option<u64>,
    commits: Option<u64>,
    events: Option<u64>,
    session: Option<SessionId>,
    version: Option<u64>,
    commit_id: Option<Uuid>,
    timestamp_ms: Option<i64>,
    index: Option<u32>,
    events_in_commit: Option<u32>,
    event: Option<SessionEvent>,
}

fn json_reason(what: &str, e: &serde_json::Error) -> String {
    format!(
        "{what} ({e}){}",
        if e.is_eof() {
            "; the file may be truncated"
        } else {
            ""
        }
    )
}

/// Reads a `spool-export` file a commit or a session at a time, checking
/// every line (header, commit grouping, contiguous sessions, the end line
/// and its totals) as it goes; the sessions are not folded here (see
/// [`ImportSession::validate`]). Memory holds one commit
/// ([`ExportReader::next_commit`]) or one session
/// ([`ExportReader::next_session`]), not the file.
pub struct ExportReader<R> {
    r: R,
    buf: Vec<u8>,
    line_no: u64,
    header: ExportHeader,
    /// A commit read ahead by [`ExportReader::next_session`]: the first of
    /// the next session.
    peeked: Option<(SessionId, ImportCommit)>,
    commits: Commits,
}

/// One line after the header, parsed on its own (what needs no other line).
// Almost every line is `Parsed`: boxing it would allocate once per line.
#[allow(clippy::large_enum_variant)]
pub(super) enum Line {
    Blank,
    /// Not UTF-8: why.
    NotUtf8(String),
    /// The line's fields, or why it is not a `spool-export` line.
    Parsed(Result<BodyLine, String>),
}

/// Parses one line (without its newline) after the header.
pub(super) fn parse_line(bytes: &[u8]) -> Line {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => return Line::NotUtf8(format!("not UTF-8: {e}")),
    };
    if text.trim().is_empty() {
        return Line::Blank;
    }
    Line::Parsed(serde_json::from_str(text).map_err(|e| json_reason("not a spool-export line", &e)))
}

/// The commits of a file's lines, checked as they come in order (commit
/// grouping, contiguous sessions, the end line and its totals).
#[derive(Default)]
pub(super) struct Commits {
    /// The session being read and the version of its last commit.
    cur: Option<(SessionId, u64)>,
    /// The commit being read, with the number of events it announced.
    open: Option<(SessionId, ImportCommit, u32)>,
    seen_ids: HashSet<SessionId>,
    totals: ExportCounts,
    end_line: Option<u64>,
}

impl<R: BufRead> ExportReader<R> {
    /// Reads and checks the header line.
    pub fn new(mut r: R) -> Result<Self, ExchangeError> {
        let mut buf = Vec::new();
        let mut line_no = 0u64;
        let header = loop {
            let had = read_line_bounded(&mut r, &mut buf, EXPORT_LINE_BYTES_MAX).map_err(|e| {
                ExchangeError::Malformed {
                    line: line_no + 1,
                    reason: e.to_string(),
                }
            })?;
            if had.is_none() {
                return Err(ExchangeError::Malformed {
                    line: line_no.max(1),
                    reason: "empty file: no spool-export header".into(),
                });
            }
            line_no += 1;
            let malformed = |reason: String| ExchangeError::Malformed {
                line: line_no,
                reason,
            };
            let text =
                std::str::from_utf8(&buf).map_err(|e| malformed(format!("not UTF-8: {e}")))?;
            if text.trim().is_empty() {
                continue;
            }
            let h: ExportHeader = serde_json::from_str(text)
                .map_err(|e| malformed(json_reason("not a spool-export header", &e)))?;
            if h.format != EXPORT_FORMAT {
                return Err(malformed(format!(
                    "format {:?} is not {EXPORT_FORMAT:?}",
                    h.format
                )));
            }
            if h.version == 0 || h.version > EXPORT_VERSION {
                return Err(malformed(format!(
                    "spool-export version {} is not supported (this build reads 1..={EXPORT_VERSION})",
                    h.version
                )));
            }
            break h;
        };
        Ok(ExportReader {
            r,
            buf,
            line_no,
            header,
            peeked: None,
            commits: Commits::default(),
        })
    }

    /// The input after the header, the number of lines read so far and the
    /// commits' state (for a reader that splits the lines elsewhere), unless a
    /// commit was read ahead.
    pub(super) fn into_parts(self) -> Result<(R, u64, Commits), Box<Self>> {
        match self.peeked {
            Some(_) => Err(Box::new(self)),
            None => Ok((self.r, self.line_no, self.commits)),
        }
    }

    /// The file's header.
    pub fn header(&self) -> &ExportHeader {
        &self.header
    }

    /// The next session, `None` after the end line (once the rest of the
    /// file is checked to be blank).
    pub fn next_session(&mut self) -> Result<Option<ImportSession>, ExchangeError> {
        let Some((id, first)) = self.next_commit()? else {
            return Ok(None);
        };
        let mut session = ImportSession {
            id,
            commits: vec![first],
        };
        loop {
            match self.next_commit()? {
                Some((id, c)) if id == session.id => session.commits.push(c),
                Some(next) => {
                    self.peeked = Some(next);
                    return Ok(Some(session));
                }
                None => return Ok(Some(session)),
            }
        }
    }

    /// The next commit and the session it belongs to, `None` after the end
    /// line (once the rest of the file is checked to be blank). A session's
    /// commits come one after the other, in version order from 1.
    pub fn next_commit(&mut self) -> Result<Option<(SessionId, ImportCommit)>, ExchangeError> {
        if let Some(c) = self.peeked.take() {
            return Ok(Some(c));
        }
        loop {
            let had = read_line_bounded(&mut self.r, &mut self.buf, EXPORT_LINE_BYTES_MAX)
                .map_err(|e| ExchangeError::Malformed {
                    line: self.line_no + 1,
                    reason: e.to_string(),
                })?;
            if had.is_none() {
                return self.commits.finish(self.line_no).map(|()| None);
            }
            self.line_no += 1;
            if let Some(c) = self.commits.accept(self.line_no, parse_line(&self.buf))? {
                return Ok(Some(c));
            }
        }
    }
}

impl Commits {
    /// The end of the file after line `last`: fine after the end line.
    pub(super) fn finish(&self, last: u64) -> Result<(), ExchangeError> {
        match self.end_line {
            Some(_) => Ok(()),
            None => Err(ExchangeError::Truncated { line: last }),
        }
    }

    /// Takes line `line_no`; the commit it completes, if any.
    pub(super) fn accept(
        &mut self,
        line_no: u64,
        line: Line,
    ) -> Result<Option<(SessionId, ImportCommit)>, ExchangeError> {
        let malformed = |reason: String| ExchangeError::Malformed {
            line: line_no,
            reason,
        };
        let line = match line {
            Line::Blank => return Ok(None),
            Line::NotUtf8(reason) => return Err(malformed(reason)),
            Line::Parsed(line) => line,
        };
        if let Some(end_line) = self.end_line {
            return Err(malformed(format!(
                "data after the end line (line {end_line})"
            )));
        }
        let line = line.map_err(malformed)?;
        if let Some(end) = line.end {
            let (Some(sessions), Some(commits), Some(events)) =
                (line.sessions, line.commits, line.events)
            else {
                return Err(malformed(
                    "malformed end line: it needs sessions, commits and events".into(),
                ));
            };
            if let Some((_, c, n)) = &self.open {
                return Err(malformed(format!(
                    "end line inside a commit ({n} events announced, {} given)",
                    c.events.len()
                )));
            }
            let t = self.totals;
            if !end || sessions != t.sessions || commits != t.commits || events != t.events {
                return Err(malformed(format!(
                    "end line says {sessions} sessions, {commits} commits, {events} events; the file has {}, {}, {}",
                    t.sessions, t.commits, t.events
                )));
            }
            self.end_line = Some(line_no);
            return Ok(None);
        }
        let missing = |f: &str| malformed(format!("malformed event line: missing field `{f}`"));
        let ev = ExportEventLine {
            session: line.session.ok_or_else(|| missing("session"))?,
            version: line.version.ok_or_else(|| missing("version"))?,
            commit_id: line.commit_id.ok_or_else(|| missing("commit_id"))?,
            timestamp_ms: line.timestamp_ms.ok_or_else(|| missing("timestamp_ms"))?,
            index: line.index.ok_or_else(|| missing("index"))?,
            events_in_commit: line
                .events_in_commit
                .ok_or_else(|| missing("events_in_commit"))?,
            event: line.event.ok_or_else(|| missing("event"))?,
        };
        if ev.events_in_commit == 0 || ev.index >= ev.events_in_commit {
            return Err(malformed(format!(
                "event index {} of a commit of {} events",
                ev.index, ev.events_in_commit
            )));
        }
        match self.open.as_mut() {
            Some((id, commit, n)) => {
                // Continue the open commit of the current session.
                if *id != ev.session
                    || commit.version != ev.version
                    || commit.commit_id != ev.commit_id
                {
                    return Err(malformed(
                        "the previous commit is incomplete (this line belongs to another commit)"
                            .into(),
                    ));
                }
                if *n != ev.events_in_commit
                    || ev.index as usize != commit.events.len()
                    || ev.timestamp_ms != commit.timestamp_ms
                {
                    return Err(malformed(format!(
                        "event {} of commit {} does not continue it",
                        ev.index, ev.commit_id
                    )));
                }
                commit.events.push(ev.event);
                commit.lines.push(line_no);
            }
            None => {
                if ev.index != 0 {
                    return Err(malformed(format!(
                        "a commit starts with event index {}",
                        ev.index
                    )));
                }
                let same = self.cur.as_ref().is_some_and(|(id, _)| *id == ev.session);
                if !same {
                    if !self.seen_ids.insert(ev.session.clone()) {
                        return Err(malformed(format!(
                            "session {} appears again after other sessions (its lines must be contiguous)",
                            ev.session
                        )));
                    }
                    self.cur = Some((ev.session.clone(), 0));
                    self.totals.sessions += 1;
                }
                let last = self.cur.as_ref().map_or(0, |(_, v)| *v);
                if ev.version != last + 1 {
                    return Err(malformed(format!(
                        "session {}: expected version {}, found {}",
                        ev.session,
                        last + 1,
                        ev.version
                    )));
                }
                if let Some((_, v)) = self.cur.as_mut() {
                    *v = ev.version;
                }
                let commit = ImportCommit {
                    version: ev.version,
                    commit_id: ev.commit_id,
                    timestamp_ms: ev.timestamp_ms,
                    events: vec![ev.event],
                    lines: vec![line_no],
                };
                self.open = Some((ev.session, commit, ev.events_in_commit));
                self.totals.commits += 1;
            }
        }
        self.totals.events += 1;
        let complete = self
            .open
            .as_ref()
            .is_some_and(|(_, c, n)| c.events.len() as u32 == *n);
        if complete {
            if let Some((id, c, _)) = self.open.take() {
                return Ok(Some((id, c)));
            }
        }
        Ok(None)
    }
}

/// Parses a whole `spool-export` file into memory (see [`ExportReader`]
/// for a reader that holds one session at a time).
pub fn read_export<R: BufRead>(r: R) -> Result<Vec<ImportSession>, ExchangeError> {
    let mut reader = ExportReader::new(r)?;
    let mut sessions = Vec::new();
    while let Some(s) = reader.next_session()? {
        sessions.push(s);
    }
    Ok(sessions)
}
