//! Reading a `spool-export` file ahead of its import: its lines are read on a
//! second thread and parsed there and on a third, while the importing thread
//! checks the commits before them.
//!
//! Parsing is most of a check pass's work, more than the checks on the
//! importing thread, and a single reading thread bounded the pass. The reader
//! splits the file into chunks of lines and parses every other one itself; a
//! parser thread parses the others. The importing thread takes the chunks in
//! file order, parsed, and groups their lines into commits (what needs the
//! lines before). The reader stops once [`AHEAD_BYTES_MAX`] bytes of lines are
//! read and not yet imported, so a file of large lines is held at most a few
//! megabytes, or one line, ahead of the import. Commits, and an error in the
//! file, reach the import in file order, as they do when it reads the file
//! itself (which it does if no thread can be started).

use super::read::{parse_line, read_line_bounded, Commits, ExportReader, Line};
use super::{ExchangeError, ImportCommit, EXPORT_LINE_BYTES_MAX};
use crate::session::SessionId;
use std::io::BufRead;
use std::sync::{mpsc, Condvar, Mutex};

/// Most bytes of lines read and not yet imported, each counted with what holding
/// it costs ([`line_cost`]): the reader waits below it (a single larger line is
/// read, then waited out).
const AHEAD_BYTES_MAX: u64 = 4 << 20;
/// A chunk of lines is handed over once it holds this many bytes ([`line_cost`]) ...
const BATCH_BYTES_MAX: u64 = 256 << 10;

/// What a line counts against the bounds: its bytes with its newline, and
/// what holding it costs until it is imported (its end in the chunk, then
/// its parse), so that blank or very short lines are bounded too.
fn line_cost(text_bytes: usize) -> u64 {
    let held = std::mem::size_of::<usize>() + std::mem::size_of::<(u64, Line)>();
    (text_bytes + 1 + held) as u64
}
/// ... or this many lines.
const BATCH_LINES_MAX: usize = 256;

/// Bytes of lines handed over and not yet imported; the reader waits on it.
#[derive(Default)]
struct Ahead {
    state: Mutex<AheadState>,
    changed: Condvar,
}

#[derive(Default)]
struct AheadState {
    bytes: u64,
    /// The import left: the reader stops.
    stopped: bool,
    /// The reader waits for room (tests).
    parked: bool,
    /// The reader is done (tests).
    finished: bool,
}

impl Ahead {
    fn lock(&self) -> std::sync::MutexGuard<'_, AheadState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, bytes: u64) {
        self.lock().bytes += bytes;
    }

    fn done(&self, bytes: u64) {
        let mut s = self.lock();
        s.bytes = s.bytes.saturating_sub(bytes);
        self.changed.notify_all();
    }

    /// Waits until less than [`AHEAD_BYTES_MAX`] is ahead; false once the import
    /// stopped.
    fn wait_room(&self) -> bool {
        let mut s = self.lock();
        while s.bytes >= AHEAD_BYTES_MAX && !s.stopped {
            s.parked = true;
            self.changed.notify_all();
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.parked = false;
        !s.stopped
    }

    fn set(&self, change: impl FnOnce(&mut AheadState)) {
        change(&mut self.lock());
        self.changed.notify_all();
    }
}

/// Stops the reader when the import leaves, however it leaves.
struct StopOnDrop<'a>(&'a Ahead);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set(|s| s.stopped = true);
    }
}

/// Calls `f` with every commit of `reader` in file order, the file parsed ahead on a
/// second thread; the first error of `f` or of the file ends it.
pub(super) fn for_each_read_ahead<R: BufRead + Send>(
    reader: ExportReader<R>,
    f: &mut dyn FnMut(&SessionId, &ImportCommit) -> Result<(), ExchangeError>,
) -> Result<(), ExchangeError> {
    read_ahead_with(reader, f, &Ahead::default())
}

fn read_ahead_with<R: BufRead + Send>(
    reader: ExportReader<R>,
    f: &mut dyn FnMut(&SessionId, &ImportCommit) -> Result<(), ExchangeError>,
    ahead: &Ahead,
) -> Result<(), ExchangeError> {
    let (r, lines_before, commits) = match reader.into_parts() {
        Ok(parts) => parts,
        Err(mut reader) => {
            while let Some((id, c)) = reader.next_commit()? {
                f(&id, &c)?;
            }
            return Ok(());
        }
    };
    let r = &Mutex::new(r);
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        let (work_tx, work_rx) = mpsc::channel::<(Chunk, mpsc::SyncSender<Parsed>)>();
        // A parser for every other chunk; the reader parses the rest. Without
        // it the reader parses them all.
        let parser = std::thread::Builder::new()
            .name("spool-import-parse".into())
            .spawn_scoped(scope, move || {
                for (chunk, done) in work_rx {
                    let _ = done.send(parse(chunk));
                }
            })
            .ok();
        let helped = parser.is_some();
        // The senders move to the reader: the channels end when it does.
        let spawned = std::thread::Builder::new()
            .name("spool-import-read".into())
            .spawn_scoped(scope, move || {
                let mut r = r.lock().unwrap_or_else(|e| e.into_inner());
                let work = helped.then_some(work_tx);
                split(&mut *r, lines_before, &tx, work.as_ref(), ahead);
                ahead.set(|s| s.finished = true);
            });
        let Ok(handle) = spawned else {
            // No reader: this thread reads and parses the lines itself.
            let mut r = r.lock().unwrap_or_else(|e| e.into_inner());
            return read_in_place(&mut *r, lines_before, commits, f);
        };
        let imported = import_chunks(rx, commits, f, ahead);
        // A panic of the reader or the parser (a bug) reaches the caller as it
        // was raised.
        for h in std::iter::once(handle).chain(parser) {
            if let Err(panic) = h.join() {
                std::panic::resume_unwind(panic);
            }
        }
        imported
    })
}

/// Raw lines for a parser: their bytes end to end.
struct Chunk {
    /// The line number of the first line.
    first_line: u64,
    text: Vec<u8>,
    /// Where each line ends in `text`.
    ends: Vec<usize>,
    /// The lines' cost against the bound ([`line_cost`]).
    cost: u64,
}

/// A chunk's lines parsed, with their numbers (blank ones left out), and
/// its cost against the bound.
struct Parsed {
    lines: Vec<(u64, Line)>,
    cost: u64,
}

/// What the reader hands the import, in file order.
enum Piece {
    /// A chunk, parsed by the time it is received.
    Chunk(mpsc::Receiver<Parsed>),
    /// The end of the file after this many lines.
    End(u64),
    /// A line that could not be read (after the chunks before it).
    Failed(ExchangeError),
}

fn parse(chunk: Chunk) -> Parsed {
    let mut lines = Vec::with_capacity(chunk.ends.len());
    let mut start = 0;
    for (k, &end) in chunk.ends.iter().enumerate() {
        let line_no = chunk.first_line + k as u64;
        match parse_line(&chunk.text[start..end]) {
            // A blank line changes nothing (see `Commits::accept`).
            Line::Blank => {}
            line => lines.push((line_no, line)),
        }
        start = end;
    }
    Parsed {
        lines,
        cost: chunk.cost,
    }
}

/// Reads and parses the lines after line `line_no` on this thread.
fn read_in_place<R: BufRead>(
    r: &mut R,
    mut line_no: u64,
    mut commits: Commits,
    f: &mut dyn FnMut(&SessionId, &ImportCommit) -> Result<(), ExchangeError>,
) -> Result<(), ExchangeError> {
    let mut buf = Vec::new();
    loop {
        let read = read_line_bounded(r, &mut buf, EXPORT_LINE_BYTES_MAX);
        match read.map_err(|e| too_long(line_no + 1, e))? {
            None => return commits.finish(line_no),
            Some(_) => line_no += 1,
        }
        if let Some((id, c)) = commits.accept(line_no, parse_line(&buf))? {
            f(&id, &c)?;
        }
    }
}

fn too_long(line: u64, e: std::io::Error) -> ExchangeError {
    ExchangeError::Malformed {
        line,
        reason: e.to_string(),
    }
}

/// The importing side: every chunk's lines made commits, in order, through
/// `f`. The reader is stopped when this returns, however it returns.
fn import_chunks(
    rx: mpsc::Receiver<Piece>,
    mut commits: Commits,
    f: &mut dyn FnMut(&SessionId, &ImportCommit) -> Result<(), ExchangeError>,
    ahead: &Ahead,
) -> Result<(), ExchangeError> {
    let _stop = StopOnDrop(ahead);
    for piece in rx {
        let parsed = match piece {
            Piece::Chunk(parsed) => parsed,
            Piece::End(lines) => return commits.finish(lines),
            Piece::Failed(e) => return Err(e),
        };
        // No chunk: its parser panicked (the caller raises the panic).
        let Ok(Parsed { lines, cost }) = parsed.recv() else {
            break;
        };
        for (line_no, line) in lines {
            if let Some((id, c)) = commits.accept(line_no, line)? {
                f(&id, &c)?;
            }
        }
        ahead.done(cost);
    }
    // The reader ended without the end of the file: it panicked (the caller
    // raises the panic).
    Err(ExchangeError::Io {
        context: "reading the file ahead of the import".into(),
        source: std::io::Error::other("the reading thread stopped"),
    })
}

/// The reader's side: the lines after line `line_no`, in chunks of at most
/// [`BATCH_LINES_MAX`] lines or [`BATCH_BYTES_MAX`] bytes (or one line), each
/// parsed here or, every other one, by the parser behind `work`; then the end
/// of the file or the line that could not be read. Ends early once the import
/// stopped.
fn split<R: BufRead>(
    r: &mut R,
    mut line_no: u64,
    tx: &mpsc::Sender<Piece>,
    work: Option<&mpsc::Sender<(Chunk, mpsc::SyncSender<Parsed>)>>,
    ahead: &Ahead,
) {
    let mut buf = Vec::new();
    for k in 0u64.. {
        let mut chunk = Chunk {
            first_line: line_no + 1,
            text: Vec::new(),
            ends: Vec::new(),
            cost: 0,
        };
        let mut end = None;
        while chunk.ends.len() < BATCH_LINES_MAX && chunk.cost < BATCH_BYTES_MAX {
            match read_line_bounded(r, &mut buf, EXPORT_LINE_BYTES_MAX) {
                Ok(Some(_)) => {
                    line_no += 1;
                    chunk.text.extend_from_slice(&buf);
                    chunk.ends.push(chunk.text.len());
                    chunk.cost += line_cost(buf.len());
                }
                Ok(None) => {
                    end = Some(Piece::End(line_no));
                    break;
                }
                Err(e) => {
                    end = Some(Piece::Failed(too_long(line_no + 1, e)));
                    break;
                }
            }
        }
        if !chunk.ends.is_empty() {
            let (done_tx, done_rx) = mpsc::sync_channel(1);
            ahead.add(chunk.cost);
            if tx.send(Piece::Chunk(done_rx)).is_err() {
                return;
            }
            match work {
                Some(w) if k % 2 == 1 => {
                    if w.send((chunk, done_tx)).is_err() {
                        return;
                    }
                }
                _ => {
                    let _ = done_tx.send(parse(chunk));
                }
            }
        }
        if let Some(piece) = end {
            let _ = tx.send(piece);
            return;
        }
        if !ahead.wait_room() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{AgentDefinition, AgentSession};
    use crate::store::exchange::ExportWriter;
    use crate::store::{LogStore, LogStoreOptions, SessionStore};
    use crate::transcript::{ContentBlock, EntryKind, Message};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// An export of `sessions` sessions of three appends of `text_bytes` each.
    fn export_of(sessions: usize, text_bytes: usize) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let opts = LogStoreOptions {
            durability: spool_engine::Durability::Buffered,
            ..Default::default()
        };
        let store = LogStore::open(dir.path(), opts).unwrap();
        let mut w = ExportWriter::new(Vec::new()).unwrap();
        for n in 0..sessions {
            let def = AgentDefinition::new("a", "d", "p");
            let mut s = store.create(AgentSession::new(def, None)).unwrap();
            for i in 0..3 {
                let text = format!("{n}/{i} {}", "x".repeat(text_bytes));
                s.append(EntryKind::Message {
                    message: Message::User {
                        content: vec![ContentBlock::text(text)],
                    },
                })
                .unwrap();
                s = store.save(s).unwrap();
            }
            w.session(&store, s.id()).unwrap();
        }
        w.finish().unwrap().0
    }

    type Read = (Vec<(SessionId, ImportCommit)>, Option<String>);

    /// What the import sees reading `bytes` itself.
    fn in_place(bytes: &[u8]) -> Read {
        let mut r = ExportReader::new(bytes).unwrap();
        let mut got = Vec::new();
        loop {
            match r.next_commit() {
                Ok(Some(c)) => got.push(c),
                Ok(None) => return (got, None),
                Err(e) => return (got, Some(e.to_string())),
            }
        }
    }

    /// What the import sees with the file read ahead.
    fn read_ahead(bytes: &[u8]) -> Read {
        let mut got = Vec::new();
        let r = ExportReader::new(bytes).unwrap();
        let res = for_each_read_ahead(r, &mut |id, c| {
            got.push((id.clone(), c.clone()));
            Ok(())
        });
        (got, res.err().map(|e| e.to_string()))
    }

    /// Every commit, in file order, in several batches; and a file damaged in the
    /// middle or cut short gives the commits before the damage, then its error, as
    /// reading it in place does.
    #[test]
    fn the_import_sees_the_file_as_it_reads_it_in_place() {
        let bytes = export_of(120, 1000);
        let whole = in_place(&bytes);
        assert_eq!(whole.1, None);
        assert_eq!(whole.0.len(), 480);
        assert_eq!(read_ahead(&bytes), whole);
        let mid = bytes.len() / 2;
        let line = mid + bytes[mid..].iter().position(|&b| b == b'\n').unwrap() + 1;
        let mut damaged = bytes.clone();
        damaged[line] = b'#';
        let cut = &bytes[..bytes.len() - 20];
        let mut not_utf8 = bytes.clone();
        not_utf8[line + 3] = 0xFF;
        let mut blank_lines = bytes[..line].to_vec();
        blank_lines.extend_from_slice(b"\n  \n");
        blank_lines.extend_from_slice(&bytes[line..]);
        let spaced = in_place(&blank_lines);
        assert_eq!((spaced.0.len(), &spaced.1), (480, &None));
        assert_eq!(read_ahead(&blank_lines), spaced);
        let mut after_end = bytes.clone();
        after_end.extend_from_slice(b"{}\n");
        for file in [&damaged[..], cut, &not_utf8[..], &after_end[..]] {
            let want = in_place(file);
            assert!(want.1.is_some());
            assert!(!want.0.is_empty());
            assert_eq!(read_ahead(file), want);
        }
    }

    /// Runs `f` on a thread of its own: `None` if it takes longer than `secs` (a hang
    /// fails the test instead of hanging it).
    fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(secs)).ok()
    }

    /// Waits until the reader is parked at the bound or done; whether it is parked.
    fn parked_or_done(ahead: &Ahead) -> bool {
        let mut s = ahead.lock();
        while !s.parked && !s.finished {
            s = ahead.changed.wait(s).unwrap();
        }
        s.parked
    }

    /// An error of the import ends the read, also while the reader waits at its
    /// bound: it is what the call returns, and no commit after it reaches the import.
    #[test]
    fn an_error_of_the_import_ends_the_read() {
        let small = export_of(120, 1000);
        let large = export_of(60, 64 << 10);
        assert!(large.len() as u64 > 2 * AHEAD_BYTES_MAX);
        for (bytes, at) in [(small, 300), (large, 1)] {
            let got = within(60, move || {
                let ahead = Ahead::default();
                let r = ExportReader::new(&bytes[..]).unwrap();
                let mut seen = 0;
                let res = read_ahead_with(
                    r,
                    &mut |_, _| {
                        seen += 1;
                        if seen < at {
                            return Ok(());
                        }
                        if at == 1 {
                            assert!(parked_or_done(&ahead), "the reader waits at its bound");
                        }
                        Err(ExchangeError::Malformed {
                            line: 0,
                            reason: "stop here".into(),
                        })
                    },
                    &ahead,
                );
                (seen, res.map_err(|e| e.to_string()))
            });
            let (seen, res) = got.expect("the read ended");
            assert!(res.unwrap_err().contains("stop here"));
            assert_eq!(seen, at);
        }
    }

    /// Counts the bytes read from the file.
    struct Counted<'a>(&'a [u8], Arc<AtomicU64>);

    impl std::io::Read for Counted<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1.fetch_add(n as u64, Ordering::SeqCst);
            Ok(n)
        }
    }

    /// Where the reader is while the import holds the first commit of `bytes`:
    /// parked at its bound (or done), and the bytes it has read of the file.
    fn at_first_commit(bytes: Vec<u8>) -> (bool, u64) {
        let got = within(120, move || {
            let read = Arc::new(AtomicU64::new(0));
            let file = std::io::BufReader::with_capacity(1 << 16, Counted(&bytes, read.clone()));
            let r = ExportReader::new(file).unwrap();
            let ahead = Ahead::default();
            let mut first = None;
            read_ahead_with(
                r,
                &mut |_, _| {
                    if first.is_none() {
                        first = Some((parked_or_done(&ahead), read.load(Ordering::SeqCst)));
                    }
                    Ok(())
                },
                &ahead,
            )
            .unwrap();
            first.unwrap()
        });
        got.expect("the read ended")
    }

    /// While the import holds its first commit, the reader stops, parked, about
    /// `AHEAD_BYTES_MAX` ahead of it, not at the end of the file.
    #[test]
    fn the_reader_stops_a_bounded_distance_ahead() {
        let line_bytes = 64 << 10;
        let bytes = export_of(60, line_bytes);
        assert!(bytes.len() as u64 > 2 * AHEAD_BYTES_MAX);
        let (parked, most) = at_first_commit(bytes);
        let bound = AHEAD_BYTES_MAX + BATCH_BYTES_MAX + 4 * line_bytes as u64 + (64 << 10);
        assert!(parked, "the reader read the whole file ({most} bytes)");
        assert!(most <= bound, "read {most} bytes ahead (bound {bound})");
    }

    /// Fails its read halfway through the file, as a bug would.
    struct PanicsHalfway<'a>(&'a [u8], usize);

    impl std::io::Read for PanicsHalfway<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            assert!(self.0.len() > self.1, "the reader's own panic");
            self.0.read(buf)
        }
    }

    /// A panic of the reader reaches the caller with its own message, never an `Ok`
    /// with commits missing.
    #[test]
    fn a_panic_of_the_reader_reaches_the_caller_as_raised() {
        let bytes = export_of(40, 1000);
        let half = bytes.len() / 2;
        let got = within(60, move || {
            let file = std::io::BufReader::with_capacity(4096, PanicsHalfway(&bytes, half));
            let r = ExportReader::new(file).unwrap();
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                for_each_read_ahead(r, &mut |_, _| Ok(()))
            }));
            match caught {
                Ok(res) => format!("returned {res:?}"),
                Err(p) => p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default(),
            }
        });
        assert_eq!(got.as_deref(), Some("the reader's own panic"));
    }

    /// A reader that fails with an I/O error once `at` bytes are read.
    struct FailsAt<'a>(&'a [u8], usize);

    impl std::io::Read for FailsAt<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.1 == 0 {
                return Err(std::io::Error::other("the disk failed"));
            }
            let n = buf.len().min(self.1).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            self.1 -= n;
            Ok(n)
        }
    }

    fn lines_of(bytes: &[u8]) -> Vec<Vec<u8>> {
        bytes
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| l.to_vec())
            .collect()
    }

    fn joined(lines: &[Vec<u8>], newline_at_end: bool) -> Vec<u8> {
        let mut out = lines.join(&b'\n');
        if newline_at_end {
            out.push(b'\n');
        }
        out
    }

    /// Every kind of bad input (and tiny files, exactly one chunk) gives, read
    /// ahead, what reading in place gives: the same commits, the same error.
    #[test]
    fn every_bad_input_reads_as_in_place() {
        let bytes = export_of(3, 10);
        let lines = lines_of(&bytes);
        let n = lines.len();
        let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
        cases.push(("whole".into(), bytes.clone()));
        cases.push(("header only".into(), joined(&lines[..1], true)));
        cases.push(("header only, no newline".into(), joined(&lines[..1], false)));
        let mut blanks = joined(&lines[..1], true);
        blanks.extend_from_slice(b"\n  \n\n");
        cases.push(("header then blank lines".into(), blanks));
        for k in [2, 3, n - 1] {
            cases.push((format!("cut after line {k}"), joined(&lines[..k], true)));
            cases.push((
                format!("cut after line {k}, no newline"),
                joined(&lines[..k], false),
            ));
        }
        // The end line inside a commit: a commit announcing 2 events, then the end.
        let mut open = lines[..2].to_vec();
        let l = String::from_utf8(open[1].clone()).unwrap();
        open[1] = l
            .replace("\"events_in_commit\":1", "\"events_in_commit\":2")
            .into_bytes();
        assert_ne!(open[1], lines[1]);
        open.push(lines[n - 1].clone());
        cases.push(("end line inside a commit".into(), joined(&open, true)));
        let mut after = bytes.clone();
        after.extend_from_slice(b"\n\xff\xfe\n");
        cases.push(("non-UTF-8 after the end".into(), after));
        let mut after = bytes.clone();
        after.extend_from_slice(b"  \n\n");
        cases.push(("blanks after the end".into(), after));
        // Exactly one chunk of lines after the header (BATCH_LINES_MAX), and one
        // more: padded with blank lines before the end line.
        for total in [BATCH_LINES_MAX, BATCH_LINES_MAX + 1, 2 * BATCH_LINES_MAX] {
            let mut ls = lines[..n - 1].to_vec();
            while ls.len() - 1 < total - 1 {
                ls.push(Vec::new());
            }
            ls.push(lines[n - 1].clone());
            assert_eq!(ls.len() - 1, total);
            cases.push((format!("{total} lines"), joined(&ls, true)));
            let mut cut = ls.clone();
            cut.pop();
            cases.push((format!("{total} lines, no end"), joined(&cut, true)));
        }
        for (what, file) in &cases {
            let want = in_place(file);
            assert_eq!(read_ahead(file), want, "{what}");
            assert_eq!(fallback(file), want, "{what}, without threads");
        }
    }

    /// What the import sees when no reading thread can be started.
    fn fallback(bytes: &[u8]) -> Read {
        let r = ExportReader::new(bytes).unwrap();
        let (mut r, lines, commits) = r.into_parts().ok().unwrap();
        let mut got = Vec::new();
        let res = read_in_place(&mut r, lines, commits, &mut |id, c| {
            got.push((id.clone(), c.clone()));
            Ok(())
        });
        (got, res.err().map(|e| e.to_string()))
    }

    /// An I/O error (or an overlong line: the same path) gives the same line
    /// number and message read ahead as in place.
    #[test]
    fn a_failed_read_reads_as_in_place() {
        let bytes = export_of(40, 1000);
        let header = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
        for at in [header + 1, header + 5000, bytes.len() / 2, bytes.len() - 3] {
            let want = {
                let r = std::io::BufReader::with_capacity(4096, FailsAt(&bytes, at));
                let mut r = ExportReader::new(r).unwrap();
                let mut got = Vec::new();
                loop {
                    match r.next_commit() {
                        Ok(Some(c)) => got.push(c),
                        Ok(None) => break (got, None),
                        Err(e) => break (got, Some(e.to_string())),
                    }
                }
            };
            assert!(want.1.as_deref().is_some_and(|e| e.contains("disk failed")));
            let r = std::io::BufReader::with_capacity(4096, FailsAt(&bytes, at));
            let r = ExportReader::new(r).unwrap();
            let mut got = Vec::new();
            let res = for_each_read_ahead(r, &mut |id, c| {
                got.push((id.clone(), c.clone()));
                Ok(())
            });
            assert_eq!((got, res.err().map(|e| e.to_string())), want, "at {at}");
        }
    }

    /// Blank lines count against the bound: while the import holds its first
    /// commit, a file of millions of blank lines is not read (and held
    /// parsed) to its end.
    #[test]
    fn blank_lines_count_against_the_bound() {
        let bytes = export_of(2, 10);
        let lines = lines_of(&bytes);
        let mut file = joined(&lines[..2], true);
        file.extend(std::iter::repeat_n(b'\n', 6_000_000));
        file.extend_from_slice(&joined(&lines[2..], true));
        let (parked, most) = at_first_commit(file);
        assert!(
            parked,
            "the reader read the whole file ({most} bytes) ahead"
        );
    }

    /// The import's error on a tiny file (one chunk, fewer lines than a chunk)
    /// ends the read at once, for every commit it may fail on.
    #[test]
    fn an_error_on_a_tiny_file_ends_the_read() {
        let bytes = export_of(2, 10);
        let total = in_place(&bytes).0.len();
        for at in 1..=total + 1 {
            let bytes = bytes.clone();
            let got = within(30, move || {
                let r = ExportReader::new(&bytes[..]).unwrap();
                let mut seen = 0;
                let res = for_each_read_ahead(r, &mut |_, _| {
                    seen += 1;
                    if seen == at {
                        return Err(ExchangeError::Malformed {
                            line: 0,
                            reason: "stop".into(),
                        });
                    }
                    Ok(())
                });
                (seen, res.is_err())
            });
            let (seen, failed) = got.expect("no hang");
            assert_eq!((seen, failed), (at.min(total), at <= total), "at {at}");
        }
    }
}
