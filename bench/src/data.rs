//! Deterministic transcript data shared by every subject of a run.
//!
//! All subjects (spool and its peers) write and read the same records,
//! generated from a fixed seed, so their figures compare like with like.
//!
//! # The mix
//!
//! Each record's role is drawn with these weights, and its text length is
//! drawn uniformly from the role's range:
//!
//! | role        | weight | length (bytes)      | mean    |
//! |-------------|--------|---------------------|---------|
//! | user        | 35 %   | 100 ..= 300         | 200 B   |
//! | assistant   | 45 %   | 512 ..= 1536        | 1 KiB   |
//! | tool result | 20 %   | 2048 ..= 6144       | 4 KiB   |
//!
//! The mean record is therefore about 1.35 KiB of text. Text is ASCII
//! words; assistant and tool-result texts also contain newlines, quotes and
//! backslashes so that JSON escaping costs what it costs in real transcripts.

use serde::{Deserialize, Serialize};

/// The seed every run uses unless told otherwise.
pub const DEFAULT_SEED: u64 = 0x5EED_5B00_1BE4_C400;

/// SplitMix64: a tiny, well-distributed PRNG; enough for test data and
/// stable across platforms (pure 64-bit integer arithmetic).
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (requires `lo <= hi`). The modulo bias is
    /// negligible for the small ranges used here.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// Who wrote a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
    ToolResult,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::ToolResult => "tool_result",
        }
    }
}

/// One transcript entry's payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub role: Role,
    pub text: String,
}

impl Record {
    /// Payload size: the text's length in bytes. This is what budgets and
    /// MB/s figures count, for every subject alike.
    pub fn bytes(&self) -> usize {
        self.text.len()
    }
}

/// Role weights in percent: user, assistant, tool result.
const WEIGHTS: [(Role, u64, u64, u64); 3] = [
    (Role::User, 35, 100, 300),
    (Role::Assistant, 45, 512, 1536),
    (Role::ToolResult, 20, 2048, 6144),
];

const WORDS: [&str; 32] = [
    "the", "session", "file", "error", "return", "value", "function", "build", "test", "agent",
    "model", "context", "tool", "result", "read", "write", "branch", "commit", "fix", "check",
    "index", "config", "path", "output", "input", "parse", "call", "stream", "entry", "log",
    "store", "open",
];

/// Deterministic record generator.
#[derive(Clone, Debug)]
pub struct Generator {
    rng: SplitMix64,
}

impl Generator {
    pub fn new(seed: u64) -> Self {
        Generator {
            rng: SplitMix64::new(seed),
        }
    }

    /// The generator for stream `index` of a run seeded with `seed`: every
    /// session gets its own independent, reproducible sequence.
    pub fn for_stream(seed: u64, index: u64) -> Self {
        let mut mix = SplitMix64::new(seed ^ index.wrapping_mul(0xA076_1D64_78BD_642F));
        Generator::new(mix.next_u64())
    }

    pub fn next_record(&mut self) -> Record {
        let pick = self.rng.range(0, 99);
        let mut acc = 0;
        let mut chosen = WEIGHTS[WEIGHTS.len() - 1];
        for w in WEIGHTS {
            acc += w.1;
            if pick < acc {
                chosen = w;
                break;
            }
        }
        let (role, _, lo, hi) = chosen;
        let len = self.rng.range(lo, hi) as usize;
        let text = self.text(role, len);
        Record { role, text }
    }

    /// `n` records.
    pub fn records(&mut self, n: usize) -> Vec<Record> {
        (0..n).map(|_| self.next_record()).collect()
    }

    fn text(&mut self, role: Role, len: usize) -> String {
        let mut s = String::with_capacity(len + 16);
        while s.len() < len {
            if !s.is_empty() {
                let r = self.rng.range(0, 15);
                let sep = match (role, r) {
                    (Role::User, _) => " ",
                    (_, 0) => "\n",
                    (Role::ToolResult, 1) => " \"",
                    (Role::ToolResult, 2) => "\\",
                    _ => " ",
                };
                s.push_str(sep);
            }
            let w = WORDS[self.rng.range(0, WORDS.len() as u64 - 1) as usize];
            s.push_str(w);
        }
        // Cut to the exact drawn length; the text is ASCII, so any byte
        // offset is a character boundary.
        debug_assert!(s.is_ascii());
        s.truncate(len);
        s
    }
}

/// A transcript of `n` records for stream `index` of a run.
pub fn transcript(seed: u64, index: u64, n: usize) -> Vec<Record> {
    Generator::for_stream(seed, index).records(n)
}

/// Total payload bytes of some records.
pub fn total_bytes(records: &[Record]) -> u64 {
    records.iter().map(|r| r.bytes() as u64).sum()
}

/// One JSONL line as file-per-session agents write it: an id, the parent's
/// id, a timestamp and the message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JsonEntry {
    pub id: String,
    #[serde(rename = "parentId")]
    pub parent_id: Option<String>,
    pub seq: u64,
    pub timestamp: i64,
    pub role: Role,
    pub text: String,
}

/// Fixed base timestamp so serialized data is reproducible.
pub const BASE_TIMESTAMP_MS: i64 = 1_750_000_000_000;

/// The entry id used for sequence number `seq` (8 hex characters, like
/// pi-style session files).
pub fn entry_id(seq: u64) -> String {
    format!("{:08x}", seq.wrapping_mul(0x9E37_79B9) & 0xFFFF_FFFF)
}

impl JsonEntry {
    pub fn new(seq: u64, record: &Record) -> Self {
        JsonEntry {
            id: entry_id(seq),
            parent_id: seq.checked_sub(1).map(entry_id),
            seq,
            timestamp: BASE_TIMESTAMP_MS + seq as i64,
            role: record.role,
            text: record.text.clone(),
        }
    }

    pub fn bytes(&self) -> usize {
        self.text.len()
    }
}

/// Serializes `record` at `seq` as one JSONL line including the trailing
/// newline, appended to `out`.
pub fn write_json_line(out: &mut Vec<u8>, seq: u64, record: &Record) -> serde_json::Result<()> {
    serde_json::to_writer(&mut *out, &JsonEntry::new(seq, record))?;
    out.push(b'\n');
    Ok(())
}

/// Parses one JSONL line (without or with its newline).
pub fn parse_json_line(line: &[u8]) -> serde_json::Result<JsonEntry> {
    serde_json::from_slice(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_is_deterministic() {
        let a = transcript(DEFAULT_SEED, 3, 500);
        let b = transcript(DEFAULT_SEED, 3, 500);
        assert_eq!(a, b);
        // Different streams differ.
        let c = transcript(DEFAULT_SEED, 4, 500);
        assert_ne!(a, c);
        // A pinned value catches accidental changes to the generator,
        // which would silently change what every benchmark measures.
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn generator_mix_matches_the_documented_one() {
        let recs = transcript(DEFAULT_SEED, 0, 20_000);
        let count = |r: Role| recs.iter().filter(|x| x.role == r).count() as f64 / 20_000.0;
        assert!((count(Role::User) - 0.35).abs() < 0.02);
        assert!((count(Role::Assistant) - 0.45).abs() < 0.02);
        assert!((count(Role::ToolResult) - 0.20).abs() < 0.02);
        for r in &recs {
            let (lo, hi) = match r.role {
                Role::User => (100, 300),
                Role::Assistant => (512, 1536),
                Role::ToolResult => (2048, 6144),
            };
            assert!(
                (lo..=hi).contains(&r.bytes()),
                "{} bytes for {:?}",
                r.bytes(),
                r.role
            );
        }
        let mean = total_bytes(&recs) as f64 / recs.len() as f64;
        assert!((1250.0..1450.0).contains(&mean), "mean {mean}");
    }

    #[test]
    fn json_lines_round_trip() {
        let recs = transcript(DEFAULT_SEED, 1, 50);
        let mut buf = Vec::new();
        for (i, r) in recs.iter().enumerate() {
            write_json_line(&mut buf, i as u64, r).unwrap();
        }
        let lines: Vec<&[u8]> = buf
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(lines.len(), recs.len());
        for (i, (line, r)) in lines.iter().zip(&recs).enumerate() {
            let e = parse_json_line(line).unwrap();
            assert_eq!(e.seq, i as u64);
            assert_eq!(e.role, r.role);
            assert_eq!(e.text, r.text);
            assert_eq!(e.parent_id, (i as u64).checked_sub(1).map(entry_id));
        }
    }
}
