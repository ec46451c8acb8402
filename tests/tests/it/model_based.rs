//! Model-based property tests: random sequences of runtime operations,
//! checked against the reference model after every step, on every store.
//!
//! Seeded: the seed is printed and `SPOOL_TEST_SEED` replays it. The number
//! of cases per store is `SPOOL_PROPTEST_CASES` (default small enough for
//! CI; raise it for a long run).

use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use spool_tests::ops::{ops_strategy, Runner, StoreKind};
use spool_tests::seed::{env_usize, test_seed};

/// Default seed of the model-based tests (fixed, so CI runs are repeatable).
const DEFAULT_SEED: u64 = 0x5_9001;

fn run(kind: StoreKind, default_cases: usize, max_len: usize) {
    let seed = test_seed(&format!("model_based {kind:?}"), DEFAULT_SEED);
    let cases = env_usize("SPOOL_PROPTEST_CASES", default_cases) as u32;
    let mut config = Config::with_cases(cases);
    config.failure_persistence = None;
    config.max_shrink_iters = 2_000;
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&(kind as u64).to_le_bytes());
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let totals = std::cell::Cell::new((0u64, 0u64, 0u64));
    let result = runner.run(&ops_strategy(max_len, true), |ops| {
        let mut r = Runner::new(kind).map_err(TestCaseError::fail)?;
        for (i, op) in ops.iter().enumerate() {
            r.step(op)
                .map_err(|e| TestCaseError::fail(format!("step {i} ({op:?}): {e}")))?;
        }
        let (o, c, n) = totals.get();
        totals.set((o + r.stats.ops, c + r.stats.checks, n + 1));
        Ok(())
    });
    let (ops, checks, n) = totals.get();
    eprintln!("model_based {kind:?}: {n} cases, {ops} operations checked against the model, {checks} full checks");
    if let Err(e) = result {
        panic!("model_based {kind:?} failed (seed {seed}): {e}");
    }
}

#[test]
fn runtime_matches_model_on_memory_store() {
    run(StoreKind::Memory, 256, 60);
}

#[test]
fn runtime_matches_model_on_file_store() {
    run(StoreKind::File, 128, 50);
}

#[test]
fn runtime_matches_model_on_log_store() {
    run(StoreKind::Log, 128, 50);
}
