//! cargo-fuzz target `session_ops`; the body is `spool_tests::fuzz::session_ops`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spool_tests::fuzz::session_ops(data);
});
