//! cargo-fuzz target `redo_record`; the body is `spool_tests::fuzz::redo_record`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spool_tests::fuzz::redo_record(data);
});
