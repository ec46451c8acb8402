//! Replays every saved fuzz input on stable Rust: each file under
//! `fuzz/corpus/<target>/` goes through the same function the cargo-fuzz
//! target calls (`spool_tests::fuzz`), as do the generated seed inputs.
//!
//! `SPOOL_WRITE_FUZZ_SEEDS=1 cargo test -p spool-tests --test fuzz_corpus`
//! (re)writes the generated seed inputs into the corpora;
//! `SPOOL_WRITE_FUZZ_SEEDS=<target>` only those of one target.

use std::path::PathBuf;

use spool_tests::fuzz::{run_target, seed_inputs, TARGETS};

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("fuzz")
        .join("corpus")
        .join(target)
}

fn replay(target: &str) {
    let dir = corpus_dir(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: empty corpus", dir.display());
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let r = std::panic::catch_unwind(|| run_target(target, &bytes));
        if r.is_err() {
            panic!("{target}: saved input {} fails", f.display());
        }
    }
    eprintln!("{target}: replayed {} saved inputs", files.len());
}

#[test]
fn frame_decode_corpus_replays() {
    replay("frame_decode");
}

#[test]
fn event_decode_corpus_replays() {
    replay("event_decode");
}

#[test]
fn store_open_corpus_replays() {
    replay("store_open");
}

#[test]
fn session_ops_corpus_replays() {
    replay("session_ops");
}

#[test]
fn index_record_corpus_replays() {
    replay("index_record");
}

#[test]
fn index_values_corpus_replays() {
    replay("index_values");
}

#[test]
fn redo_record_corpus_replays() {
    replay("redo_record");
}

#[test]
fn key_filter_corpus_replays() {
    replay("key_filter");
}

#[test]
fn checkpoint_file_corpus_replays() {
    replay("checkpoint_file");
}

#[test]
fn generated_seed_inputs_pass_every_target() {
    let seeds = seed_inputs();
    for t in TARGETS {
        assert!(
            seeds.iter().any(|(tt, _, _)| *tt == t),
            "no seed input for {t}"
        );
    }
    // `1` writes every target's seeds; a target's name writes only its own.
    let write = std::env::var("SPOOL_WRITE_FUZZ_SEEDS").ok();
    for (target, name, bytes) in &seeds {
        run_target(target, bytes);
        if write.as_deref().is_some_and(|w| w == "1" || w == *target) {
            let dir = corpus_dir(target);
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("write seed");
        }
    }
}
