//! A bounded byte buffer between a producer task and a response body.
//!
//! Streaming responses (SSE token relays, video feeds) are produced by a
//! task that reads the engine, not by the body hyper polls: hyper polls a
//! body only when the client's flow-control window has room, and work the
//! gateway holds on a client's behalf (an engine slot, an admission ticket,
//! a tenant's lease) must end when the *engine* finishes, not when the
//! slowest reader lets go. The producer [`Outbox`] appends encoded bytes;
//! the consumer [`OutboxBody`] hands them to hyper.
//!
//! Bounds: the buffer holds at most `capacity` bytes plus one push (a push
//! is never split). A producer that finds no room waits in [`Outbox::room`]
//! under a [`Stall`] rule: a reader that takes less than `min_rate` bytes/s
//! over a `timeout` window while bytes wait for it is *stalled*, and the
//! producer gives up ([`Stop::Stalled`]) and resets the stream
//! ([`Outbox::reset`]). A reader that goes away (hyper drops the body: the
//! client reset the stream or closed the connection) is seen at once by
//! [`Outbox::gone`].

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;

/// Largest data frame handed to hyper at once (hyper keeps one frame while
/// it waits for flow-control capacity: this bounds that copy too).
const MAX_FRAME: usize = 16 << 10;

/// When a reader counts as stalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    /// The window over which a waiting producer measures the reader.
    pub timeout: Duration,
    /// Bytes per second the reader must take while bytes wait for it (at
    /// least one byte per window whatever this is).
    pub min_rate: u64,
}

impl Stall {
    fn needed(&self) -> u64 {
        ((self.min_rate as f64 * self.timeout.as_secs_f64()) as u64).max(1)
    }
}

/// Why a producer stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Stop {
    #[error("the reader went away")]
    Gone,
    #[error("the reader stalled")]
    Stalled,
}

/// The error a reset stream's body ends with: hyper answers it with
/// RST_STREAM (HTTP/2) or by closing the connection (HTTP/1.1).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("stream reset: the client did not read its response")]
pub struct StreamReset;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Open,
    /// Ends cleanly once the buffer is drained.
    Finished,
    /// Ends with [`StreamReset`] at the next poll.
    Reset,
}

#[derive(Debug)]
struct State {
    buf: BytesMut,
    /// Bytes the reader has taken, ever.
    taken: u64,
    end: End,
    gone: bool,
    reader: Option<Waker>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    capacity: usize,
    /// Signalled when the reader takes bytes or goes away.
    progress: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A new outbox holding at most `capacity` bytes (plus one push).
pub fn outbox(capacity: usize) -> (Outbox, OutboxBody) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            buf: BytesMut::new(),
            taken: 0,
            end: End::Open,
            gone: false,
            reader: None,
        }),
        capacity: capacity.max(1),
        progress: Notify::new(),
    });
    (Outbox { shared: Arc::clone(&shared) }, OutboxBody { shared })
}

/// The producer's end. Dropping it without [`Outbox::finish`] resets the
/// stream (a producer that failed must not look like a clean end).
#[derive(Debug)]
pub struct Outbox {
    shared: Arc<Shared>,
}

impl Outbox {
    /// Appends `bytes` whole, even past the capacity (callers wait for
    /// [`Outbox::room`] first). `Err(Gone)` once the reader has gone.
    pub fn push(&self, bytes: &[u8]) -> Result<(), Stop> {
        let mut st = self.shared.lock();
        if st.gone {
            return Err(Stop::Gone);
        }
        st.buf.extend_from_slice(bytes);
        let waker = st.reader.take();
        drop(st);
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Whether a push now stays within the capacity.
    pub fn has_room(&self) -> bool {
        self.shared.lock().buf.len() < self.shared.capacity
    }

    /// Waits until the buffer is below its capacity.
    pub async fn room(&self, stall: Stall) -> Result<(), Stop> {
        let cap = self.shared.capacity;
        self.wait(stall, |st| st.buf.len() < cap).await
    }

    /// Waits until the reader has taken everything.
    pub async fn drained(&self, stall: Stall) -> Result<(), Stop> {
        self.wait(stall, |st| st.buf.is_empty()).await
    }

    /// Resolves once the reader has gone.
    pub async fn gone(&self) {
        loop {
            let notified = self.shared.progress.notified();
            if self.shared.lock().gone {
                return;
            }
            notified.await;
        }
    }

    async fn wait(&self, stall: Stall, done: impl Fn(&State) -> bool) -> Result<(), Stop> {
        let mut window = tokio::time::Instant::now() + stall.timeout;
        let mut taken_at = self.shared.lock().taken;
        loop {
            let notified = self.shared.progress.notified();
            {
                let st = self.shared.lock();
                if st.gone {
                    return Err(Stop::Gone);
                }
                if done(&st) {
                    return Ok(());
                }
                if tokio::time::Instant::now() >= window {
                    if st.taken - taken_at < stall.needed() {
                        return Err(Stop::Stalled);
                    }
                    taken_at = st.taken;
                    window = tokio::time::Instant::now() + stall.timeout;
                }
            }
            let _ = tokio::time::timeout_at(window, notified).await;
        }
    }

    /// Ends the stream cleanly after what is buffered (later pushes are
    /// ignored by the reader). Called before the reader has taken the last
    /// bytes, their DATA frame carries the end of the stream: one frame and
    /// one write fewer than an empty closing frame.
    pub fn finish(&self) {
        self.end(End::Finished, false);
    }

    /// Drops what is buffered and ends the stream with [`StreamReset`],
    /// also after [`Outbox::finish`] while the reader has bytes left to take
    /// (a stalled reader of a finished stream is still reset).
    pub fn reset(&self) {
        self.end(End::Reset, true);
    }

    fn end(&self, end: End, over_finished: bool) {
        let mut st = self.shared.lock();
        let open = st.end == End::Open || (over_finished && st.end == End::Finished && !st.buf.is_empty());
        if !open {
            return;
        }
        st.end = end;
        if end == End::Reset {
            st.buf = BytesMut::new(); // the memory goes now, not when hyper next polls
        }
        let waker = st.reader.take();
        drop(st);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.end(End::Reset, false); // a finished stream keeps its last bytes
    }
}

/// The consumer's end: the response body.
#[derive(Debug)]
pub struct OutboxBody {
    shared: Arc<Shared>,
}

impl Body for OutboxBody {
    type Data = Bytes;
    type Error = StreamReset;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamReset>>> {
        let shared = &self.get_mut().shared;
        let mut st = shared.lock();
        if !st.buf.is_empty() {
            let n = st.buf.len().min(MAX_FRAME);
            let data = st.buf.split_to(n).freeze();
            st.taken += n as u64;
            if st.buf.capacity() > 4 * shared.capacity && st.buf.is_empty() {
                st.buf = BytesMut::new(); // one large push does not pin its allocation
            }
            drop(st);
            shared.progress.notify_one();
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match st.end {
            End::Finished => Poll::Ready(None),
            End::Reset => Poll::Ready(Some(Err(StreamReset))),
            End::Open => {
                st.reader = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let st = self.shared.lock();
        st.end == End::Finished && st.buf.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for OutboxBody {
    fn drop(&mut self) {
        self.shared.lock().gone = true;
        self.shared.progress.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    const STALL: Stall = Stall { timeout: Duration::from_secs(2), min_rate: 0 };

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_never_reads_is_stalled_after_the_timeout() {
        let (out, _body) = outbox(8);
        out.push(b"0123456789").unwrap();
        let t0 = tokio::time::Instant::now();
        assert_eq!(out.room(STALL).await, Err(Stop::Stalled));
        assert_eq!(t0.elapsed(), STALL.timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_keeps_reading_is_never_stalled() {
        let (out, mut body) = outbox(4);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(f) = body.frame().await {
                got.extend_from_slice(&f.unwrap().into_data().unwrap());
                tokio::time::sleep(Duration::from_secs(1)).await; // slow, but within the window
            }
            got
        });
        for i in 0..20u8 {
            out.room(STALL).await.unwrap();
            out.push(&[i; 4]).unwrap();
        }
        out.drained(STALL).await.unwrap();
        out.finish();
        let got = reader.await.unwrap();
        assert_eq!(got.len(), 80);
        assert!(got.chunks(4).enumerate().all(|(i, c)| c == [i as u8; 4]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_slower_than_the_minimum_rate_is_stalled() {
        let stall = Stall { timeout: Duration::from_secs(1), min_rate: 1000 };
        let (out, mut body) = outbox(64);
        out.push(&[7; 4096]).unwrap();
        // The reader takes the first 4096 bytes, then nothing more: over the
        // next 1 s window it takes 0 of the 1,000 bytes the rate asks for.
        let _ = body.frame().await;
        out.push(&[7; 4096]).unwrap();
        assert_eq!(out.room(stall).await, Err(Stop::Stalled));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_body_is_gone_for_the_producer() {
        let (out, body) = outbox(4);
        out.push(b"abcdef").unwrap();
        let waiting = tokio::spawn(async move { (out.room(STALL).await, out) });
        tokio::task::yield_now().await;
        drop(body);
        let (r, out) = waiting.await.unwrap();
        assert_eq!(r, Err(Stop::Gone));
        assert_eq!(out.push(b"x"), Err(Stop::Gone));
        out.gone().await;
    }

    #[tokio::test]
    async fn a_large_push_leaves_in_frames_of_at_most_16_kib_in_order() {
        let (out, mut body) = outbox(1024);
        let big: Vec<u8> = (0..40 << 10).map(|i| (i % 251) as u8).collect();
        out.push(&big).unwrap();
        out.finish();
        let mut sizes = Vec::new();
        let mut read = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            sizes.push(data.len());
            read.extend_from_slice(&data);
        }
        assert_eq!(sizes, [MAX_FRAME, MAX_FRAME, (40 << 10) - 2 * MAX_FRAME]);
        assert_eq!(read, big);
        assert_eq!(out.shared.lock().buf.capacity(), 0, "a large push does not pin its allocation");
    }

    #[tokio::test]
    async fn finish_ends_after_the_buffer_and_reset_ends_with_an_error() {
        let (out, body) = outbox(1024);
        out.push(b"data: 1\n\n").unwrap();
        out.finish();
        assert_eq!(body.collect().await.unwrap().to_bytes().as_ref(), b"data: 1\n\n");

        let (out, mut body) = outbox(1024);
        out.push(b"data: 1\n\n").unwrap();
        out.reset();
        assert!(body.frame().await.unwrap().is_err(), "buffered bytes are dropped on reset");

        let (out, mut body) = outbox(1024);
        drop(out);
        assert!(body.frame().await.unwrap().is_err(), "a producer that vanished resets the stream");
    }

    #[tokio::test]
    async fn finishing_before_the_reader_takes_the_last_bytes_ends_the_stream_with_them() {
        let (out, mut body) = outbox(1024);
        out.push(b"data: [DONE]\n\n").unwrap();
        out.finish();
        drop(out); // the relay task ends: a finished stream keeps its bytes
        assert!(!body.is_end_stream(), "bytes are still to be read");
        let last = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(last.as_ref(), b"data: [DONE]\n\n");
        // What hyper asks after taking a frame: this one carries END_STREAM.
        assert!(body.is_end_stream());
        assert!(body.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_stream_whose_reader_stalls_is_still_reset() {
        let (out, mut body) = outbox(8);
        out.push(b"0123456789").unwrap();
        out.finish();
        assert_eq!(out.drained(STALL).await, Err(Stop::Stalled));
        out.reset();
        assert!(body.frame().await.unwrap().is_err(), "the stalled reader gets a reset, not the bytes");
    }
}
