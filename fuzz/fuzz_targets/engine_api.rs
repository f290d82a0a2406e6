//! Every engine API request body (generate, video sessions, chunks,
//! batching hints), parsed and validated as the engine does.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gateway::fuzzing::engine_api(data);
});
