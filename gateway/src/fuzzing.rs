//! Entry points for fuzzing every parser of untrusted input, shared by the
//! cargo-fuzz targets (`fuzz/`) and the property tests that run in CI
//! (`gateway/tests/parsers.rs`). Each takes arbitrary bytes; none may
//! panic, and each checks what must hold of the result besides.

use crate::dispatch::EventLines;
/// The engine event reader's line bound (the parser tests go past it).
pub use crate::dispatch::MAX_EVENT_LINE;
use crate::openai::{self, Kind};

/// The OpenAI request parser, as both endpoints.
pub fn openai_request(data: &[u8]) {
    for kind in [Kind::Chat, Kind::Completion] {
        if let Ok(r) = openai::parse(kind, data) {
            assert!(r.stop.len() <= engine_api::bounds::MAX_STOPS);
            assert!(r.max_tokens != Some(0));
        }
    }
}

/// The Anthropic Messages parser (both bodies): what it accepts becomes a
/// chat request the chat parser takes, with the bounds kept.
pub fn anthropic_request(data: &[u8]) {
    for count_only in [false, true] {
        if let Ok(t) = crate::wire::anthropic::to_chat(data, count_only) {
            if let Ok(r) = openai::parse(Kind::Chat, &t.chat) {
                assert!(r.stop.len() <= engine_api::bounds::MAX_STOPS);
                assert!(count_only || r.max_tokens.is_some_and(|m| m >= 1), "max_tokens is required");
            }
        }
    }
}

/// The Responses parser, with and without a stored conversation to
/// continue: what it accepts becomes a chat request.
pub fn responses_request(data: &[u8]) {
    for previous in [None, Some(vec![serde_json::json!({"role": "user", "content": "earlier"})])] {
        if let Ok(t) = crate::wire::responses::to_chat(data, |_| previous.clone()) {
            assert!(t.conversation.len() <= 4096);
            if let Ok(r) = openai::parse(Kind::Chat, &t.chat) {
                assert!(r.max_tokens != Some(0));
            }
        }
    }
}

/// The policy document parser and validator: a document that parses
/// parses again to the same version.
pub fn policy_document(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(doc) = policies::PolicyDocument::parse("fuzz.toml", text) {
        let again = policies::PolicyDocument::parse("fuzz.toml", text).expect("parses twice");
        assert_eq!(doc.version, again.version);
    }
}

/// The engine event stream reader, fed in pieces whose sizes come from the
/// input: its buffer never holds more than one line's bound plus a piece.
pub fn engine_events(data: &[u8]) {
    let Some((&step, rest)) = data.split_first() else { return };
    let step = usize::from(step).max(1);
    let mut lines = EventLines::default();
    for piece in rest.chunks(step) {
        lines.push(piece);
        while lines.next_event().is_some() {}
        assert!(lines.pending() <= MAX_EVENT_LINE + step);
    }
}

/// One engine event line: the token fast path reads exactly what serde's
/// full parse reads, and accepts nothing it refuses.
pub fn engine_event_line(line: &[u8]) {
    let full = serde_json::from_slice::<engine_api::Event>(line).ok();
    let fast = crate::dispatch::parse_event(line).ok();
    assert_eq!(fast, full, "{:?}", String::from_utf8_lossy(line));
}

/// Every engine API body: the first byte picks which.
pub fn engine_api(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else { return };
    match which % 6 {
        0 => {
            if let Ok(g) = serde_json::from_slice::<engine_api::GenerateRequest>(body) {
                let _ = g.validate();
            }
        }
        1 => {
            if let Ok(c) = serde_json::from_slice::<engine_api::video::CreateSession>(body) {
                if c.validate().is_ok() {
                    assert!(c.latent_frames >= 1 && c.latent_frames <= engine_api::video::MAX_LATENT_FRAMES);
                }
            }
        }
        2 => {
            let _ = serde_json::from_slice::<engine_api::video::ChunkRequest>(body);
        }
        3 => {
            if let Ok(h) = serde_json::from_slice::<policies::batching::BatchHints>(body) {
                let _ = h.validate();
            }
        }
        4 => {
            let _ = serde_json::from_slice::<engine_api::Event>(body);
        }
        _ => {
            // A latency profile, as engines serve it to gateways.
            let Ok(text) = std::str::from_utf8(body) else { return };
            if let Ok(p) = policies::LatencyProfile::parse("fuzz", text) {
                for n in [0, 1, 4096, u32::MAX] {
                    let _ = (p.prefill(n), p.decode_step(n, n));
                }
            }
        }
    }
}
