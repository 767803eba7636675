//! Binding and graceful shutdown.
//!
//! On the shutdown signal the daemon stops accepting connections, lets
//! running cells finish for up to the grace period, kills every kernel
//! (a cell still running then ends with `state_lost` and its caller gets
//! that result), waits for those cells to be recorded, gives responses a
//! moment to go out, and flushes the history. Connections are served by
//! `conn` (caps and timeouts).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

use crate::AppState;

/// How long responses get to go out after the kernels are gone.
const DRAIN: Duration = Duration::from_secs(5);

/// The daemon runtime's worker threads: `TOKIO_WORKER_THREADS` when set,
/// else one fewer than the cores (at least one). The kernels are processes
/// of their own that need cores too: on a 2-core machine a second worker
/// mostly woke up to steal a task from the first, and one worker gave both
/// a lower HTTP − library and more cells/s under 32-way load
/// (docs/benchmarks.md, "HTTP figures").
pub fn worker_threads() -> usize {
    if let Some(n) = std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n;
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get().saturating_sub(1))
        .max(1)
}

/// Why the daemon cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A non-loopback address and no token.
    #[error("refusing to listen on {addr} without a token: anyone who can reach it could run code as you; set CELLHOST_TOKEN (or [server] token), or listen on 127.0.0.1")]
    NeedToken {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The address could not be bound.
    #[error("failed to listen on {addr} (pick another address with --listen)")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding failed (in use, not permitted, not local).
        #[source]
        source: std::io::Error,
    },
}

/// A bound listener, checked against the token rule.
#[derive(Debug)]
pub struct Listening {
    /// The bound socket.
    pub listener: TcpListener,
    /// The address it is bound to (the real port when 0 was asked for).
    pub addr: SocketAddr,
}

impl Listening {
    /// Bind `addr`; a non-loopback address needs a token.
    ///
    /// # Errors
    /// [`ServeError`] when the rule forbids it or the bind fails.
    pub async fn bind(addr: SocketAddr, has_token: bool) -> Result<Listening, ServeError> {
        if !addr.ip().is_loopback() && !has_token {
            return Err(ServeError::NeedToken { addr });
        }
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind { addr, source })?;
        let addr = listener.local_addr().unwrap_or(addr);
        Ok(Listening { listener, addr })
    }
}

/// Serve until `shutdown` resolves, then shut down gracefully.
pub async fn serve(listening: Listening, state: AppState, shutdown: impl Future<Output = ()>) {
    let app = crate::router(state.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let limits = state.options.limits.clone().fit_open_files();
    let conns = state.conns.clone();
    let server = tokio::spawn(crate::conn::run(
        listening.listener,
        app,
        limits,
        conns,
        async {
            let _ = stopped.await;
        },
    ));
    shutdown.await;
    let _ = stop.send(());
    let deadline = Instant::now() + state.options.shutdown_grace;
    while state.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // MCP sessions hold streams open: end them so connections can close
    // (after the grace: ending a session cancels its calls, which would
    // interrupt their cells).
    state.mcp_stop.cancel();
    let left = state.in_flight.load(Ordering::SeqCst);
    if left > 0 {
        eprintln!("cellhost: {left} cell(s) still running after the shutdown grace; killing their kernels");
    }
    state.manager.shutdown().await;
    // The killed cells' tasks still record their results: wait for them
    // (bounded) before the history closes.
    let deadline = Instant::now() + state.options.shutdown_grace.max(DRAIN);
    while state.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = tokio::time::timeout(DRAIN, server).await;
    if let Some(h) = state.history.clone() {
        let _ = tokio::task::spawn_blocking(move || h.close()).await;
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
