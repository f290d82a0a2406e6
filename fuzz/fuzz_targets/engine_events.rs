//! The gateway's reader of engine NDJSON event streams, fed in pieces.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gateway::fuzzing::engine_events(data);
});
