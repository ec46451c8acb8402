//! cargo-fuzz target `index_record`; the body is `spool_tests::fuzz::index_record`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spool_tests::fuzz::index_record(data);
});
