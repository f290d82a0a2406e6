//! The gateway's reader of engine NDJSON event streams, fed in pieces, and
//! its token fast path against serde's full parse of one line.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gateway::fuzzing::engine_events(data);
    gateway::fuzzing::engine_event_line(data);
});
