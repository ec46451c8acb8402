//! Seeds for randomized tests.
//!
//! Every randomized test takes its seed from [`test_seed`]: the environment
//! variable `SPOOL_TEST_SEED` when set, else a fixed default, and prints it
//! so a failure can be replayed exactly.

/// The environment variable that overrides every randomized test's seed.
pub const SEED_ENV: &str = "SPOOL_TEST_SEED";

/// The seed for the test `name`: `SPOOL_TEST_SEED` if set (decimal or
/// `0x` hex), else `default`. Printed to stderr (shown by `cargo test` when
/// the test fails, or with `--nocapture`).
pub fn test_seed(name: &str, default: u64) -> u64 {
    let seed = std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| parse_seed(&s))
        .unwrap_or(default);
    eprintln!("{name}: seed {seed} (rerun with {SEED_ENV}={seed})");
    seed
}

fn parse_seed(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// A `usize` from the environment variable `var`, or `default`.
pub fn env_usize(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
}

/// SplitMix64: a tiny deterministic generator for test schedules.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

/// A scratch directory for tests that do much small synced I/O: under
/// `SPOOL_TEST_TMP` when set, else in `/dev/shm` (memory-backed, so fsyncs
/// are cheap) when it is usable, else in the system temporary directory.
/// What these tests check is the logic of the error and recovery paths;
/// the disk itself is exercised by the kill -9 loop in tools/tests/cli.rs.
pub fn scratch_dir() -> tempfile::TempDir {
    let base = std::env::var_os("SPOOL_TEST_TMP")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            let shm = std::path::Path::new("/dev/shm");
            shm.is_dir().then(|| shm.to_path_buf())
        });
    if let Some(b) = base {
        if let Ok(d) = tempfile::Builder::new()
            .prefix("spool-test-")
            .tempdir_in(&b)
        {
            return d;
        }
    }
    tempfile::tempdir().expect("create a temporary directory")
}
