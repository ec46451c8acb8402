//! The memory of reading a long pi session file a commit at a time: a
//! [`PiFile`] opened and read through holds well under the file's size at
//! any moment, where [`read_pi`] holds the whole session (several times
//! the file). A binary of its own: it counts every allocation of the
//! process with its own global allocator.

use std::alloc::System;
use std::io::{BufReader, Write};

use peakmem_alloc::{PeakMemAlloc, PeakMemAllocTrait, INSTRUMENTED_SYSTEM};
use spool_runtime::import::pi::{read_pi, PiFile};

/// The system allocator, counting the bytes live and their peak.
#[global_allocator]
static GLOBAL: &PeakMemAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Runs `f` and returns its result with the peak of live bytes during it
/// above the bytes live before it.
fn peak_above<T>(f: impl FnOnce() -> T) -> (T, usize) {
    GLOBAL.reset_peak_memory();
    let out = f();
    (out, GLOBAL.get_peak_memory())
}

/// Writes a pi v3 session of `n` entries to `w`: a linear chain of user and
/// assistant messages, each line about 200 bytes, ids of 8 hex digits as
/// pi makes them. Returns the bytes written.
fn write_session(w: &mut impl Write, n: usize) -> usize {
    let mut bytes = 0;
    let mut line = |l: String| {
        bytes += l.len() + 1;
        writeln!(w, "{l}").unwrap();
    };
    line(
        r#"{"type":"session","version":3,"id":"pi-stream","timestamp":"2025-01-02T03:04:05.678Z","cwd":"/tmp"}"#
            .into(),
    );
    let id = |i: usize| format!("{:08x}", (i as u32).wrapping_mul(2_654_435_761));
    for i in 0..n {
        let parent = match i {
            0 => "null".to_string(),
            _ => format!("\"{}\"", id(i - 1)),
        };
        let head = format!(
            r#"{{"type":"message","id":"{}","parentId":{parent},"timestamp":"2025-01-02T03:04:06.000Z","#,
            id(i)
        );
        line(if i % 2 == 0 {
            format!(
                r#"{head}"message":{{"role":"user","content":"question {i:06}: {}"}}}}"#,
                "q".repeat(50)
            )
        } else {
            format!(
                r#"{head}"message":{{"role":"assistant","provider":"anthropic","model":"claude","stopReason":"stop","content":[{{"type":"text","text":"answer {i:06}: {}"}}]}}}}"#,
                "a".repeat(10)
            )
        });
    }
    bytes
}

/// The one test of this binary: the counters are the process's, so the
/// stages run one after the other.
#[test]
fn streaming_a_long_pi_file_holds_a_fraction_of_it() {
    const ENTRIES: usize = 50_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.jsonl");
    let file_bytes = {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let n = write_session(&mut w, ENTRIES);
        w.flush().unwrap();
        n
    };
    let limit = file_bytes / 3;

    // The first reading: every line checked, nothing of an entry kept.
    let (f, open_peak) = peak_above(|| PiFile::open(&path, "long.jsonl").unwrap());
    let mut f = f;
    eprintln!(
        "file {file_bytes} bytes, {ENTRIES} entries; PiFile::open peak {open_peak} bytes ({:.1}% of the file)",
        100.0 * open_peak as f64 / file_bytes as f64
    );
    assert!(
        open_peak < limit,
        "PiFile::open took {open_peak} bytes for a file of {file_bytes}"
    );

    // The second: the commits, each dropped once seen.
    let (counts, pass_peak) = peak_above(|| {
        let (mut commits, mut events) = (0usize, 0usize);
        f.for_each_commit(&mut |_, c| {
            commits += 1;
            events += c.events.len();
            Ok(())
        })
        .unwrap();
        (commits, events)
    });
    eprintln!(
        "for_each_commit peak {pass_peak} bytes ({:.1}% of the file); {} commits, {} events",
        100.0 * pass_peak as f64 / file_bytes as f64,
        counts.0,
        counts.1
    );
    assert_eq!(counts.1, ENTRIES + 1, "created + one event per entry");
    assert!(
        pass_peak < limit,
        "for_each_commit took {pass_peak} bytes for a file of {file_bytes}"
    );
    drop(f);

    // For comparison (not asserted): the whole session in memory.
    let (s, whole_peak) = peak_above(|| {
        let r = BufReader::with_capacity(1 << 16, std::fs::File::open(&path).unwrap());
        read_pi(r, "long.jsonl").unwrap()
    });
    eprintln!(
        "read_pi peak {whole_peak} bytes ({:.1}x the file)",
        whole_peak as f64 / file_bytes as f64
    );
    assert_eq!(s.import.event_count(), ENTRIES as u64 + 1);
}
