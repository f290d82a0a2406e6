//! A response body fed by a channel, so a producer task can stream while
//! hyper writes. Dropping the body (client went away, or RST_STREAM) closes
//! the channel, which is how producers learn of cancellation.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::sync::mpsc;

/// A body whose data frames arrive on an mpsc channel; ends when every
/// sender is dropped.
#[derive(Debug)]
pub struct ChannelBody {
    rx: mpsc::UnboundedReceiver<Bytes>,
}

impl ChannelBody {
    pub fn new(rx: mpsc::UnboundedReceiver<Bytes>) -> Self {
        Self { rx }
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}
