//! MCP session hygiene over streamable HTTP: the [`HttpService`] wraps
//! rmcp's service to
//!
//! - answer a successful `DELETE /mcp` with 200 instead of rmcp's 202
//!   (the official SDKs accept only 200 and 204 and warn otherwise), and
//! - close a session that sent no request and ran no cell for the idle
//!   period: closing it drops its handler, which disposes the session's
//!   implicit kernel (see `server`). A session whose cell still runs is
//!   never closed, however long the cell is quiet.
//!
//! [`Activity`] is when each session was last heard from and how many of
//! its calls are running; the sweeper reads it.

use std::collections::HashMap;
use std::fmt::Display;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use cellhost::registry::KernelManager;
use cellhost::KernelState;
use futures_util::future::BoxFuture;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::StreamableHttpService;
use tokio_util::sync::CancellationToken;

use crate::server::McpServer;

const SESSION_HEADER: &str = "mcp-session-id";

/// Last request and running calls of each live MCP session.
#[derive(Default)]
pub(crate) struct Activity {
    sessions: Mutex<HashMap<String, Entry>>,
}

struct Entry {
    last: Instant,
    running: usize,
}

impl Activity {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A session rmcp just created (its id came back in a response).
    fn created(&self, id: &str) {
        self.lock().entry(id.to_owned()).or_insert(Entry {
            last: Instant::now(),
            running: 0,
        });
    }

    /// A request for `id`; ids that are no live session are ignored, so a
    /// client cannot grow the table with made-up ids.
    fn touch(&self, id: &str) {
        if let Some(e) = self.lock().get_mut(id) {
            e.last = Instant::now();
        }
    }

    fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    /// A call of session `id` runs until the guard drops.
    pub(crate) fn running(self: &Arc<Self>, id: &str) -> Running {
        if let Some(e) = self.lock().get_mut(id) {
            e.running += 1;
            e.last = Instant::now();
        }
        Running {
            activity: self.clone(),
            id: id.to_owned(),
        }
    }

    /// Sessions silent for `idle` with no running call.
    fn idle(&self, idle: Duration) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, e)| e.running == 0 && e.last.elapsed() >= idle)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// A running call (see [`Activity::running`]).
pub(crate) struct Running {
    activity: Arc<Activity>,
    id: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(e) = self.activity.lock().get_mut(&self.id) {
            e.running = e.running.saturating_sub(1);
            e.last = Instant::now();
        }
    }
}

type Inner = StreamableHttpService<McpServer, LocalSessionManager>;

/// The tower service that serves MCP over streamable HTTP (`/mcp`).
#[derive(Clone)]
pub struct HttpService {
    inner: Inner,
    activity: Arc<Activity>,
    /// Sessions are tracked only when idle ones are closed.
    track: bool,
}

impl HttpService {
    pub(crate) fn new(
        inner: Inner,
        activity: Arc<Activity>,
        sessions: &Arc<LocalSessionManager>,
        manager: KernelManager,
        idle: Option<Duration>,
        cancel: CancellationToken,
    ) -> HttpService {
        if let (Some(idle), Ok(rt)) = (idle, tokio::runtime::Handle::try_current()) {
            rt.spawn(sweep(
                Arc::downgrade(sessions),
                activity.clone(),
                manager,
                idle,
                cancel,
            ));
        }
        HttpService {
            inner,
            activity,
            track: idle.is_some(),
        }
    }
}

impl<B> tower_service::Service<http::Request<B>> for HttpService
where
    B: http_body::Body + Send + 'static,
    B::Error: Display,
    B::Data: Send + 'static,
{
    type Response = <Inner as tower_service::Service<http::Request<B>>>::Response;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let id = header(req.headers());
        let delete = req.method() == http::Method::DELETE;
        if let Some(id) = &id {
            self.activity.touch(id);
        }
        let mut inner = self.inner.clone();
        let activity = self.activity.clone();
        let track = self.track;
        Box::pin(async move {
            let mut resp = inner.call(req).await?;
            let ok = resp.status().is_success();
            if delete && ok {
                if resp.status() == http::StatusCode::ACCEPTED {
                    *resp.status_mut() = http::StatusCode::OK;
                }
                if let Some(id) = &id {
                    activity.forget(id);
                }
            } else if ok && track {
                if let Some(new) = header(resp.headers()).filter(|n| id.as_ref() != Some(n)) {
                    activity.created(&new);
                }
            }
            Ok(resp)
        })
    }
}

fn header(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Close idle sessions until `cancel` or the service is gone.
async fn sweep(
    sessions: Weak<LocalSessionManager>,
    activity: Arc<Activity>,
    manager: KernelManager,
    idle: Duration,
    cancel: CancellationToken,
) {
    let tick = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(tick) => {}
        }
        let Some(sessions) = sessions.upgrade() else {
            return;
        };
        let candidates = activity.idle(idle);
        if candidates.is_empty() {
            continue;
        }
        // A cell of the session's own kernel that outlived its call (the
        // client hung up mid-cell) still counts as running.
        let busy: Vec<String> = manager
            .list()
            .into_iter()
            .filter(|k| k.state != KernelState::Idle)
            // A tenant's implicit owner is `tenant:{session id}`.
            .filter_map(|k| {
                k.owner
                    .rsplit(cellhost::tenant::SEPARATOR)
                    .next()
                    .map(str::to_owned)
            })
            .collect();
        for id in candidates {
            if busy.contains(&id) {
                continue;
            }
            activity.forget(&id);
            if let Err(e) = sessions.close_session(&id.as_str().into()).await {
                eprintln!("cellhost: could not close idle MCP session {id}: {e}");
            }
        }
    }
}
