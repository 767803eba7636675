//! What `cellhost serve` and `cellhost mcp` set up alike: the config, the
//! kernels' options (strict sandbox unless configured), the private data
//! dir, the tools cells may call (`[[tools]]` webhooks and the tools of
//! `[[mcp_servers]]`), and the kernel manager.
//!
//! Errors are printed here, one line that says what to fix; the caller
//! exits with the returned code.

use std::path::PathBuf;

use cellhost::config::{Config, Profile};
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::KernelOptions;
use cellhost_mcp::Downstream;

use crate::HostArgs;

/// A host ready to serve.
pub(crate) struct Host {
    pub config: Config,
    pub opts: KernelOptions,
    pub data_dir: PathBuf,
    pub manager: KernelManager,
    /// The running `[[mcp_servers]]` (stopped on drop).
    pub downstream: Downstream,
}

impl Host {
    pub(crate) fn profile(&self) -> &'static str {
        if self.opts.sandbox.is_strict() {
            "strict"
        } else {
            "none"
        }
    }

    /// Stop the kernels and the downstream servers.
    pub(crate) async fn shutdown(&self) {
        self.manager.shutdown().await;
        self.downstream.shutdown().await;
    }
}

/// Load the config (exit code 2 on error).
pub(crate) fn load_config(args: &HostArgs) -> Result<Config, u8> {
    match &args.config {
        Some(path) => Config::load(path).map_err(|e| {
            eprintln!("cellhost: {e}");
            2
        }),
        None => Ok(Config::default()),
    }
}

/// Check the interpreter and sandbox, make the data dir, start the
/// downstream servers and the kernel manager.
pub(crate) async fn host(args: &HostArgs, config: Config) -> Result<Host, u8> {
    let opts = KernelOptions {
        python: args.python.clone(),
        // Code an agent wrote: strict unless configured.
        sandbox: config.sandbox.sandbox(args.sandbox, Profile::Strict),
        limits: config.limits.limits(),
        ..KernelOptions::default()
    };
    if let Err(e) = cellhost::Interpreter::resolve(opts.python.as_deref()) {
        eprintln!("cellhost: {e}");
        return Err(2);
    }
    // Say it now, not on the first request: strict needs bubblewrap.
    if opts.sandbox.is_strict() && !on_path("bwrap") {
        eprintln!(
            "cellhost: {} (--sandbox none)",
            cellhost::sandbox::SandboxError::BwrapMissing
        );
        return Err(2);
    }
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(cellhost::registry::default_data_dir);
    // The data dir holds every cell's code and output (history): private.
    if let Err(e) = private_dir(&data_dir) {
        eprintln!(
            "cellhost: cannot create the data dir {}: {e}; pick another with --data-dir",
            data_dir.display()
        );
        return Err(2);
    }
    let tools = cellhost_server::webhook::toolset(&config.tools).map_err(|e| {
        eprintln!("cellhost: {e}");
        2u8
    })?;
    let downstream = Downstream::start(&config.mcp_servers).await.map_err(|e| {
        eprintln!("cellhost: {e}");
        2u8
    })?;
    let tools = downstream.add_tools(tools);
    let manager = KernelManager::start(
        ManagerOptions::new(&data_dir)
            .lifecycle(&config.lifecycle)
            .workspace_quota(config.limits.workspace_quota())
            .kernel(opts.clone())
            .remote(&config)
            .tools(tools),
    )
    .await;
    Ok(Host {
        config,
        opts,
        data_dir,
        manager,
        downstream,
    })
}

/// Create `dir` (0700) or tighten it to 0700.
fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(dir.join(name))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}
