//! cellhost over the Model Context Protocol (the official Rust SDK, `rmcp`).
//!
//! Two halves:
//!
//! - **Server** ([`McpServer`]): the tools `execute_code`, `interrupt`,
//!   `reset_session` and `list_kernels` over any MCP transport: stdio
//!   ([`serve_stdio`], `cellhost mcp`) or streamable HTTP ([`http_service`],
//!   the daemon's `/mcp`). The kernel owner is the MCP session (one client
//!   connection), or the `session` a call names. Cancelling an
//!   `execute_code` interrupts its cell; output lines stream as progress
//!   notifications. Cells run through a [`CellRunner`], so the daemon can
//!   record them in its history and metrics.
//! - **Code mode** ([`Downstream`]): `[[mcp_servers]]` are started as MCP
//!   clients and their tools become `tools.SERVER.TOOL(...)` in cells, under
//!   each cell's allow-list and budget. A server that exits is restarted;
//!   its calls fail with a clear error meanwhile.
//!
//! Modules: `server` (the handler and owners), `tools` (the tool
//! definitions and their arguments), `render` (a cell result as text and
//! images for a model), `progress` (output lines as notifications),
//! `runner` (how a cell runs), `hygiene` (`DELETE /mcp`'s status and
//! closing idle HTTP sessions), `downstream` (code mode), `resources` (the
//! session's workspace files as MCP resources).

#![warn(missing_docs, unreachable_pub)]

mod downstream;
mod hygiene;
mod progress;
mod render;
mod resources;
mod runner;
mod server;
mod tools;

pub use downstream::{Downstream, DownstreamError};
pub use hygiene::HttpService;
pub use render::{render, render_in};
pub use runner::{CellRunner, RunFuture};
pub use server::{http_service, serve_stdio, McpServer};
pub use tokio_util::sync::CancellationToken;
