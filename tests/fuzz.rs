//! Bodies of the cargo-fuzz targets in `fuzz/`.
//!
//! Each function takes arbitrary bytes and must never panic, hang or
//! allocate without bound; where a cross-check is cheap it also asserts an
//! invariant (a panic is a finding). The `fuzz/` crate calls these from its
//! `fuzz_target!`s; the test `tests/fuzz_corpus.rs` replays every saved input
//! of `fuzz/corpus/<target>/` through the same function on stable Rust.
//!
//! [`seed_inputs`] produces meaningful starting inputs (valid segments,
//! valid events and snapshots, operation scripts) for the corpora.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use spool_engine::format::{self, FrameCheck, SEGMENT_HEADER_BYTES};
use spool_engine::fuzzing as engine_fz;
use spool_engine::vfs::{FaultKind, FaultVfs, OpenMode, SimVfs, Vfs};
use spool_engine::{
    verify, Durability, EventData, ExpectedVersion, LogPosition, NewCommit, Options, Store,
};
use spool_runtime::fuzzing::{
    self as tx, decode_appended_entry_serde, decode_event_serde, decode_snapshot_serde,
    encode_seed_bucket, header_record_reencoded, seed_bucket_records, EntryRecord,
    TRANSCRIPT_INDEXER,
};
use spool_runtime::session::{
    decode_appended_entry, decode_event, decode_snapshot, encode_event, encode_snapshot,
    AgentDefinition, AgentSession, SessionEvent, SessionId,
};
use spool_runtime::store::log::SESSION_INDEXER;
use spool_runtime::store::{ListQuery, LogStore, LogStoreOptions, SessionStore};

use crate::ops::{Op, Pick, Runner, StoreKind};
use crate::seed::Rng;
use crate::workload::{capturing_runtime, check_recovered, run_workload, Tracker};

/// The fuzz targets, by name (also the corpus directory names).
pub const TARGETS: [&str; 9] = [
    "frame_decode",
    "event_decode",
    "store_open",
    "session_ops",
    "index_record",
    "index_values",
    "redo_record",
    "key_filter",
    "checkpoint_file",
];

/// Runs the target `name` on `data`. Unknown names panic (a test bug).
pub fn run_target(name: &str, data: &[u8]) {
    match name {
        "frame_decode" => frame_decode(data),
        "event_decode" => event_decode(data),
        "store_open" => store_open(data),
        "session_ops" => session_ops(data),
        "index_record" => index_record(data),
        "index_values" => index_values(data),
        "redo_record" => redo_record(data),
        "key_filter" => key_filter(data),
        "checkpoint_file" => checkpoint_file(data),
        other => panic!("unknown fuzz target {other}"),
    }
}

/// Largest input the targets look at; libFuzzer's default is 4 KiB, this
/// keeps replay of hand-made inputs bounded too.
pub const INPUT_BYTES_MAX: usize = 1 << 20;

const STORE_DIR: &str = "/fuzz-store";
/// Segment size of the stores `store_open` opens. A writer open that
/// starts a segment (a new active one, or the spare built ahead) fills it
/// with zeros and a reopen scans it, so at the default 64 MiB one input
/// took about a second, most of it zeroing and scanning; small segments
/// keep an execution in milliseconds. Segments the input holds keep their
/// own length.
const STORE_OPEN_SEGMENT_BYTES: u64 = 64 << 10;
/// A path that never exists: `verify` then skips the index.
const NO_INDEX: &str = "/nonexistent/spool-fuzz-index";

fn sim_with_files(files: &[(u64, Vec<u8>)]) -> SimVfs {
    let sim = SimVfs::new();
    let dir = Path::new(STORE_DIR);
    sim.create_dir_all(dir).expect("sim mkdir");
    for (id, bytes) in files {
        let p = dir.join(format::segment_file_name(*id));
        let f = sim.open(&p, OpenMode::CreateNew).expect("sim create");
        f.write_at(bytes, 0).expect("sim write");
        f.sync_data().expect("sim sync");
    }
    sim.sync_dir(dir).expect("sim sync dir");
    sim
}

/// `frame_decode`: record framing and segment recovery on arbitrary bytes.
///
/// The first byte chooses the mode. Mode 0: the rest is the record area of
/// a segment as is. Mode 1: the rest is a list of `u16 length ++ payload`
/// chunks, each framed with a correct checksum, so the fuzzer reaches the
/// commit decoder. Both are walked with the engine's frame checker and
/// commit decoder, then written as segment 1 into a `SimVfs` and verified.
pub fn frame_decode(data: &[u8]) {
    let data = &data[..data.len().min(INPUT_BYTES_MAX)];
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let max = spool_engine::RECORD_BYTES_MAX_DEFAULT;
    let records = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let mut out = Vec::new();
        let mut r = rest;
        while r.len() >= 2 {
            let n = usize::from(u16::from_le_bytes([r[0], r[1]])).min(r.len() - 2);
            let payload = &r[2..2 + n];
            out.extend_from_slice(&(n as u32).to_le_bytes());
            out.extend_from_slice(
                &format::record_crc(1, format::RECORD_KIND_COMMIT, payload).to_le_bytes(),
            );
            out.push(format::RECORD_KIND_COMMIT);
            out.extend_from_slice(payload);
            r = &r[2 + n..];
        }
        out
    };
    // Walk the frames as recovery does.
    let mut off = 0usize;
    let mut walked = 0u64;
    while off < records.len() {
        match format::check_frame(&records[off..], 1, max) {
            FrameCheck::Valid { payload, total, .. } => {
                assert!(
                    total as usize <= records.len() - off,
                    "frame larger than its bytes"
                );
                let pos = LogPosition {
                    segment: 1,
                    offset: SEGMENT_HEADER_BYTES + off as u64,
                };
                if let Ok(c) = format::decode_commit(payload, pos) {
                    assert!(!c.info.stream.is_empty());
                    assert!(c.events.len() <= format::EVENTS_PER_COMMIT_MAX);
                }
                off += total as usize;
                walked += 1;
            }
            FrameCheck::Zero | FrameCheck::Invalid(_) => break,
        }
    }
    let _ = format::check_header(rest, 1);
    // The same bytes as a whole segment: verify must report, never panic.
    let mut seg = format::encode_header(1).to_vec();
    seg.extend_from_slice(&records);
    let sim = sim_with_files(&[(1, seg)]);
    let opts = Options::default().vfs(Arc::new(sim)).index_dir(NO_INDEX);
    let report = verify(STORE_DIR, opts).expect("verify of a readable store");
    // Segment 1 is the last segment: whatever follows the valid frames is
    // a torn tail, so a clean report counts exactly the walked records.
    if report.ok {
        assert_eq!(report.records, walked, "verify and the frame walk disagree");
    }
}

/// `index_record`: the transcript index's entry record ([`EntryRecord`], a
/// value of the sled index, so bytes on disk) on arbitrary bytes. Decoding
/// never panics and never allocates past the input; whatever decodes
/// re-encodes to exactly the same bytes (the encoding is canonical, so no
/// two byte strings mean one record), and the children prefix that
/// `children` lookups read alone agrees with the whole decode. The same
/// bytes as a seed table bucket (`E` value): parsing never panics, and a
/// bucket that parses is rebuilt byte for byte from its records.
pub fn index_record(data: &[u8]) {
    let data = &data[..data.len().min(INPUT_BYTES_MAX)];
    if let Ok(records) = seed_bucket_records(data) {
        for (_, record) in &records {
            let _ = EntryRecord::decode(record);
        }
        assert_eq!(
            encode_seed_bucket(&records),
            data,
            "a parsed seed bucket rebuilds to other bytes"
        );
    }
    let prefix = EntryRecord::decode_children(data);
    if let Ok(r) = EntryRecord::decode(data) {
        assert_eq!(
            r.encode(),
            data,
            "a decoded record re-encodes to other bytes"
        );
        assert_eq!(
            prefix,
            Ok((r.children, r.only_child.clone())),
            "the children prefix disagrees with the record"
        );
        // An append writes its parent's count back by splicing the bytes it
        // read: the same bytes as encoding the changed record. One more child
        // (named by the record's parent id, or its own only child) and none.
        let only = r.parent.clone().or_else(|| r.only_child.clone());
        for (children, only) in [(r.children.wrapping_add(1), only), (0, None)] {
            let mut changed = r.clone();
            changed.children = children;
            changed.only_child = if children == 1 { only } else { None };
            assert_eq!(
                tx::splice_child_count(data, children, changed.only_child.as_ref()),
                Some(changed.encode()),
                "a spliced child count differs from the record's encoding"
            );
        }
    } else {
        // Never panics on bytes that are not a record.
        let _ = tx::splice_child_count(data, 1, None);
    }
}

/// `index_values`: the decoders of the sled index's other values that the
/// runtime reads back, on arbitrary bytes (each takes the same bytes):
/// - an active-path block (`p`): the framing is read alike by every reader
///   (the links, their count, a point read of each slot, a writer's
///   decoding) and a block that frames re-frames to the same bytes; each
///   link that decodes re-encodes to the same bytes and names the id a
///   leaf check reads in place;
/// - an orphan parent's child count (`n`): a count with exactly the bytes
///   the writer would give it re-encodes to them;
/// - a session header record (the sessions index): what decodes re-encodes
///   to the same bytes;
/// - the transcript meta record (`m`, MessagePack): what decodes encodes
///   and decodes to the same value.
///
/// None of them may panic or allocate past the input.
pub fn index_values(data: &[u8]) {
    let data = &data[..data.len().min(INPUT_BYTES_MAX)];
    // Active-path block and links.
    let links = tx::path_block_links(data);
    match &links {
        Ok(links) => {
            assert_eq!(tx::path_block_len(data), Ok(links.len() as u64));
            assert_eq!(tx::path_block_decoded(data), Ok(links.len()));
            for slot in 0..=links.len() {
                assert_eq!(
                    tx::path_block_link(data, slot),
                    Ok(links.get(slot).copied()),
                    "a point read of slot {slot} disagrees with the scan"
                );
            }
            let mut framed = Vec::with_capacity(data.len());
            for l in links {
                framed.extend_from_slice(&(l.len() as u16).to_be_bytes());
                framed.extend_from_slice(l);
            }
            assert_eq!(framed, data, "a framed block re-frames to other bytes");
            for l in links {
                check_path_link(l);
            }
        }
        Err(slot) => {
            assert!(tx::path_block_len(data).is_err(), "slot {slot} is bad");
            assert!(tx::path_block_decoded(data).is_err(), "slot {slot} is bad");
            assert_eq!(tx::path_block_link(data, 0), Err(*slot));
        }
    }
    check_path_link(data);
    // Child count of an absent parent.
    let (count, only) = tx::count_value_parts(data);
    if let Some(count) = count {
        let canonical = tx::count_value_bytes(count, only.as_ref());
        if (count != 1 || only.is_some()) && data.len() == canonical.len() {
            assert_eq!(canonical, data, "a count value re-encodes to other bytes");
        }
    }
    // Session header record.
    if let Ok(again) = header_record_reencoded(data) {
        assert_eq!(again, data, "a header record re-encodes to other bytes");
    }
    // Transcript meta record.
    if let Ok(m) = tx::decode_meta(data) {
        let again = tx::encode_meta(&m).expect("a decoded meta re-encodes");
        assert_eq!(
            tx::decode_meta(&again),
            Ok(m),
            "meta round trip changed the value"
        );
    }
}

/// One active-path link: decoding never panics, and a link that decodes
/// re-encodes to exactly its bytes, whose id is the one read in place.
fn check_path_link(link: &[u8]) {
    let id = tx::path_link_id_bytes(link);
    if let Some(again) = tx::path_link_reencoded(link) {
        assert_eq!(again, link, "a path link re-encodes to other bytes");
        assert!(id.is_some(), "a decoded link has no id in place");
    }
}

/// `event_decode`: the runtime's event and snapshot decoders on arbitrary
/// bytes. Whatever decodes must re-encode and decode to the same value, and
/// folding it (after a fixed `created`) must not panic; the hand readers
/// (appended entry, created and history_rewritten events, snapshots) must
/// agree with serde.
pub fn event_decode(data: &[u8]) {
    let data = &data[..data.len().min(INPUT_BYTES_MAX)];
    assert_eq!(
        decode_event(data).ok(),
        decode_event_serde(data).ok(),
        "the event hand reader and serde disagree"
    );
    if let Ok(ev) = decode_event(data) {
        let again = encode_event(&ev).expect("a decoded event re-encodes");
        let back = decode_event(&again).expect("a re-encoded event decodes");
        assert_eq!(back, ev, "event round trip changed the value");
        let created = created_event();
        let _ = AgentSession::replay([&created, &ev]);
        let _ = AgentSession::replay([&ev]);
    }
    // The same bytes with the schema byte forced, so mutations explore the body.
    let mut forced = data.to_vec();
    if !forced.is_empty() {
        forced[0] = spool_runtime::session::EVENT_SCHEMA;
        if let Ok(ev) = decode_event(&forced) {
            let again = encode_event(&ev).expect("a decoded event re-encodes");
            assert_eq!(decode_event(&again).expect("decodes"), ev);
        }
        // The appended-entry reader (a hand reader of the written layout,
        // serde for the rest) answers exactly what serde answers.
        assert_eq!(
            decode_appended_entry(&forced).ok(),
            decode_appended_entry_serde(&forced).ok(),
            "the hand reader and serde disagree"
        );
        assert_eq!(
            decode_event(&forced).ok(),
            decode_event_serde(&forced).ok(),
            "the event hand reader and serde disagree"
        );
        forced[0] = spool_runtime::session::SNAPSHOT_SCHEMA;
    }
    assert_eq!(
        decode_snapshot(&forced).ok(),
        decode_snapshot_serde(&forced).ok(),
        "the snapshot hand reader and serde disagree"
    );
    if let Ok(s) = decode_snapshot(&forced) {
        let again = encode_snapshot(&s).expect("a decoded snapshot re-encodes");
        let back = decode_snapshot(&again).expect("a re-encoded snapshot decodes");
        assert_eq!(back, s, "snapshot round trip changed the value");
        let _ = s.state().transcript.context();
        let _ = s.state().transcript.tree();
    }
}

fn created_event() -> SessionEvent {
    let s = AgentSession::new(AgentDefinition::new("fuzz", "", "p"), None);
    s.pending_events()[0].clone()
}

/// `key_filter`: the key filter saved at a clean close
/// (`DIR/index/keys.filter`, read by the next owner open) on arbitrary
/// bytes, as its filter part. Decoding never panics nor allocates past
/// the format's bounds, a filter that decodes re-encodes to the same
/// bytes, and the keys the input's last bytes name are looked up in it.
pub fn key_filter(data: &[u8]) {
    let data = &data[..data.len().min(INPUT_BYTES_MAX)];
    match engine_fz::key_filter_reencode(data) {
        Ok(again) => assert_eq!(again, data, "a key filter re-encodes to other bytes"),
        Err(_) => return,
    }
    for n in [0, 1, 8, 32] {
        let key = &data[data.len().saturating_sub(n)..];
        assert!(engine_fz::key_filter_may_contain(data, key).is_some());
    }
}

/// `checkpoint_file`: a checkpoint (`DIR/checkpoints/<seq>.ckpt`, which a
/// reader opens without a lock; a bulk load's runs have the same format) on
/// arbitrary bytes, opened and read whole as a reader reads one. Neither
/// panics nor allocates past the format's bounds (every length is checked
/// against the file before it is used), and a file whose entries come out in
/// ascending key order answers a lookup of each of them with its value.
pub fn checkpoint_file(data: &[u8]) {
    let data = &data[..data.len().min(INPUT_BYTES_MAX)];
    let Ok((entries, found)) = engine_fz::checkpoint_entries(data, 64) else {
        return;
    };
    if !entries.windows(2).all(|w| w[0].0 < w[1].0) {
        return;
    }
    for ((k, v), f) in entries.iter().zip(&found) {
        assert_eq!(f.as_deref(), Some(&v[..]), "the lookup of key {k:?}");
    }
}

/// A checkpoint file as a clean close writes it: a store of a few hundred
/// commits over several streams.
fn checkpoint_seed() -> Vec<u8> {
    let sim = SimVfs::new();
    let dir = Path::new("/fuzz-checkpoint-store");
    let ix = crate::seed::scratch_dir();
    let opts = Options::default()
        .durability(Durability::Buffered)
        .vfs(Arc::new(sim.clone()))
        .next_segment(spool_engine::NextSegment::Inline)
        .index_dir(ix.path().join("index"));
    let s = Store::open(dir, opts).expect("open a sim store");
    for i in 0..300u64 {
        let event = EventData::new("e", vec![i as u8; 40]);
        let c = NewCommit::new(format!("s{}", i % 7), ExpectedVersion::Any, vec![event]);
        s.append(c).expect("append");
    }
    s.close().expect("close");
    let ckpts = dir.join(spool_engine::CHECKPOINT_DIR);
    let name = sim
        .read_dir(&ckpts)
        .expect("the checkpoint directory")
        .into_iter()
        .find(|n| n.ends_with(".ckpt"))
        .expect("a checkpoint written at close");
    sim.read_file(&ckpts.join(name))
        .expect("read the checkpoint")
}

/// `redo_record`: the index's redo log (`DIR/index/moves.redo`, written by
/// every move of the memtable into sled and read by an open after a crash)
/// on arbitrary bytes. The first byte chooses the mode.
///
/// - Mode 0: the rest is a record body. Decoding never panics, and a body
///   that decodes re-encodes to the same bytes (one encoding per record).
/// - Mode 1: the rest is a whole redo log, written into a scratch index
///   directory and searched, as an open after a crash searches it, for the
///   marker of every record that frames in it, for a marker made of the
///   input's first bytes and for one of the wrong length. A body found is
///   the one the marker names (same length and checksum), and a record
///   whose header carries its body's checksum is always found (or an
///   earlier record with the same header fails its checksum: an error).
pub fn redo_record(data: &[u8]) {
    let data = &data[..data.len().min(INPUT_BYTES_MAX)];
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        if let Ok(writes) = engine_fz::redo_body_writes(rest) {
            assert_eq!(
                engine_fz::redo_body(&writes),
                rest,
                "a redo record body re-encodes to other bytes"
            );
        }
        return;
    }
    let dir = crate::seed::scratch_dir();
    std::fs::write(dir.path().join(engine_fz::REDO_FILE), rest).expect("write the redo log");
    // (marker, whether the record it was made from must be found)
    let mut markers: Vec<(Vec<u8>, bool)> = Vec::new();
    let mut at = 0usize;
    while at + 8 <= rest.len() && markers.len() < 16 {
        let len = u32::from_le_bytes([rest[at], rest[at + 1], rest[at + 2], rest[at + 3]]) as usize;
        let body_at = at + 8;
        let Some(body) = rest.get(body_at..body_at.saturating_add(len)) else {
            break;
        };
        let marker = engine_fz::redo_marker(body);
        let honest = marker[8..] == rest[at + 4..at + 8];
        markers.push((marker, honest));
        at = body_at + len;
    }
    markers.push((rest.iter().copied().take(12).collect(), false));
    markers.push((vec![0; 11], false));
    for (marker, honest) in &markers {
        match engine_fz::redo_find(dir.path(), marker) {
            Ok(Some(body)) => {
                assert_eq!(
                    &engine_fz::redo_marker(&body),
                    marker,
                    "the redo log gave a record the marker does not name"
                );
                let _ = engine_fz::redo_body_writes(&body);
            }
            Ok(None) => assert!(!honest, "a whole redo record was not found"),
            // A marker of the wrong length, or a damaged record under its header.
            Err(_) => {}
        }
    }
}

/// `store_open`: a store directory of 1–3 arbitrary segment files.
///
/// Byte 0: file count (1–3) and, per file, whether to prefix a valid
/// header; byte 1: segment id offset. The rest is split into the files by
/// `u16` lengths. Checks: `verify` never fails on a readable directory;
/// when it reports the log clean, a read-only open succeeds and sees as
/// many commits, a writer open (which truncates a torn tail) succeeds and
/// a reopen after it sees the same commits; sessions in it load or fail
/// cleanly through the log store.
pub fn store_open(data: &[u8]) {
    let data = &data[..data.len().min(INPUT_BYTES_MAX)];
    if data.len() < 2 {
        return;
    }
    let n = usize::from(data[0] % 3) + 1;
    let first = u64::from(data[1] % 4) + 1;
    let mut rest = &data[2..];
    let mut files = Vec::new();
    for i in 0..n {
        let len = if i + 1 == n || rest.len() < 2 {
            rest.len()
        } else {
            let l = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
            rest = &rest[2..];
            l.min(rest.len())
        };
        let id = first + i as u64;
        let mut bytes = Vec::new();
        if data[0] & (0x10 << i) != 0 {
            bytes.extend_from_slice(&format::encode_header(id));
        }
        bytes.extend_from_slice(&rest[..len]);
        rest = &rest[len..];
        files.push((id, bytes));
    }
    let sim = sim_with_files(&files);
    let plain = |v: &SimVfs| {
        Options::default()
            .vfs(Arc::new(v.clone()))
            .segment_bytes_max(STORE_OPEN_SEGMENT_BYTES)
            .index_dir(NO_INDEX)
    };
    let report = verify(STORE_DIR, plain(&sim)).expect("verify of a readable store");
    let ro = Store::open_read_only(STORE_DIR, plain(&sim));
    if report.ok {
        let ro = ro.unwrap_or_else(|e| panic!("verify says clean, read-only open fails: {e}"));
        assert_eq!(
            ro.last_seq(),
            report.last_seq,
            "read-only open and verify disagree"
        );
        let seen = ro
            .scan(1)
            .map(|s| s.filter(Result::is_ok).count())
            .unwrap_or(0);
        assert_eq!(seen as u64, report.commits, "scan and verify disagree");
        drop(ro);
        // The session view of the same log: loads fail cleanly or succeed.
        if let Ok(ls) = Store::open_read_only(
            STORE_DIR,
            LogStoreOptions::default()
                .engine_options()
                .vfs(Arc::new(sim.clone()))
                .next_segment(spool_engine::NextSegment::Inline),
        )
        .map(LogStore::from_engine)
        {
            if let Ok(l) = ls.list_headers(&ListQuery::all().including_deleted()) {
                for h in l.headers.iter().take(8) {
                    let _ = ls.load(&h.id);
                }
            }
        }
        // A writer open recovers (truncating a torn tail) and keeps every commit.
        let ix = crate::seed::scratch_dir();
        let wopts = |v: &SimVfs| plain(v).index_dir(ix.path().join("index"));
        let w = Store::open(STORE_DIR, wopts(&sim))
            .unwrap_or_else(|e| panic!("verify says clean, writer open fails: {e}"));
        assert_eq!(w.last_seq(), report.last_seq, "writer open lost commits");
        let appended = w.append(NewCommit::new(
            "fuzz",
            ExpectedVersion::Any,
            vec![EventData::new("k", b"v".to_vec())],
        ));
        drop(w);
        let again = Store::open(STORE_DIR, wopts(&sim))
            .unwrap_or_else(|e| panic!("reopen after a writer open fails: {e}"));
        let want = report.last_seq
            + u64::from(matches!(
                appended,
                Ok(spool_engine::AppendOutcome::Committed(_))
            ));
        assert_eq!(again.last_seq(), want, "reopen lost commits");
    } else if let Ok(ro) = ro {
        // A read-only open tolerates a torn tail but not mid-log damage;
        // whatever it accepts must be readable.
        if let Ok(scan) = ro.scan(1) {
            for r in scan.take(10_000) {
                let _ = r;
            }
        }
    }
}

/// `session_ops`: operation sequences against the reference model, then a
/// seeded workload with an injected I/O failure.
///
/// Bytes 0–3 choose the fault: which I/O call fails (from 1), whether
/// persistently, and the workload seed; the rest decodes into [`Op`]s (see
/// [`ops_from_bytes`]) that run on the memory store and the log store with
/// the model checked after every step. Then the workload runs on a log
/// store over `FaultVfs`, and the reopened store must hold every
/// acknowledged save (see [`crate::workload::check_recovered`]).
pub fn session_ops(data: &[u8]) {
    let data = &data[..data.len().min(4096)];
    if data.len() < 4 {
        return;
    }
    let nth = u64::from(u16::from_le_bytes([data[0], data[1]]) % 400) + 1;
    let persistent = data[2] & 1 == 1;
    let seed = u64::from(data[3]);
    let ops = ops_from_bytes(&data[4..]);
    for kind in [StoreKind::Memory, StoreKind::Log] {
        let mut r = Runner::new(kind).expect("a fresh store opens");
        for (i, op) in ops.iter().enumerate() {
            if let Err(e) = r.step(op) {
                panic!("{kind:?} step {i} ({op:?}): {e}");
            }
        }
    }
    // The fault part.
    let sim = SimVfs::new();
    let fv = FaultVfs::new(Arc::new(sim.clone()));
    fv.fail_nth(FaultKind::Any, nth, persistent);
    let ix = crate::seed::scratch_dir();
    let opts = |v: Arc<dyn Vfs>| {
        LogStoreOptions {
            durability: Durability::Immediate,
            segment_bytes_max: Some(4096),
            ..LogStoreOptions::default()
        }
        .engine_options()
        .vfs(v)
        .next_segment(spool_engine::NextSegment::Inline)
        .index_dir(ix.path().join("index"))
    };
    let mut tracker = Tracker::default();
    if let Ok(store) = Store::open(STORE_DIR, opts(Arc::new(fv.clone()))) {
        let store = Arc::new(LogStore::from_engine(store));
        let (rt, capture) = capturing_runtime(store.clone() as Arc<dyn SessionStore>);
        let mut rng = Rng::new(seed);
        let steps = 8 + usize::from(data[2] >> 4);
        let res = run_workload(&rt, &capture, &mut tracker, &mut rng, steps, |t| {
            t.mark_durable()
        })
        .unwrap_or_else(|e| panic!("workload: {e}"));
        if res.is_some() && store.engine().expect("engine handle").is_poisoned() {
            fv.clear();
            let id = tracker.order.first().cloned();
            if let Some(id) = id {
                let after = rt.execute(
                    &id,
                    &spool_runtime::actions::WriteMetadata::new("x", serde_json::json!(1)),
                );
                assert!(
                    after.is_err(),
                    "a save was acknowledged after the store was poisoned"
                );
            }
        }
    }
    let store = Store::open(STORE_DIR, opts(Arc::new(sim.clone())))
        .map(LogStore::from_engine)
        .unwrap_or_else(|e| panic!("reopen after an injected fault at call {nth}: {e}"));
    if let Err(e) = check_recovered(&store, &tracker) {
        panic!("fault at call {nth} (persistent {persistent}): {e}");
    }
}

/// Decodes operations from bytes: one tag byte (modulo the number of
/// kinds) and up to three argument bytes each. At most 64 operations.
pub fn ops_from_bytes(data: &[u8]) -> Vec<Op> {
    let mut ops = vec![Op::Create {
        agent: data.first().copied().unwrap_or(0),
        seeded: data.get(1).is_some_and(|b| b & 1 == 1),
    }];
    let mut it = data.iter().copied();
    let mut next = move || it.next();
    while ops.len() < 64 {
        let Some(tag) = next() else { break };
        let a = next().unwrap_or(0);
        let s = usize::from(a & 0x0f);
        let pick = |b: u8| match b % 8 {
            0 => Pick::None,
            1 | 2 => Pick::Leaf,
            7 => Pick::Unknown,
            x => Pick::Entry(usize::from(b >> 3) + usize::from(x)),
        };
        let op = match tag % 24 {
            0 => Op::Create {
                agent: a,
                seeded: a & 0x80 != 0,
            },
            1 | 2 => Op::Send {
                s,
                text: next().unwrap_or(0),
                turn: a >> 4,
            },
            3 => Op::Suspend(s),
            4 => Op::Resume(s),
            5 => Op::Complete(s),
            6 => Op::Fail {
                s,
                reason: a & 0x80 != 0,
            },
            7 => Op::Clear(s),
            8 => Op::Prompt { s, p: a >> 4 },
            9 => Op::Model { s, m: a >> 4 },
            10 => Op::WriteMeta {
                s,
                key: next().unwrap_or(0),
                value: next().unwrap_or(0),
            },
            11 => Op::RemoveMeta {
                s,
                key: next().unwrap_or(0),
            },
            12 => Op::UpsertTask {
                s,
                id: a >> 4,
                status: next().unwrap_or(0),
            },
            13 => Op::RemoveTask { s, id: a >> 4 },
            14 => Op::ReplaceTasks {
                s,
                n: next().unwrap_or(0) % 70,
                in_progress: a >> 6,
            },
            15 | 16 => Op::Append {
                s,
                parent: pick(next().unwrap_or(1)),
                dup: a & 0x80 != 0,
            },
            17 => Op::MoveLeaf {
                s,
                to: pick(next().unwrap_or(0)),
            },
            18 => Op::Rewrite {
                s,
                keep: u64::from(next().unwrap_or(0xff)) * 0x0101_0101_0101_0101,
                leaf: pick(next().unwrap_or(0)),
                reverse: a & 0x80 != 0,
            },
            19 => Op::Fork {
                s,
                at: pick(next().unwrap_or(0)),
            },
            20 => Op::Delete(s),
            21 => Op::Purge(s),
            22 => Op::StaleSave(s),
            _ => match a % 3 {
                0 => Op::Missing,
                1 => Op::Reopen { drop_index: false },
                _ => Op::Reopen { drop_index: true },
            },
        };
        ops.push(op);
    }
    ops
}

/// Meaningful starting inputs per target: `(target, name, bytes)`.
pub fn seed_inputs() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    // A real store written by the log store: its segments.
    let sim = SimVfs::new();
    let ix = crate::seed::scratch_dir();
    let opts = LogStoreOptions {
        segment_bytes_max: Some(4096),
        ..LogStoreOptions::default()
    }
    .engine_options()
    .vfs(Arc::new(sim.clone()))
    .next_segment(spool_engine::NextSegment::Inline)
    .index_dir(ix.path().join("index"));
    let mut events = Vec::new();
    let mut records: Vec<Vec<u8>> = Vec::new();
    let mut values: Vec<(String, Vec<u8>)> = Vec::new();
    let snapshot;
    {
        let store = Arc::new(LogStore::from_engine(
            Store::open(STORE_DIR, opts).expect("open a sim store"),
        ));
        let (rt, capture) = capturing_runtime(store.clone() as Arc<dyn SessionStore>);
        let mut runner_rng = Rng::new(7);
        let mut tracker = Tracker::default();
        let _ = run_workload(&rt, &capture, &mut tracker, &mut runner_rng, 30, |_| {});
        for c in store
            .engine()
            .expect("engine handle")
            .scan(1)
            .expect("scan")
            .flatten()
        {
            for e in c.events {
                if events.len() < 24
                    && !events.iter().any(|(k, _): &(String, Vec<u8>)| k == &e.kind)
                {
                    events.push((e.kind.clone(), e.payload.clone()));
                }
            }
        }
        // index_record: the real entry records of the workload's sessions,
        // one per distinct length (different kinds, markers and counts).
        let engine = store.engine().expect("engine handle");
        let mut lens = std::collections::BTreeSet::new();
        for kv in engine.index().scan_prefix(TRANSCRIPT_INDEXER, b"e") {
            let (_, v) = kv.expect("index scan");
            if lens.len() < 12 && lens.insert(v.len()) {
                records.push(v.to_vec());
            }
        }
        // index_values: real values of the other kinds the runtime reads
        // back: active-path blocks, metas, child counts, header records.
        for (ns, tag, name, most) in [
            (TRANSCRIPT_INDEXER, b'p', "path-block", 4),
            (TRANSCRIPT_INDEXER, b'm', "meta", 2),
            (TRANSCRIPT_INDEXER, b'n', "count", 2),
            (SESSION_INDEXER, b'h', "header", 2),
        ] {
            let mut lens = std::collections::BTreeSet::new();
            for kv in engine.index().scan_prefix(ns, &[tag]) {
                let (_, v) = kv.expect("index scan");
                if lens.len() < most && lens.insert(v.len()) {
                    values.push((format!("{name}-{}", lens.len()), v.to_vec()));
                }
            }
        }
        snapshot = tracker
            .order
            .iter()
            .find_map(|id| store.load(id).ok().flatten())
            .and_then(|s| encode_snapshot(&s).ok());
    }
    let seg_files: Vec<(u64, Vec<u8>)> = (1..=3u64)
        .filter_map(|id| {
            let p = PathBuf::from(STORE_DIR).join(format::segment_file_name(id));
            let b = sim.read_file(&p).ok()?;
            let end = b.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1);
            Some((id, b[..end.max(SEGMENT_HEADER_BYTES as usize)].to_vec()))
        })
        .collect();
    for (id, seg) in &seg_files {
        // frame_decode mode 0 takes the record area.
        let mut fd = vec![0u8];
        let area = &seg[SEGMENT_HEADER_BYTES as usize..];
        // Records carry their segment id in the checksum: segment 1's are
        // valid as they are.
        if *id == 1 {
            fd.extend_from_slice(area);
            out.push(("frame_decode", "valid-segment-1".to_string(), fd.clone()));
            fd.truncate(fd.len() - fd.len() / 3);
            out.push(("frame_decode", "torn-segment-1".to_string(), fd));
        }
    }
    // frame_decode mode 1: payloads of real commits.
    if let Some((_, seg)) = seg_files.first() {
        let mut fd = vec![1u8];
        let mut off = SEGMENT_HEADER_BYTES as usize;
        while let FrameCheck::Valid { payload, total, .. } =
            format::check_frame(&seg[off..], 1, 1 << 20)
        {
            fd.extend_from_slice(&(payload.len() as u16).to_le_bytes());
            fd.extend_from_slice(payload);
            off += total as usize;
        }
        out.push(("frame_decode", "commit-payloads".to_string(), fd));
    }
    // checkpoint_file: a real checkpoint, cut short, and with a byte flipped.
    let ck = checkpoint_seed();
    let (entries, _) = engine_fz::checkpoint_entries(&ck, 0).expect("a real checkpoint reads");
    assert!(entries.len() > 7, "{} entries", entries.len());
    let mut flipped = ck.clone();
    flipped[ck.len() / 3] ^= 0x40;
    out.push((
        "checkpoint_file",
        "cut".to_string(),
        ck[..ck.len() / 2].to_vec(),
    ));
    out.push(("checkpoint_file", "flipped".to_string(), flipped));
    out.push(("checkpoint_file", "real".to_string(), ck));
    // store_open: the real segments (headers included, as files).
    let mut so = vec![(seg_files.len() as u8).saturating_sub(1), 0];
    for (i, (_, seg)) in seg_files.iter().enumerate() {
        if i + 1 < seg_files.len() {
            so.extend_from_slice(&(seg.len().min(u16::MAX as usize) as u16).to_le_bytes());
        }
        so.extend_from_slice(&seg[..seg.len().min(u16::MAX as usize)]);
    }
    out.push(("store_open", "real-store".to_string(), so));
    out.push((
        "store_open",
        "header-only".to_string(),
        [vec![0x10u8, 0], vec![0u8; 64]].concat(),
    ));
    // The same records as one seed table bucket (ids made up: the bucket
    // format does not tie a record to its id).
    let ids: Vec<String> = (0..records.len()).map(|i| format!("e{i}")).collect();
    let bucket: Vec<(&[u8], &[u8])> = ids
        .iter()
        .zip(&records)
        .map(|(id, r)| (id.as_bytes(), r.as_slice()))
        .collect();
    if !bucket.is_empty() {
        out.push((
            "index_record",
            "seed-bucket".to_string(),
            encode_seed_bucket(&bucket),
        ));
    }
    for (i, r) in records.into_iter().enumerate() {
        out.push(("index_record", format!("record-{i}"), r));
    }
    // redo_record: a body of real index values under keys of the index's
    // shapes, alone and as a redo log of two records.
    let mut writes: Vec<(Vec<u8>, Option<Vec<u8>>)> = values
        .iter()
        .take(4)
        .map(|(name, v)| {
            (
                format!("\x02transcript\x00{name}").into_bytes(),
                Some(v.clone()),
            )
        })
        .collect();
    writes.push((b"\x00meta:applied".to_vec(), Some(vec![0; 24])));
    writes.push((b"\x02transcript\x00gone".to_vec(), None));
    writes.sort();
    let body = engine_fz::redo_body(&writes);
    let mut seed = vec![0];
    seed.extend_from_slice(&body);
    out.push(("redo_record", "body".to_string(), seed));
    let dir = crate::seed::scratch_dir();
    engine_fz::redo_append(dir.path(), &body).expect("append a redo record");
    engine_fz::redo_append(dir.path(), &engine_fz::redo_body(&writes[..1]))
        .expect("append a redo record");
    let mut seed = vec![1];
    seed.extend_from_slice(
        &std::fs::read(dir.path().join(engine_fz::REDO_FILE)).expect("read the redo log"),
    );
    out.push(("redo_record", "log-two-records".to_string(), seed));
    // key_filter: a filter of the index keys above (128 KiB: the smallest
    // filter's blocks).
    let keys: Vec<&[u8]> = writes.iter().map(|(k, _)| k.as_slice()).collect();
    out.push((
        "key_filter",
        "index-keys".to_string(),
        engine_fz::key_filter_of(&keys),
    ));
    for (name, v) in values {
        out.push(("index_values", name, v));
    }
    // event_decode: every kind of event the workload wrote, and a snapshot.
    for (kind, payload) in events {
        out.push(("event_decode", kind.replace('.', "-"), payload));
    }
    if let Some(s) = snapshot {
        out.push(("event_decode", "snapshot".to_string(), s));
    }
    for ev in [
        SessionEvent::Deleted,
        SessionEvent::Touched,
        SessionEvent::Forked {
            from: SessionId::parse("parent-1").expect("id"),
            at_entry: None,
        },
    ] {
        out.push((
            "event_decode",
            ev.kind().to_string(),
            encode_event(&ev).expect("encode"),
        ));
    }
    // session_ops: a few scripts.
    out.push((
        "session_ops",
        "sends-and-forks".to_string(),
        vec![
            5, 0, 0, 1, 1, 0x00, 7, 15, 0x00, 1, 19, 0x01, 3, 3, 0x00, 1, 0x10, 9, 23, 2,
        ],
    ));
    out.push((
        "session_ops",
        "rewrite-delete-purge".to_string(),
        vec![
            40, 0, 1, 9, 15, 0, 1, 15, 0, 1, 15, 0, 3, 18, 0, 0x0f, 4, 20, 0, 21, 1, 22, 0, 23, 1,
        ],
    ));
    out.push((
        "session_ops",
        "tasks-meta-status".to_string(),
        vec![
            120, 0, 0x31, 3, 12, 0x10, 1, 12, 0x20, 1, 14, 0x40, 66, 10, 0, 3, 5, 11, 0, 3, 5, 0,
            4, 0, 6, 0x80,
        ],
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generated seeds reach deep: a clean store, decodable events.
    #[test]
    fn seed_inputs_are_meaningful() {
        let seeds = seed_inputs();
        let get = |t: &str, n: &str| {
            seeds
                .iter()
                .find(|(tt, nn, _)| *tt == t && nn == n)
                .map(|(_, _, b)| b.clone())
                .unwrap_or_else(|| panic!("no seed {t}/{n}"))
        };
        let body = get("redo_record", "body");
        let writes = engine_fz::redo_body_writes(&body[1..]).expect("the body seed decodes");
        assert_eq!(writes.len(), 6, "writes in the redo body seed");
        assert!(
            writes.iter().any(|(_, v)| v.is_none()),
            "no removal in the seed"
        );
        let log = get("redo_record", "log-two-records");
        let dir = crate::seed::scratch_dir();
        std::fs::write(dir.path().join(engine_fz::REDO_FILE), &log[1..]).unwrap();
        let found = engine_fz::redo_find(dir.path(), &engine_fz::redo_marker(&body[1..]));
        assert_eq!(found, Ok(Some(body[1..].to_vec())));
        let kf = get("key_filter", "index-keys");
        for (k, _) in &engine_fz::redo_body_writes(&body[1..]).unwrap() {
            assert_eq!(engine_fz::key_filter_may_contain(&kf, k), Some(true));
        }
        let so = get("store_open", "real-store");
        let files = usize::from(so[0] % 3) + 1;
        assert!(files >= 2, "the real store has {files} segments");
        let fd = get("frame_decode", "valid-segment-1");
        let mut off = 0;
        let mut n = 0;
        while let FrameCheck::Valid { total, .. } = format::check_frame(&fd[1 + off..], 1, 1 << 20)
        {
            off += total as usize;
            n += 1;
        }
        assert!(n >= 2, "only {n} valid frames in the segment seed");
        assert!(decode_snapshot(&get("event_decode", "snapshot")).is_ok());
        assert!(decode_event(&get("event_decode", "session-created")).is_ok());
        assert!(ops_from_bytes(&get("session_ops", "sends-and-forks")[4..]).len() > 5);
        let block = get("index_values", "path-block-1");
        let links = tx::path_block_links(&block).expect("a real path block frames");
        assert!(!links.is_empty());
        for l in links {
            assert_eq!(tx::path_link_reencoded(l).as_deref(), Some(l));
        }
        let header = get("index_values", "header-1");
        assert_eq!(header_record_reencoded(&header), Ok(header));
        assert!(tx::decode_meta(&get("index_values", "meta-1")).is_ok());
    }
}
