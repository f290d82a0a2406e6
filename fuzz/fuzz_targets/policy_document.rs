//! The policy document parser and validator (files, the admin API, Redis).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gateway::fuzzing::policy_document(data);
});
