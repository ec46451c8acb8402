//! cargo-fuzz target `store_open`; the body is `spool_tests::fuzz::store_open`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spool_tests::fuzz::store_open(data);
});
