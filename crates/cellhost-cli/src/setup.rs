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
            eprintln!("cellhost: {}", cellhost::error_chain(&e));
            2
        }),
        None => Ok(Config::default()),
    }
}

/// The start-up warning for a config file that holds a secret (the
/// daemon token, a `[[tools]]` header, an `[[mcp_servers]]` env value) and
/// that users other than its owner may read, if it is one.
pub(crate) fn secret_warning(args: &HostArgs, config: &Config) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = args.config.as_ref()?;
    let mut holds = Vec::new();
    if config.server.token.is_some() {
        holds.push("[server] token".to_owned());
    }
    for t in config.tools.iter().filter(|t| !t.headers.is_empty()) {
        holds.push(format!("the headers of tool `{}`", t.name));
    }
    for m in config.mcp_servers.iter().filter(|m| !m.env.is_empty()) {
        holds.push(format!("the env of MCP server `{}`", m.name));
    }
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    if holds.is_empty() || mode & 0o044 == 0 {
        return None;
    }
    Some(format!(
        "cellhost: warning: {} holds {} and is readable by other users (mode {:04o}); run `chmod 600 {}`",
        path.display(),
        holds.join(", "),
        mode & 0o7777,
        path.display()
    ))
}

/// Check the interpreter and sandbox, make the data dir, start the
/// downstream servers and the kernel manager.
pub(crate) async fn host(args: &HostArgs, config: Config) -> Result<Host, u8> {
    let mut opts = KernelOptions {
        python: args.python.clone(),
        // Code an agent wrote: strict unless configured.
        sandbox: config.sandbox.sandbox(args.sandbox, Profile::Strict),
        limits: config.limits.limits(),
        packages: cellhost::packages::PackageOptions {
            policy: std::sync::Arc::new(config.packages.clone()),
            ..Default::default()
        },
        ..KernelOptions::default()
    };
    // The daemon's token and the tools' credentials are never in a cell's
    // output (nor, through `opts`, in the history's code).
    opts.env.add_secrets(cellhost::env::config_secrets(&config));
    if let Err(e) = cellhost::Interpreter::resolve(opts.python.as_deref()) {
        eprintln!("cellhost: {e}");
        return Err(2);
    }
    if let cellhost::Sandbox::Strict(strict) = &mut opts.sandbox {
        if let Err(why) = network_ok(strict, &config) {
            eprintln!("cellhost: {why}");
            return Err(2);
        }
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
            .snapshots(match config.lifecycle.snapshots {
                cellhost::config::SnapshotMode::OnStop => Some(config.snapshots.max_bytes()),
                cellhost::config::SnapshotMode::Off => None,
            })
            .snapshot_timeout(config.snapshots.timeout())
            .preload(config.kernel.preload.clone())
            .warmup(config.kernel.warmup)
            .templates(config.kernel.template)
            .workspace_quota(config.limits.workspace_quota())
            .workspace_fs(config.limits.workspace_fs)
            .event_buffer(config.server.events_buffer)
            .kernel(opts.clone())
            .remote(&config)
            .tools(tools),
    )
    .await;
    if let Some(warning) = manager.workspace_fs_warning() {
        eprintln!("{warning}");
    }
    Ok(Host {
        config,
        opts,
        data_dir,
        manager,
        downstream,
    })
}

/// Kernels reach neither the daemon's API nor a `[[tools]]` endpoint
/// except through their `tools` module: `network = "host"` is refused
/// unless the daemon has a token and no `[[tools]]` endpoint exists (the
/// host network would reach them); under `"allowlist"` their hosts are
/// refused by the proxy whatever the list says.
fn network_ok(strict: &mut cellhost::StrictSandbox, config: &Config) -> Result<(), String> {
    let tool_hosts = || {
        config
            .tools
            .iter()
            .filter_map(|t| t.url.split_once("://").map(|(_, rest)| rest))
            .filter_map(|rest| rest.split(['/', '?', '#']).next())
            .map(|auth| {
                let host = auth.rsplit_once('@').map_or(auth, |(_, h)| h);
                match host.rsplit_once(':') {
                    Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h.to_owned(),
                    _ => host.to_owned(),
                }
            })
            .collect::<Vec<_>>()
    };
    if strict.network {
        let token = std::env::var("CELLHOST_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
            .or_else(|| config.server.token.clone());
        if token.is_none() {
            return Err(
                "[sandbox] network = \"host\" lets kernels reach this daemon's API; set \
                 [server] token (kernels never see it) or use network = \"allowlist\""
                    .into(),
            );
        }
        if !config.tools.is_empty() {
            return Err(format!(
                "[sandbox] network = \"host\" would let kernels call [[tools]] endpoints ({}) \
                 directly, skipping their allow-list and budget; use network = \"allowlist\"",
                tool_hosts().join(", ")
            ));
        }
    }
    if let Some(policy) = &mut strict.egress {
        let p = std::sync::Arc::make_mut(policy);
        p.deny_hosts.extend(tool_hosts());
        if let Some((h, _)) = config.server.listen.rsplit_once(':') {
            p.deny_hosts.push(h.trim_matches(['[', ']']).to_owned());
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_readable_config_with_a_token_is_warned_about_and_a_private_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cellhost.toml");
        std::fs::write(&path, "[server]\ntoken = \"t0ken\"\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let args = HostArgs {
            config: Some(path.clone()),
            data_dir: None,
            python: None,
            sandbox: None,
        };
        let config = Config::load(&path).unwrap();
        let warning = secret_warning(&args, &config).expect("a warning");
        assert!(
            warning.contains("[server] token") && warning.contains("chmod 600"),
            "{warning}"
        );
        assert!(!warning.contains("t0ken"), "never the secret itself");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(secret_warning(&args, &config), None);
        let none = Config::parse("[limits]\nmemory_mib = 512\n", &path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(secret_warning(&args, &none), None, "no secret, no warning");
    }
}
