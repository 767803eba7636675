//! Request bodies with deadlines: a body that stalls (no bytes for the
//! body timeout) or arrives slower than the minimum rate (after the first
//! body-timeout's grace, on average) fails with [`TooSlow`], so the
//! handler answers and the connection closes instead of holding a
//! slowloris' partial body for as long as it likes.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// The body did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error(
    "the request body arrived too slowly ({bytes} bytes in {secs:.1} s; a body must keep \
     coming at least every {stall:?} and at {rate} bytes/s on average); send it faster, or \
     raise [server] body_timeout_seconds / lower min_body_bytes_per_second"
)]
pub(crate) struct TooSlow {
    bytes: u64,
    secs: f64,
    stall: Duration,
    rate: u64,
}

/// `inner` with a stall timeout and a minimum average rate.
pub(crate) struct Timed<B> {
    inner: B,
    stall: Duration,
    /// Bytes per second (0: no rate check).
    rate: u64,
    started: Option<Instant>,
    bytes: u64,
    sleep: Pin<Box<Sleep>>,
}

impl<B> Timed<B> {
    pub(crate) fn new(inner: B, stall: Duration, rate: u64) -> Timed<B> {
        Timed {
            inner,
            stall,
            rate,
            started: None,
            bytes: 0,
            sleep: Box::pin(tokio::time::sleep(stall)),
        }
    }

    /// When the body is late: no bytes for `stall`, or fewer than `rate`
    /// per second since the grace (one `stall`) ended.
    fn deadline(&self, last: Instant) -> Instant {
        let stalled = last + self.stall;
        let Some(started) = self.started else {
            return stalled;
        };
        if self.rate == 0 {
            return stalled;
        }
        let owed = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        stalled.min(started + self.stall + owed)
    }

    fn too_slow(&self) -> TooSlow {
        TooSlow {
            bytes: self.bytes,
            secs: self.started.map_or(0.0, |s| s.elapsed().as_secs_f64()),
            stall: self.stall,
            rate: self.rate,
        }
    }
}

impl<B> Body for Timed<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let now = Instant::now();
        if self.started.is_none() {
            self.started = Some(now);
            let at = self.deadline(now);
            self.sleep.as_mut().reset(at);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    self.bytes += d.len() as u64;
                }
                let at = self.deadline(now);
                if at <= now {
                    return Poll::Ready(Some(Err(self.too_slow().into())));
                }
                self.sleep.as_mut().reset(at);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(self.too_slow().into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
