//! How an MCP call's cell runs: straight through the [`KernelManager`]
//! (`cellhost mcp`), or through the daemon's path that also records
//! history and metrics (`/mcp`).

use std::future::Future;
use std::pin::Pin;

use cellhost::registry::{KernelManager, KernelSpec};
use cellhost::{Cell, CellEvent, CellResult, ExecuteRequest};
use tokio::sync::mpsc::UnboundedSender;

/// A cell's result, or a message for the model saying what went wrong.
pub type RunFuture = Pin<Box<dyn Future<Output = Result<CellResult, String>> + Send + 'static>>;

/// Runs the cells of MCP calls.
pub trait CellRunner: Send + Sync + 'static {
    /// The manager the kernels live in (interrupts, resets, listing).
    fn manager(&self) -> &KernelManager;
    /// Run `req`'s cell in `owner`'s kernel, sending its live events to
    /// `events`. The returned future must finish the cell even if it is
    /// dropped early (spawn it), so a cell is never cut halfway by a client.
    fn run(
        &self,
        owner: String,
        req: ExecuteRequest,
        events: Option<UnboundedSender<CellEvent>>,
    ) -> RunFuture;
    /// The MCP client `name` (its `clientInfo`) is about to run a cell as
    /// `owner` (the daemon records it with the cell).
    fn client(&self, _owner: &str, _name: &str) {}
    /// `owner`'s kernels were disposed on request (`reset_session`).
    fn disposed(&self, _owner: &str) {}
}

/// The kernel spec of MCP cells: every tool the manager has, like the
/// daemon's default, so a session's kernel is the same one over HTTP and
/// MCP.
pub(crate) fn default_spec(manager: &KernelManager) -> KernelSpec {
    KernelSpec::default().tools(manager.options().tools.names())
}

impl CellRunner for KernelManager {
    fn manager(&self) -> &KernelManager {
        self
    }

    fn run(
        &self,
        owner: String,
        req: ExecuteRequest,
        events: Option<UnboundedSender<CellEvent>>,
    ) -> RunFuture {
        let mut cell = Cell::from_request(&req);
        if let Some(tx) = events {
            cell = cell.events(tx);
        }
        let manager = self.clone();
        let task = tokio::spawn(async move {
            let spec = default_spec(&manager);
            manager
                .execute_with(&owner, &spec, cell)
                .await
                .map_err(|e| e.to_string())
        });
        Box::pin(async move {
            task.await
                .unwrap_or_else(|e| Err(format!("the cell's task failed: {e}")))
        })
    }
}
