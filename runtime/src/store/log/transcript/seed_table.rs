//! The seed table (`E` keys): a fork's seed records spread over at most
//! [`SEED_BUCKETS`] keys, their encoding and the lookup of one id in them.
//! Pure functions over bytes: nothing here touches the index. The bucket
//! layout is in docs/format.md, "Indexer `transcript`".

use super::keys::{sk, TAG_SEED};
use crate::transcript::EntryId;

/// Buckets of a seed table: a seed's records are spread over at most this
/// many `E` keys, whatever its size (a bucket is one byte of the key).
pub const SEED_BUCKETS: u32 = 256;

/// Format byte of a seed bucket value.
const SEED_BUCKET_FORMAT: u8 = 2;

/// The seed bucket of an entry id: FNV-1a (64-bit) over the id's bytes,
/// mixed by the SplitMix64 finalizer, top 8 bits. Stored data depends on
/// it: changing it is a layout change.
pub(super) fn seed_bucket(id: &EntryId) -> u8 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in id.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    (h >> 56) as u8
}

pub(super) fn seed_key(sid: &str, bucket: u8) -> Vec<u8> {
    let mut k = sk(TAG_SEED, sid);
    k.push(bucket);
    k
}

/// One record of a seed bucket: (id bytes, record bytes).
pub type SeedRecord<'v> = (&'v [u8], &'v [u8]);

/// Encodes a seed bucket value from its records, sorted by id bytes behind
/// an offset table (the layout is in docs/format.md, "Indexer
/// `transcript`", seed bucket). The sorted offset table
/// lets a lookup binary-search the bucket instead of walking it (a new
/// id, which every append checks, is a miss that would read the whole
/// bucket). Ids are at most 255 bytes and records at most `u32::MAX`
/// bytes (entry ids are at most 128 bytes; a record is bounded by the
/// commit it indexes); a duplicate id keeps its first record.
pub fn encode_seed_bucket(records: &[SeedRecord<'_>]) -> Vec<u8> {
    let mut sorted: Vec<SeedRecord<'_>> = Vec::with_capacity(records.len());
    for r in records {
        debug_assert!(r.0.len() <= usize::from(u8::MAX));
        debug_assert!(u32::try_from(r.1.len()).is_ok());
        sorted.push(*r);
    }
    // Stable: the first of equal ids stays first, and is the one kept.
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    sorted.dedup_by(|later, first| later.0 == first.0);
    let n = sorted.len();
    let dir_end = 1 + 4 + 4 * n;
    let body: usize = sorted.iter().map(|(id, r)| 5 + id.len() + r.len()).sum();
    let mut v = Vec::with_capacity(dir_end + body);
    v.push(SEED_BUCKET_FORMAT);
    v.extend_from_slice(&(n as u32).to_be_bytes());
    let mut at = dir_end;
    for (id, r) in &sorted {
        v.extend_from_slice(&(at as u32).to_be_bytes());
        at += 5 + id.len() + r.len();
    }
    for (id, r) in &sorted {
        v.push(id.len().min(usize::from(u8::MAX)) as u8);
        v.extend_from_slice(id);
        v.extend_from_slice(&u32::try_from(r.len()).unwrap_or(u32::MAX).to_be_bytes());
        v.extend_from_slice(r);
    }
    debug_assert_eq!(v.len(), at);
    v
}

/// A seed bucket's header: its record count and offset table, checked
/// against the value's length before anything is read through them.
fn seed_bucket_dir(v: &[u8]) -> Result<(usize, &[u8]), String> {
    let Some((&format, rest)) = v.split_first() else {
        return Err("empty seed bucket".into());
    };
    if format != SEED_BUCKET_FORMAT {
        return Err(format!(
            "seed bucket format {format}, expected {SEED_BUCKET_FORMAT}"
        ));
    }
    let n = rest
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("seed bucket truncated in its record count")?;
    // Every record takes at least 5 bytes besides its 4-byte offset.
    if n > rest.len().saturating_sub(4) / 9 {
        return Err(format!(
            "seed bucket of {} bytes claims {n} records",
            v.len()
        ));
    }
    Ok((n, &rest[4..4 + 4 * n]))
}

/// The record starting at byte `at` of a seed bucket value, and where the
/// next one starts.
fn seed_record_at(v: &[u8], at: usize) -> Result<(SeedRecord<'_>, usize), String> {
    let truncated = || format!("seed bucket record truncated at byte {at}");
    let id_len = usize::from(*v.get(at).ok_or_else(truncated)?);
    let id = v.get(at + 1..at + 1 + id_len).ok_or_else(truncated)?;
    let len = v
        .get(at + 1 + id_len..at + 5 + id_len)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or_else(truncated)?;
    let start = at + 5 + id_len;
    let end = start.checked_add(len).ok_or_else(truncated)?;
    let record = v.get(start..end).ok_or_else(truncated)?;
    Ok(((id, record), end))
}

fn dir_offset(dir: &[u8], i: usize) -> usize {
    let b = &dir[4 * i..4 * i + 4];
    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
}

/// The records of a seed bucket value, in order: (id bytes, record
/// bytes), borrowed from `v`. The whole value is checked: the offsets
/// name the records in sequence, the ids strictly increase and nothing
/// follows the last record. Hostile bytes give an error naming the byte
/// offset, never a panic or an allocation the value's length does not
/// bound.
pub fn seed_bucket_records(v: &[u8]) -> Result<Vec<SeedRecord<'_>>, String> {
    let (n, dir) = seed_bucket_dir(v)?;
    let mut out: Vec<SeedRecord<'_>> = Vec::with_capacity(n);
    let mut at = 5 + 4 * n;
    for i in 0..n {
        if dir_offset(dir, i) != at {
            return Err(format!("seed bucket offset {i} does not name byte {at}"));
        }
        let (r, next) = seed_record_at(v, at)?;
        if out.last().is_some_and(|p| p.0 >= r.0) {
            return Err(format!("seed bucket ids out of order at byte {at}"));
        }
        out.push(r);
        at = next;
    }
    if at != v.len() {
        return Err(format!(
            "seed bucket has {} bytes past its last record",
            v.len() - at
        ));
    }
    Ok(out)
}

/// The record bytes of `id` in a seed bucket value: a binary search over
/// its offset table (only the records it visits are read and checked).
pub(super) fn find_in_seed_bucket<'v>(
    v: &'v [u8],
    id: &EntryId,
) -> Result<Option<&'v [u8]>, String> {
    let id = id.as_bytes();
    let (n, dir) = seed_bucket_dir(v)?;
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let ((k, r), _) = seed_record_at(v, dir_offset(dir, mid))?;
        match k.cmp(id) {
            std::cmp::Ordering::Equal => return Ok(Some(r)),
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
        }
    }
    Ok(None)
}

/// What a seed bucket holds for one id: its record (copied out), or an
/// error naming what is wrong with the bucket.
pub(super) type SeedLookup = Result<Option<Vec<u8>>, String>;

/// The lookup of `id` in a seed bucket value handed over in place
/// (`None`: no such bucket).
pub(super) fn seed_lookup(v: Option<&[u8]>, id: &EntryId) -> SeedLookup {
    match v {
        None => Ok(None),
        Some(v) => find_in_seed_bucket(v, id).map(|r| r.map(<[u8]>::to_vec)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seed bucket value keeps its records sorted by id behind an offset
    /// table; lookups binary-search it. Any truncation, an offset or
    /// length past the end, ids out of order or another format is an
    /// error (never a panic or an allocation from a damaged length).
    #[test]
    fn seed_buckets_are_sorted_searched_and_checked() {
        let records: [SeedRecord<'_>; 4] = [
            (b"ccc", b"0123456789"),
            (b"a", b"xyz"),
            (b"bb", b""),
            (b"a", b"second a, dropped"),
        ];
        let v = encode_seed_bucket(&records);
        let got = seed_bucket_records(&v).unwrap();
        let want: Vec<SeedRecord<'_>> = vec![(b"a", b"xyz"), (b"bb", b""), (b"ccc", b"0123456789")];
        assert_eq!(got, want);
        for (id, r) in &want {
            let id = EntryId::parse(std::str::from_utf8(id).unwrap()).unwrap();
            assert_eq!(find_in_seed_bucket(&v, &id).unwrap(), Some(*r));
        }
        for absent in ["0", "b", "bbb", "d"] {
            let id = EntryId::parse(absent).unwrap();
            assert_eq!(find_in_seed_bucket(&v, &id).unwrap(), None, "{absent}");
        }
        assert_eq!(
            seed_bucket_records(&encode_seed_bucket(&[])).unwrap(),
            vec![]
        );
        for n in 0..v.len() {
            let r = seed_bucket_records(&v[..n]);
            assert!(r.is_err(), "truncated at {n}: {r:?}");
        }
        let ccc = EntryId::parse("ccc").unwrap();
        // A huge record count.
        let mut bad = v.clone();
        bad[1] = 0xff;
        assert!(seed_bucket_records(&bad).is_err());
        assert!(find_in_seed_bucket(&bad, &ccc).is_err());
        // The last offset past the end.
        let mut bad = v.clone();
        bad[5 + 8..5 + 12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(seed_bucket_records(&bad).is_err());
        assert!(find_in_seed_bucket(&bad, &ccc).is_err());
        // The first record's length made huge.
        let mut bad = v.clone();
        let first = 5 + 4 * 3;
        bad[first + 2..first + 6].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(seed_bucket_records(&bad).is_err());
        // Ids out of order (the first id changed to sort after the second).
        let mut bad = v.clone();
        bad[first + 1] = b'z';
        assert!(seed_bucket_records(&bad).is_err());
        // Another format.
        let mut bad = v.clone();
        bad[0] = SEED_BUCKET_FORMAT + 1;
        assert!(seed_bucket_records(&bad).is_err());
        assert!(find_in_seed_bucket(&bad, &ccc).is_err());
    }
}
