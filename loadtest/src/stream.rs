//! Token events in a streamed response body, counted as bytes arrive, in
//! either wire format the harness reads: OpenAI SSE from the gateway, or an
//! engine's NDJSON.

use serde_json::Value;

use crate::runner::Api;
use crate::sse::SseParser;

/// Counts tokens in a streamed body as it arrives, in either wire format.
pub struct TokenStream {
    api: Api,
    sse: SseParser,
    /// Partial NDJSON line.
    line: Vec<u8>,
    /// Token events seen.
    pub tokens: u32,
    /// The server's own count of output tokens, when it sent one.
    pub usage: Option<u32>,
    /// The stream ended normally (`[DONE]`, or the engine's `done`).
    pub finished: bool,
    /// The error event's code, if the stream carried one.
    pub error: Option<String>,
    /// The answer's text, when asked for ([`TokenStream::capturing`]): its
    /// leading tokens up to [`MAX_ANSWER_BYTES`] (and one token past it).
    pub text: Option<String>,
}

/// The most of an answer's text a stream keeps (a conversation resends it).
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

impl TokenStream {
    pub fn new(api: Api) -> Self {
        Self {
            api,
            sse: SseParser::new(),
            line: Vec::new(),
            tokens: 0,
            usage: None,
            finished: false,
            error: None,
            text: None,
        }
    }

    /// A stream that also keeps the answer's text.
    pub fn capturing(api: Api) -> Self {
        Self { text: Some(String::new()), ..Self::new(api) }
    }

    fn keep(&mut self, t: &str) {
        if let Some(text) = self.text.as_mut().filter(|x| x.len() < MAX_ANSWER_BYTES) {
            text.push_str(t);
        }
    }

    /// Feeds body bytes; returns how many token events they completed.
    pub fn push(&mut self, data: &[u8]) -> u32 {
        let before = self.tokens;
        match self.api {
            Api::Openai | Api::Chat => {
                for ev in self.sse.push(data) {
                    self.openai_event(&ev.data);
                }
            }
            Api::Engine => {
                self.line.extend_from_slice(data);
                while let Some(i) = self.line.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = self.line.drain(..=i).collect();
                    self.engine_line(&line);
                }
            }
        }
        self.tokens - before
    }

    fn openai_event(&mut self, data: &str) {
        if data == "[DONE]" {
            self.finished = true;
            return;
        }
        let v: Value = serde_json::from_str(data).unwrap_or_default();
        if let Some(e) = v.get("error") {
            self.error = Some(e["code"].as_str().or(e["type"].as_str()).unwrap_or("unknown").to_string());
            return;
        }
        let choice = &v["choices"][0];
        let text = choice["text"].as_str().or(choice["delta"]["content"].as_str());
        if let Some(t) = text.filter(|t| !t.is_empty()) {
            self.tokens += 1;
            self.keep(t);
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            self.usage = Some(u32::try_from(n).unwrap_or(u32::MAX));
        }
    }

    fn engine_line(&mut self, line: &[u8]) {
        let v: Value = serde_json::from_slice(line).unwrap_or_default();
        match v["event"].as_str() {
            Some("token") => {
                self.tokens += 1;
                self.keep(v["text"].as_str().unwrap_or_default());
            }
            Some("done") => {
                self.finished = true;
                self.usage = v["usage"]["completion_tokens"].as_u64().map(|n| n as u32);
            }
            Some("error") => self.error = Some(v["code"].as_str().unwrap_or("unknown").to_string()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_stream_counts_sse_tokens_usage_and_errors() {
        let mut s = TokenStream::new(Api::Openai);
        let chunk = |t: &str| format!("data: {{\"choices\":[{{\"text\":\"{t}\"}}]}}\n\n");
        let wire = format!("{}{}{}", chunk("a"), chunk(""), chunk("b"));
        // Split mid-event: the token counts when its event completes.
        assert_eq!(s.push(&wire.as_bytes()[..10]), 0);
        assert_eq!(s.push(&wire.as_bytes()[10..]), 2);
        assert_eq!(
            s.push(b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":7}}\n\ndata: [DONE]\n\n"),
            0
        );
        assert_eq!((s.tokens, s.usage, s.finished), (2, Some(7), true));
        assert_eq!(s.text, None, "text is kept only when asked for");
        let mut kept = TokenStream::capturing(Api::Openai);
        kept.push(wire.as_bytes());
        assert_eq!(kept.text.as_deref(), Some("ab"));
        let mut long = TokenStream::capturing(Api::Openai);
        let big = "x".repeat(MAX_ANSWER_BYTES / 2 + 1);
        for _ in 0..4 {
            long.push(chunk(&big).as_bytes());
        }
        assert_eq!(long.text.map(|t| t.len()), Some(2 * big.len()), "bounded: no more after the cap");
        let mut e = TokenStream::new(Api::Openai);
        e.push(b"data: {\"error\":{\"code\":\"engine_failed\",\"message\":\"x\"}}\n\n");
        assert_eq!(e.error.as_deref(), Some("engine_failed"));
    }

    #[test]
    fn token_stream_reads_engine_ndjson_split_across_frames() {
        let mut s = TokenStream::new(Api::Engine);
        let wire = b"{\"event\":\"token\",\"text\":\"a\"}\n{\"event\":\"token\",\"text\":\"b\"}\n{\"event\":\"done\",\"finish_reason\":\"length\",\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2},\"queue_ms\":0,\"prefill_ms\":0}\n";
        let got: u32 = wire.chunks(7).map(|c| s.push(c)).sum();
        assert_eq!((got, s.usage, s.finished), (2, Some(2), true));
    }
}
