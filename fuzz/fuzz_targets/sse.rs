//! The loadtest's incremental SSE parser, fed in pieces.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    loadtest::sse::fuzz(data);
});
