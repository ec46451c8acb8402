//! cargo-fuzz target `key_filter`; the body is `spool_tests::fuzz::key_filter`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spool_tests::fuzz::key_filter(data);
});
