//! Hostile input at the store and runtime level: each gets a clear error,
//! and nothing is lost, corrupted or created.
//!
//! Engine-level checks of crafted segments (every bit flip, hostile frame
//! lengths, future versions, wrong ids on the bare engine) live in
//! engine/tests/recovery.rs; these cover what a session store adds on top.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use spool_engine::format::{self, SEGMENT_HEADER_BYTES};
use spool_engine::{Durability, EventData, ExpectedVersion, NewCommit, INDEX_DIR, LOCK_FILE};
use spool_runtime::actions::WriteMetadata;
use spool_runtime::hooks::SessionHookStack;
use spool_runtime::observer::NullSink;
use spool_runtime::session::{encode_event, SessionEvent, SessionId};
use spool_runtime::store::{
    FileStore, ListQuery, LogStore, LogStoreOptions, MemoryStore, SessionStore, StoreError,
};
use spool_runtime::transcript::{Entry, EntryId, EntryKind};
use spool_runtime::SessionRuntime;
use spool_tests::ops::definition;
use spool_tests::seed::scratch_dir;

fn runtime(store: Arc<dyn SessionStore>) -> SessionRuntime {
    SessionRuntime::new(store, Arc::new(NullSink), SessionHookStack::empty())
}

fn log_opts() -> LogStoreOptions {
    LogStoreOptions {
        durability: Durability::Immediate,
        segment_bytes_max: Some(4096),
        ..LogStoreOptions::default()
    }
}

fn dir_listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn hostile_ids() -> Vec<String> {
    vec![
        String::new(),
        "/".into(),
        "a/b".into(),
        "..".into(),
        "../etc/passwd".into(),
        ".".into(),
        "a\0b".into(),
        "\0".into(),
        "x".repeat(10 * 1024),
        "a b".into(),
        "é".into(),
        "a.json".into(),
        "a\\b".into(),
    ]
}

#[test]
fn hostile_session_ids_are_refused_everywhere_and_create_nothing() {
    let fdir = scratch_dir();
    let ldir = scratch_dir();
    let fstore = FileStore::open(fdir.path()).expect("file store");
    let lstore = LogStore::open(ldir.path(), log_opts()).expect("log store");
    let files_before = dir_listing(fdir.path());
    let segs_before = dir_listing(ldir.path());
    // Positive control for the hand-made MessagePack below: a valid id decodes.
    let ok = json!({ "type": "forked", "from": "valid-id", "at_entry": null });
    let mut bytes = vec![spool_runtime::session::EVENT_SCHEMA];
    bytes.extend(serde_json_to_msgpack(&ok));
    assert!(matches!(
        spool_runtime::session::decode_event(&bytes),
        Ok(SessionEvent::Forked { .. })
    ));
    for bad in hostile_ids() {
        let shown = format!("{:?}", &bad.chars().take(20).collect::<String>());
        let err = SessionId::parse(&bad).expect_err(&format!("{shown} accepted"));
        // The error shows at most 64 bytes of the input, never 10 KB.
        assert!(err.to_string().len() < 300, "{shown}: error too long");
        assert_eq!(StoreError::from(err).kind(), "invalid_id");
        assert!(bad.parse::<SessionId>().is_err());
        // Ids inside documents are validated when decoded, too.
        let doc = serde_json::to_string(&bad).expect("json string");
        assert!(
            serde_json::from_str::<SessionId>(&doc).is_err(),
            "{shown} via JSON"
        );
        let ev = json!({ "type": "forked", "from": bad, "at_entry": null });
        let mut bytes = vec![spool_runtime::session::EVENT_SCHEMA];
        bytes.extend(serde_json_to_msgpack(&ev));
        assert!(
            spool_runtime::session::decode_event(&bytes).is_err(),
            "{shown} via an event"
        );
    }
    // A listing cursor carrying a hostile id is an invalid query, not a panic.
    for bad in ["u1:../x", "u1:", "i0:a/b", "zzz", ""] {
        let e = fstore
            .list_headers(&ListQuery::all().after(bad))
            .expect_err("hostile cursor accepted");
        assert_eq!(e.kind(), "invalid_query", "{bad}");
        let e = lstore
            .list_headers(&ListQuery::all().after(bad))
            .expect_err("hostile cursor accepted");
        assert_eq!(e.kind(), "invalid_query", "{bad}");
    }
    assert_eq!(dir_listing(fdir.path()), files_before, "files were created");
    assert_eq!(dir_listing(ldir.path()), segs_before, "files were created");
    assert!(lstore
        .engine()
        .expect("engine handle")
        .streams()
        .expect("streams")
        .is_empty());
}

/// MessagePack (named form, as the codecs write) of a JSON value.
fn serde_json_to_msgpack(v: &serde_json::Value) -> Vec<u8> {
    rmp_serde_like(v)
}

/// A minimal MessagePack encoder for JSON values (maps, arrays, strings,
/// null), so the test can craft events without the runtime's encoder.
fn rmp_serde_like(v: &serde_json::Value) -> Vec<u8> {
    let mut out = Vec::new();
    fn put(out: &mut Vec<u8>, v: &serde_json::Value) {
        match v {
            serde_json::Value::Null => out.push(0xc0),
            serde_json::Value::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
            serde_json::Value::Number(n) => {
                out.push(0xcf);
                out.extend_from_slice(&n.as_u64().unwrap_or(0).to_be_bytes());
            }
            serde_json::Value::String(s) => {
                out.push(0xdb);
                out.extend_from_slice(&(s.len() as u32).to_be_bytes());
                out.extend_from_slice(s.as_bytes());
            }
            serde_json::Value::Array(a) => {
                out.push(0xdd);
                out.extend_from_slice(&(a.len() as u32).to_be_bytes());
                for x in a {
                    put(out, x);
                }
            }
            serde_json::Value::Object(m) => {
                out.push(0xdf);
                out.extend_from_slice(&(m.len() as u32).to_be_bytes());
                for (k, x) in m {
                    put(out, &serde_json::Value::String(k.clone()));
                    put(out, x);
                }
            }
        }
    }
    put(&mut out, v);
    out
}

/// A file store with two good sessions; returns the store, the runtime
/// and the ids.
fn file_store_with_two() -> (tempfile::TempDir, SessionRuntime, SessionId, SessionId) {
    let dir = scratch_dir();
    let store = Arc::new(FileStore::open(dir.path()).expect("file store"));
    let rt = runtime(store);
    let a = rt.create(definition(0), None).expect("create").id().clone();
    let b = rt.create(definition(1), None).expect("create").id().clone();
    rt.execute(&b, &WriteMetadata::new("k", json!("v")))
        .expect("save");
    (dir, rt, a, b)
}

/// Loading `victim` fails with `InvalidSessionFile` naming its file; the
/// listing still works, reports the file in `skipped` (when even the header
/// is unreadable), and still lists the good session intact.
fn assert_reported(
    rt: &SessionRuntime,
    dir: &Path,
    victim: &SessionId,
    good: &SessionId,
    what: &str,
) {
    let path = dir.join(format!("{victim}.json"));
    match rt.get_session(victim) {
        Err(e) => match e.as_store() {
            Some(StoreError::InvalidSessionFile { path: p, reason }) => {
                assert_eq!(p, &path, "{what}");
                assert!(!reason.is_empty(), "{what}");
            }
            other => panic!("{what}: expected InvalidSessionFile, got {other:?} ({e})"),
        },
        Ok(_) => panic!("{what}: a damaged session file loaded"),
    }
    let list = rt
        .list_sessions(&ListQuery::all().including_deleted())
        .unwrap_or_else(|e| panic!("{what}: listing failed: {e}"));
    assert!(
        list.ids().contains(good),
        "{what}: the good session is not listed"
    );
    let listed_victim = list.ids().contains(victim);
    let skipped_victim = list
        .skipped
        .iter()
        .any(|s| s.location.contains(victim.as_str()));
    assert!(
        listed_victim ^ skipped_victim,
        "{what}: the damaged file must be listed (readable header) or skipped, not both or neither"
    );
    let g = rt
        .get_session(good)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(g.version(), 2, "{what}");
}

#[test]
fn truncated_session_files_are_reported_and_listing_goes_on() {
    let (dir, rt, a, b) = file_store_with_two();
    let path = dir.path().join(format!("{a}.json"));
    let original = std::fs::read(&path).expect("read");
    // Every 7th length, and the last one that is not a whole document (the
    // file ends with `}` and a newline; dropping only the newline is fine).
    assert!(original.ends_with(b"}\n"));
    let mut cuts: Vec<usize> = (0..original.len() - 1).step_by(7).collect();
    cuts.push(original.len() - 2);
    for cut in cuts {
        std::fs::write(&path, &original[..cut]).expect("write");
        assert_reported(&rt, dir.path(), &a, &b, &format!("truncated at {cut}"));
    }
    // Restored, it loads again: nothing else was touched.
    std::fs::write(&path, &original).expect("write");
    assert_eq!(rt.get_session(&a).expect("load").version(), 1);
}

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

#[test]
fn deeply_nested_session_files_are_errors_not_stack_overflows() {
    let (dir, rt, a, b) = file_store_with_two();
    let path = dir.path().join(format!("{a}.json"));
    let original = String::from_utf8(std::fs::read(&path).expect("read")).expect("utf8");
    let (first, _) = original.split_once('\n').expect("two-line layout");
    let deep = nested(1_100);
    // In the state (the header line stays readable).
    std::fs::write(
        &path,
        format!("{first}\n\"definition\":{{}},\"state\":{{\"metadata\":{{\"k\":{deep}}}}}}}\n"),
    )
    .expect("write");
    assert_reported(&rt, dir.path(), &a, &b, "nested state");
    // In the header line.
    std::fs::write(&path, format!("{{\"format\":1,\"header\":{deep}}}\n")).expect("write");
    assert_reported(&rt, dir.path(), &a, &b, "nested header");
    // Objects rather than arrays, on one line.
    let objs = format!("{}1{}", "{\"a\":".repeat(1_100), "}".repeat(1_100));
    std::fs::write(&path, format!("{{\"format\":1,\"header\":{objs}}}")).expect("write");
    assert_reported(&rt, dir.path(), &a, &b, "nested objects");
}

#[test]
fn enormous_session_files_are_bounded_and_listing_goes_on() {
    let (dir, rt, a, b) = file_store_with_two();
    let path = dir.path().join(format!("{a}.json"));
    let original = String::from_utf8(std::fs::read(&path).expect("read")).expect("utf8");
    let (first, _) = original.split_once('\n').expect("two-line layout");
    // 64 MiB of whitespace before the document: no header line to read
    // quickly; the file is still valid JSON.
    let mut ws = vec![b' '; 64 << 20];
    ws.extend_from_slice(original.as_bytes());
    std::fs::write(&path, &ws).expect("write");
    drop(ws);
    let s = rt.get_session(&a).expect("whitespace is valid JSON");
    assert_eq!(s.version(), 1);
    let list = rt.list_sessions(&ListQuery::all()).expect("listing");
    assert_eq!(list.total, 2);
    // A 64 MiB array in the state after an intact header line: listing
    // reads only the header line; the load either succeeds or fails
    // cleanly (here the array is not a valid metadata map: an error).
    let mut big = String::with_capacity((64 << 20) + 1024);
    big.push_str(first);
    big.push_str("\n\"definition\":{},\"state\":{\"metadata\":[");
    while big.len() < 64 << 20 {
        big.push_str("0,0,0,0,0,0,0,0,");
    }
    big.push_str("0]}}\n");
    std::fs::write(&path, big.as_bytes()).expect("write");
    drop(big);
    assert_reported(&rt, dir.path(), &a, &b, "64 MiB array");
    let list = rt.list_sessions(&ListQuery::all()).expect("listing");
    assert_eq!(
        list.total, 2,
        "the header line of the big file is still listed"
    );
    // 64 MiB of whitespace inside the header line (past the 64 KiB fast
    // path) and garbage after: an error, listing goes on.
    let mut junk = first.as_bytes()[..20].to_vec();
    junk.extend(std::iter::repeat_n(b' ', 64 << 20));
    junk.extend_from_slice(b"\x00\xff garbage");
    std::fs::write(&path, &junk).expect("write");
    drop(junk);
    assert_reported(&rt, dir.path(), &a, &b, "64 MiB header line");
}

#[test]
fn session_file_whose_header_names_another_session_is_refused() {
    let (dir, rt, a, b) = file_store_with_two();
    let pa = dir.path().join(format!("{a}.json"));
    let pb = dir.path().join(format!("{b}.json"));
    // A copy of b's file under a's name must not load as either.
    std::fs::copy(&pb, &pa).expect("copy");
    assert_reported(&rt, dir.path(), &a, &b, "file of another session");
    // Files whose names are not valid ids are skipped by listing, never opened as sessions.
    for name in ["..json", "a b.json", ".hidden.json", "x.json.tmp"] {
        std::fs::write(dir.path().join(name), b"{}").expect("write");
    }
    let list = rt
        .list_sessions(&ListQuery::all().including_deleted())
        .expect("listing");
    assert!(list.ids().contains(&b));
    assert!(list
        .skipped
        .iter()
        .any(|s| s.location.ends_with("a b.json")));
}

// ---------------------------------------------------------------------------
// Log store: damaged and crafted segments under a session store.

/// A log store with three sessions saved a few times; returns the dir and
/// (id, version) of each.
fn log_store_with_sessions(dir: &Path) -> Vec<(SessionId, u64)> {
    let store = Arc::new(LogStore::open(dir, log_opts()).expect("open"));
    let rt = runtime(store.clone());
    let mut out = Vec::new();
    for agent in 0..3u8 {
        let s = rt.create(definition(agent), None).expect("create");
        let mut v = s.version();
        for i in 0..6 {
            v = rt
                .execute(
                    s.id(),
                    &WriteMetadata::new(format!("k{i}"), json!("x".repeat(300))),
                )
                .expect("save")
                .version();
        }
        out.push((s.id().clone(), v));
    }
    drop(rt);
    Arc::try_unwrap(store)
        .expect("sole owner")
        .close()
        .expect("close");
    out
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// One past the last non-zero byte.
fn log_end(b: &[u8]) -> usize {
    b.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1)
}

fn expect_open_error(dir: &Path, what: &str, check: impl Fn(&spool_engine::Error)) {
    let before: Vec<Vec<u8>> = segments(dir)
        .iter()
        .map(|p| std::fs::read(p).expect("read"))
        .collect();
    for read_only in [false, true] {
        let r = if read_only {
            LogStore::open_read_only(dir)
        } else {
            LogStore::open(dir, log_opts())
        };
        match r {
            Err(StoreError::Engine(e)) => {
                check(&e);
                assert_eq!(StoreError::Engine(e).kind(), "engine");
            }
            Err(other) => panic!("{what}: expected an engine error, got {other}"),
            Ok(_) => panic!("{what}: a damaged log opened (read_only {read_only})"),
        }
    }
    let after: Vec<Vec<u8>> = segments(dir)
        .iter()
        .map(|p| std::fs::read(p).expect("read"))
        .collect();
    assert!(
        before == after,
        "{what}: a refused open modified the segments"
    );
}

#[test]
fn zeroed_tail_and_torn_last_save_under_the_session_store() {
    let dir = scratch_dir();
    let sessions = log_store_with_sessions(dir.path());
    let segs = segments(dir.path());
    let last = segs.last().expect("a segment");
    let bytes = std::fs::read(last).expect("read");
    let end = log_end(&bytes);
    // Zeroing the (never written) tail changes nothing.
    let mut z = bytes.clone();
    for b in &mut z[end..] {
        *b = 0;
    }
    std::fs::write(last, &z).expect("write");
    {
        let store = LogStore::open(dir.path(), log_opts()).expect("open");
        for (id, v) in &sessions {
            assert_eq!(
                store.load(id).expect("load").expect("present").version(),
                *v
            );
        }
    }
    // Tear the last record: zero its second half. Exactly the last save
    // (of the last session) is lost; everything else is intact.
    let store = LogStore::open_read_only(dir.path()).expect("open");
    let (last_id, last_v) = sessions.last().expect("sessions").clone();
    let pos = store
        .engine()
        .expect("engine handle")
        .read_stream(last_id.as_str(), last_v, 1)
        .expect("read")[0]
        .info
        .position;
    drop(store);
    let path = dir.path().join(format::segment_file_name(pos.segment));
    let mut torn = std::fs::read(&path).expect("read");
    let start = pos.offset as usize;
    let rec_end = log_end(&torn);
    for b in &mut torn[start + (rec_end - start) / 2..rec_end] {
        *b = 0;
    }
    std::fs::write(&path, &torn).expect("write");
    // A write torn at a crash was never synced, so the index cannot record it as on
    // disk; this store's index does (the save was acknowledged and the store closed),
    // and would make the open refuse the damage. Without it, the bytes are all there is.
    std::fs::remove_dir_all(dir.path().join("index")).expect("remove the index");
    let store = LogStore::open(dir.path(), log_opts()).expect("open a torn tail");
    for (id, v) in &sessions {
        let want = if *id == last_id { v - 1 } else { *v };
        let s = store.load(id).expect("load").expect("present");
        assert_eq!(s.version(), want, "{id}");
        assert_eq!(store.header(id).expect("header").as_ref(), Some(s.info()));
    }
    // And the session continues from there.
    let rt = runtime(Arc::new(store));
    let s = rt
        .execute(&last_id, &WriteMetadata::new("again", json!(1)))
        .expect("save after recovery");
    assert_eq!(s.version(), last_v);
}

/// A log store of sealed segments whose second segment's first frame claims
/// a hostile length; returns the damaged segment's file name.
fn hostile_length_in_a_sealed_segment(dir: &Path) -> String {
    log_store_with_sessions(dir);
    let segs = segments(dir);
    assert!(segs.len() >= 3, "want sealed segments, got {}", segs.len());
    let victim = &segs[1];
    let mut bytes = std::fs::read(victim).expect("read");
    let at = SEGMENT_HEADER_BYTES as usize;
    bytes[at..at + 4].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    std::fs::write(victim, &bytes).expect("write");
    victim
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned()
}

fn is_corrupt_at_first_frame(e: &spool_engine::Error, name: &str) {
    match e {
        spool_engine::Error::Corrupt {
            segment, offset, ..
        } => {
            assert_eq!(segment, name);
            assert_eq!(*offset, SEGMENT_HEADER_BYTES);
            assert!(e.to_string().contains(name));
        }
        other => panic!("expected Corrupt, got {other}"),
    }
}

#[test]
fn hostile_frame_length_in_a_sealed_segment_is_refused_with_segment_and_offset() {
    let dir = scratch_dir();
    let name = hostile_length_in_a_sealed_segment(dir.path());
    // Without a checkpoint every open reads the whole log and meets it.
    std::fs::remove_dir_all(dir.path().join(spool_engine::CHECKPOINT_DIR))
        .expect("remove the checkpoints");
    expect_open_error(dir.path(), "hostile length", |e| {
        is_corrupt_at_first_frame(e, &name)
    });
    // verify names it too, and the tools' salvage path can start from there.
    let r = spool_engine::verify(dir.path(), log_opts().engine_options()).expect("verify runs");
    assert!(!r.ok);
    assert!(r.errors.iter().any(|p| p.segment == name));
}

#[test]
fn hostile_frame_length_before_a_checkpoint_fails_the_read_that_meets_it_and_verify() {
    let dir = scratch_dir();
    let name = hostile_length_in_a_sealed_segment(dir.path());
    // An open from a checkpoint does not read the records before it: the damage is
    // met by the read that reaches it (naming the file and offset) and by verify,
    // which reads every record.
    let store = LogStore::open_read_only(dir.path()).expect("open from the checkpoint");
    let engine = store.engine().expect("engine handle");
    let err = engine
        .scan(1)
        .expect("scan")
        .find_map(Result::err)
        .expect("a scan of the whole log meets the damage");
    is_corrupt_at_first_frame(&err, &name);
    drop(store);
    let r = spool_engine::verify(dir.path(), log_opts().engine_options()).expect("verify runs");
    assert!(!r.ok);
    assert!(r.errors.iter().any(|p| p.segment == name));
}

#[test]
fn future_format_version_and_wrong_segment_id_under_the_session_store() {
    let dir = scratch_dir();
    log_store_with_sessions(dir.path());
    let segs = segments(dir.path());
    // A segment claiming a future format (with a valid header checksum).
    let victim = segs.last().expect("segment");
    let original = std::fs::read(victim).expect("read");
    let id = format::parse_segment_file_name(&victim.file_name().expect("name").to_string_lossy())
        .expect("segment name");
    let mut h = format::encode_header(id);
    let future = format::SEGMENT_FORMAT_VERSION + 1;
    h[8..12].copy_from_slice(&future.to_le_bytes());
    let crc = format::mask_crc(crc32(&h[..28]));
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    let mut bytes = original.clone();
    bytes[..32].copy_from_slice(&h);
    std::fs::write(victim, &bytes).expect("write");
    expect_open_error(dir.path(), "future format", |e| match e {
        spool_engine::Error::UnsupportedFormat { found, .. } => assert_eq!(*found, future),
        other => panic!("expected UnsupportedFormat, got {other}"),
    });
    std::fs::write(victim, &original).expect("restore");
    // A sealed segment renamed to another id: records carry their segment
    // id in the checksum, so it cannot pass as the other segment.
    let moved = dir.path().join(format::segment_file_name(id + 10));
    std::fs::rename(&segs[0], &moved).expect("rename");
    let r = LogStore::open(dir.path(), log_opts());
    assert!(
        matches!(
            r,
            Err(StoreError::Engine(spool_engine::Error::Corrupt { .. }))
        ),
        "a renamed segment opened: {:?}",
        r.err()
    );
}

fn crc32(b: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &byte in b {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn undecodable_and_dangling_events_fail_that_session_only() {
    let dir = scratch_dir();
    let sessions = log_store_with_sessions(dir.path());
    let store = Arc::new(LogStore::open(dir.path(), log_opts()).expect("open"));
    let (garbled, vg) = sessions[0].clone();
    let (dangling, vd) = sessions[1].clone();
    let (good, _) = sessions[2].clone();
    // Checksummed, framed correctly, but the payload is not an event.
    store
        .engine()
        .expect("engine handle")
        .append(NewCommit::new(
            garbled.as_str(),
            ExpectedVersion::Exact(vg),
            vec![EventData::new(
                "session.entry_appended",
                vec![1, 0xc1, 0xff, 0x00],
            )],
        ))
        .expect("append");
    // A valid event whose entry's parent does not exist.
    let ev = SessionEvent::EntryAppended {
        entry: Entry {
            id: EntryId::parse("child").expect("id"),
            parent_id: Some(EntryId::parse("nowhere").expect("id")),
            timestamp_ms: 1,
            kind: EntryKind::Reset,
        },
    };
    store
        .engine()
        .expect("engine handle")
        .append(NewCommit::new(
            dangling.as_str(),
            ExpectedVersion::Exact(vd),
            vec![EventData::new(
                "session.entry_appended",
                encode_event(&ev).expect("encode"),
            )],
        ))
        .expect("append");
    for s in [&*store, &LogStore::open_read_only(dir.path()).expect("ro")] {
        match s.load(&garbled) {
            Err(e @ StoreError::Encoding { .. }) => {
                assert!(e.to_string().contains(garbled.as_str()), "{e}")
            }
            other => panic!("garbled event: expected Encoding, got {other:?}"),
        }
        match s.load(&dangling) {
            Err(e @ StoreError::Corrupt { .. }) => {
                assert!(e.to_string().contains(dangling.as_str()), "{e}")
            }
            other => panic!("dangling parent: expected Corrupt, got {other:?}"),
        }
        assert!(s.load(&good).expect("load").is_some());
        let list = s.list_headers(&ListQuery::all()).expect("listing");
        assert_eq!(list.total, 3);
    }
}

#[test]
fn commit_over_the_size_limit_is_a_clear_error_and_the_store_stays_usable() {
    let dir = scratch_dir();
    let opts = LogStoreOptions {
        record_bytes_max: Some(64 << 10),
        ..log_opts()
    };
    let store = Arc::new(LogStore::open(dir.path(), opts.clone()).expect("open"));
    let rt = runtime(store.clone());
    let s = rt.create(definition(0), None).expect("create");
    let err = rt
        .execute(
            s.id(),
            &WriteMetadata::new("big", json!("x".repeat(100 << 10))),
        )
        .expect_err("an oversized commit was accepted");
    match err.as_store() {
        Some(StoreError::Engine(spool_engine::Error::RecordTooLarge { bytes, max })) => {
            assert!(*bytes > 100 << 10);
            assert_eq!(*max, 64 << 10);
        }
        other => panic!("expected RecordTooLarge, got {other:?}"),
    }
    assert!(
        !store.engine().expect("engine handle").is_poisoned(),
        "an oversized commit poisoned the store"
    );
    let s2 = rt
        .execute(s.id(), &WriteMetadata::new("small", json!(1)))
        .expect("the store stays usable");
    assert_eq!(s2.version(), 2);
    assert!(!s2.state().metadata.contains_key("big"));
    // The same for a create whose first commit is too large.
    let seed = spool_runtime::session::AgentState::new()
        .with_metadata("big", json!("y".repeat(100 << 10)));
    assert!(rt.create(definition(1), Some(seed)).is_err());
    assert_eq!(rt.list_sessions(&ListQuery::all()).expect("list").total, 1);
    drop(rt);
    drop(store);
    let store = LogStore::open(dir.path(), opts).expect("reopen");
    assert_eq!(
        store
            .load(s.id())
            .expect("load")
            .expect("present")
            .version(),
        2
    );
    // The memory and file stores accept it (they have no record limit).
    let rt = runtime(Arc::new(MemoryStore::new()));
    let m = rt.create(definition(0), None).expect("create");
    rt.execute(
        m.id(),
        &WriteMetadata::new("big", json!("x".repeat(100 << 10))),
    )
    .expect("memory store has no record limit");
}

// ---------------------------------------------------------------------------
// Permissions.

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777
}

/// Every file and directory under `root` (and root itself) that grants
/// anything to group or others. (Under the usual umask 022 a file created
/// without an explicit mode is 0644, so the defect shows; a umask of 077
/// would hide it.)
fn too_open(root: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = mode(&p);
        if m & 0o077 != 0 {
            bad.push(format!("{} {:o}", p.display(), m));
        }
        if p.is_dir() {
            for e in std::fs::read_dir(&p).expect("read_dir") {
                stack.push(e.expect("entry").path());
            }
        }
    }
    bad.sort();
    bad
}

#[test]
fn file_store_creates_owner_only_files_and_directories() {
    let base = scratch_dir();
    let dir = base.path().join("sessions");
    let rt = runtime(Arc::new(FileStore::open(&dir).expect("open")));
    let s = rt.create(definition(0), None).expect("create");
    rt.execute(s.id(), &WriteMetadata::new("k", json!(1)))
        .expect("save");
    let bad = too_open(&dir);
    assert!(bad.is_empty(), "group/other access: {bad:?}");
}

#[test]
fn log_store_creates_owner_only_files_and_directories() {
    let base = scratch_dir();
    let dir = base.path().join("store");
    let store = Arc::new(LogStore::open(&dir, log_opts()).expect("open"));
    let rt = runtime(store.clone());
    let s = rt.create(definition(0), None).expect("create");
    for i in 0..20 {
        rt.execute(s.id(), &WriteMetadata::new("k", json!("x".repeat(200 + i))))
            .expect("save");
    }
    drop(rt);
    Arc::try_unwrap(store)
        .expect("sole owner")
        .close()
        .expect("close");
    assert!(dir.join(LOCK_FILE).exists() && dir.join(INDEX_DIR).is_dir());
    let bad = too_open(&dir);
    assert!(bad.is_empty(), "group/other access: {bad:?}");
}

/// A checksummed record whose `session.status_changed` payload does not
/// decode (a foreign writer, or a newer event schema) must cost that one
/// session, not the store: the other sessions must stay readable and
/// listable, read-only opens included.
#[test]

fn undecodable_indexed_event_fails_that_session_only() {
    let dir = scratch_dir();
    let sessions = log_store_with_sessions(dir.path());
    let store = LogStore::open(dir.path(), log_opts()).expect("open");
    let (bad, v) = sessions[0].clone();
    // The append is durable in the log even though indexing it fails.
    let _ = store
        .engine()
        .expect("engine handle")
        .append(NewCommit::new(
            bad.as_str(),
            ExpectedVersion::Exact(v),
            vec![EventData::new("session.status_changed", vec![1, 0xc1])],
        ));
    drop(store);
    for read_only in [false, true] {
        let store = if read_only {
            LogStore::open_read_only(dir.path())
        } else {
            LogStore::open(dir.path(), log_opts())
        }
        .unwrap_or_else(|e| panic!("read_only {read_only}: one bad event refused the store: {e}"));
        for (id, v) in &sessions[1..] {
            assert_eq!(
                store.load(id).expect("load").expect("present").version(),
                *v
            );
        }
        assert!(store.load(&bad).is_err(), "the bad session loaded");
        let list = store.list_headers(&ListQuery::all()).expect("listing");
        assert!(list.total >= 2);
    }
}
