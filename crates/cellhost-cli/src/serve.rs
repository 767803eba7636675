//! `cellhost serve`: the daemon. With no flags and no config it listens on
//! 127.0.0.1:8787, runs kernels in the strict sandbox, and keeps history
//! in SQLite under the data dir.

use std::net::SocketAddr;
use std::sync::Arc;

use cellhost::config::{Config, Profile};
use cellhost::history::History;
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::KernelOptions;
use cellhost_server::{AppState, Listening, ServerOptions};

use crate::ServeArgs;

pub(crate) async fn serve(args: ServeArgs) -> u8 {
    let config = match &args.config {
        Some(path) => match Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("cellhost: {e}");
                return 2;
            }
        },
        None => Config::default(),
    };
    let listen = args
        .listen
        .clone()
        .unwrap_or_else(|| config.server.listen.clone());
    let addr: SocketAddr = match listen.parse() {
        Ok(a) => a,
        Err(_) => {
            eprintln!("cellhost: --listen {listen:?} is not an address like 127.0.0.1:8787");
            return 2;
        }
    };
    let token = std::env::var("CELLHOST_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .or_else(|| config.server.token.clone());
    let opts = KernelOptions {
        python: args.python.clone(),
        // The daemon runs code an agent wrote: strict unless configured.
        sandbox: config.sandbox.sandbox(args.sandbox, Profile::Strict),
        limits: config.limits.limits(),
        ..KernelOptions::default()
    };
    if let Err(e) = cellhost::Interpreter::resolve(opts.python.as_deref()) {
        eprintln!("cellhost: {e}");
        return 2;
    }
    // Say it now, not on the first request: strict needs bubblewrap.
    if opts.sandbox.is_strict() && !on_path("bwrap") {
        eprintln!(
            "cellhost: {} (--sandbox none)",
            cellhost::sandbox::SandboxError::BwrapMissing
        );
        return 2;
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
        return 2;
    }
    let listening = match Listening::bind(addr, token.is_some()).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return 2;
        }
    };
    let history = if config.history.enabled {
        let path = data_dir.join("history.sqlite");
        let secrets = opts.env.secrets.clone();
        let config = config.history.clone();
        let opened =
            tokio::task::spawn_blocking(move || History::open(&path, &config, secrets)).await;
        match opened {
            Ok(Ok(h)) => Some(Arc::new(h)),
            Ok(Err(e)) => {
                eprintln!("cellhost: {e}; fix or move the file, or set [history] enabled = false");
                return 1;
            }
            Err(e) => {
                eprintln!("cellhost: opening the history failed: {e}");
                return 1;
            }
        }
    } else {
        None
    };
    let profile = if opts.sandbox.is_strict() {
        "strict"
    } else {
        "none"
    };
    let tools = match cellhost_server::webhook::toolset(&config.tools) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cellhost: {e}");
            return 2;
        }
    };
    let manager = KernelManager::start(
        ManagerOptions::new(&data_dir)
            .lifecycle(&config.lifecycle)
            .kernel(opts)
            .remote(&config)
            .tools(tools),
    )
    .await;
    let state = AppState::new(
        manager,
        history,
        ServerOptions {
            token: token.clone(),
            max_body_bytes: config.server.max_body_bytes,
            shutdown_grace: config.server.shutdown_grace(),
            allowed_hosts: config.server.allowed_hosts.clone(),
            bound: Some(listening.addr),
        },
    );
    let url = format!("http://{}", listening.addr);
    // Never the token itself: stdout ends up in logs and terminals.
    let dashboard = match &token {
        Some(_) => format!("{url}/ (open it once as {url}/?token=$CELLHOST_TOKEN)"),
        None => format!("{url}/"),
    };
    println!(
        "cellhost: listening on {url} (sandbox {profile}, data in {})",
        data_dir.display()
    );
    println!("cellhost: dashboard {dashboard}");
    if token.is_none() {
        println!("cellhost: no token set: anyone on this machine can use the API (set CELLHOST_TOKEN to require one)");
    }
    cellhost_server::serve(listening, state, cellhost_server::shutdown_signal()).await;
    println!("cellhost: stopped");
    0
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
