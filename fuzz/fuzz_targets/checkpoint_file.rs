//! cargo-fuzz target `checkpoint_file`; the body is `spool_tests::fuzz::checkpoint_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spool_tests::fuzz::checkpoint_file(data);
});
