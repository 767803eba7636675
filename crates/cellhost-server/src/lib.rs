//! The cellhost daemon: an HTTP/JSON API over a [`KernelManager`], with
//! cell history, Prometheus metrics, an OpenAPI document and a dashboard.
//!
//! [`router`] builds the axum app (tests drive it with `oneshot`);
//! [`serve`] binds it, runs until SIGTERM/SIGINT and shuts down gracefully.
//!
//! Modules: `api` (the `/v1` handlers), `execute` (the execute request, the
//! cell it becomes, SSE), `error` (one JSON error shape), `auth` (Bearer
//! token), `guard` (Host, Origin and Content-Type checks), `metrics`,
//! `openapi`, `dashboard` (embedded assets), `mcp` (MCP over streamable
//! HTTP at `/mcp`), `jupyter` (the Jupyter Kernel Gateway protocol under
//! `/api`), `files` (the workspace routes), `events` (the live
//! session event stream), `serve` (binding and
//! shutdown), `conn` (the accept loop: connection caps and timeouts),
//! `queue` (bounds on cells in flight), `tenant` (the caller's session
//! namespace and limits, used by every route).

#![warn(missing_docs, unreachable_pub)]

mod api;
mod auth;
mod conn;
mod dashboard;
mod error;
mod events;
mod execute;
mod files;
mod guard;
mod jupyter;
mod mcp;
mod metrics;
mod openapi;
mod queue;
mod serve;
mod tenant;
pub mod webhook;

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post};
use axum::Router;
use cellhost::history::History;
use cellhost::registry::KernelManager;

pub use cellhost_protocol::ExecuteRequest;
pub use conn::HttpLimits;
pub use error::ApiError;
pub use serve::{serve, shutdown_signal, worker_threads, Listening, ServeError};

/// How the daemon runs (everything but the manager and the history).
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Bearer token every route but `/healthz` requires; `None`: no auth.
    pub token: Option<String>,
    /// Largest request body in bytes (default 10 MiB).
    pub max_body_bytes: usize,
    /// How long running cells may take to finish at shutdown.
    pub shutdown_grace: Duration,
    /// Host names (or `name:port`) a browser may reach a tokenless daemon
    /// by besides loopback and the bound address (`[server] allowed_hosts`).
    pub allowed_hosts: Vec<String>,
    /// The address the daemon is bound to (its IP is an allowed Host).
    pub bound: Option<SocketAddr>,
    /// Connection caps and timeouts, bounds on queued cells.
    pub limits: HttpLimits,
    /// Largest file upload in bytes (`[files] max_upload_mib`, default
    /// 1 GiB); `None`: only the workspace quota bounds it.
    pub max_upload_bytes: Option<u64>,
    /// An MCP session with no request and no running cell this long is
    /// closed (`[mcp] idle_session_seconds`; `None`: never).
    pub mcp_idle_session: Option<Duration>,
    /// `[[tenants]]`: tokens with their own session namespace and limits
    /// (`token` is then the admin's, who sees every tenant).
    pub tenants: cellhost::tenant::Tenants,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            token: None,
            max_body_bytes: 10 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(30),
            allowed_hosts: Vec::new(),
            bound: None,
            limits: HttpLimits::default(),
            max_upload_bytes: cellhost::config::FilesConfig::default().max_upload_bytes(),
            mcp_idle_session: Some(Duration::from_secs(600)),
            tenants: cellhost::tenant::Tenants::default(),
        }
    }
}

/// What every handler shares: one `Arc`, so the clone every request's
/// extractors and cell task take is one reference count, not one per
/// field (and a cancellation token's lock).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The fields of [`AppState`].
pub struct Shared {
    /// The kernels of every session.
    pub manager: KernelManager,
    /// `None` when history is off.
    pub history: Option<Arc<History>>,
    /// The daemon's settings (limits, token, tenants).
    pub options: Arc<ServerOptions>,
    pub(crate) metrics: Arc<metrics::Metrics>,
    /// Cells running now (graceful shutdown waits for them).
    pub(crate) in_flight: Arc<AtomicUsize>,
    /// Ends every `/mcp` session at shutdown.
    pub(crate) mcp_stop: cellhost_mcp::CancellationToken,
    /// Owners with cells in the history from an earlier daemon process and
    /// none yet under this one: their first cell here says their state
    /// was lost (the old daemon's kernels are gone, crashed or stopped).
    pub(crate) previous: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// Cells in flight per session (429 past the bounds).
    pub(crate) queue: queue::Queue,
    /// Connection counters (`/metrics`).
    pub(crate) conns: Arc<conn::ConnStats>,
    /// Tenants' limits on admitted cells (429 past them).
    pub(crate) gate: tenant::Gate,
    /// The MCP client behind each MCP owner (the dashboard's names).
    pub(crate) clients: mcp::Clients,
}

impl AppState {
    /// The state of a daemon serving `manager`'s kernels, recording cells
    /// in `history` when it is on.
    pub fn new(
        manager: KernelManager,
        history: Option<Arc<History>>,
        options: ServerOptions,
    ) -> AppState {
        let previous = history
            .as_deref()
            .map(execute::previous_owners)
            .unwrap_or_default();
        AppState(Arc::new(Shared {
            manager,
            history,
            options: Arc::new(options),
            metrics: Arc::default(),
            in_flight: Arc::default(),
            mcp_stop: cellhost_mcp::CancellationToken::new(),
            previous: Arc::new(std::sync::Mutex::new(previous)),
            queue: queue::Queue::default(),
            conns: Arc::default(),
            gate: tenant::Gate::default(),
            clients: mcp::Clients::default(),
        }))
    }
}

/// The workspace file routes (`files.rs`). Their bodies stream: the `/v1`
/// body limit is replaced by `[files] max_upload_mib`, checked as bytes
/// arrive.
fn file_routes() -> Router<AppState> {
    use axum::routing::get as read;
    let file = || read(files::get).put(files::put).delete(files::delete);
    let mut r = Router::new();
    for base in [
        "/v1/sessions/{session}/files",
        "/v1/sessions/{session}/children/{child}/files",
    ] {
        r = r
            .route(base, read(files::get))
            .route(&format!("{base}/"), read(files::get))
            .route(&format!("{base}/{{*path}}"), file());
    }
    r.layer(DefaultBodyLimit::disable())
}

/// The whole app: `/v1` API, MCP at `/mcp`, `/healthz`, `/metrics`,
/// `/openapi.json` and the dashboard at `/`.
pub fn router(state: AppState) -> Router {
    let limit = state.options.max_body_bytes;
    Router::new()
        .merge(file_routes())
        .route("/v1/sessions/{session}/execute", post(api::execute))
        .route("/v1/sessions/{session}/interrupt", post(api::interrupt))
        .route(
            "/v1/sessions/{session}/snapshot",
            post(api::snapshot_session),
        )
        .route("/v1/sessions/{session}/fork", post(api::fork_session))
        .route(
            "/v1/sessions/{session}/children/{child}/fork",
            post(api::fork_child),
        )
        .route("/v1/sessions/{session}", delete(api::dispose_session))
        .route(
            "/v1/sessions/{session}/children/{child}",
            delete(api::dispose_child),
        )
        .route("/v1/sessions/{session}/history", get(api::session_history))
        .route("/v1/sessions/{session}/events", get(events::session))
        .route(
            "/v1/sessions/{session}/children/{child}/events",
            get(events::child),
        )
        .route("/v1/history", get(api::recent_history))
        .route("/v1/kernels", get(api::kernels))
        .route("/v1/environment", get(api::environment))
        .route("/healthz", get(api::healthz))
        .route("/metrics", get(metrics::render))
        .route("/openapi.json", get(openapi::document))
        .route("/", get(dashboard::index))
        .route("/assets/{file}", get(dashboard::asset))
        .route_service("/mcp", mcp::service(&state))
        .merge(jupyter::routes(&state))
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(axum::middleware::from_fn(guard::require_json))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::check_origin,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn(dashboard::no_framing))
        .with_state(state)
}
