//! `cellhost serve`: the daemon. With no flags and no config it listens on
//! 127.0.0.1:8787, runs kernels in the strict sandbox, and keeps history
//! in SQLite under the data dir.

use std::net::SocketAddr;
use std::sync::Arc;

use cellhost::history::History;
use cellhost_server::{AppState, Listening, ServerOptions};

use crate::{setup, ServeArgs};

pub(crate) async fn serve(args: ServeArgs) -> u8 {
    let config = match setup::load_config(&args.host) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(warning) = setup::secret_warning(&args.host, &config) {
        eprintln!("{warning}");
    }
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
    let tenants = cellhost::tenant::Tenants::new(&config.tenants);
    if !tenants.is_empty() {
        // Without an admin, a tokenless request would have to be someone:
        // tenants need the admin token, which alone sees every tenant.
        let Some(admin) = &token else {
            eprintln!(
                "cellhost: [[tenants]] need an admin token: set [server] token or CELLHOST_TOKEN                  (the admin sees every tenant's sessions; see docs/tenants.md)"
            );
            return 2;
        };
        if let Some(t) = tenants.authenticate(admin.as_bytes()) {
            eprintln!(
                "cellhost: tenant {:?} has the admin token (CELLHOST_TOKEN / [server] token);                  give it its own",
                t.name
            );
            return 2;
        }
    }
    let listening = match Listening::bind(addr, token.is_some()).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cellhost: {}", cellhost::error_chain(&e));
            return 2;
        }
    };
    let host = match setup::host(&args.host, config).await {
        Ok(h) => h,
        Err(code) => return code,
    };
    let history = if host.config.history.enabled {
        let path = host.data_dir.join("history.sqlite");
        let secrets = host.opts.env.secrets.clone();
        let config = host.config.history.clone();
        let opened =
            tokio::task::spawn_blocking(move || History::open(&path, &config, secrets)).await;
        let failed = match opened {
            Ok(Ok(h)) => Ok(Some(Arc::new(h))),
            Ok(Err(e)) => Err(format!(
                "{}; fix or move the file, or set [history] enabled = false",
                cellhost::error_chain(&e)
            )),
            Err(e) => Err(format!("opening the history failed: {e}")),
        };
        match failed {
            Ok(h) => h,
            Err(e) => {
                eprintln!("cellhost: {e}");
                host.shutdown().await;
                return 1;
            }
        }
    } else {
        None
    };
    let state = AppState::new(
        host.manager.clone(),
        history,
        ServerOptions {
            token: token.clone(),
            max_body_bytes: host.config.server.max_body_bytes,
            shutdown_grace: host.config.server.shutdown_grace(),
            allowed_hosts: host.config.server.allowed_hosts.clone(),
            bound: Some(listening.addr),
            limits: cellhost_server::HttpLimits::from_config(&host.config.server),
            max_upload_bytes: host.config.files.max_upload_bytes(),
            mcp_idle_session: host.config.mcp.idle_session(),
            tenants,
        },
    );
    let url = format!("http://{}", listening.addr);
    // Never the token itself: stdout ends up in logs and terminals.
    let dashboard = match &token {
        Some(_) => format!("{url}/ (open it once as {url}/?token=$CELLHOST_TOKEN)"),
        None => format!("{url}/"),
    };
    println!(
        "cellhost: listening on {url} (sandbox {}, data in {})",
        host.profile(),
        host.data_dir.display()
    );
    println!("cellhost: dashboard {dashboard}, MCP {url}/mcp");
    if token.is_none() {
        println!("cellhost: no token set: anyone on this machine can use the API (set CELLHOST_TOKEN to require one)");
    }
    cellhost_server::serve(listening, state, cellhost_server::shutdown_signal()).await;
    host.shutdown().await;
    println!("cellhost: stopped");
    0
}
