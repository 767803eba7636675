//! The accept loop and what guards each connection (none of these
//! connections has reached the auth check yet, so a token does not help):
//!
//! - caps on open connections, in total and per peer address: past a cap
//!   a new connection gets a one-shot `503` and is closed at once, while
//!   connections already open keep being served;
//! - a header timeout (a new connection's first request, and any request
//!   once its first byte arrived), a keep-alive idle timeout, and an end
//!   to responses the client does not read ([`watch`]);
//! - a stall timeout and a minimum average rate on request bodies
//!   ([`body`]).
//!
//! Graceful shutdown is axum's: on the stop signal no connection is
//! accepted any more, each open one finishes its in-flight requests and
//! closes (an idle one at once), and [`run`] returns when all are closed.

mod body;
mod watch;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch as signal;
use tower::ServiceExt;

use watch::{Expiry, Tracked, Watch, Watched};

/// The HTTP guards (`[server]` keys).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpLimits {
    /// A request's headers must be complete this long after its first
    /// byte (a new connection's, after it was accepted).
    pub header_timeout: Duration,
    /// A kept-alive connection may wait this long for its next request;
    /// a response its client reads nothing of for this long is dropped.
    pub idle_timeout: Duration,
    /// A request body may pause this long; after this long it must also
    /// have come at `min_body_bytes_per_second` on average.
    pub body_timeout: Duration,
    /// 0: no rate check.
    pub min_body_bytes_per_second: u64,
    /// Open connections at once; past it new ones are refused.
    pub max_connections: usize,
    /// Open connections from one peer address at once.
    pub max_connections_per_peer: usize,
    /// Cells of one session waiting behind its running cell.
    pub max_queued_cells_per_session: usize,
    /// Bytes of code of one session's cells in flight.
    pub max_queued_bytes_per_session: usize,
    /// Bytes of code of every cell in flight.
    pub max_queued_bytes: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits::from_config(&cellhost::config::ServerConfig::default())
    }
}

impl HttpLimits {
    /// The limits a `[server]` section sets (timeouts in seconds become
    /// `Duration`s).
    pub fn from_config(c: &cellhost::config::ServerConfig) -> HttpLimits {
        HttpLimits {
            header_timeout: Duration::from_secs(c.header_timeout_seconds),
            idle_timeout: Duration::from_secs(c.idle_timeout_seconds),
            body_timeout: Duration::from_secs(c.body_timeout_seconds),
            min_body_bytes_per_second: c.min_body_bytes_per_second,
            max_connections: c.max_connections,
            max_connections_per_peer: c.max_connections_per_peer,
            max_queued_cells_per_session: c.max_queued_cells_per_session,
            max_queued_bytes_per_session: c.max_queued_bytes_per_session,
            max_queued_bytes: c.max_queued_bytes,
        }
    }

    /// The connection cap this process can honour: at most half its
    /// open-file limit (kernels, the history and the log need the rest),
    /// with a warning when that lowers the configured cap.
    pub fn fit_open_files(mut self) -> HttpLimits {
        let mut lim = libc::rlimit {
            rlim_cur: libc::RLIM_INFINITY,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: getrlimit only writes the struct it is given.
        let soft = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } {
            0 => lim.rlim_cur,
            _ => libc::RLIM_INFINITY,
        };
        let fit = usize::try_from(soft / 2).unwrap_or(usize::MAX).max(16);
        if self.max_connections > fit {
            eprintln!(
                "cellhost: [server] max_connections lowered from {} to {fit}: the open-file \
                 limit is {soft} (raise it with `ulimit -n` to allow more connections)",
                self.max_connections
            );
            self.max_connections = fit;
        }
        self.max_connections_per_peer = self.max_connections_per_peer.min(self.max_connections);
        self
    }
}

/// Connection counters for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct ConnStats {
    pub(crate) open: AtomicU64,
    pub(crate) accepted: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) header_timeouts: AtomicU64,
    pub(crate) idle_timeouts: AtomicU64,
    pub(crate) write_timeouts: AtomicU64,
}

/// Open connections, in total and per peer.
#[derive(Debug, Default)]
struct Open {
    total: usize,
    peers: HashMap<IpAddr, usize>,
}

/// One open connection's place under the caps, given back on drop.
struct Slot {
    open: Arc<Mutex<Open>>,
    stats: Arc<ConnStats>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut o = self.open.lock().unwrap_or_else(|e| e.into_inner());
        o.total -= 1;
        if let Some(n) = o.peers.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                o.peers.remove(&self.peer);
            }
        }
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

fn admit(
    open: &Arc<Mutex<Open>>,
    stats: &Arc<ConnStats>,
    limits: &HttpLimits,
    peer: IpAddr,
) -> Option<Slot> {
    let mut o = open.lock().unwrap_or_else(|e| e.into_inner());
    let mine = o.peers.get(&peer).copied().unwrap_or(0);
    if o.total >= limits.max_connections || mine >= limits.max_connections_per_peer {
        return None;
    }
    o.total += 1;
    *o.peers.entry(peer).or_insert(0) += 1;
    stats.open.fetch_add(1, Ordering::Relaxed);
    Some(Slot {
        open: open.clone(),
        stats: stats.clone(),
        peer,
    })
}

/// The answer to a connection past a cap (written once, never waited on).
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
Retry-After: 1\r\nConnection: close\r\nContent-Length: 159\r\n\r\n\
{\"error\":{\"code\":\"too_many_connections\",\"message\":\"the server has too many open \
connections; close idle ones, retry later, or raise [server] max_connections\"}}";

/// Accept connections and serve `app` on them until `stop` resolves,
/// then shut down gracefully (returns once every connection is closed).
pub(crate) async fn run(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    stats: Arc<ConnStats>,
    stop: impl Future<Output = ()>,
) {
    let open = Arc::new(Mutex::new(Open::default()));
    // Dropped at stop: every connection task sees it and shuts down.
    let (signal_tx, signal_rx) = signal::channel(());
    // Held by every connection task: closed when the last one ends.
    let (close_tx, close_rx) = signal::channel(());
    let mut stop = std::pin::pin!(stop);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let peer_ip = peer.ip().to_canonical();
        let Some(slot) = admit(&open, &stats, &limits, peer_ip) else {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            let _ = tcp.try_write(BUSY);
            drop(tcp);
            continue;
        };
        // Replies are small: send them at once rather than wait on Nagle.
        let _ = tcp.set_nodelay(true);
        tokio::spawn(connection(
            tcp,
            peer,
            app.clone(),
            limits.clone(),
            stats.clone(),
            slot,
            signal_tx.subscribe(),
            close_rx.clone(),
        ));
    }
    drop(signal_rx);
    drop(signal_tx);
    drop(close_rx);
    drop(listener);
    close_tx.closed().await;
}

/// Like axum's: a per-connection error (reset before accept) is nothing;
/// anything else (EMFILE) waits a moment so the loop does not spin.
async fn accept_error(e: std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    eprintln!("cellhost: accepting a connection failed: {e}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[allow(clippy::too_many_arguments)]
async fn connection(
    tcp: TcpStream,
    _peer: SocketAddr,
    app: Router,
    limits: HttpLimits,
    stats: Arc<ConnStats>,
    _slot: Slot,
    mut shutdown: signal::Receiver<()>,
    _close: signal::Receiver<()>,
) {
    let watch = Watch::new(limits.header_timeout, limits.idle_timeout);
    let io = TokioIo::new(Watched::new(tcp, watch.clone()));
    let w = watch.clone();
    let (stall, rate) = (limits.body_timeout, limits.min_body_bytes_per_second);
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        w.request_started();
        let req = req.map(|b| Body::new(body::Timed::new(b, stall, rate)));
        let w = w.clone();
        let app = app.clone();
        async move {
            let resp = app
                .oneshot(req)
                .await
                .unwrap_or_else(|e: Infallible| match e {});
            Ok::<_, Infallible>(resp.map(|b| Tracked::new(b, w)))
        }
    });
    let mut builder = http1::Builder::new();
    // Our own watch does the header timeout (and the idle one hyper lacks).
    builder.timer(TokioTimer::new()).header_read_timeout(None);
    // Upgrades: the Jupyter kernel WebSocket (after the upgrade the socket
    // belongs to the WebSocket task, outside these timeouts and caps).
    let conn = builder.serve_connection(io, service).with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let mut shutting_down = false;
    loop {
        let next = match watch.expired(tokio::time::Instant::now()) {
            Ok(at) => at.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(1)),
            Err(why) => {
                let counter = match why {
                    Expiry::Header => &stats.header_timeouts,
                    Expiry::Idle => &stats.idle_timeouts,
                    Expiry::Write => &stats.write_timeouts,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                // Dropping the connection closes the socket; a cell it
                // asked for runs on in its own task.
                return;
            }
        };
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = tokio::time::sleep_until(next) => {}
            changed = shutdown.changed(), if !shutting_down => {
                let _ = changed;
                shutting_down = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_answer_has_the_length_it_says() {
        let text = std::str::from_utf8(BUSY).unwrap();
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            text.contains(&format!("Content-Length: {}\r\n", body.len())),
            "{}",
            body.len()
        );
        serde_json::from_str::<serde_json::Value>(body).unwrap();
    }

    #[test]
    fn caps_count_in_total_and_per_peer() {
        let open = Arc::new(Mutex::new(Open::default()));
        let stats = Arc::new(ConnStats::default());
        let limits = HttpLimits {
            max_connections: 3,
            max_connections_per_peer: 2,
            ..HttpLimits::default()
        };
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = admit(&open, &stats, &limits, a).unwrap();
        let _a2 = admit(&open, &stats, &limits, a).unwrap();
        assert!(admit(&open, &stats, &limits, a).is_none());
        let _b1 = admit(&open, &stats, &limits, b).unwrap();
        assert!(admit(&open, &stats, &limits, b).is_none());
        drop(a1);
        let _b2 = admit(&open, &stats, &limits, b).unwrap();
        assert_eq!(stats.open.load(Ordering::Relaxed), 3);
    }
}
