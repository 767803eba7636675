//! `/mcp`: the MCP server over streamable HTTP, behind the same auth and
//! guards as the API. Cells run through the daemon's own path, so they
//! are counted in the metrics, recorded in the history (as the MCP
//! session's) and waited for at shutdown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method};
use axum::response::Response;

use cellhost::registry::KernelManager;
use cellhost::{CellEvent, ExecuteRequest};
use cellhost_mcp::{CellRunner, McpServer, RunFuture};
use tokio::sync::mpsc::UnboundedSender;

use crate::tenant::Caller;
use crate::AppState;

struct DaemonRunner(AppState);

impl CellRunner for DaemonRunner {
    fn manager(&self) -> &KernelManager {
        &self.0.manager
    }

    fn client(&self, owner: &str, name: &str) {
        self.0.clients.set(owner, name);
    }

    fn disposed(&self, owner: &str) {
        crate::execute::forget_previous(&self.0, owner);
    }

    fn run(
        &self,
        owner: String,
        req: ExecuteRequest,
        events: Option<UnboundedSender<CellEvent>>,
    ) -> RunFuture {
        // The same entry as `POST /v1/sessions/{owner}/execute`.
        let result = crate::execute::submit(
            &self.0,
            owner.clone(),
            owner,
            req,
            events,
            cellhost::events::FrontEnd::Mcp,
        );
        Box::pin(async move {
            let result = result.map_err(|e| e.message)?;
            match result.await {
                Ok(Ok(r)) => Ok(r.result),
                Ok(Err(e)) => Err(e.message),
                Err(_) => {
                    Err("the cell's task ended without a result; see the server's log".into())
                }
            }
        })
    }
}

/// Which MCP client (its `clientInfo` name) last ran a cell as each
/// owner: the dashboard names MCP sessions by it. Bounded; an owner
/// forgotten past the bound is shown by its id alone.
#[derive(Default, Clone)]
pub(crate) struct Clients(Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>);

/// Most owners [`Clients`] remembers.
const CLIENTS_MAX: usize = 4096;

impl Clients {
    pub(crate) fn set(&self, owner: &str, name: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if m.get(owner).is_some_and(|n| n == name) {
            return;
        }
        if m.len() >= CLIENTS_MAX && !m.contains_key(owner) {
            if let Some(k) = m.keys().next().cloned() {
                m.remove(&k);
            }
        }
        let name: String = name.chars().take(128).collect();
        m.insert(owner.to_owned(), name);
    }

    pub(crate) fn get(&self, owner: &str) -> Option<String> {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.get(owner).cloned()
    }
}

/// The `/mcp` service for this daemon.
pub(crate) fn service(state: &AppState) -> Bound {
    let server = McpServer::new(Arc::new(DaemonRunner(state.clone())));
    Bound {
        inner: cellhost_mcp::http_service(
            server,
            state.mcp_stop.clone(),
            state.options.mcp_idle_session,
        ),
        owners: Arc::default(),
    }
}

const SESSION_HEADER: &str = "mcp-session-id";

/// Binds each MCP session to the caller that opened it: a request
/// naming another caller's `Mcp-Session-Id` is passed on with an id
/// nobody has, so it gets rmcp's own answer for an unknown session (404),
/// exactly as for an id that does not exist. (Its kernels are namespaced
/// anyway; this keeps a tenant from using or closing another's session.)
#[derive(Clone)]
pub(crate) struct Bound {
    inner: cellhost_mcp::HttpService,
    owners: Arc<Mutex<HashMap<String, Caller>>>,
}

impl Bound {
    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, Caller>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl tower::Service<Request> for Bound {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = futures_util::future::BoxFuture<'static, Result<Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let caller = req
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or_default();
        let id = req
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if let Some(id) = &id {
            let owner = self.owners().get(id).cloned();
            if owner.is_some_and(|o| o != caller) {
                let nobody = format!("not-yours-{}", crate::jupyter::new_uuid());
                if let Ok(v) = HeaderValue::from_str(&nobody) {
                    req.headers_mut().insert(SESSION_HEADER, v);
                }
            }
        }
        let delete = req.method() == Method::DELETE;
        let mut inner = self.inner.clone();
        let this = self.clone();
        Box::pin(async move {
            let resp = inner.call(req).await?;
            let ok = resp.status().is_success();
            let new = resp
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let mut owners = this.owners();
            match (&id, new) {
                (Some(id), _) if delete && ok => {
                    owners.remove(id);
                }
                (None, Some(new)) if ok => {
                    // Sessions the idle close ended are gone from rmcp;
                    // keep the table bounded all the same.
                    if owners.len() >= 100_000 {
                        owners.clear();
                    }
                    owners.insert(new, caller);
                }
                _ => {}
            }
            drop(owners);
            Ok(resp.map(Body::new))
        })
    }
}
