//! `cellhost mcp`: MCP over stdio for one client (Claude Desktop, Claude
//! Code, Cursor…). Stdout carries the protocol only; everything else goes
//! to stderr. It runs until the client closes stdin, then stops every
//! kernel and downstream server.

use std::sync::Arc;

use cellhost_mcp::McpServer;

use crate::{setup, HostArgs};

pub(crate) async fn mcp(args: HostArgs) -> u8 {
    let config = match setup::load_config(&args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let host = match setup::host(&args, config).await {
        Ok(h) => h,
        Err(code) => return code,
    };
    eprintln!(
        "cellhost: MCP on stdio (sandbox {}, data in {}, {} tool(s) for cells)",
        host.profile(),
        host.data_dir.display(),
        host.manager.options().tools.len()
    );
    let server = McpServer::new(Arc::new(host.manager.clone()));
    let code = tokio::select! {
        r = cellhost_mcp::serve_stdio(server) => match r {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("cellhost: {e}");
                1
            }
        },
        () = cellhost_server::shutdown_signal() => 0,
    };
    host.shutdown().await;
    code
}
