//! cargo-fuzz target `frame_decode`; the body is `spool_tests::fuzz::frame_decode`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spool_tests::fuzz::frame_decode(data);
});
