//! Reading a `spool-export` file ahead of its import: its lines are parsed on a
//! second thread while the importing thread checks or appends the commits before
//! them.
//!
//! Parsing is about a fifth of an import's work on the importing thread, and the
//! second core is otherwise idle during the check pass and mostly idle during the
//! writes. The parsed commits are handed over in batches. The reader stops once
//! [`AHEAD_BYTES_MAX`] bytes of lines are parsed and not yet handed over, so a file
//! of large lines is held at most a few megabytes, or one line, ahead of the import.
//! Commits, and an error in the file, reach the import in file order, as they do
//! when it reads the file itself (which it does if no thread can be started).

use super::read::ExportReader;
use super::{ExchangeError, ImportCommit};
use crate::session::SessionId;
use std::io::BufRead;
use std::sync::{mpsc, Condvar, Mutex};

/// Most bytes of lines parsed and not yet handed to the import: the reader waits
/// below it (a single larger line is parsed, then waited out).
const AHEAD_BYTES_MAX: u64 = 4 << 20;
/// A batch is handed over once it holds this many bytes of lines ...
const BATCH_BYTES_MAX: u64 = 256 << 10;
/// ... or this many commits.
const BATCH_COMMITS_MAX: usize = 256;

type Batch = Vec<(SessionId, ImportCommit)>;

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
    let reader = &Mutex::new(reader);
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        // The sender moves to the reader: the channel ends when the reader does.
        let spawned = std::thread::Builder::new()
            .name("spool-import-read".into())
            .spawn_scoped(scope, move || {
                let mut r = reader.lock().unwrap_or_else(|e| e.into_inner());
                read_ahead(&mut r, &tx, ahead);
                ahead.set(|s| s.finished = true);
            });
        let Ok(handle) = spawned else {
            let mut r = reader.lock().unwrap_or_else(|e| e.into_inner());
            while let Some((id, c)) = r.next_commit()? {
                f(&id, &c)?;
            }
            return Ok(());
        };
        let imported = import_batches(rx, f, ahead);
        // A panic of the reader (a bug) reaches the caller as it was raised.
        if let Err(panic) = handle.join() {
            std::panic::resume_unwind(panic);
        }
        imported
    })
}

/// The importing side: every batch's commits through `f`, in order. The reader is
/// stopped when this returns, however it returns.
fn import_batches(
    rx: mpsc::Receiver<Result<(Batch, u64), ExchangeError>>,
    f: &mut dyn FnMut(&SessionId, &ImportCommit) -> Result<(), ExchangeError>,
    ahead: &Ahead,
) -> Result<(), ExchangeError> {
    let _stop = StopOnDrop(ahead);
    for msg in rx {
        let (batch, bytes) = msg?;
        for (id, c) in &batch {
            f(id, c)?;
        }
        drop(batch);
        ahead.done(bytes);
    }
    Ok(())
}

/// The reader's side: batches of parsed commits into `tx`, then the file's error if
/// it has one; ends early once the import stopped.
fn read_ahead<R: BufRead>(
    r: &mut ExportReader<R>,
    tx: &mpsc::Sender<Result<(Batch, u64), ExchangeError>>,
    ahead: &Ahead,
) {
    let mut batch: Batch = Vec::new();
    let mut bytes = 0u64;
    let send = |batch: Batch, bytes: u64| {
        ahead.add(bytes);
        tx.send(Ok((batch, bytes))).is_ok()
    };
    loop {
        let before = r.bytes_read();
        match r.next_commit() {
            Ok(Some(c)) => {
                bytes += r.bytes_read() - before;
                batch.push(c);
                if bytes >= BATCH_BYTES_MAX || batch.len() >= BATCH_COMMITS_MAX {
                    if !send(std::mem::take(&mut batch), bytes) || !ahead.wait_room() {
                        return;
                    }
                    bytes = 0;
                }
            }
            Ok(None) => {
                if !batch.is_empty() {
                    send(batch, bytes);
                }
                return;
            }
            Err(e) => {
                if batch.is_empty() || send(batch, bytes) {
                    let _ = tx.send(Err(e));
                }
                return;
            }
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
        for file in [&damaged[..], cut] {
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
