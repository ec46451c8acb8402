//! cargo-fuzz target `index_values`; the body is `spool_tests::fuzz::index_values`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spool_tests::fuzz::index_values(data);
});
