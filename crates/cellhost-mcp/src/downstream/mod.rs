//! Code mode: downstream MCP servers (`[[mcp_servers]]`) whose tools cells
//! call as `tools.SERVER.TOOL(...)`.
//!
//! Each server is started as a stdio MCP client (`connect.rs`) and kept
//! alive by a supervisor task: when it exits it is started again after a
//! backoff (0.5 s doubling to 30 s), and calls made meanwhile fail with an
//! error that says so. Its tools, listed once at start, become cellhost
//! [`Tool`](cellhost::Tool)s (`tool.rs`) that run under each cell's
//! allow-list and budget like any other.

mod connect;
mod tool;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellhost::config::McpServerConfig;
use cellhost::tools::ToolSet;
use rmcp::service::{Peer, RoleClient};
use tokio_util::sync::CancellationToken;

pub(crate) use tool::McpTool;

const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A server that ran this long before exiting restarts without delay.
const HEALTHY_RUN: Duration = Duration::from_secs(30);

/// Why code mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum DownstreamError {
    /// One server could not be started, initialized or listed.
    #[error("[[mcp_servers]] {name:?}: {message}")]
    Start {
        /// The server's `name` in `[[mcp_servers]]`.
        name: String,
        /// What failed and what to check.
        message: String,
    },
}

/// The running downstream servers.
pub struct Downstream {
    servers: Vec<Arc<Server>>,
    supervisors: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Each server's tools as listed at start.
    listed: Vec<(Arc<Server>, Vec<rmcp::model::Tool>)>,
    stop: CancellationToken,
}

/// One downstream server and its current connection.
pub(crate) struct Server {
    pub config: McpServerConfig,
    state: Mutex<State>,
}

struct State {
    peer: Option<Peer<RoleClient>>,
    /// Why it is down (when `peer` is `None`).
    down: String,
    restarts: u64,
}

impl Server {
    /// The live connection, or an error that says why there is none.
    pub(crate) fn peer(&self) -> Result<Peer<RoleClient>, String> {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &s.peer {
            Some(p) if !p.is_transport_closed() => Ok(p.clone()),
            _ => Err(format!(
                "MCP server {:?} is not running ({}); cellhost is restarting it: try again in a \
                 few seconds",
                self.config.name, s.down
            )),
        }
    }

    fn set(&self, peer: Option<Peer<RoleClient>>, down: String) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if peer.is_some() && s.peer.is_none() && !s.down.is_empty() {
            s.restarts += 1;
        }
        s.peer = peer;
        s.down = down;
    }
}

impl Downstream {
    /// Start every configured server and list its tools. Fails when one
    /// cannot start, so a typo in the config is seen at once.
    ///
    /// # Errors
    /// [`DownstreamError::Start`] naming the server and the reason.
    pub async fn start(configs: &[McpServerConfig]) -> Result<Downstream, DownstreamError> {
        let stop = CancellationToken::new();
        // A server that fails stops the ones already started.
        let guard = stop.clone().drop_guard();
        let mut servers = Vec::new();
        let mut supervisors = Vec::new();
        let mut tools = Vec::new();
        for config in configs {
            let fail = |message: String| DownstreamError::Start {
                name: config.name.clone(),
                message,
            };
            let limit = Duration::from_secs_f64(config.start_timeout);
            let started = tokio::time::timeout(limit, async {
                let running = connect::connect(config).await?;
                let listed = running
                    .peer()
                    .list_all_tools()
                    .await
                    .map_err(|e| format!("listing its tools failed: {e}"))?;
                Ok::<_, String>((running, listed))
            })
            .await
            .map_err(|_| {
                fail(format!(
                    "it did not start and list its tools within {} s (start_timeout)",
                    config.start_timeout
                ))
            })?;
            let (running, listed) = started.map_err(fail)?;
            let server = Arc::new(Server {
                config: config.clone(),
                state: Mutex::new(State {
                    peer: Some(running.peer().clone()),
                    down: String::new(),
                    restarts: 0,
                }),
            });
            tools.push((server.clone(), listed));
            supervisors.push(tokio::spawn(supervise(
                server.clone(),
                running,
                stop.clone(),
            )));
            servers.push(server);
        }
        guard.disarm();
        Ok(Downstream {
            servers,
            supervisors: Mutex::new(supervisors),
            listed: tools,
            stop,
        })
    }

    /// Add every downstream tool to `set` as `SERVER.TOOL`. Tools whose
    /// names cellhost cannot take are skipped with a line on stderr.
    pub fn add_tools(&self, mut set: ToolSet) -> ToolSet {
        for (server, tools) in &self.listed {
            for t in tools {
                let tool = McpTool::new(server.clone(), t);
                let name = cellhost::Tool::name(&tool).to_owned();
                match set.clone().with(tool) {
                    Ok(s) => set = s,
                    Err(e) => eprintln!(
                        "cellhost: skipping tool {name:?} of MCP server {:?}: {e}",
                        server.config.name
                    ),
                }
            }
        }
        set
    }

    /// How many times each server was restarted.
    pub fn restarts(&self) -> Vec<(String, u64)> {
        self.servers
            .iter()
            .map(|s| {
                let st = s.state.lock().unwrap_or_else(|e| e.into_inner());
                (s.config.name.clone(), st.restarts)
            })
            .collect()
    }

    /// Stop every server and its process group, and wait until they are
    /// gone. (Dropping a `Downstream` only signals the stop.)
    pub async fn shutdown(&self) {
        self.stop.cancel();
        let tasks =
            std::mem::take(&mut *self.supervisors.lock().unwrap_or_else(|e| e.into_inner()));
        for t in tasks {
            let _ = t.await;
        }
    }
}

impl Drop for Downstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Keep one server running until `stop`.
async fn supervise(server: Arc<Server>, first: connect::Running, stop: CancellationToken) {
    let mut running = Some(first);
    let mut backoff = FIRST_BACKOFF;
    loop {
        if let Some(connect::Running { service, guard }) = running.take() {
            let started = Instant::now();
            let ct = service.cancellation_token();
            let mut waiting = Box::pin(service.waiting());
            let why = tokio::select! {
                q = &mut waiting => match q {
                    Ok(reason) => format!("it exited ({reason:?})").to_lowercase(),
                    Err(e) => format!("its connection failed: {e}"),
                },
                () = stop.cancelled() => {
                    // The group first, while its leader is unreaped.
                    guard.kill_group().await;
                    ct.cancel();
                    let _ = tokio::time::timeout(Duration::from_secs(5), waiting).await;
                    return;
                }
            };
            // It exited by itself (its leader may be reaped): only stop
            // the watcher.
            drop(guard);
            server.set(None, why);
            if started.elapsed() >= HEALTHY_RUN {
                backoff = FIRST_BACKOFF;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop.cancelled() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
        let next = tokio::select! {
            r = connect::connect(&server.config) => r,
            () = stop.cancelled() => return,
        };
        match next {
            Ok(r) => {
                server.set(Some(r.peer().clone()), String::new());
                running = Some(r);
            }
            Err(e) => server.set(None, format!("restarting failed: {e}")),
        }
    }
}
