//! Upstream bodies and SSE decoding, on chunks shaped as vLLM, SGLang and
//! llama.cpp server write them (OpenAI's streaming format; the final
//! usage chunk after `stream_options.include_usage`).

use super::*;

fn gen(max_tokens: u32, temperature: Option<f32>) -> GenerateRequest {
    GenerateRequest {
        request_id: "req_1".into(),
        model: "synthetic-small".into(),
        prompt: "rendered".into(),
        max_tokens,
        temperature,
        seed: None,
        stop: vec![],
        priority_key: None,
        ttft_budget_ms: None,
        priority: None,
    }
}

fn decode(lines: &str) -> (Vec<Event>, bool) {
    let mut d = SseDecoder::default();
    for line in lines.lines() {
        d.line(line.as_bytes()).unwrap();
    }
    let mut events = vec![];
    while let Some(e) = d.pop() {
        events.push(e);
    }
    (events, d.ended())
}

fn tok(t: &str) -> Event {
    Event::Token { text: t.into() }
}

fn done(reason: FinishReason, prompt: u32, completion: u32) -> Event {
    Event::Done {
        finish_reason: reason,
        usage: Usage { prompt_tokens: prompt, completion_tokens: completion, cached_tokens: 0 },
        queue_ms: 0.0,
        prefill_ms: 0.0,
    }
}

#[test]
fn the_client_body_goes_up_with_the_gateways_decisions() {
    let client = br#"{"model":"synthetic-small","messages":[{"role":"user","content":"hi"}],
        "max_completion_tokens":500,"temperature":0.7,"stream":false,"user":"u1"}"#;
    let up: Value =
        serde_json::from_slice(&body(client, &gen(64, None), Some("tiny-llama"), true).unwrap()).unwrap();
    assert_eq!(up["model"], "tiny-llama");
    assert_eq!(up["max_tokens"], 64, "admission's cap");
    assert!(up.get("max_completion_tokens").is_none());
    assert_eq!(up["temperature"], 0.0, "admission made it greedy");
    assert_eq!(up["stream"], true);
    assert_eq!(up["stream_options"]["include_usage"], true);
    assert_eq!(up["messages"][0]["content"], "hi", "messages go up as sent");
    assert_eq!(up["user"], "u1");
    let kept: Value =
        serde_json::from_slice(&body(client, &gen(64, Some(0.7)), None, true).unwrap()).unwrap();
    assert_eq!((kept["model"].as_str(), kept["temperature"].as_f64()), (Some("synthetic-small"), Some(0.7)));
    assert!(body(b"[1,2]", &gen(1, None), None, true).is_err());
}

#[test]
fn a_chat_stream_with_a_usage_chunk_decodes_to_tokens_and_its_usage() {
    let (events, ended) = decode(concat!(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
        ": keep-alive comment\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"length\"}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n",
        "data: [DONE]\n\n",
    ));
    assert_eq!(events, vec![tok("Hel"), tok("lo"), done(FinishReason::Length, 9, 2)]);
    assert!(ended);
}

#[test]
fn a_completion_stream_without_usage_counts_its_tokens() {
    let (events, _) = decode(concat!(
        "data: {\"choices\":[{\"text\":\"a\",\"index\":0,\"finish_reason\":null}]}\r\n\r\n",
        "data: {\"choices\":[{\"text\":\"b\",\"index\":0,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
        "data: [DONE]\n",
    ));
    assert_eq!(events, vec![tok("a"), tok("b"), done(FinishReason::Stop, 0, 2)]);
}

#[test]
fn an_error_chunk_ends_the_stream_with_an_error_event() {
    let (events, ended) = decode(
        "data: {\"error\":{\"message\":\"out of KV cache\",\"type\":\"server_error\",\"code\":503}}\n",
    );
    assert_eq!(events, vec![Event::Error { code: "503".into(), message: "out of KV cache".into() }]);
    assert!(ended);
}

#[test]
fn garbage_and_data_after_the_end_are_errors() {
    let mut d = SseDecoder::default();
    assert!(d.line(b"data: {not json").is_err());
    d.line(b"data: [DONE]").unwrap();
    assert!(d.line(b"data: {\"choices\":[]}").is_err());
    let huge = format!("data: {{\"choices\":[{{\"text\":\"{}\"}}]}}", "x".repeat(MAX_DELTA_BYTES + 1));
    assert!(SseDecoder::default().line(huge.as_bytes()).is_err());
}
