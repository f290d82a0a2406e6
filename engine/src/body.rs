//! A response body fed by a channel, so a producer task can stream while
//! hyper writes. Dropping the body (client went away, or RST_STREAM) closes
//! the channel, which is how producers learn of cancellation.
//!
//! The body knows which frame is its last (a predicate over the frame) and
//! says so through `is_end_stream`, so HTTP/2 carries END_STREAM on the last
//! DATA frame. Without that, the end comes in a separate empty frame after
//! the reader already has everything it wants; a reader that then drops the
//! stream makes its HTTP/2 library reset it, and enough such resets on one
//! connection make h2 close the connection (its defence against reset
//! floods), failing every stream on it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::sync::mpsc;

/// A body whose data frames arrive on an mpsc channel; ends after the frame
/// `is_last` accepts, or when every sender is dropped.
#[derive(Debug)]
pub struct ChannelBody {
    rx: mpsc::UnboundedReceiver<Bytes>,
    is_last: fn(&[u8]) -> bool,
    ended: bool,
}

impl ChannelBody {
    pub fn new(rx: mpsc::UnboundedReceiver<Bytes>, is_last: fn(&[u8]) -> bool) -> Self {
        Self { rx, is_last, ended: false }
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let polled = self.rx.poll_recv(cx);
        if let Poll::Ready(Some(b)) = &polled {
            self.ended = (self.is_last)(b);
        }
        polled.map(|o| o.map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{is_terminal_line, Event, FinishReason, Usage};
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn the_terminal_event_ends_the_body_on_its_own_frame() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut body = ChannelBody::new(rx, is_terminal_line);
        tx.send(Event::Token { text: "a".into() }.to_line().into()).unwrap();
        let done = Event::Done {
            finish_reason: FinishReason::Length,
            usage: Usage::default(),
            queue_ms: 0.0,
            prefill_ms: 0.0,
        };
        tx.send(done.to_line().into()).unwrap();
        assert!(body.frame().await.is_some());
        assert!(!body.is_end_stream());
        assert!(body.frame().await.is_some());
        assert!(body.is_end_stream(), "END_STREAM rides on the done line, though the sender is still open");
        assert!(body.frame().await.is_none());
        assert!(is_terminal_line(&Event::Error { code: "x".into(), message: "y".into() }.to_line()));
    }
}
