//! Incremental Server-Sent Events parsing (the WHATWG event-stream format):
//! events end at a blank line, `data:` lines join with `\n`, lines starting
//! with `:` are comments, and `\n`, `\r\n` or `\r` end a line.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, if any (`None` means the default "message").
    pub event: Option<String>,
    pub data: String,
    /// The `id:` field of this event, if it had one (what a client sends
    /// back as `Last-Event-ID` to resume).
    pub id: Option<String>,
}

/// Feeds bytes in arbitrary pieces; yields complete events.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
    id: Option<String>,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes and returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i < self.buf.len() {
            let b = self.buf[i];
            if b == b'\n' || b == b'\r' {
                // A lone '\r' at the end may be the first half of "\r\n": wait.
                if b == b'\r' && i + 1 == self.buf.len() {
                    break;
                }
                let line = String::from_utf8_lossy(&self.buf[start..i]).into_owned();
                i += if b == b'\r' && self.buf[i + 1] == b'\n' { 2 } else { 1 };
                start = i;
                if let Some(ev) = self.line(&line) {
                    out.push(ev);
                }
            } else {
                i += 1;
            }
        }
        self.buf.drain(..start);
        out
    }

    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            if self.data.is_empty() && self.event.is_none() {
                self.id = None;
                return None;
            }
            let data = std::mem::take(&mut self.data).join("\n");
            return Some(SseEvent { event: self.event.take(), data, id: self.id.take() });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "data" => self.data.push(value.to_string()),
            "event" => self.event = Some(value.to_string()),
            "id" if !value.contains('\0') => self.id = Some(value.to_string()),
            _ => {}
        }
        None
    }
}

/// Fuzzing entry point (`fuzz/`, and the property test below): bytes fed in
/// pieces whose size the first byte picks must give the same events as
/// the bytes fed at once.
#[doc(hidden)]
pub fn fuzz(data: &[u8]) {
    let Some((&step, rest)) = data.split_first() else { return };
    let whole = SseParser::new().push(rest);
    let mut p = SseParser::new();
    let pieces: Vec<SseEvent> = rest.chunks(usize::from(step).max(1)).flat_map(|c| p.push(c)).collect();
    assert_eq!(whole, pieces);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_split_anywhere() {
        let stream =
            b"data: {\"a\":1}\n\n: comment\r\nevent: end\r\ndata: x\r\ndata: y\r\n\r\ndata: [DONE]\n\n";
        for split in 0..stream.len() {
            let mut p = SseParser::new();
            let mut events = p.push(&stream[..split]);
            events.extend(p.push(&stream[split..]));
            assert_eq!(
                events,
                vec![
                    SseEvent { event: None, data: "{\"a\":1}".into(), id: None },
                    SseEvent { event: Some("end".into()), data: "x\ny".into(), id: None },
                    SseEvent { event: None, data: "[DONE]".into(), id: None },
                ],
                "split at {split}"
            );
        }
    }

    #[test]
    fn bare_cr_line_ends_fields_without_space_and_unknown_fields() {
        let mut p = SseParser::new();
        let mut events = p.push(b"data:one\rdata:  two\r\r");
        // A trailing CR might be half of CRLF: the event completes on the next byte.
        events.extend(p.push(b"id: 7\nretry: 10\ndata\n\n:only a comment\n\n"));
        assert_eq!(
            events,
            vec![
                SseEvent { event: None, data: "one\n two".into(), id: None },
                SseEvent { event: None, data: "".into(), id: Some("7".into()) }
            ]
        );
        assert!(p.push(b"data: unterminated").is_empty(), "no event before its blank line");
    }
}
