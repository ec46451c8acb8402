//! The memory an import takes for a line holding a large JSON payload:
//! at most ~10 times the line, above what was allocated before, for a
//! pi session file and for a `spool-export` file, and the payload comes
//! back exactly. A binary of its own: it counts every allocation of the
//! process with its own global allocator.

use std::alloc::System;
use std::io::Cursor;

use peakmem_alloc::{PeakMemAlloc, PeakMemAllocTrait, INSTRUMENTED_SYSTEM};
use spool_engine::Durability;
use spool_runtime::import::pi::read_pi;
use spool_runtime::store::exchange::{import_from, read_export, ExportWriter, ImportOptions};
use spool_runtime::transcript::{ContentBlock, EntryKind, Message};
use spool_runtime::{LogStore, LogStoreOptions, SessionStore};

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

/// A JSON array of `n` small integers.
fn big_array(n: usize) -> String {
    let mut s = String::with_capacity(2 * n + 2);
    s.push('[');
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push(char::from(b'0' + (i % 10) as u8));
    }
    s.push(']');
    s
}

/// The one test of this binary: the counters are the process's, so the
/// stages run one after the other.
#[test]
fn importing_a_line_with_a_large_array_takes_at_most_ten_times_the_line() {
    const ELEMENTS: usize = 2_000_000;
    let array = big_array(ELEMENTS);
    let big_line = format!(
        r#"{{"type":"message","id":"a1","parentId":"u1","timestamp":"2025-01-02T03:04:07.000Z","message":{{"role":"assistant","content":[{{"type":"toolCall","id":"c1","name":"t","arguments":{{"xs":{array}}}}}],"provider":"p","model":"m","stopReason":"toolUse"}}}}"#
    );
    let file = format!(
        "{}\n{}\n{}\n",
        r#"{"type":"session","version":3,"id":"pi-memory","timestamp":"2025-01-02T03:04:05.678Z","cwd":"/tmp"}"#,
        r#"{"type":"message","id":"u1","parentId":null,"timestamp":"2025-01-02T03:04:06.000Z","message":{"role":"user","content":"hi"}}"#,
        big_line
    );
    let line = big_line.len();
    drop(big_line);
    let limit = 10 * line;

    // Reading the pi file.
    let (pi, peak) = peak_above(|| read_pi(Cursor::new(file.as_bytes()), "memory.jsonl").unwrap());
    eprintln!("line {line} bytes; read_pi peak {peak}");
    assert!(
        peak <= limit,
        "read_pi took {peak} bytes for a line of {line}"
    );
    drop(file);

    // Importing it into a store.
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions {
        durability: Durability::Buffered,
        ..Default::default()
    };
    let store = LogStore::open(dir.path().join("a"), opts.clone()).unwrap();
    let sessions = vec![pi.import];
    let (imported, peak) = peak_above(|| {
        import_from(
            &store,
            &mut sessions.as_slice(),
            &ImportOptions::default(),
            &mut |_| {},
        )
        .unwrap()
    });
    eprintln!("pi import peak {peak}");
    assert!(
        peak <= limit,
        "the import took {peak} bytes for a line of {line}"
    );
    let id = imported[0].id.clone();
    drop(sessions);

    // Exported, then the export read and imported into another store.
    let mut w = ExportWriter::new(Vec::new()).unwrap();
    w.session(&store, &id).unwrap();
    let (export, _) = w.finish().unwrap();
    let export_line = export
        .split(|&b| b == b'\n')
        .map(<[u8]>::len)
        .max()
        .unwrap();
    assert!(export_line >= line - 200, "{export_line}");
    let (sessions, peak) = peak_above(|| read_export(Cursor::new(&export)).unwrap());
    eprintln!("export line {export_line} bytes; read_export peak {peak}");
    assert!(
        peak <= 10 * export_line,
        "reading the export took {peak} bytes"
    );
    let other = LogStore::open(dir.path().join("b"), opts).unwrap();
    let (_, peak) = peak_above(|| {
        import_from(
            &other,
            &mut sessions.as_slice(),
            &ImportOptions::default(),
            &mut |_| {},
        )
        .unwrap()
    });
    eprintln!("export import peak {peak}");
    assert!(peak <= 10 * export_line, "the import took {peak} bytes");
    drop(sessions);

    // The payload is back, exactly, in the second store.
    let session = other.load(&id).unwrap().unwrap();
    let call = session
        .state()
        .transcript
        .entries()
        .iter()
        .find_map(|e| match &e.kind {
            EntryKind::Message {
                message: Message::Assistant { content, .. },
            } => content.iter().find_map(|b| match b {
                ContentBlock::ToolCall { arguments, .. } => Some(arguments.clone()),
                _ => None,
            }),
            _ => None,
        })
        .unwrap();
    assert_eq!(call.as_str(), format!(r#"{{"xs":{array}}}"#));
    // And a second export gives the same lines (but the header's time).
    let mut w = ExportWriter::new(Vec::new()).unwrap();
    w.session(&other, &id).unwrap();
    let (again, _) = w.finish().unwrap();
    let body = |b: &[u8]| {
        b.split(|&c| c == b'\n')
            .skip(1)
            .map(<[u8]>::to_vec)
            .collect::<Vec<_>>()
    };
    assert!(body(&again) == body(&export));
}
