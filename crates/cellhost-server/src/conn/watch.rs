//! What one connection is doing, for its deadlines.
//!
//! A connection is `Waiting` (between requests, nothing read yet), in a
//! `Head` (bytes of a request arrived, its headers are not complete) or
//! `Busy` (requests dispatched whose responses are not finished). The
//! socket wrapper [`Watched`] reports reads and blocked writes, the
//! service wrapper reports requests starting and [`Tracked`] response
//! bodies ending. The connection task asks [`Watch::expired`] when its
//! timer fires:
//!
//! - a new connection must send its first request's headers within the
//!   header timeout, and so must a request once its first byte arrived;
//! - a kept-alive connection may wait for its next request for the idle
//!   timeout;
//! - a response the client does not read for the idle timeout (its
//!   writes blocked all along) ends the connection.
//!
//! A busy request's body has its own deadlines ([`super::body`]).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Why a connection was ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    Header,
    Idle,
    Write,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Waiting { since: Instant },
    Head { since: Instant },
    Busy { requests: usize },
}

#[derive(Debug)]
struct State {
    phase: Phase,
    /// Since when every write attempt has been blocked (`None`: the last
    /// write went through, or there was none).
    write_blocked: Option<Instant>,
}

/// One connection's phase, shared by its socket, service and task.
#[derive(Debug)]
pub(crate) struct Watch {
    state: Mutex<State>,
    header: Duration,
    idle: Duration,
}

impl Watch {
    /// A connection accepted now: its first headers are due within `header`.
    pub(crate) fn new(header: Duration, idle: Duration) -> Arc<Watch> {
        Arc::new(Watch {
            state: Mutex::new(State {
                phase: Phase::Head {
                    since: Instant::now(),
                },
                write_blocked: None,
            }),
            header,
            idle,
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn read(&self) {
        self.with(|s| {
            if let Phase::Waiting { .. } = s.phase {
                s.phase = Phase::Head {
                    since: Instant::now(),
                };
            }
        });
    }

    fn wrote(&self, blocked: bool) {
        self.with(|s| match (blocked, s.write_blocked) {
            (true, None) => s.write_blocked = Some(Instant::now()),
            (false, Some(_)) => s.write_blocked = None,
            _ => {}
        });
    }

    /// A request's headers are in and it is dispatched.
    pub(crate) fn request_started(&self) {
        self.with(|s| {
            s.phase = match s.phase {
                Phase::Busy { requests } => Phase::Busy {
                    requests: requests + 1,
                },
                _ => Phase::Busy { requests: 1 },
            }
        });
    }

    /// A response (its body) is finished or dropped.
    pub(crate) fn request_done(&self) {
        self.with(|s| {
            if let Phase::Busy { requests } = s.phase {
                s.phase = if requests > 1 {
                    Phase::Busy {
                        requests: requests - 1,
                    }
                } else {
                    Phase::Waiting {
                        since: Instant::now(),
                    }
                };
            }
        });
    }

    /// The earliest moment a deadline could pass (`None`: none runs now;
    /// look again later) and whether one has passed already.
    pub(crate) fn expired(&self, now: Instant) -> Result<Option<Instant>, Expiry> {
        self.with(|s| {
            let phase = match s.phase {
                Phase::Waiting { since } => Some((since + self.idle, Expiry::Idle)),
                Phase::Head { since } => Some((since + self.header, Expiry::Header)),
                Phase::Busy { .. } => None,
            };
            let write = s.write_blocked.map(|t| (t + self.idle, Expiry::Write));
            let mut next = None;
            for (at, why) in [phase, write].into_iter().flatten() {
                if at <= now {
                    return Err(why);
                }
                next = Some(next.map_or(at, |n: Instant| n.min(at)));
            }
            Ok(next)
        })
    }
}

/// A socket that tells its [`Watch`] about reads and blocked writes.
pub(crate) struct Watched<T> {
    io: T,
    watch: Arc<Watch>,
}

impl<T> Watched<T> {
    pub(crate) fn new(io: T, watch: Arc<Watch>) -> Watched<T> {
        Watched { io, watch }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.watch.read();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch.wrote(r.is_pending());
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch.wrote(r.is_pending());
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.watch.wrote(r.is_pending());
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A response body that tells its [`Watch`] when it is finished (dropped).
pub(crate) struct Tracked<B> {
    body: B,
    watch: Arc<Watch>,
}

impl<B> Tracked<B> {
    pub(crate) fn new(body: B, watch: Arc<Watch>) -> Tracked<B> {
        Tracked { body, watch }
    }
}

impl<B> Drop for Tracked<B> {
    fn drop(&mut self) {
        self.watch.request_done();
    }
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_follow_the_phase() {
        let s = Duration::from_secs;
        let t0 = Instant::now();
        let w = Watch::new(s(2), s(10));
        let due = w.expired(t0).unwrap().unwrap();
        assert!(due >= t0 + s(2) && due < t0 + s(3));
        assert_eq!(w.expired(t0 + s(3)), Err(Expiry::Header));
        w.request_started();
        assert_eq!(w.expired(t0 + s(60)), Ok(None));
        w.request_done();
        let due = w.expired(t0 + s(9)).unwrap().unwrap();
        assert!(due >= t0 + s(10) && due < t0 + s(11));
        assert_eq!(w.expired(t0 + s(11)), Err(Expiry::Idle));
        w.read();
        assert_eq!(w.expired(t0 + s(3)), Err(Expiry::Header));
        w.request_started();
        w.wrote(true);
        assert_eq!(w.expired(t0 + s(11)), Err(Expiry::Write));
        w.wrote(false);
        assert_eq!(w.expired(t0 + s(11)), Ok(None));
    }
}
