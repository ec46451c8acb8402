//! Output helpers: JSON printing, aligned tables, readable sizes and times,
//! and the tool's error type.

use std::io::{self, Write};

/// `println!` that returns the write error instead of panicking, so a
/// closed stdout (`spool log | head`) ends the command quietly: the error
/// is a broken pipe, which `main` treats as success.
#[macro_export]
macro_rules! outln {
    () => {
        std::io::Write::write_all(&mut std::io::stdout(), b"\n")?
    };
    ($($arg:tt)*) => {
        std::io::Write::write_fmt(&mut std::io::stdout(), format_args!("{}\n", format_args!($($arg)*)))?
    };
}

/// The tool's error: a message, an optional cause, an optional hint saying
/// what to do next, and an exit code.
#[derive(Debug)]
pub struct ToolError {
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    hint: Option<String>,
    code: u8,
}

/// Exit code for a failure of the tool itself (bad arguments, I/O, a store
/// that cannot be opened).
pub const EXIT_FAILURE: u8 = 2;
/// Exit code when a check ran and found a problem (e.g. `verify` found corruption).
pub const EXIT_PROBLEM: u8 = 1;
/// Exit code of a version conflict: another writer committed first and
/// nothing was written (run the command again).
pub const EXIT_CONFLICT: u8 = 3;

impl ToolError {
    pub fn new(message: impl Into<String>) -> Self {
        ToolError {
            message: message.into(),
            source: None,
            hint: None,
            code: EXIT_FAILURE,
        }
    }

    pub fn with_source(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ToolError {
            message: message.into(),
            source: Some(Box::new(source)),
            hint: None,
            code: EXIT_FAILURE,
        }
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Sets the exit code (e.g. [`EXIT_CONFLICT`]).
    pub fn code(mut self, code: u8) -> Self {
        self.code = code;
        self
    }

    /// Sets the hint that fits what the cause actually is (see
    /// [`cause_hint`]), or `fallback` when no specific hint applies.
    pub fn hint_from_cause(mut self, fallback: Option<&str>) -> Self {
        let specific = self
            .source
            .as_deref()
            .and_then(|e| cause_hint(e as &(dyn std::error::Error + 'static)));
        self.hint = specific.or_else(|| fallback.map(str::to_string));
        self
    }

    pub fn get_hint(&self) -> Option<&str> {
        self.hint.as_deref()
    }

    pub fn exit_code(&self) -> u8 {
        self.code
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ToolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<io::Error> for ToolError {
    fn from(e: io::Error) -> Self {
        ToolError::with_source("output failed", e)
    }
}

impl From<serde_json::Error> for ToolError {
    fn from(e: serde_json::Error) -> Self {
        if e.is_io() {
            ToolError::with_source("output failed", io::Error::from(e))
        } else {
            ToolError::with_source("JSON encoding failed", e)
        }
    }
}

pub type Result<T> = std::result::Result<T, ToolError>;

/// The messages of an error and of each of its causes, every cause once.
///
/// Errors of spool's own crates do not repeat their `source()` in their
/// message; errors of other crates (and a few wrappers) may, so a message
/// that ends with the message of one of its causes is cut back to its own
/// words (and left out when nothing is left).
pub fn cause_chain(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut msgs = Vec::new();
    let mut cur = Some(err);
    while let Some(e) = cur {
        msgs.push(e.to_string());
        cur = e.source();
    }
    let mut out: Vec<String> = Vec::with_capacity(msgs.len());
    for (i, msg) in msgs.iter().enumerate() {
        let mut own = msg.as_str();
        for cause in msgs.iter().skip(i + 1).filter(|c| !c.is_empty()) {
            if let Some(head) = own.strip_suffix(cause.as_str()) {
                own = head.trim_end_matches([' ', ':', ',', ';', '-']);
                break;
            }
        }
        let own = own.trim();
        if !own.is_empty() && out.last().map(String::as_str) != Some(own) {
            out.push(own.to_string());
        }
    }
    out
}

/// An error and its causes on one line (`a: b: c`), each cause once: for
/// reports that carry an error as text.
pub fn chain_text(err: &(dyn std::error::Error + 'static)) -> String {
    cause_chain(err).join(": ")
}

/// The engine error inside one link of an error chain, looking through
/// the wrappers that forward it transparently (so it is not a link of its
/// own).
fn engine_error_of<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a spool_engine::Error> {
    use spool_runtime::handle::HandleError;
    use spool_runtime::store::exchange::ExchangeError;
    use spool_runtime::{RuntimeError, StoreError};
    let store = |s: &'a StoreError| match s {
        StoreError::Engine(e) => Some(e),
        _ => None,
    };
    if let Some(e) = e.downcast_ref::<spool_engine::Error>() {
        return Some(e);
    }
    if let Some(s) = e.downcast_ref::<StoreError>() {
        return store(s);
    }
    if let Some(r) = e.downcast_ref::<RuntimeError>() {
        return r.as_store().and_then(store);
    }
    if let Some(ExchangeError::Store(s)) = e.downcast_ref::<ExchangeError>() {
        return store(s);
    }
    if let Some(HandleError::Store(s)) = e.downcast_ref::<HandleError>() {
        return store(s);
    }
    None
}

/// Whether the store's lock is held by another owner somewhere in the chain.
pub fn is_locked(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if matches!(engine_error_of(e), Some(spool_engine::Error::Locked { .. })) {
            return true;
        }
        cur = e.source();
    }
    false
}

/// What to do about a failure, from what its causes are: the hint names
/// what actually helps (a permission problem is not damage, a locked
/// store is not a corrupt one, an entry over the record limit cannot be
/// retried). `None` when no cause is recognised: no hint beats a wrong one.
pub fn cause_hint(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    use spool_engine::{Error as E, IndexError};
    let mut engine = None;
    let mut io_kind = None;
    let mut cur = Some(err);
    while let Some(e) = cur {
        if engine.is_none() {
            engine = engine_error_of(e);
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            io_kind.get_or_insert(io.kind());
        }
        cur = e.source();
    }
    if let Some(E::Locked { .. }) = engine {
        return Some(
            "another process owns the store: stop it, or use a command that only reads (sessions, show, log, stats, verify)"
                .into(),
        );
    }
    match io_kind {
        Some(io::ErrorKind::PermissionDenied) => {
            return Some(
                "permission denied: check the owner and mode of the store directory and of the files in it"
                    .into(),
            )
        }
        Some(io::ErrorKind::StorageFull) => {
            return Some(
                "the disk is full: free space, then run the command again"
                    .into(),
            )
        }
        Some(io::ErrorKind::NotADirectory) => {
            return Some("part of the store path is a file, not a directory: check the path".into())
        }
        _ => {}
    }
    Some(match engine? {
        E::RecordTooLarge { max, .. } => format!(
            "one commit may hold at most {} (the record size limit); retrying cannot help: store less in one entry",
            human_bytes(*max)
        ),
        E::Corrupt { .. } => "run `spool --store DIR verify` to locate the damage; `verify --salvage OUT_DIR` copies every readable commit".into(),
        E::UnsupportedFormat { .. } => "the store was written in another on-disk format version: open it with the spool that wrote it (`export` there, `import` here)".into(),
        E::Index(IndexError::Mismatch(_) | IndexError::Malformed(_) | IndexError::Sled(_)) => {
            "the index is derived from the log: `spool --store DIR replay` rebuilds it".into()
        }
        E::Poisoned { .. } => "an earlier write failed, so this process refuses writes: run the command again (opening the store recovers from the log)".into(),
        _ => return None,
    })
}

/// True when the error (or any cause) is a broken pipe on output.
pub fn is_broken_pipe(err: &ToolError) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(ioe) = e.downcast_ref::<io::Error>() {
            if ioe.kind() == io::ErrorKind::BrokenPipe {
                return true;
            }
        }
        cur = e.source();
    }
    false
}

/// Prints a value as pretty JSON on stdout, followed by a newline.
pub fn print_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<()> {
    let stdout = io::stdout();
    let mut lock = stdout.lock();
    serde_json::to_writer_pretty(&mut lock, value)?;
    writeln!(lock)?;
    lock.flush()?;
    Ok(())
}

/// The shape version of the `--json` documents (objects) the commands
/// print: it changes when a field is renamed, removed or changes meaning,
/// not when one is added. Arrays of rows carry none (a row may gain
/// fields, never lose or change one). See docs/json.md.
pub const JSON_VERSION: u32 = 1;

/// A `--json` document: its body's fields after `"version"`.
#[derive(serde::Serialize)]
struct Doc<'a, T: serde::Serialize + ?Sized> {
    version: u32,
    #[serde(flatten)]
    body: &'a T,
}

/// Prints a `--json` document (an object) with its `"version"` field
/// ([`JSON_VERSION`]) first.
pub fn print_doc<T: serde::Serialize + ?Sized>(body: &T) -> Result<()> {
    print_json(&Doc {
        version: JSON_VERSION,
        body,
    })
}

/// A simple aligned text table.
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    right: Vec<bool>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            right: vec![false; headers.len()],
        }
    }

    /// Right-aligns the given column (numbers).
    pub fn right(mut self, col: usize) -> Self {
        if let Some(r) = self.right.get_mut(col) {
            *r = true;
        }
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn print(&self) -> Result<()> {
        let stdout = io::stdout();
        let mut w = stdout.lock();
        self.write_to(&mut w)?;
        w.flush()?;
        Ok(())
    }

    pub fn write_to(&self, w: &mut dyn Write) -> io::Result<()> {
        let cols = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(cols) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let line = |w: &mut dyn Write, cells: &[String]| -> io::Result<()> {
            let mut s = String::new();
            for (i, width) in widths.iter().enumerate() {
                let cell = cells.get(i).map(String::as_str).unwrap_or("");
                let pad = width.saturating_sub(cell.chars().count());
                if i > 0 {
                    s.push_str("  ");
                }
                if self.right[i] {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(cell);
                } else {
                    s.push_str(cell);
                    if i + 1 < cols {
                        s.push_str(&" ".repeat(pad));
                    }
                }
            }
            writeln!(w, "{}", s.trim_end())
        };
        line(w, &self.headers)?;
        for row in &self.rows {
            line(w, row)?;
        }
        Ok(())
    }
}

/// `1536` -> `1.5 KiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Milliseconds since the epoch -> `2026-11-30 07:35:12Z` (UTC).
pub fn human_time_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian, UTC).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Shortens a string to at most `max` characters, marking the cut with `…`.
pub fn ellipsize(s: &str, max: usize) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut t: String = one_line.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_read_well() {
        assert_eq!(human_bytes(10), "10 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!(human_time_ms(0), "1970-01-01 00:00:00Z");
        assert_eq!(human_time_ms(1_796_024_112_000), "2026-11-30 07:35:12Z");
        assert_eq!(ellipsize("abcdef", 4), "abc…");
    }

    #[derive(Debug)]
    struct Repeating(&'static str, Option<Box<Repeating>>);
    impl std::fmt::Display for Repeating {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Repeating {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn each_cause_is_listed_once() {
        let leaf = Repeating("Connection refused (os error 111)", None);
        let mid = Repeating(
            "error connecting to server: Connection refused (os error 111)",
            Some(Box::new(leaf)),
        );
        let top = Repeating(
            "postgres connect: error connecting to server: Connection refused (os error 111)",
            Some(Box::new(mid)),
        );
        assert_eq!(
            cause_chain(&top),
            [
                "postgres connect",
                "error connecting to server",
                "Connection refused (os error 111)"
            ]
        );
        // A wrapper whose message is only its cause's is left out.
        let same = Repeating("disk full", Some(Box::new(Repeating("disk full", None))));
        assert_eq!(cause_chain(&same), ["disk full"]);
        assert_eq!(
            chain_text(&top),
            "postgres connect: error connecting to server: Connection refused (os error 111)"
        );
    }

    #[test]
    fn a_permission_error_hints_at_permissions_not_at_damage_or_owners() {
        let e = ToolError::with_source(
            "opening s failed",
            io::Error::from(io::ErrorKind::PermissionDenied),
        )
        .hint_from_cause(Some("fallback"));
        let hint = e.get_hint().unwrap();
        assert!(hint.contains("permission"), "{hint}");
        assert!(!hint.contains("verify") && !hint.contains("another process"));
        // An unrecognised cause gets the fallback, not a guess.
        let e = ToolError::with_source("x", io::Error::other("odd")).hint_from_cause(None);
        assert_eq!(e.get_hint(), None);
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&["a", "bb"]).right(1);
        t.row(vec!["xxx".into(), "1".into()]);
        let mut buf = Vec::new();
        t.write_to(&mut buf).unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), "a    bb\nxxx   1\n");
    }
}
