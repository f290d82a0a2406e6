//! The OpenAI Responses request parser and its translation to chat.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gateway::fuzzing::responses_request(data);
});
