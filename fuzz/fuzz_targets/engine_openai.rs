//! The engine's own OpenAI surface: chat and completion bodies parsed with
//! the engine's parser (the vLLM/SGLang extensions at neutral values),
//! turned into a generate request and validated.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    engine::fuzzing::openai_request(data);
});
