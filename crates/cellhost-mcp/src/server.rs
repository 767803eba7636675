//! The MCP server: one [`McpServer`] per client connection (stdio) or MCP
//! session (streamable HTTP), sharing one kernel manager.
//!
//! Owners: a call's kernel belongs to its MCP session: over HTTP the
//! `Mcp-Session-Id`, over stdio a random id made for the connection. A
//! `session` argument names another owner explicitly (a conversation id
//! that outlives the connection). When a connection ends, the kernels of
//! its implicit owner are disposed; named sessions are left to the idle
//! reaper. Only protocol versions with the `initialize` handshake are
//! offered, so every client has a session to own its kernel.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use cellhost::registry::{validate_owner, KernelManager};
use cellhost::tenant::Caller;
use cellhost::CellEvent;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};

use crate::hygiene::{Activity, HttpService};
use crate::progress;
use crate::render;
use crate::runner::CellRunner;
use crate::tools::{self, ExecuteArgs, ForkArgs, NoArgs, SessionArgs};

/// How long an HTTP MCP session lives without traffic: past the longest
/// cell timeout (one day).
const SESSION_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(86_400 + 3_600);

/// The MCP handler for one connection or session.
pub struct McpServer {
    runner: Arc<dyn CellRunner>,
    tools: Arc<Vec<Tool>>,
    conn: Arc<Connection>,
    /// Shared by every session of one HTTP service.
    activity: Arc<Activity>,
}

impl Clone for McpServer {
    fn clone(&self) -> Self {
        McpServer {
            runner: self.runner.clone(),
            tools: self.tools.clone(),
            conn: self.conn.clone(),
            activity: self.activity.clone(),
        }
    }
}

/// The implicit owner of one connection; its kernels go when it does.
struct Connection {
    /// Used when the transport has no session id (stdio).
    fallback: String,
    /// The implicit owner once a call used it.
    used: OnceLock<String>,
    manager: KernelManager,
}

impl Drop for Connection {
    fn drop(&mut self) {
        let Some(owner) = self.used.get().cloned() else {
            return;
        };
        let manager = self.manager.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                manager.dispose_owner(&owner).await;
            });
        }
    }
}

impl McpServer {
    /// A handler for a new connection; `functions` are the code-mode
    /// function lines for `execute_code`'s description (see
    /// [`cellhost::ToolSet::signatures`]).
    pub fn new(runner: Arc<dyn CellRunner>) -> McpServer {
        let functions = runner.manager().options().tools.signatures();
        let tools = Arc::new(tools::definitions(&functions));
        let conn = Arc::new(Connection {
            fallback: format!("mcp-{}", random_hex()),
            used: OnceLock::new(),
            manager: runner.manager().clone(),
        });
        McpServer {
            runner,
            tools,
            conn,
            activity: Arc::default(),
        }
    }

    /// A handler for another connection, sharing the tool list.
    pub fn fresh(&self) -> McpServer {
        let mut s = McpServer::new(self.runner.clone());
        s.tools = self.tools.clone();
        s.activity = self.activity.clone();
        s
    }

    /// The MCP session id of an HTTP request (`None` over stdio).
    fn session_id(ctx: &RequestContext<RoleServer>) -> Option<String> {
        ctx.extensions
            .get::<http::request::Parts>()?
            .headers
            .get("mcp-session-id")?
            .to_str()
            .ok()
            .map(str::to_owned)
    }

    /// Who sent the request: the daemon's auth layer puts a [`Caller`]
    /// in the HTTP request's extensions (a tenant, or the admin); over
    /// stdio, and over HTTP without one, the admin.
    fn caller(ctx: &RequestContext<RoleServer>) -> Caller {
        ctx.extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<Caller>())
            .cloned()
            .unwrap_or_default()
    }

    /// The owner key a call acts for: `named`, else this session's, in
    /// the caller's namespace (a tenant's `s1` is the key `tenant:s1`).
    fn owner(
        &self,
        named: Option<String>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let caller = Self::caller(ctx);
        if let Some(name) = named {
            validate_owner(&name).map_err(|e| e.to_string())?;
            return Ok(caller.key(&name));
        }
        let owner = match ctx.extensions.get::<http::request::Parts>() {
            // Over HTTP the session id is the owner; a request without one
            // (served statelessly) would get a throwaway kernel.
            Some(parts) => parts
                .headers
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .filter(|id| validate_owner(id).is_ok())
                .map(|id| caller.key(id))
                .ok_or_else(|| {
                    "this request has no MCP session (Mcp-Session-Id): initialize a session \
                     first, or name one with the `session` argument"
                        .to_owned()
                })?,
            None => self.conn.fallback.clone(),
        };
        let _ = self.conn.used.set(owner.clone());
        Ok(owner)
    }

    /// The workspace of this session's implicit owner (its resources).
    fn workspace(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<cellhost::files::Workspace, ErrorData> {
        let owner = self
            .owner(None, ctx)
            .map_err(|e| ErrorData::invalid_request(e, None))?;
        self.conn
            .manager
            .workspace(&owner)
            .map_err(|e| ErrorData::invalid_request(cellhost::error_chain(&e), None))
    }

    async fn execute(
        &self,
        args: ExecuteArgs,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, String> {
        let (req, session) = args.request()?;
        let owner = self.owner(session.clone(), &ctx)?;
        // The session is not idle while this call runs (see `hygiene`).
        let _running = Self::session_id(&ctx).map(|id| self.activity.running(&id));
        let manager = self.runner.manager().clone();
        if manager.is_shut_down() {
            return Err("cellhost is shutting down; try again when it is back".to_owned());
        }
        let mut events = None;
        let forward = ctx.meta.get_progress_token().map(|token| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<CellEvent>();
            events = Some(tx);
            tokio::spawn(progress::forward(ctx.peer.clone(), token, rx))
        });
        if let Some(info) = ctx.peer.peer_info() {
            let c = &info.client_info;
            let name = c
                .title
                .as_deref()
                .filter(|t| !t.is_empty())
                .unwrap_or(&c.name);
            self.runner.client(&owner, name);
        }
        let mut run = self.runner.run(owner.clone(), req, events);
        let result = tokio::select! {
            // A cell that already finished is never mistaken for the
            // owner's next one.
            biased;
            r = &mut run => r,
            () = ctx.ct.cancelled() => {
                // The client gave up on this call: stop the cell, keep the
                // kernel (it is killed only if it ignores the interrupt).
                manager.interrupt(&owner).await;
                run.await
            }
        };
        if let Some(mut f) = forward {
            // The last lines go out before the result; a sender the cell
            // still holds (one that never ran) must not hold the reply.
            if tokio::time::timeout(progress::DRAIN, &mut f).await.is_err() {
                f.abort();
            }
        }
        let r = result?;
        let mut out = CallToolResult::success(render::content(&r, session.as_deref()));
        out.structured_content = serde_json::to_value(&r).ok();
        out.is_error = Some(!r.is_success());
        Ok(out)
    }

    async fn interrupt(
        &self,
        args: SessionArgs,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, String> {
        let owner = self.owner(args.session, &ctx)?;
        let n = self.runner.manager().interrupt(&owner).await;
        let caller = Self::caller(&ctx);
        let owner = caller.name_of(&owner).unwrap_or(&owner);
        let text = if n == 0 {
            format!("No cell was running in session {owner:?}; nothing to interrupt.")
        } else {
            format!(
                "Interrupted the running cell of session {owner:?}; its kernel's state is kept."
            )
        };
        Ok(structured(text, serde_json::json!({ "interrupted": n })))
    }

    async fn reset(
        &self,
        args: SessionArgs,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, String> {
        let owner = self.owner(args.session, &ctx)?;
        let n = self.runner.manager().dispose_owner(&owner).await;
        self.runner.disposed(&owner);
        let caller = Self::caller(&ctx);
        let owner = caller.name_of(&owner).unwrap_or(&owner);
        let text = if n == 0 {
            format!("Session {owner:?} had no kernel; the next execute_code starts a fresh one.")
        } else {
            format!(
                "Discarded the kernel of session {owner:?} and all its state; the next \
                 execute_code starts a fresh one."
            )
        };
        Ok(structured(text, serde_json::json!({ "disposed": n })))
    }

    async fn fork(
        &self,
        args: ForkArgs,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, String> {
        let source = self.owner(args.session, &ctx)?;
        let caller = Self::caller(&ctx);
        let mut into = Vec::with_capacity(args.into.len());
        for name in &args.into {
            validate_owner(name).map_err(|e| e.to_string())?;
            into.push(caller.key(name));
        }
        let mut report = self
            .runner
            .manager()
            .fork(&source, &into)
            .await
            .map_err(|e| cellhost::error_chain(&e))?;
        report.from = caller.name_of(&source).unwrap_or(&source).to_owned();
        for (forked, name) in report.into.iter_mut().zip(&args.into) {
            forked.session = name.clone();
        }
        let names: Vec<String> = args.into.iter().map(|n| format!("{n:?}")).collect();
        let text = format!(
            "Forked session {:?} into {}: each starts with a copy of its current state and \
             files (loaded before its first cell) and is independent from now on.",
            report.from,
            names.join(", ")
        );
        let value = serde_json::to_value(&report).unwrap_or_default();
        Ok(structured(text, value))
    }

    /// The live kernels the caller may see, named as it names them.
    fn list(&self, caller: &Caller) -> CallToolResult {
        let kernels: Vec<_> = self
            .runner
            .manager()
            .list()
            .into_iter()
            .filter_map(|mut k| {
                let name = caller.name_of(&k.owner)?.to_owned();
                if let Some(rest) = k.key.strip_prefix(k.owner.as_str()) {
                    k.key = format!("{name}{rest}");
                }
                k.owner = name;
                Some(k)
            })
            .collect();
        let mut text = format!("{} live kernel(s)", kernels.len());
        for k in &kernels {
            let rss = k
                .rss_bytes
                .map(|b| format!(", {:.1} MB", b as f64 / 1e6))
                .unwrap_or_default();
            text.push_str(&format!(
                "\n- {}: {:?}, {} cell(s), idle {:.0} s, backend {}{rss}",
                k.owner, k.state, k.execution_count, k.idle_seconds, k.backend
            ));
        }
        structured(text, serde_json::json!({ "kernels": kernels }))
    }

    async fn dispatch(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, String> {
        let args = request.arguments;
        match request.name.as_ref() {
            tools::EXECUTE => {
                let a = tools::parse_required::<ExecuteArgs>(tools::EXECUTE, args)?;
                self.execute(a, ctx).await
            }
            tools::INTERRUPT => {
                let a = tools::parse::<SessionArgs>(tools::INTERRUPT, args)?;
                self.interrupt(a, ctx).await
            }
            tools::RESET => {
                let a = tools::parse::<SessionArgs>(tools::RESET, args)?;
                self.reset(a, ctx).await
            }
            tools::LIST => {
                tools::parse::<NoArgs>(tools::LIST, args)?;
                Ok(self.list(&Self::caller(&ctx)))
            }
            tools::FORK => {
                let a = tools::parse_required::<ForkArgs>(tools::FORK, args)?;
                self.fork(a, ctx).await
            }
            other => Err(format!(
                "unknown tool {other:?}; cellhost offers execute_code, interrupt, reset_session, \
                 fork_session and list_kernels"
            )),
        }
    }
}

fn structured(text: String, value: serde_json::Value) -> CallToolResult {
    let mut out = CallToolResult::success(vec![ContentBlock::text(text)]);
    out.structured_content = Some(value);
    out
}

fn random_hex() -> String {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b = ((t as u64) ^ u64::from(std::process::id())).to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
        .with_server_info(Implementation::new("cellhost", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "cellhost runs Python in a persistent kernel per conversation. Call \
                 execute_code; state persists between calls until reset_session.",
        )
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        // Sessions own kernels: only the versions that have one.
        Cow::Borrowed(ProtocolVersion::known_up_to(
            &ProtocolVersion::LATEST_WITH_INITIALIZE,
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // The model is told its environment (asked of the interpreter once,
        // then cached).
        let env = cellhost::environment::describe(self.runner.manager().options()).await;
        Ok(ListToolsResult::with_all_items(tools::with_environment(
            &self.tools,
            &env.summary,
        )))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        crate::resources::list(&self.workspace(&ctx)?).await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let ws = self.workspace(&ctx)?;
        Ok(crate::resources::read(&ws, &request.uri).await?.into())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // Errors a model should read are tool results, not protocol errors.
        Ok(match self.dispatch(request, ctx).await {
            Ok(r) => r.into(),
            Err(message) => CallToolResult::error(vec![ContentBlock::text(message)]).into(),
        })
    }
}

/// Serve MCP over this process's stdin/stdout until the client hangs up.
///
/// # Errors
/// When the connection cannot be set up (the client never initialized).
pub async fn serve_stdio(server: McpServer) -> Result<(), String> {
    let running = server
        .serve(rmcp::transport::io::stdio_pipes())
        .await
        .map_err(|e| format!("the MCP client did not initialize: {e}"))?;
    let _ = running.waiting().await;
    Ok(())
}

/// The streamable HTTP service for `/mcp`: a fresh [`McpServer`] (and
/// implicit owner) per MCP session. Host and Origin checks are the
/// caller's (the daemon's guard), so rmcp's own are off. A session with no
/// request and no running call for `idle` is closed and its implicit
/// kernel disposed (`None`: never; see `hygiene`).
pub fn http_service(
    server: McpServer,
    cancel: tokio_util::sync::CancellationToken,
    idle: Option<std::time::Duration>,
) -> HttpService {
    use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .disable_allowed_origins()
        .with_cancellation_token(cancel.clone());
    // rmcp ends a session with no traffic for `keep_alive`, even while a
    // call runs: longer than the longest cell (one day), so a quiet cell
    // or a pause never costs a session its kernel; the idle close (which
    // knows about running cells) ends abandoned sessions long before.
    let mut sessions =
        rmcp::transport::streamable_http_server::session::local::LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(SESSION_KEEP_ALIVE);
    let sessions = Arc::new(sessions);
    let activity = server.activity.clone();
    let manager = server.runner.manager().clone();
    let inner = rmcp::transport::StreamableHttpService::new(
        move || Ok(server.fresh()),
        sessions.clone(),
        config,
    );
    HttpService::new(inner, activity, &sessions, manager, idle, cancel)
}
