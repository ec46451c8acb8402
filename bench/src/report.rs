//! The result model of a run and its two outputs: one JSON object
//! (`--json`) and the Markdown that `BENCHMARKS.md` shows (`--markdown`).
//!
//! Every figure is a rate, higher is better. `spool` is `null` when no
//! spool subject took part (the peers-only run).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::harness::{CONTEXT_BUDGET, LIST_ENTRIES_PER_SESSION, PAGE_BUDGET};
use crate::peers;
use crate::stats::{self, Samples};

/// The order peers appear in tables.
pub const PEER_ORDER: [&str; 6] = [
    "sqlite",
    "postgres",
    "jsonl",
    "json-file",
    "raw",
    "raw-append",
];

/// A whole run: `{"machine": {...}, "run": {...}, "results": [...]}`.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub run: RunInfo,
    pub results: Vec<ResultRow>,
}

/// The machine the figures were measured on. Fields that cannot be read
/// are `null`.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: Option<String>,
    pub memory_bytes: Option<u64>,
    pub os: String,
    pub kernel: Option<String>,
    /// File system type of the scratch directory (from /proc/self/mountinfo).
    pub fs: Option<String>,
    /// `release` or `debug`: figures from a debug build mean little.
    pub build: &'static str,
}

/// How the run was made.
#[derive(Clone, Debug, Serialize)]
pub struct RunInfo {
    pub quick: bool,
    pub repetitions: usize,
    pub seed: u64,
    pub context_budget: u64,
    pub page_budget: u64,
    /// Whether the peak RSS was reset before each workload, so that
    /// `peak_rss_bytes` is that workload's peak; when false it is the
    /// process's peak so far (cumulative).
    pub peak_rss_per_workload: bool,
}

/// One row: one workload, one variant, one unit.
#[derive(Clone, Debug, Serialize)]
pub struct ResultRow {
    pub workload: String,
    pub variant: String,
    pub unit: String,
    /// Median rate of spool; `None` (JSON `null`) when spool did not run.
    pub spool: Option<f64>,
    /// Median rate of each peer that took part, by peer key; `null` for a
    /// peer that could not run here (see `notes`).
    pub peers: BTreeMap<String, Option<f64>>,
    /// Why a peer has no figure, by peer key.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub notes: BTreeMap<String, String>,
    /// `[min, max]` of the repetitions, by subject (`spool` and peer keys).
    pub spread: BTreeMap<String, [f64; 2]>,
    /// spool's median over each peer's median (absent without spool).
    pub ratios: BTreeMap<String, f64>,
    /// `[min, max]` of spool's rate over each peer's in the same
    /// interleaved round (see [`stats::round_ratios`]), by peer key: how far
    /// the machine's drift moved the ratio during the run.
    pub round_ratios: BTreeMap<String, [f64; 2]>,
    pub repetitions: usize,
    /// Peak resident set of the process during this workload (see
    /// [`RunInfo::peak_rss_per_workload`]); includes the generated data and
    /// every subject, so it is an upper bound for each.
    pub peak_rss_bytes: Option<u64>,
    /// `open` rows (spool's open latency and memory): the history length
    /// in entries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<u64>,
    /// `open`: median microseconds per spool open (handle + context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_us: Option<f64>,
    /// `open`: resident bytes of the open spool handle's snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resident_bytes: Option<u64>,
    /// `open`: median microseconds of spool's first root-first page
    /// (the page budget) on an open handle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_page_us: Option<f64>,
    /// `open`: median microseconds per open by the JSONL whole-file parse
    /// of the same transcript.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jsonl_open_us: Option<f64>,
    /// `execute` rows: time per turn and memory by subject, and the goals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execute: Option<crate::workloads::execute::ExecuteFigures>,
    /// `store` rows: the question, the size, each subject's process time
    /// and peak RSS, and the goals decided at the largest size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<crate::workloads::store::StoreFigures>,
}

impl ResultRow {
    /// Builds a row from each subject's samples; the subject named `spool`
    /// is spool, the others are peers.
    pub fn from_measured(
        workload: &str,
        variant: &str,
        unit: &str,
        measured: impl IntoIterator<Item = (String, Samples)>,
    ) -> Self {
        let mut row = ResultRow {
            workload: workload.to_string(),
            variant: variant.to_string(),
            unit: unit.to_string(),
            spool: None,
            peers: BTreeMap::new(),
            spread: BTreeMap::new(),
            notes: BTreeMap::new(),
            ratios: BTreeMap::new(),
            round_ratios: BTreeMap::new(),
            repetitions: 0,
            peak_rss_bytes: None,
            history: None,
            open_us: None,
            resident_bytes: None,
            first_page_us: None,
            jsonl_open_us: None,
            execute: None,
            store: None,
        };
        let measured: Vec<(String, Samples)> = measured.into_iter().collect();
        for (name, samples) in &measured {
            row.repetitions = row.repetitions.max(samples.rates.len());
            let Some(s) = samples.summary() else { continue };
            row.spread.insert(name.clone(), [s.min, s.max]);
            if name == "spool" {
                row.spool = Some(s.median);
            } else {
                row.peers.insert(name.clone(), Some(s.median));
            }
        }
        if let Some(sp) = row.spool {
            for (name, p) in &row.peers {
                if let Some(r) = p.and_then(|p| stats::ratio(sp, p)) {
                    row.ratios.insert(name.clone(), r);
                }
            }
        }
        let samples_of = |want: &str| measured.iter().find(|(n, _)| n == want).map(|m| &m.1);
        if let Some(spool) = samples_of("spool") {
            for name in row.ratios.keys() {
                if let Some(r) = samples_of(name).and_then(|p| stats::round_ratios(spool, p)) {
                    row.round_ratios.insert(name.clone(), r);
                }
            }
        }
        row
    }

    /// Records a peer that could not run: `null` figure and the reason.
    pub fn missing_peer(&mut self, peer: &str, note: &str) {
        self.peers.insert(peer.to_string(), None);
        self.notes.insert(peer.to_string(), note.to_string());
    }

    /// The median figure of a peer, if it has one.
    pub fn peer(&self, peer: &str) -> Option<f64> {
        self.peers.get(peer).copied().flatten()
    }
}

impl Machine {
    /// Reads what Linux tells about this machine; `dir` is the scratch
    /// directory whose file system is reported.
    pub fn detect(dir: &Path) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string());
        let memory_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| kib_field(&m, "MemTotal:"));
        let os = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                    .map(|v| v.trim_matches('"').to_string())
            })
            .unwrap_or_else(|| std::env::consts::OS.to_string());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .map(|s| s.trim().to_string());
        Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            memory_bytes,
            os,
            kernel,
            fs: fs_type(dir),
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
        }
    }
}

/// A `Name:   1234 kB` field of a /proc file, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line[name.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// The file system type of the mount holding `dir`: the longest mount
/// point that is a prefix of it in /proc/self/mountinfo.
fn fs_type(dir: &Path) -> Option<String> {
    let dir = std::fs::canonicalize(dir).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<(usize, String)> = None;
    for line in info.lines() {
        // Fields: id parent major:minor root mount-point options
        // [optional...] - fstype source super-options
        let mut parts = line.split(" - ");
        let (Some(left), Some(right)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Some(mount) = left.split(' ').nth(4) else {
            continue;
        };
        let Some(fstype) = right.split(' ').next() else {
            continue;
        };
        let mount = mount.replace("\\040", " ");
        let depth = Path::new(&mount).components().count();
        if dir.starts_with(&mount) && best.as_ref().is_none_or(|(d, _)| depth >= *d) {
            best = Some((depth, fstype.to_string()));
        }
    }
    best.map(|(_, t)| t)
}

/// Resets the process's peak RSS to its current RSS (Linux: writing `5`
/// to /proc/self/clear_refs). Returns whether it worked.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The process's peak RSS (VmHWM) in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    kib_field(&status, "VmHWM:")
}

/// The `--json` output: one object, pretty-printed.
pub fn to_json(report: &Report) -> String {
    // Serializing plain data with string keys cannot fail; non-finite
    // floats never reach a report (stats filters them) and would become
    // `null` anyway.
    serde_json::to_string_pretty(report).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

fn fmt_rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn fmt_cell(median: Option<f64>, spread: Option<&[f64; 2]>) -> String {
    match (median, spread) {
        (Some(m), Some([lo, hi])) => {
            format!("{} ({}–{})", fmt_rate(m), fmt_rate(*lo), fmt_rate(*hi))
        }
        (Some(m), None) => fmt_rate(m),
        _ => "—".to_string(),
    }
}

fn fmt_bytes(b: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    format!("{:.1} MiB", b as f64 / MIB)
}

/// The `--markdown` output: the results table, then the machine, the
/// method, the peer configurations and how to rerun.
pub fn to_markdown(report: &Report) -> String {
    let mut out = String::new();
    let peers: Vec<&str> = PEER_ORDER
        .iter()
        .copied()
        .filter(|p| report.results.iter().any(|r| r.peers.contains_key(*p)))
        .collect();
    let m = &report.machine;
    let r = &report.run;

    let _ = writeln!(out, "# Benchmarks\n");
    let _ = writeln!(
        out,
        "Rates, higher is better: median of {} repetitions{}, (min–max) in brackets. \
         Ratios are spool's median over each peer's, from the same run; in brackets, \
         the lowest and highest ratio of spool's rate to the peer's within one \
         interleaved round.{}\n",
        r.repetitions,
        if report.results.iter().any(|row| row.store.is_some()) {
            " (the `store` rows: as many as their section below says)"
        } else {
            ""
        },
        if r.quick {
            " **Quick run: small sizes, for checking only.**"
        } else {
            ""
        }
    );
    let mut header = String::from("| workload | variant | unit | spool |");
    let mut rule = String::from("|---|---|---|---:|");
    for p in &peers {
        let _ = write!(header, " {p} |");
        rule.push_str("---:|");
    }
    header.push_str(" spool ÷ peer | peak RSS |");
    rule.push_str("---|---:|");
    let _ = writeln!(out, "{header}\n{rule}");
    for row in &report.results {
        let mut line = format!(
            "| {} | {} | {} | {} |",
            row.workload,
            row.variant,
            row.unit,
            fmt_cell(row.spool, row.spread.get("spool"))
        );
        for p in &peers {
            let _ = write!(line, " {} |", fmt_cell(row.peer(p), row.spread.get(*p)));
        }
        let ratios: Vec<String> = PEER_ORDER
            .iter()
            .filter_map(|p| {
                let v = row.ratios.get(*p)?;
                Some(match row.round_ratios.get(*p) {
                    Some([lo, hi]) => format!("{p} {v:.2}× ({lo:.2}–{hi:.2})"),
                    None => format!("{p} {v:.2}×"),
                })
            })
            .collect();
        let ratios = if ratios.is_empty() {
            "—".to_string()
        } else {
            ratios.join(", ")
        };
        let rss = row.peak_rss_bytes.map_or("—".to_string(), fmt_bytes);
        let _ = writeln!(line, " {ratios} | {rss} |");
        out.push_str(&line);
    }
    let opens: Vec<&ResultRow> = report
        .results
        .iter()
        .filter(|r| r.history.is_some())
        .collect();
    if !opens.is_empty() {
        let _ = writeln!(
            out,
            "\nOpening a session with a {CONTEXT_BUDGET}-byte budget (an open's time and a \
             handle's resident memory should not grow with the history; microseconds, medians; \
             the first page is one root-first {PAGE_BUDGET}-byte page read on an open \
             handle):\n\n\
             | history | spool open µs | resident bytes | first page µs | JSONL open µs |\n\
             |---:|---:|---:|---:|---:|"
        );
        let us = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
        for r in opens {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                r.history.unwrap_or(0),
                us(r.open_us),
                r.resident_bytes.map_or("—".to_string(), |b| b.to_string()),
                us(r.first_page_us),
                us(r.jsonl_open_us)
            );
        }
    }
    out.push_str(&crate::workloads::execute::markdown(&report.results));
    let stores: Vec<&ResultRow> = report
        .results
        .iter()
        .filter(|r| r.store.is_some())
        .collect();
    out.push_str(&crate::workloads::store::markdown(&stores));
    let notes: Vec<String> = report
        .results
        .iter()
        .flat_map(|r| {
            r.notes
                .iter()
                .map(move |(p, n)| format!("- {} {} `{p}`: {n}", r.workload, r.variant))
        })
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\nPeers without a figure:\n\n{}", notes.join("\n"));
    }

    let _ = writeln!(out, "\n## Machine\n");
    let _ = writeln!(
        out,
        "- CPUs: {} ({})",
        m.cpus,
        m.cpu_model.as_deref().unwrap_or("model unknown")
    );
    if let Some(b) = m.memory_bytes {
        let _ = writeln!(out, "- Memory: {}", fmt_bytes(b));
    }
    let _ = writeln!(
        out,
        "- OS: {}, kernel {}",
        m.os,
        m.kernel.as_deref().unwrap_or("unknown")
    );
    let _ = writeln!(
        out,
        "- File system of the scratch directory: {}",
        m.fs.as_deref().unwrap_or("unknown")
    );
    let _ = writeln!(out, "- Build: {}", m.build);

    let _ = writeln!(out, "\n## Method\n");
    let _ = writeln!(
        out,
        "- Every subject runs through the same harness: the same generated records, the \
         same threads, the same timer, the same answer checks (a subject whose context, \
         page or list answer differs from the expected one fails the run).\n\
         - Data: a fixed seed ({seed:#x}); each record is a user message (35 %, 100–300 \
         bytes), an assistant message (45 %, 512–1536 bytes) or a tool result (20 %, \
         2048–6144 bytes): about 1.35 KiB of text on average. MB/s count text bytes (1 MB = \
         10^6 bytes); the raw peers write 1 KiB per commit.\n\
         - Budgets count each subject's own unit: text bytes for the peers, the entry's \
         compact JSON size (`entry_size`, what spool's budgets count; about 170 bytes more \
         than the text per entry) for spool. The expected context (the newest entries whose \
         costs fit the budget) and the expected first page are computed per subject from \
         that unit, so spool's 64 KiB context holds a few entries fewer than a peer's.\n\
         - Loading is untimed: each store is loaded buffered (spool: one commit per entry, \
         the layout appends leave), closed, and reopened with the workload's durability.\n\
         - `append-durable`: each writer thread commits its own session's records one \
         commit per record, acknowledged only once on stable storage; timed from a common \
         start to the last writer's end. `append-buffered`: one writer, acknowledged from the \
         page cache; the final flush is not timed.\n\
         - `open`: the store is loaded, closed and reopened; then each open builds the model \
         context, the newest entries fitting {cb} bytes, text in memory. `page`: the whole \
         branch in pages of {pb} bytes. `list`: the headers of every active session (about \
         25 %), newest first; every session also holds {le} records. `fork`: a durable fork \
         at the middle entry, then opening the fork.\n\
         - Read workloads repeat their operation for a fixed minimum time per repetition \
         with a warm page cache.\n\
         - Repetitions are interleaved: round r runs repetition r of every subject in turn \
         (every store of a read workload is loaded first), so a slow stretch of a shared \
         machine falls on every subject alike. After each repetition the subject finishes \
         its background work untimed (spool: a next segment being built ahead, then \
         `Store::flush_index`, the move of the memtable into sled; SQLite and the file \
         peers leave none; PostgreSQL's server \
         processes write in the background on their own schedule).\n\
         - Peak RSS: {rss}",
        seed = r.seed,
        cb = CONTEXT_BUDGET,
        pb = PAGE_BUDGET,
        le = LIST_ENTRIES_PER_SESSION,
        rss = if r.peak_rss_per_workload {
            "the process's VmHWM, reset before each workload; it includes the generated \
             data and every subject of the workload, so it bounds each from above."
        } else {
            "the process's VmHWM so far (it could not be reset, so it is cumulative over \
             the run)."
        }
    );

    let _ = writeln!(out, "\n## Subject and peer configurations\n");
    let _ = writeln!(
        out,
        "- `spool`: the runtime's public handle API over the log store (engine durability \
         `Immediate` = fdatasync with group commit for durable runs, `Buffered` otherwise). \
         Append = one writer `SessionHandle` per session per writer thread, `append_entry` \
         per record: one commit, then the publication of the handle's bounded snapshot. \
         Open = `open_handle` read-only with the 64 KiB budget, then the snapshot's model \
         context. Page = a read-only handle, `read(BranchPage {{ order: RootFirst }})` in \
         pages of at most {pb} bytes and {pe} entries until complete (each page's depth range \
         is read from the active-path index, which gives every entry's log position). Fork = \
         `SessionRuntime::fork` at the middle entry, then the open. List = the log store's \
         header index with a status filter (one prefix scan of header records). Tool \
         results are custom messages (`tool_output`): the data has no tool calls, and the \
         context builder drops a tool result that answers no call. The benchmark's Rust \
         code allocates with mimalloc (the `spool` binary's global allocator; the JSONL and \
         JSON-file peers, which run in the same process, use it too); SQLite and PostgreSQL use their \
         own defaults (the C library's `malloc`).",
        pb = PAGE_BUDGET,
        pe = crate::spool::PAGE_EVENTS_MAX,
    );
    let settings: Vec<String> = peers::pg_server::SERVER_SETTINGS
        .iter()
        .map(|(k, v)| format!("`{k}={v}`"))
        .collect();
    let _ = writeln!(
        out,
        "- `sqlite`: bundled SQLite through rusqlite; WAL; `synchronous=FULL` (durable) or \
         `OFF` (buffered); busy_timeout {busy} s; one connection per writer thread; cached \
         prepared statements; entries in a rowid table with a unique index on (session, \
         seq); sessions with an index on (status, updated_ms). Append = `BEGIN IMMEDIATE`, \
         one `INSERT`, `COMMIT`. Open = tail query newest first until the budget. Page = \
         keyset pagination. Fork = `INSERT ... SELECT` row copy in one transaction, then \
         the tail query.\n\
         - `postgres` (append-durable and open): a throwaway PostgreSQL server started by the \
         run (initdb + pg_ctl, as the `postgres` user when run as root), its data directory on \
         the scratch disk, with {pg} and every other setting at its default \
         (`full_page_writes=on`, default `wal_sync_method`); the synchronous `postgres` crate \
         over the Unix socket; one connection per writer; prepared statements; append = one \
         autocommit `INSERT` (one transaction, acknowledged after its WAL flush); entries \
         keyed by (session, seq); open = keyset tail batches of {rows} rows newest first \
         until the budget.\n\
         - `jsonl`: one file per session, one serde_json line per entry written with one \
         `write` (plus `fdatasync` when durable). Open and page parse the whole file.\n\
         - `json-file`: one JSON file per session holding header, definition and \
         transcript; listing reads and parses every file (header deserialized, the rest \
         skipped), filters and sorts.\n\
         - `raw`: durable: {rb}-byte `pwrite` + `fdatasync` overwriting a file preallocated \
         with written zeros in {chunk} KiB writes, as spool's segments are (its size never \
         changes), one file per writer; buffered: \
         sequential {rb}-byte writes to a growing file, no sync. `raw-append`: the durable \
         loop appending to a growing file.",
        pg = settings.join(", "),
        rows = peers::postgres::TAIL_FETCH_ROWS,
        busy = peers::sqlite::BUSY_TIMEOUT.as_secs(),
        rb = peers::raw::RAW_RECORD_BYTES,
        chunk = peers::raw::PREALLOC_CHUNK >> 10,
    );

    let _ = writeln!(out, "\n## Rerun\n");
    let _ = writeln!(
        out,
        "```sh\n\
         cargo run --release -p spool-bench -- --store /path/on/the/disk --markdown  # full run, minutes\n\
         cargo run --release -p spool-bench -- --quick --json                        # seconds (CI)\n\
         cargo run --release -p spool-bench -- --workload open --json                # open latency, memory\n```\n\n\
         The PostgreSQL peer needs `initdb` and `pg_ctl` (PATH, `SPOOL_PG_BIN` or \
         `/usr/lib/postgresql/*/bin`); as root, the `postgres` user and `runuser`, and a \
         scratch directory that user can reach. Without them its figures are `null` with a \
         note."
    );
    out
}
