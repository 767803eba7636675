//! cellhost: session-persistent Python kernels for AI agents.
//!
//! A [`Kernel`] is a handle to one live Python interpreter whose state
//! (variables, imports, open files) persists from cell to cell. Every
//! [`Kernel::execute`] returns a bounded, cleaned [`CellResult`] that says
//! honestly whether the kernel's state was kept, reset or lost.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cellhost::KernelError> {
//! use cellhost::{Cell, Kernel, KernelOptions};
//! let kernel = Kernel::spawn(KernelOptions::default()).await?;
//! kernel.execute(Cell::new("x = 41")).await?;
//! let r = kernel.execute(Cell::new("x + 1")).await?;
//! assert_eq!(r.value.as_deref(), Some("42"));
//! kernel.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! A [`registry::KernelManager`] keeps one kernel per owner (a session id),
//! starting it on the owner's first cell and reaping it when idle. This
//! example runs (doc tests start a real Python; `python3` must be on PATH):
//!
//! ```
//! use cellhost::registry::{KernelManager, ManagerOptions};
//! use cellhost::{Cell, KernelOptions};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), cellhost::registry::ManagerError> {
//! let dir = tempfile::tempdir().expect("a temporary directory");
//! let opts = ManagerOptions::new(dir.path().join("data"))
//!     .kernel(KernelOptions::default().runtime_dir(dir.path().join("run")))
//!     .warm_pool(0);
//! let manager = KernelManager::start(opts).await;
//! manager.execute("alice", Cell::new("x = 41")).await?;
//! let r = manager.execute("alice", Cell::new("x + 1")).await?;
//! assert_eq!(r.value.as_deref(), Some("42"));
//! assert!(r.kernel.reused);
//! // Another owner has a kernel of its own.
//! let other = manager.execute("bob", Cell::new("'x' in globals()")).await?;
//! assert_eq!(other.value.as_deref(), Some("False"));
//! manager.shutdown().await;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs, unreachable_pub)]

pub mod config;
pub mod egress;
pub mod env;
pub mod environment;
mod error_chain;
#[cfg(test)]
mod error_tests;
pub mod events;
pub mod files;
pub mod history;
pub mod interpreter;
pub mod kernel;
pub mod output;
pub mod owner;
pub mod packages;
pub mod percent;
pub mod registry;
pub mod remote;
mod request;
pub mod sandbox;
pub mod sys;
pub mod tenant;
pub mod tools;

pub use cellhost_protocol::{
    CellResult, DisplayItem, ExecuteRequest, ForkPath, ForkReport, Forked, KernelInfo, KernelState,
    KernelSummary, OutputStream, RestoreFrom, Restored, Skipped, SnapshotReport, Status, Truncated,
};
pub use error_chain::error_chain;
pub use interpreter::{Interpreter, InterpreterError};
pub use kernel::{
    Cell, CellEvent, DisplayLimits, ForkError, Kernel, KernelError, KernelOptions, SnapshotError,
    SnapshotLimits, SnapshotSummary, SpawnError, Template,
};
pub use output::OutputLimits;
pub use sandbox::{ResourceLimits, Sandbox, StrictSandbox};
pub use tools::{FnTool, Tool, ToolError, ToolSet};
