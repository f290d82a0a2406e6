//! The engine's video session import (an exported session's bytes).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gateway::fuzzing::video_import(data);
});
