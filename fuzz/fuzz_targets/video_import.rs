//! The engine's video session import (an exported session's bytes).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    engine::video::fuzz_import(data);
});
