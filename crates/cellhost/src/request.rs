//! The [`Cell`] a front end's [`ExecuteRequest`] asks for: one mapping for
//! HTTP, MCP and the Jupyter gateway.

use cellhost_protocol::ExecuteRequest;

use crate::Cell;

impl Cell {
    /// The cell `req` asks for: its code, reset, timeout and tool-call
    /// budget. Its tools come from the kernel key (the request's `tools`
    /// pick the kernel), so they are not set here; nor are events.
    ///
    /// A timeout [`ExecuteRequest::validate`] would refuse is left out
    /// (the kernel's default applies).
    pub fn from_request(req: &ExecuteRequest) -> Cell {
        let mut cell = Cell::new(req.code.clone()).reset(req.reset);
        if let Some(t) = req.timeout_duration() {
            cell = cell.timeout(t);
        }
        if let Some(n) = req.max_tool_calls {
            cell = cell.max_tool_calls(n);
        }
        cell
    }
}
