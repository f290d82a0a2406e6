//! The public OpenAI request parser (chat and completions bodies).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gateway::fuzzing::openai_request(data);
});
