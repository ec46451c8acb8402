//! cargo-fuzz target `event_decode`; the body is `spool_tests::fuzz::event_decode`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spool_tests::fuzz::event_decode(data);
});
