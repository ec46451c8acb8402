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

/// Most bytes of lines parsed and not yet handed to the import: the reader waits
/// below it (a single larger line is parsed, then waited out).
const AHEAD_BYTES_MAX: u64 = 4 << 20;
/// A chunk of lines is handed over once it holds this many bytes ...
const BATCH_BYTES_MAX: u64 = 256 << 10;
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
}

/// A chunk's lines parsed, with their numbers, and its bytes.
struct Parsed {
    lines: Vec<(u64, Line)>,
    bytes: u64,
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
        lines.push((line_no, parse_line(&chunk.text[start..end])));
        start = end;
    }
    Parsed {
        lines,
        bytes: chunk.text.len() as u64,
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
        let Ok(Parsed { lines, bytes }) = parsed.recv() else {
            break;
        };
        for (line_no, line) in lines {
            if let Some((id, c)) = commits.accept(line_no, line)? {
                f(&id, &c)?;
            }
        }
        ahead.done(bytes);
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
        };
        let mut end = None;
        while chunk.ends.len() < BATCH_LINES_MAX && (chunk.text.len() as u64) < BATCH_BYTES_MAX {
            match read_line_bounded(r, &mut buf, EXPORT_LINE_BYTES_MAX) {
                Ok(Some(_)) => {
                    line_no += 1;
                    chunk.text.extend_from_slice(&buf);
                    chunk.ends.push(chunk.text.len());
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
            let bytes = chunk.text.len() as u64;
            let (done_tx, done_rx) = mpsc::sync_channel(1);
            ahead.add(bytes);
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

    /// While the import holds its first commit, the reader stops, parked, about
    /// `AHEAD_BYTES_MAX` ahead of it, not at the end of the file.
    #[test]
    fn the_reader_stops_a_bounded_distance_ahead() {
        let line_bytes = 64 << 10;
        let bytes = export_of(60, line_bytes);
        assert!(bytes.len() as u64 > 2 * AHEAD_BYTES_MAX);
        let got = within(60, move || {
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
        let (parked, most) = got.expect("the read ended");
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
}
