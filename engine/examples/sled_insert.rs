//! sled's own cost per inserted key, configured as the index configures it,
//! with keys shaped like the transcript index's entry records: the floor
//! under the background move of the index's memtable into sled, which a
//! buffered append pays about once (one new key per chain append).
//!
//! Run it with
//! `cargo run --release -p spool-engine --example sled_insert -- [N] [VALUE_BYTES]...`
//! (default: 200,000 keys, values of 247 bytes, the mean size of an entry
//! record in `spool-bench`'s transcripts, and of 16 bytes, a bare log
//! position). For each value size it inserts `N` keys into a fresh sled
//! database opened by the index's own code (no flusher thread, the index's
//! cache bound, high-throughput mode), in batches of 4,096 keys sorted by key
//! as a move writes them (`write_move`), each followed by the move's own
//! epoch reclamation, and prints the wall time per key. Keys are the
//! entry-record key of one session: the tag `e`, the session id's length and
//! a 36-byte session id, then the bench's 8-hex-digit entry id of the
//! append's sequence number, so consecutive appends land far apart in key
//! order, as in the bench.

use std::time::Instant;

/// The allocator of the `spool` binary (see `tools/src/main.rs`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Keys per sorted batch: the memtable's move bound in commits.
const BATCH_KEYS: u64 = 4096;
const SESSION_ID: &[u8; 36] = b"0193a4b2-7c1d-7e3f-9a8b-123456789abc";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(200_000);
    let mut value_sizes: Vec<usize> = args.map(|s| s.parse()).collect::<Result<_, _>>()?;
    if value_sizes.is_empty() {
        value_sizes = vec![247, 16];
    }
    for value_bytes in value_sizes {
        let dir = tempfile::tempdir()?;
        let db = spool_engine::profiling::open_index_sled(&dir.path().join("index"))?;
        let value = vec![0x5a_u8; value_bytes];
        let mut batch: Vec<Vec<u8>> = Vec::with_capacity(BATCH_KEYS as usize);
        let start = Instant::now();
        let mut seq = 0u64;
        while seq < n {
            batch.clear();
            let end = (seq + BATCH_KEYS).min(n);
            for s in seq..end {
                let mut key = Vec::with_capacity(2 + SESSION_ID.len() + 8);
                key.push(b'e');
                key.push(SESSION_ID.len() as u8);
                key.extend_from_slice(SESSION_ID);
                let id = s.wrapping_mul(0x9E37_79B9) & 0xFFFF_FFFF;
                key.extend_from_slice(format!("{id:08x}").as_bytes());
                batch.push(key);
            }
            batch.sort_unstable();
            for key in &batch {
                db.insert(key.as_slice(), value.as_slice())?;
            }
            spool_engine::profiling::reclaim_after_move(batch.len());
            seq = end;
        }
        let elapsed = start.elapsed();
        {
            // Pinned, as the index flushes (see `flush_sled`).
            let _pinned = sled::pin();
            db.flush()?;
        }
        assert_eq!(db.len() as u64, n, "every key is distinct");
        let per_key_us = elapsed.as_secs_f64() * 1e6 / n as f64;
        println!(
            "values of {value_bytes} bytes: {n} keys in {:.2} s, {per_key_us:.2} us per key, {:.0} keys/s",
            elapsed.as_secs_f64(),
            n as f64 / elapsed.as_secs_f64()
        );
    }
    Ok(())
}
