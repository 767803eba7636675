//! `/mcp`: the MCP server over streamable HTTP, behind the same auth and
//! guards as the API. Cells run through the daemon's own path, so they
//! are counted in the metrics, recorded in the history (as the MCP
//! session's) and waited for at shutdown.

use std::sync::Arc;

use cellhost::registry::KernelManager;
use cellhost::Cell;
use cellhost_mcp::{CellRunner, McpServer, RunFuture};

use crate::execute::{spawn_cell, ExecuteRequest};
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

    fn run(&self, owner: String, code: String, cell: Cell) -> RunFuture {
        let req = ExecuteRequest {
            code,
            timeout: None,
            reset: false,
            child: None,
            tools: None,
            max_tool_calls: None,
            backend: None,
            client: self.0.clients.get(&owner),
        };
        let cell = cell.front_end(cellhost::events::FrontEnd::Mcp);
        let result = spawn_cell(&self.0, owner.clone(), owner, req, cell);
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
pub(crate) fn service(state: &AppState) -> cellhost_mcp::HttpService {
    let server = McpServer::new(Arc::new(DaemonRunner(state.clone())));
    cellhost_mcp::http_service(
        server,
        state.mcp_stop.clone(),
        state.options.mcp_idle_session,
    )
}
