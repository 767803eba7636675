//! `/mcp`: the MCP server over streamable HTTP, behind the same auth and
//! guards as the API. Cells run through the daemon's own path, so they
//! are counted in the metrics, recorded in the history (as the MCP
//! session's) and waited for at shutdown.

use std::sync::Arc;

use cellhost::registry::KernelManager;
use cellhost::{CellEvent, ExecuteRequest};
use cellhost_mcp::{CellRunner, McpServer, RunFuture};
use tokio::sync::mpsc::UnboundedSender;

use crate::AppState;

struct DaemonRunner(AppState);

impl CellRunner for DaemonRunner {
    fn manager(&self) -> &KernelManager {
        &self.0.manager
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
        let result = crate::execute::submit(&self.0, owner.clone(), owner, req, events);
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

/// The `/mcp` service for this daemon.
pub(crate) fn service(state: &AppState) -> cellhost_mcp::HttpService {
    let server = McpServer::new(Arc::new(DaemonRunner(state.clone())));
    cellhost_mcp::http_service(
        server,
        state.mcp_stop.clone(),
        state.options.mcp_idle_session,
    )
}
