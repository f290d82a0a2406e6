//! Fair reads: a connection's task reads about [`SLICE`] bytes a turn (at
//! least one read), and a new stream's handler waits until the bytes that
//! could carry its reset have been read.
//!
//! Why. The gateway's connection workers are single-threaded runtimes
//! (Envoy's model): an honest client's connection shares its thread with
//! whatever else that worker owns. A peer writing frames as fast as it can
//! (the rapid-reset shape: HEADERS, DATA and RST_STREAM for thousands of
//! streams) kept its connection's task decoding them, accepting each
//! stream and spawning its handler for as long as the socket had data:
//! tokio's cooperative budget counts socket reads (128 a turn), and one
//! read brings tens of such streams, so a turn could be thousands of
//! streams and tens of milliseconds. [`Fair`] charges the task's budget by
//! the byte, so the turn ends after about [`SLICE`]
//! bytes (one read of hyper's buffer when the peer floods) and the other
//! connections on the thread run. Measured with the gateway's rapid-reset
//! test, 10 runs interleaved (docs/reliability.md): an honest tenant's p99
//! beside the attack at 1.05x of unloaded at the median with 4 KiB slices,
//! 0.96x with 8 KiB, 1.31x with 16 KiB, against 1.6x before.
//!
//! The catch, found when slices were first tried (a plain "yield after
//! 16 KiB", withdrawn): a slice boundary can fall between a stream's request and its
//! RST_STREAM. The handler's old defence (yield once, so that hyper, which
//! checks for a reset each time the handler is pending, drops a stream
//! reset in the same read) then let the stream through to admission.
//! [`Reads::caught_up`] closes that: a stream accepted after read *n*
//! waits until read *n + 2* started (read *n + 1*'s frames are decoded, so
//! a reset in them is recorded) or read *n + 1* found the socket empty
//! (everything the peer had sent is decoded). It then yields once, and
//! hyper drops it if it was reset. An honest connection's next read finds
//! the socket empty right after the request, so its handler waits for
//! nothing. A reset the peer sends after a pause (its own flush, a later
//! segment) can still arrive after the handler went on: the connection's
//! [`crate::Watch`] bounds those.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// Units of tokio's cooperative budget a task gets a turn.
const BUDGET: usize = 128;
/// About what one connection's task reads in a turn on the gateway's
/// listeners (4 KiB): a read bigger than what is left of the budget ends
/// the turn after it.
pub const SLICE: usize = 4 * 1024;
/// The longest a stream's handler waits for [`Reads::caught_up`]: past
/// it the connection's reading is stuck (its peer not reading our writes,
/// hyper not reading its frames), and the stream goes on.
pub const CATCH_UP_MAX: std::time::Duration = std::time::Duration::from_millis(250);

/// A connection's read progress, shared between its socket ([`Fair`]) and
/// its streams' handlers ([`Reads::caught_up`]).
#[derive(Debug, Default)]
pub struct Reads {
    /// Read calls started on the socket.
    started: AtomicU64,
    /// The last read call that found the socket empty (0: none).
    idle_at: AtomicU64,
    changed: Notify,
}

impl Reads {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Where the connection's reading stands: take it when a stream is
    /// accepted (hyper calls the service in the connection's task, after
    /// decoding every whole frame read so far).
    pub fn mark(&self) -> u64 {
        self.started.load(Ordering::Acquire)
    }

    /// Whether every byte that could carry the reset of a stream accepted
    /// at `mark` has been decoded.
    pub fn is_caught_up(&self, mark: u64) -> bool {
        self.started.load(Ordering::Acquire) >= mark + 2 || self.idle_at.load(Ordering::Acquire) > mark
    }

    /// Resolves once [`Reads::is_caught_up`]. The connection's task goes on
    /// reading as long as the connection lives, so this ends unless the
    /// connection stops reading (bound it with [`CATCH_UP_MAX`]).
    pub async fn caught_up(&self, mark: u64) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.is_caught_up(mark) {
                return;
            }
            changed.await;
        }
    }
}

/// A connection's socket whose reads draw on its task's cooperative
/// budget by the byte (see the module's notes), counting reads in a
/// [`Reads`].
#[derive(Debug)]
pub struct Fair<T> {
    inner: T,
    reads: Arc<Reads>,
    /// Bytes read per unit of budget.
    unit: usize,
}

impl<T> Fair<T> {
    /// Reads about `slice` bytes a turn ([`SLICE`] on the gateway).
    pub fn new(inner: T, reads: Arc<Reads>, slice: usize) -> Self {
        Self { inner, reads, unit: (slice / BUDGET).max(1) }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Fair<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Out of budget: Pending, and tokio polls the task again at its
        // next turn, after the other tasks that are ready.
        let unit = ready!(tokio::task::coop::poll_proceed(cx));
        let n = this.reads.started.fetch_add(1, Ordering::AcqRel) + 1;
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        match &polled {
            Poll::Pending => {
                // Pending with budget left is an empty socket (without, it
                // may be the budget running out under us: not idle).
                if tokio::task::coop::has_budget_remaining() {
                    this.reads.idle_at.store(n, Ordering::Release);
                }
            }
            Poll::Ready(_) => {
                unit.made_progress();
                for _ in 0..(buf.filled().len() - before) / this.unit {
                    match tokio::task::coop::poll_proceed(cx) {
                        Poll::Ready(unit) => unit.made_progress(),
                        Poll::Pending => break, // spent: the next read yields
                    }
                }
            }
        }
        this.reads.changed.notify_waiters();
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Fair<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads `fair` to its end in one task, counting the turns it took.
    async fn read_all_counting_turns(fair: &mut Fair<tokio::io::DuplexStream>) -> (usize, usize) {
        let mut buf = vec![0u8; 4096];
        let (mut read, mut turns) = (0, 1);
        loop {
            let mut rb = ReadBuf::new(&mut buf);
            let polled = std::future::poll_fn(|cx| match Pin::new(&mut *fair).poll_read(cx, &mut rb) {
                Poll::Pending => Poll::Ready(None),
                Poll::Ready(r) => Poll::Ready(Some(r)),
            })
            .await;
            match polled {
                // Out of budget: a turn ends.
                None => {
                    turns += 1;
                    tokio::task::yield_now().await;
                }
                Some(r) => {
                    r.unwrap();
                    if rb.filled().is_empty() {
                        return (read, turns);
                    }
                    read += rb.filled().len();
                }
            }
        }
    }

    #[tokio::test]
    async fn a_fast_peer_is_read_a_slice_a_turn_and_writes_pass_through() {
        let (mut peer, ours) = tokio::io::duplex(1 << 20);
        peer.write_all(&vec![7u8; 10 * SLICE]).await.unwrap();
        drop(peer);
        let reads = Reads::new();
        let mut fair = Fair::new(ours, Arc::clone(&reads), SLICE);
        // One task reading: every byte, a slice a turn.
        let (read, turns) =
            tokio::spawn(async move { read_all_counting_turns(&mut fair).await }).await.unwrap();
        assert_eq!(read, 10 * SLICE, "every byte is read");
        // Reads of 4 KiB, each spending a slice's budget (the duplex counts
        // one unit of its own): about a turn each.
        let slices = 10 * SLICE / 4096;
        assert!((slices..=slices + 2).contains(&turns), "a slice a turn: {turns} turns, {slices} slices");
        let (mut a, b) = tokio::io::duplex(64);
        let mut fair = Fair::new(b, Reads::new(), SLICE);
        fair.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        a.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
    }

    #[tokio::test]
    async fn a_stream_waits_for_the_read_after_next_or_an_empty_socket() {
        let (mut peer, ours) = tokio::io::duplex(1 << 16);
        let reads = Reads::new();
        let mut fair = Fair::new(ours, Arc::clone(&reads), SLICE);
        peer.write_all(b"request").await.unwrap();
        let mut buf = [0u8; 64];
        let got = fair.read(&mut buf).await.unwrap(); // read 1
        assert_eq!(got, 7);
        let mark = reads.mark(); // a stream accepted from read 1
        assert!(!reads.is_caught_up(mark), "read 2 has not happened: its reset may be in it");
        // Read 2 brings more bytes (maybe its reset): not yet.
        peer.write_all(b"reset").await.unwrap();
        assert_eq!(fair.read(&mut buf).await.unwrap(), 5);
        assert!(!reads.is_caught_up(mark), "read 2's bytes are not known to be decoded until read 3");
        let waiting = tokio::spawn({
            let reads = Arc::clone(&reads);
            async move { reads.caught_up(mark).await }
        });
        // Read 3 starts: read 2 was decoded.
        let pending = tokio::time::timeout(std::time::Duration::from_millis(50), fair.read(&mut buf)).await;
        assert!(pending.is_err(), "nothing to read");
        assert!(reads.is_caught_up(mark));
        tokio::time::timeout(std::time::Duration::from_secs(1), waiting).await.unwrap().unwrap();
        // An honest stream: its next read finds the socket empty.
        peer.write_all(b"request").await.unwrap();
        assert_eq!(fair.read(&mut buf).await.unwrap(), 7);
        let mark = reads.mark();
        assert!(!reads.is_caught_up(mark));
        let pending = tokio::time::timeout(std::time::Duration::from_millis(50), fair.read(&mut buf)).await;
        assert!(pending.is_err());
        assert!(reads.is_caught_up(mark), "an empty socket: every byte sent is decoded");
    }
}
