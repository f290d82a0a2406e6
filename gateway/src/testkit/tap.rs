//! The bytes the gateway writes to the test client, kept for tests that
//! look at the wire (HTTP/2 frames), and a reader of those frames.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes kept at most: a test's few hundred responses, not a stream's.
const MAX_KEPT: usize = 4 << 20;

/// A connection end that copies what is written through it.
pub(crate) struct Tap<T> {
    pub(crate) io: T,
    pub(crate) written: Arc<Mutex<Vec<u8>>>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Tap<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tap<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let n = std::task::ready!(Pin::new(&mut self.io).poll_write(cx, buf))?;
        let mut kept = self.written.lock().expect("tap lock");
        let room = MAX_KEPT.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// One HTTP/2 frame as written: its type, stream and payload length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub stream: u32,
    pub len: usize,
}

/// HEADERS.
pub const HEADERS: u8 = 0x1;

/// The frames in a server's byte stream (its preface is a SETTINGS frame,
/// so the stream is frames from the first byte); a frame cut off at the end
/// is left out.
pub fn frames(bytes: &[u8]) -> Vec<Frame> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(head) = bytes.get(at..at + 9) {
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if bytes.len() < at + 9 + len {
            break;
        }
        out.push(Frame { kind: head[3], stream, len });
        at += 9 + len;
    }
    out
}
