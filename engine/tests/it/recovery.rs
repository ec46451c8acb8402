//! Recovery: torn tails, bit flips, crafted segments, read-only opens, verify.
use crate::common;
use common::*;
use spool_engine::format::{self, SEGMENT_HEADER_BYTES};
use spool_engine::vfs::{SimVfs, Vfs};
use spool_engine::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn write_commits(dir: &Path, opts: Options, n: u64) -> Vec<CommitInfo> {
    let s = Store::open(dir, opts).unwrap();
    let infos = (0..n)
        .map(|i| {
            committed(append_next(
                &s,
                &format!("s{}", i % 3),
                ev(format!("payload-{i}").as_bytes()),
            ))
        })
        .collect();
    s.close().unwrap();
    infos
}

fn seg_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format::segment_file_name(id))
}

#[test]
fn truncating_last_record_at_every_offset_recovers_preceding_commits() {
    let src = tempfile::tempdir().unwrap();
    let infos = write_commits(src.path(), test_opts(), 6);
    let last = infos.last().unwrap().clone();
    let seg = seg_path(src.path(), last.position.segment);
    let original = std::fs::read(&seg).unwrap();
    let rec_len = {
        let s = Store::open_read_only(src.path(), test_opts()).unwrap();
        s.read_at(last.position).unwrap().record_bytes as u64
    };
    for cut in last.position.offset..last.position.offset + rec_len {
        for zero_instead_of_truncate in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let mut bytes = original.clone();
            if zero_instead_of_truncate {
                // Keep the preallocated size; the record's bytes past `cut` are garbage.
                for (i, b) in bytes[cut as usize..(last.position.offset + rec_len) as usize]
                    .iter_mut()
                    .enumerate()
                {
                    *b = (i as u8).wrapping_mul(37) | 1;
                }
            } else {
                bytes.truncate(cut as usize);
            }
            std::fs::write(seg_path(dir.path(), last.position.segment), &bytes).unwrap();
            let s = Store::open(dir.path(), test_opts())
                .unwrap_or_else(|e| panic!("cut {cut} zero {zero_instead_of_truncate}: {e}"));
            let seen: Vec<u64> = s.scan(1).unwrap().map(|r| r.unwrap().info.seq).collect();
            assert_eq!(
                seen,
                (1..infos.len() as u64).collect::<Vec<_>>(),
                "cut {cut}"
            );
            assert_eq!(
                s.stream_version(&last.stream).unwrap(),
                Some(last.version - 1)
            );
            // The store goes on from there, and reopens cleanly.
            let again = committed(
                s.append(commit(
                    &last.stream,
                    ExpectedVersion::Exact(last.version - 1),
                    b"again",
                ))
                .unwrap(),
            );
            assert_eq!(again.seq, last.seq);
            drop(s);
            let s = Store::open(dir.path(), test_opts()).unwrap();
            assert_eq!(s.last_seq(), last.seq);
        }
    }
}

/// A store with two sealed segments and an active one, in a SimVfs.
fn sim_store_with_sealed_segments() -> (SimVfs, tempfile::TempDir, PathBuf) {
    let sim = SimVfs::new();
    let ix = tempfile::tempdir().unwrap();
    let dir = PathBuf::from("/store");
    let opts = test_opts()
        .vfs(Arc::new(sim.clone()))
        .segment_bytes_max(4096)
        .index_dir(ix.path().join("index"));
    let s = Store::open(&dir, opts).unwrap();
    for i in 0..12u64 {
        s.append(commit("a", ExpectedVersion::Exact(i), &[i as u8; 700]))
            .unwrap();
    }
    assert!(s.stats().segments >= 3);
    s.close().unwrap();
    (sim, ix, dir)
}

#[test]
fn every_bit_flip_in_a_sealed_segment_is_detected() {
    let (sim, ix, dir) = sim_store_with_sealed_segments();
    let path = dir.join(format::segment_file_name(1));
    let original = sim.read_file(&path).unwrap();
    let opts = || {
        test_opts()
            .vfs(Arc::new(sim.clone()))
            .segment_bytes_max(4096)
    };
    let clean = verify(&dir, opts().index_dir(ix.path().join("none"))).unwrap();
    assert!(clean.ok, "{clean:?}");
    let end = log_end(&original);
    // The owner's open from a checkpoint reads no segment before the checkpoint's
    // record (verify above and a whole-log open do): without one, it reads them all.
    let cdir = dir.join(CHECKPOINT_DIR);
    for name in sim.read_dir(&cdir).unwrap() {
        sim.remove(&cdir.join(name)).unwrap();
    }
    let mut opened = 0;
    for byte in SEGMENT_HEADER_BYTES as usize..end {
        for bit in 0..8 {
            let mut damaged = original.clone();
            damaged[byte] ^= 1 << bit;
            sim.write_file_durable(&path, damaged).unwrap();
            let r = verify(&dir, opts().index_dir(ix.path().join("none"))).unwrap();
            assert!(!r.ok, "flip of bit {bit} in byte {byte} not detected");
            assert!(r
                .errors
                .iter()
                .any(|e| e.segment == format::segment_file_name(1)));
            // Opening refuses too (checked on a sample: each open also opens sled).
            if (byte * 8 + bit) % 211 == 0 {
                opened += 1;
                match Store::open(&dir, opts().index_dir(ix.path().join("index"))) {
                    Err(Error::Corrupt {
                        segment, offset, ..
                    }) => {
                        assert_eq!(segment, format::segment_file_name(1));
                        assert!(offset >= SEGMENT_HEADER_BYTES && offset <= byte as u64);
                    }
                    other => panic!("bit {bit} byte {byte}: expected Corrupt, got {other:?}"),
                }
            }
        }
    }
    assert!(opened > 10);
    sim.write_file_durable(&path, original).unwrap();
    Store::open(&dir, opts().index_dir(ix.path().join("index"))).unwrap();
}

/// One past the last nonzero byte.
fn log_end(b: &[u8]) -> usize {
    b.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1)
}

#[test]
fn mid_log_corruption_in_last_segment_is_an_error_with_segment_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let infos = write_commits(dir.path(), test_opts(), 5);
    let victim = &infos[2];
    let path = seg_path(dir.path(), victim.position.segment);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[victim.position.offset as usize + 12] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    // An open from the close's checkpoint would read nothing before its record.
    std::fs::remove_dir_all(dir.path().join(CHECKPOINT_DIR)).unwrap();
    let err = Store::open(dir.path(), test_opts()).unwrap_err();
    let name = format::segment_file_name(victim.position.segment);
    match &err {
        Error::Corrupt {
            segment, offset, ..
        } => {
            assert_eq!(segment, &name);
            assert_eq!(*offset, victim.position.offset);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&name) && msg.contains(&victim.position.offset.to_string()),
        "{msg}"
    );
    // The file was not modified by the failed open.
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    let r = verify(dir.path(), test_opts()).unwrap();
    assert!(!r.ok);
    assert_eq!(r.errors[0].segment, name);
    assert_eq!(r.errors[0].offset, victim.position.offset);
}

fn craft_segment(id: u64, frames: &[Vec<u8>]) -> Vec<u8> {
    let mut b = format::encode_header(id).to_vec();
    for f in frames {
        b.extend_from_slice(f);
    }
    b.resize(8192, 0);
    b
}

fn frame(seg: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(&format::record_crc(seg, 1, payload).to_le_bytes());
    f.push(1);
    f.extend_from_slice(payload);
    f
}

#[test]
fn hostile_length_field_does_not_allocate_beyond_the_file() {
    // A sealed segment whose first frame claims ~4 GiB.
    let dir = tempfile::tempdir().unwrap();
    let mut hostile = vec![0xF0, 0xFF, 0xFF, 0xFF, 1, 2, 3, 4, 1];
    hostile.extend_from_slice(&[9u8; 40]);
    std::fs::write(seg_path(dir.path(), 1), craft_segment(1, &[hostile])).unwrap();
    std::fs::write(seg_path(dir.path(), 2), craft_segment(2, &[])).unwrap();
    let opts = test_opts().record_bytes_max(RECORD_BYTES_HARD_CAP);
    match Store::open(dir.path(), opts.clone()) {
        Err(Error::Corrupt {
            segment, offset, ..
        }) => {
            assert_eq!(segment, format::segment_file_name(1));
            assert_eq!(offset, SEGMENT_HEADER_BYTES);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // A record with a valid checksum whose event count and payload length lie.
    let dir = tempfile::tempdir().unwrap();
    let mut p = Vec::new();
    p.extend_from_slice(&1u16.to_le_bytes());
    p.push(b'a');
    p.push(0);
    p.extend_from_slice(&0u64.to_le_bytes());
    p.extend_from_slice(&1u64.to_le_bytes());
    p.extend_from_slice(&[0u8; 16]);
    p.extend_from_slice(&0i64.to_le_bytes());
    p.extend_from_slice(&1u64.to_le_bytes());
    let mut huge_count = p.clone();
    huge_count.extend_from_slice(&u32::MAX.to_le_bytes());
    let mut huge_payload = p.clone();
    huge_payload.extend_from_slice(&1u32.to_le_bytes());
    huge_payload.push(1);
    huge_payload.push(b'k');
    huge_payload.extend_from_slice(&(u32::MAX - 1).to_le_bytes());
    for bad in [huge_count, huge_payload] {
        std::fs::write(seg_path(dir.path(), 1), craft_segment(1, &[frame(1, &bad)])).unwrap();
        match Store::open(dir.path(), opts.clone()) {
            Err(Error::Corrupt {
                segment,
                offset,
                problem,
            }) => {
                assert_eq!(segment, format::segment_file_name(1));
                assert_eq!(offset, SEGMENT_HEADER_BYTES, "{problem}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
}

#[test]
fn future_format_version_and_wrong_segment_id() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = format::encode_header(1);
    h[8..12].copy_from_slice(&(format::SEGMENT_FORMAT_VERSION + 1).to_le_bytes());
    let crc = format::mask_crc(crc32fast_hash(&h[..28]));
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    let mut seg = h.to_vec();
    seg.resize(4096, 0);
    std::fs::write(seg_path(dir.path(), 1), &seg).unwrap();
    match Store::open(dir.path(), test_opts()) {
        Err(Error::UnsupportedFormat {
            path,
            found,
            supported,
        }) => {
            assert!(path.ends_with(format::segment_file_name(1)));
            assert_eq!(found, format::SEGMENT_FORMAT_VERSION + 1);
            assert_eq!(supported, format::SEGMENT_FORMAT_VERSION);
        }
        other => panic!("expected UnsupportedFormat, got {other:?}"),
    }

    let dir = tempfile::tempdir().unwrap();
    write_commits(dir.path(), test_opts(), 2);
    std::fs::rename(seg_path(dir.path(), 1), seg_path(dir.path(), 7)).unwrap();
    match Store::open(dir.path(), test_opts()) {
        Err(Error::Corrupt {
            segment, problem, ..
        }) => {
            assert_eq!(segment, format::segment_file_name(7));
            assert!(problem.contains("segment id 1"), "{problem}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

fn crc32fast_hash(b: &[u8]) -> u32 {
    // The header checksum is crc32 (IEEE) of the first 28 bytes, masked.
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
fn zeroed_tail_and_blank_last_segment_open_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let infos = write_commits(dir.path(), test_opts(), 3);
    // A crash between creating the next segment and writing its header.
    std::fs::write(seg_path(dir.path(), 2), vec![0u8; 4096]).unwrap();
    let r = verify(dir.path(), test_opts()).unwrap();
    assert!(r.ok, "{r:?}");
    let s = Store::open(dir.path(), test_opts()).unwrap();
    assert_eq!(s.last_seq(), infos.len() as u64);
    let i = committed(
        s.append(commit("x", ExpectedVersion::NoStream, b"y"))
            .unwrap(),
    );
    assert_eq!(i.position.segment, 2);
    drop(s);
    let s = Store::open(dir.path(), test_opts()).unwrap();
    assert_eq!(s.last_seq(), infos.len() as u64 + 1);
}

#[test]
fn read_only_tolerates_torn_tail_without_writing_and_verify_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let infos = write_commits(dir.path(), test_opts(), 4);
    let last = infos.last().unwrap();
    let path = seg_path(dir.path(), last.position.segment);
    let mut bytes = std::fs::read(&path).unwrap();
    let tail = log_end(&bytes);
    bytes[tail..tail + 5].copy_from_slice(&[0x33, 0, 0, 0, 0xAB]);
    std::fs::write(&path, &bytes).unwrap();
    // A writer that died: no lock held. Read-only open sees the acknowledged commits.
    let ro = Store::open_read_only(dir.path(), test_opts()).unwrap();
    assert_eq!(ro.last_seq(), 4);
    assert_eq!(
        ro.read_stream(&last.stream, 1, 10).unwrap().len() as u64,
        last.version
    );
    drop(ro);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "read-only open wrote to the store"
    );
    let r = verify(dir.path(), test_opts()).unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(r.torn_tail_bytes, 5);
    assert_eq!((r.commits, r.records, r.streams, r.last_seq), (4, 4, 3, 4));
    assert_eq!(r.index, IndexCheck::Checked { applied_seq: 4 });
    // The owner truncates it.
    let s = Store::open(dir.path(), test_opts()).unwrap();
    assert_eq!(s.last_seq(), 4);
    drop(s);
    let r = verify(dir.path(), test_opts()).unwrap();
    assert_eq!(r.torn_tail_bytes, 0);
}

/// A zero frame header ends a reader's view without the reader looking at the rest of
/// the segment (which would make the whole preallocated zero tail resident); the owner's
/// open still reads every byte after it and refuses a valid record there, as `verify`
/// reports it.
#[test]
fn a_zero_header_ends_a_readers_view_and_the_owner_still_judges_what_follows() {
    let dir = tempfile::tempdir().unwrap();
    let infos = write_commits(dir.path(), test_opts(), 4);
    let third = &infos[2];
    let last = &infos[3];
    assert_eq!(third.position.segment, last.position.segment);
    let path = seg_path(dir.path(), last.position.segment);
    let mut bytes = std::fs::read(&path).unwrap();
    // Damage that zeroes the third record's frame header: the fourth, valid, follows.
    let at = third.position.offset as usize;
    bytes[at..at + format::FRAME_HEADER_BYTES as usize].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    // Without the close's checkpoint, the reader scans these records.
    std::fs::remove_dir_all(dir.path().join(CHECKPOINT_DIR)).unwrap();

    let ro = Store::open_read_only(dir.path(), test_opts()).unwrap();
    assert_eq!(ro.last_seq(), 2, "the view ends at the zero header");
    drop(ro);
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "a reader wrote");

    match Store::open(dir.path(), test_opts()) {
        Err(Error::Corrupt {
            segment, offset, ..
        }) => {
            assert!(segment.contains(&format!("{:016x}", last.position.segment)));
            assert_eq!(offset, third.position.offset);
        }
        other => panic!("the owner's open must refuse, got {other:?}"),
    }
    let r = verify(dir.path(), test_opts()).unwrap();
    assert!(!r.ok, "{r:?}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "a refused open wrote");
}

#[test]
fn verify_skips_the_index_of_a_locked_store() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), test_opts()).unwrap();
    s.append(commit("a", ExpectedVersion::NoStream, b"1"))
        .unwrap();
    let r = verify(dir.path(), test_opts()).unwrap();
    assert!(r.ok);
    assert_eq!(r.index, IndexCheck::Locked);
}

/// Deterministic bytes that are not zero anywhere in any 8-byte word (xorshift64).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8 | 1
        })
        .collect()
}

/// Every open refuses the store, `verify` reports the segment, and no byte of it changes.
fn assert_refused_untouched(dir: &Path, id: u64) {
    let path = seg_path(dir, id);
    let before = std::fs::read(&path).unwrap();
    let name = format::segment_file_name(id);
    let r = verify(dir, test_opts()).unwrap();
    assert!(!r.ok, "verify passed a foreign segment: {r:?}");
    assert!(r.errors.iter().any(|e| e.segment == name), "{r:?}");
    match Store::open_read_only(dir, test_opts()) {
        Err(Error::Corrupt { segment, .. }) => assert_eq!(segment, name),
        other => panic!("expected Corrupt from a read-only open, got {other:?}"),
    }
    match Store::open(dir, test_opts()) {
        Err(Error::Corrupt { segment, .. }) => assert_eq!(segment, name),
        other => panic!("expected Corrupt from an owner open, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "{name} was rewritten"
    );
}

/// Found by putting a file of random bytes under a segment's name: verify reported a
/// 200,000-byte torn tail and a writer open reformatted the file. A segment whose header
/// is not spool's is an unfinished creation only when nothing after the header was ever
/// written (a creation writes its header before any record); anything else is damage.
#[test]
fn a_segment_file_that_is_not_spools_is_damage_and_never_overwritten() {
    // Only 0000000000000001.seg, of random bytes.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(seg_path(dir.path(), 1), noise(7, 200_000)).unwrap();
    assert_refused_untouched(dir.path(), 1);

    // The last segment of a store, with bad magic and bytes after its header.
    let dir = tempfile::tempdir().unwrap();
    write_commits(dir.path(), test_opts(), 3);
    let mut seg = format::encode_header(2).to_vec();
    seg[0] ^= 0x20;
    seg.extend(noise(8, 4096));
    std::fs::write(seg_path(dir.path(), 2), &seg).unwrap();
    assert_refused_untouched(dir.path(), 2);

    // A valid header naming another segment id, on the last segment.
    let dir = tempfile::tempdir().unwrap();
    write_commits(dir.path(), test_opts(), 3);
    let mut seg = format::encode_header(9).to_vec();
    seg.resize(4096, 0);
    std::fs::write(seg_path(dir.path(), 2), &seg).unwrap();
    assert_refused_untouched(dir.path(), 2);

    // A torn header with nothing after it is still an unfinished creation.
    let dir = tempfile::tempdir().unwrap();
    let infos = write_commits(dir.path(), test_opts(), 3);
    let mut seg = format::encode_header(2)[..11].to_vec();
    seg.extend(noise(9, 21));
    seg.resize(4096, 0);
    std::fs::write(seg_path(dir.path(), 2), &seg).unwrap();
    assert!(verify(dir.path(), test_opts()).unwrap().ok);
    let s = Store::open(dir.path(), test_opts()).unwrap();
    assert_eq!(s.last_seq(), infos.len() as u64);
}

/// The frame bytes of seq 3 on stream "forged" in segment 1 of a scratch store: a
/// valid frame for segment 1 of any store whose third commit it would be.
fn forged_frame() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), test_opts()).unwrap();
    append_next(&s, "s0", ev(b"one"));
    append_next(&s, "s1", ev(b"two"));
    let i = committed(append_next(&s, "forged", ev(b"FORGED COMMIT")));
    let rec = s.read_at(i.position).unwrap();
    drop(s);
    let seg = std::fs::read(seg_path(dir.path(), i.position.segment)).unwrap();
    let at = i.position.offset as usize;
    seg[at..at + rec.record_bytes as usize].to_vec()
}

/// Found by planting a frame in message text and tearing the last write (losing its
/// final bytes, which the fault model allows): `verify --salvage` copied the planted
/// commit into the new store as real data. A frame inside the bytes an earlier record's
/// header claims is never taken for a record: salvage copies nothing from there, verify
/// reports the damage without counting it, and an owner open refuses (it cannot tell a
/// torn last write from a damaged length field) and names salvage.
#[test]
fn a_frame_planted_in_message_text_is_never_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), test_opts()).unwrap();
    append_next(&s, "s0", ev(b"one"));
    append_next(&s, "s1", ev(b"two"));
    let mut text = b"user text before ".to_vec();
    text.extend(forged_frame());
    text.extend(vec![b'.'; 200]);
    let carrier = committed(append_next(&s, "chat", ev(&text)));
    let carrier_bytes = s.read_at(carrier.position).unwrap().record_bytes as u64;
    drop(s);
    // Tear the last write: its final 64 bytes never landed.
    let path = seg_path(dir.path(), carrier.position.segment);
    let mut seg = std::fs::read(&path).unwrap();
    let end = (carrier.position.offset + carrier_bytes) as usize;
    seg[end - 64..end].fill(0);
    std::fs::write(&path, &seg).unwrap();

    let out = dir.path().join("salvaged");
    let report = salvage(dir.path(), &out, test_opts()).unwrap();
    assert_eq!(report.commits_copied, 2, "{report:?}");
    let s = Store::open(&out, test_opts()).unwrap();
    assert_eq!(s.stream_version("forged").unwrap(), None);
    assert_eq!(s.last_seq(), 2);
    drop(s);

    let r = verify(dir.path(), test_opts()).unwrap();
    assert!(!r.ok, "{r:?}");
    assert_eq!(r.commits, 2, "{r:?}");
    assert!(
        r.errors.iter().any(|e| e.offset == carrier.position.offset),
        "{r:?}"
    );
    match Store::open(dir.path(), test_opts()) {
        Err(Error::Corrupt {
            offset, problem, ..
        }) => {
            assert_eq!(offset, carrier.position.offset);
            assert!(problem.contains("salvage"), "{problem}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        seg,
        "a refused open changed the segment"
    );
}

/// The last record of a closed store (its index flushed, so the index's synced mark is
/// in sled) damaged by one flipped bit, at every byte of the record: that commit was
/// acknowledged after it reached the disk, so the owner's open refuses instead of
/// trimming it as a torn tail, writes nothing, and `verify` reports the damage. Both
/// durabilities: a `Buffered` store's close flushes, which records the mark too.
#[test]
fn a_bit_flip_in_an_acknowledged_last_record_is_refused_not_trimmed() {
    for durability in [Durability::Immediate, Durability::Buffered] {
        let src = tempfile::tempdir().unwrap();
        let opts = || test_opts().durability(durability);
        let infos = write_commits(src.path(), opts(), 5);
        let last = infos.last().unwrap().clone();
        let rec_len = {
            let s = Store::open_read_only(src.path(), opts()).unwrap();
            s.read_at(last.position).unwrap().record_bytes as u64
        };
        let name = format::segment_file_name(last.position.segment);
        let mut damaged_tails = 0;
        for at in last.position.offset..last.position.offset + rec_len {
            let ctx = format!("{durability:?} flip at {at}");
            let dir = tempfile::tempdir().unwrap();
            copy_tree(src.path(), dir.path());
            let path = seg_path(dir.path(), last.position.segment);
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[at as usize] ^= 1 << (at % 8);
            std::fs::write(&path, &bytes).unwrap();

            let r = verify(dir.path(), opts()).unwrap();
            assert!(!r.ok, "{ctx}: {r:?}");
            assert_eq!(r.torn_tail_bytes, 0, "{ctx}: {r:?}");
            assert!(r.errors.iter().any(|e| e.segment == name), "{ctx}: {r:?}");
            match Store::open(dir.path(), opts()) {
                Err(Error::DamagedTail {
                    segment,
                    offset,
                    synced_seq,
                    last_seq,
                    ..
                }) => {
                    damaged_tails += 1;
                    assert_eq!(segment, name, "{ctx}");
                    assert_eq!(offset, last.position.offset, "{ctx}");
                    assert_eq!((synced_seq, last_seq), (last.seq, last.seq - 1), "{ctx}");
                }
                // A flip that makes the frame claim other bytes may be reported as
                // mid-log damage instead; a refusal either way.
                Err(Error::Corrupt { segment, .. }) => assert_eq!(segment, name, "{ctx}"),
                other => panic!("{ctx}: expected a refusal, got {:?}", other.map(|_| ())),
            }
            assert_eq!(
                std::fs::read(&path).unwrap(),
                bytes,
                "{ctx}: the refused open wrote to the segment"
            );
            // The error points at salvage, which keeps every intact commit.
            let msg = Store::open(dir.path(), opts()).err().unwrap().to_string();
            assert!(msg.contains("verify --salvage"), "{ctx}: {msg}");
        }
        assert!(
            damaged_tails > 0,
            "{durability:?}: no flip was a damaged tail"
        );
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else if e.file_name() != "LOCK" {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// The write in flight at a crash (an `Immediate` group whose fdatasync never
/// happened) is a torn tail: it lies past the index's synced mark, so the open trims
/// it as before and keeps every acknowledged commit.
#[test]
fn a_torn_write_past_the_synced_mark_is_trimmed() {
    let dir = PathBuf::from("/store");
    let mut torn = 0;
    for seed in 0..40u64 {
        let ctx = format!("seed {seed}");
        let sim = SimVfs::new();
        let ix = tempfile::tempdir().unwrap();
        let opts = |v: &SimVfs| {
            test_opts()
                .vfs(Arc::new(v.clone()))
                .durability(Durability::Immediate)
                .index_dir(ix.path().join("index"))
        };
        let s = Store::open(&dir, opts(&sim)).unwrap();
        for i in 0..5u64 {
            s.append(commit("a", ExpectedVersion::Exact(i), &[i as u8; 300]))
                .unwrap();
        }
        s.flush_index().unwrap();
        sim.crash_at_sync(1, seed);
        assert!(s
            .append(commit("a", ExpectedVersion::Exact(5), &[9u8; 3000]))
            .is_err());
        drop(s);
        let after = sim.after_crash();
        let r = verify(&dir, opts(&after)).unwrap();
        assert!(r.ok, "{ctx}: {r:?}");
        if r.torn_tail_bytes > 0 {
            torn += 1;
        }
        let s = Store::open(&dir, opts(&after)).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert!(s.last_seq() >= 5, "{ctx}");
        assert_eq!(s.stream_version("a").unwrap(), Some(s.last_seq()), "{ctx}");
        drop(s);
        let r = verify(&dir, opts(&after)).unwrap();
        assert!(r.ok && r.torn_tail_bytes == 0, "{ctx}: {r:?}");
    }
    assert!(torn > 0, "no seed left a torn tail");
}

/// `Buffered` commits are published to the index before they are synced and may be
/// lost at a power loss, torn or whole: the synced mark covers only what a flush
/// synced, so the open trims the lost tail and rebuilds the index, and a damaged
/// commit that a flush covered is still refused.
#[test]
fn buffered_commits_lost_at_power_loss_open_but_flushed_ones_are_guarded() {
    let dir = PathBuf::from("/store");
    for seed in 0..20u64 {
        let ctx = format!("seed {seed}");
        let sim = SimVfs::new();
        let ix = tempfile::tempdir().unwrap();
        let opts = |v: &SimVfs| {
            test_opts()
                .vfs(Arc::new(v.clone()))
                .durability(Durability::Buffered)
                .buffered_flush_interval(std::time::Duration::from_secs(3600))
                .index_dir(ix.path().join("index"))
        };
        let s = Store::open(&dir, opts(&sim)).unwrap();
        let mut flushed = None;
        for i in 0..6u64 {
            let info = committed(
                s.append(commit("a", ExpectedVersion::Exact(i), &[i as u8; 500]))
                    .unwrap(),
            );
            if i == 2 {
                s.flush().unwrap();
                flushed = Some(info);
            }
        }
        let flushed = flushed.unwrap();
        s.flush_index().unwrap();
        assert_eq!(s.index().applied_seq().unwrap(), 6);
        sim.crash(seed);
        drop(s);
        let after = sim.after_crash();
        let s = Store::open(&dir, opts(&after)).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert!(s.last_seq() >= flushed.seq, "{ctx}");
        drop(s);

        // Damage inside the last flushed commit, with the later ones gone.
        let sim = SimVfs::new();
        let ix2 = tempfile::tempdir().unwrap();
        let opts2 = |v: &SimVfs| {
            test_opts()
                .vfs(Arc::new(v.clone()))
                .durability(Durability::Buffered)
                .buffered_flush_interval(std::time::Duration::from_secs(3600))
                .index_dir(ix2.path().join("index"))
        };
        let s = Store::open(&dir, opts2(&sim)).unwrap();
        let mut last = None;
        for i in 0..3u64 {
            last = Some(committed(
                s.append(commit("a", ExpectedVersion::Exact(i), &[i as u8; 500]))
                    .unwrap(),
            ));
        }
        s.close().unwrap();
        let last = last.unwrap();
        let path = seg_path(&dir, last.position.segment);
        let mut bytes = sim.read_file(&path).unwrap();
        bytes[(last.position.offset + 40 + seed) as usize] ^= 0x10;
        sim.write_file_durable(&path, bytes).unwrap();
        match Store::open(&dir, opts2(&sim)) {
            Err(Error::DamagedTail { synced_seq, .. }) => assert_eq!(synced_seq, 3, "{ctx}"),
            other => panic!("{ctx}: expected DamagedTail, got {:?}", other.map(|_| ())),
        }
    }
}

/// Runs once, at the first map of the file it belongs to: what a live writer
/// does between a reader's listing of the segments and its map of one.
struct Hook(std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

/// A file whose first map runs its hook first.
#[derive(Debug)]
struct BeforeMapFile {
    inner: Arc<dyn spool_engine::vfs::VfsFile>,
    hook: Arc<Hook>,
}

impl spool_engine::vfs::VfsFile for BeforeMapFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
    fn sync_all(&self) -> std::io::Result<()> {
        self.inner.sync_all()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn map(&self) -> std::io::Result<spool_engine::vfs::Mapped> {
        if let Some(hook) = self.hook.0.lock().unwrap().take() {
            hook();
        }
        self.inner.map()
    }
}

/// A reader that lists a segment whose creation had not begun writing (an empty
/// file) and maps it after the writer wrote its header and records reports no
/// damage: its view is a prefix of the log (an open that finds damage reads the
/// log again, up to three times, and then sees the whole segment).
#[test]
fn a_segment_created_between_a_readers_listing_and_its_map_is_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let infos = write_commits(dir.path(), small_opts(), 200);
    let last = infos.last().unwrap().position.segment;
    assert!(last > 1, "the commits fill more than one segment");
    let in_last = infos.iter().filter(|i| i.position.segment == last).count() as u64;
    std::fs::remove_dir_all(dir.path().join(CHECKPOINT_DIR)).unwrap();
    let path = seg_path(dir.path(), last);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, b"").unwrap();
    let hook = Arc::new(Hook(std::sync::Mutex::new(Some(Box::new({
        let path = path.clone();
        move || std::fs::write(&path, &bytes).unwrap()
    })))));
    let vfs = OpenHook(move |p: &Path, mode| {
        let inner = os_open(p, mode)?;
        Ok(match p == path {
            true => Arc::new(BeforeMapFile {
                inner,
                hook: hook.clone(),
            }),
            false => inner,
        })
    });
    let ro = Store::open_read_only(dir.path(), small_opts().vfs(Arc::new(vfs))).unwrap();
    let seen = ro.last_seq();
    assert!(seen == 200 || seen == 200 - in_last, "{seen}");
    let read: Vec<u64> = ro.scan(1).unwrap().map(|r| r.unwrap().info.seq).collect();
    assert_eq!(read, (1..=seen).collect::<Vec<u64>>());
}
