//! `cellhost.toml`: the operator's configuration file.
//!
//! Every section is optional and every key has a default, so an empty file
//! (or no file) is a valid configuration. Unknown keys are errors: a typo
//! must not silently fall back to a default. Each section lives in its own
//! module next to the concept it configures; docs/configuration.md documents every key.

mod backends;
mod files;
mod history;
mod lifecycle;
mod limits;
mod mcp;
mod mcp_servers;
mod packages;
mod sandbox;
mod server;
mod snapshots;
mod tenants;
mod tools;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use backends::{BackendConfig, DockerConfig, KubectlConfig, RemoteCommon, SshConfig};
pub use files::FilesConfig;
pub use history::HistoryConfig;
pub use lifecycle::{LifecycleConfig, SnapshotMode};
pub use limits::LimitsConfig;
pub use mcp::McpConfig;
pub use mcp_servers::McpServerConfig;
pub use packages::{KernelConfig, PackagesConfig, PipInstaller};
pub use sandbox::{Network, Profile, SandboxConfig};
pub use server::{ServerConfig, DEFAULT_LISTEN};
pub use snapshots::SnapshotsConfig;
pub use tenants::TenantConfig;
pub use tools::ToolConfig;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[lifecycle]`: kernel caps, idle reaping, warm pool.
    pub lifecycle: LifecycleConfig,
    /// `[sandbox]`: isolation profile and its settings.
    pub sandbox: SandboxConfig,
    /// `[limits]`: per-kernel resource limits.
    pub limits: LimitsConfig,
    /// `[server]`: the daemon's address, token, body limit, shutdown.
    pub server: ServerConfig,
    /// `[history]`: the daemon's cell history retention.
    pub history: HistoryConfig,
    /// `[files]`: upload limits of the workspace file routes.
    pub files: FilesConfig,
    /// `[snapshots]`: the size cap of a session's snapshot.
    pub snapshots: SnapshotsConfig,
    /// The backend of requests that name none (default `"local"`).
    pub default_backend: Option<String>,
    /// `[backends.NAME]`: remote kernels over ssh, docker or kubectl.
    pub backends: BTreeMap<String, BackendConfig>,
    /// `[[tools]]`: tools the daemon offers to cells, served over HTTP.
    pub tools: Vec<ToolConfig>,
    /// `[[mcp_servers]]`: downstream MCP servers whose tools cells call
    /// (code mode).
    pub mcp_servers: Vec<McpServerConfig>,
    /// `[packages]`: `%pip install` by the host.
    pub packages: PackagesConfig,
    /// `[kernel]`: what pooled kernels import before they are handed out.
    pub kernel: KernelConfig,
    /// `[mcp]`: the daemon's MCP sessions (idle close).
    pub mcp: McpConfig,
    /// `[[tenants]]`: clients kept apart, each with its own token,
    /// session namespace and limits (the `[server] token` is the admin).
    pub tenants: Vec<TenantConfig>,
}

/// Why a configuration file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path} (check the path given to --config)")]
    Read {
        /// The config file.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has keys or types cellhost does not
    /// know.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The config file.
        path: PathBuf,
        /// The TOML parser's message (it names the line and the key).
        message: String,
    },
    /// The file parses, but its values do not go together (a zero where
    /// a size is needed, a pool larger than `max_kernels`, …).
    #[error("invalid config file {path}: {message}")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// Which section and key are wrong, and why.
        message: String,
    },
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text, path)
    }

    /// Parses config text; `path` only names the source in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        config.validate().map_err(|message| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        })?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), String> {
        self.lifecycle.validate()?;
        self.snapshots.validate()?;
        self.sandbox.validate()?;
        self.limits.validate()?;
        self.server.validate()?;
        self.packages.validate()?;
        self.kernel.validate()?;
        self.history.validate()?;
        tenants::validate(&self.tenants)?;
        if let (Some(admin), false) = (&self.server.token, self.tenants.is_empty()) {
            let admin: [u8; 32] = {
                use sha2::Digest;
                sha2::Sha256::digest(admin.as_bytes()).into()
            };
            if let Some(t) = self.tenants.iter().find(|t| t.digest() == admin) {
                return Err(format!(
                    "[[tenants]] {:?} has the [server] token (the admin's); give it its own",
                    t.name
                ));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for tool in &self.tools {
            tool.validate()?;
            if !names.insert(tool.name.as_str()) {
                return Err(format!(
                    "[[tools]]: a tool named {:?} is already registered; tool names must be unique",
                    tool.name
                ));
            }
        }
        let mut servers = std::collections::BTreeSet::new();
        for server in &self.mcp_servers {
            server.validate()?;
            if !servers.insert(server.name.as_str()) {
                return Err(format!(
                    "[[mcp_servers]]: a server named {:?} is already configured; names must be unique",
                    server.name
                ));
            }
            let prefix = format!("{}.", server.name);
            if let Some(tool) = self
                .tools
                .iter()
                .find(|t| t.name == server.name || t.name.starts_with(&prefix))
            {
                return Err(format!(
                    "[[mcp_servers]] {:?} would share the name tools.{} with [[tools]] {:?}; rename one",
                    server.name, server.name, tool.name
                ));
            }
        }
        for (name, backend) in &self.backends {
            backend.validate(name)?;
        }
        match &self.default_backend {
            Some(name) if name != "local" && !self.backends.contains_key(name) => Err(format!(
                "default_backend = {name:?} names no backend: add a [backends.{name}] section or use \"local\""
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("cellhost.toml"))
    }

    #[test]
    fn empty_file_is_all_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
    }

    #[test]
    fn unknown_keys_are_errors_that_name_the_key() {
        let err = parse("[lifecycle]\nmax_kernel = 3\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_kernel"), "{err}");
        assert!(err.contains("cellhost.toml"), "{err}");
        let err = parse("[lifecycl]\n").unwrap_err().to_string();
        assert!(err.contains("lifecycl"), "{err}");
    }

    #[test]
    fn sandbox_and_limits_sections_parse_with_defaults() {
        let c = parse("[sandbox]\nprofile = \"strict\"\nnetwork = true\n[limits]\nmemory_mib = 512\ncpu_seconds_per_cell = 0\n").unwrap();
        let crate::sandbox::Sandbox::Strict(s) = c.sandbox.sandbox(None, Profile::None) else {
            panic!("strict expected");
        };
        assert!(s.network && s.uid == 65534);
        let l = c.limits.limits();
        assert_eq!(l.memory_bytes, Some(512 << 20));
        assert_eq!(l.cpu_seconds_per_cell, None);
        assert_eq!(l.max_open_files, Some(1024));
        assert_eq!(
            parse("").unwrap().limits.limits(),
            crate::sandbox::ResourceLimits::default()
        );
    }

    #[test]
    fn a_root_kernel_uid_or_a_bad_profile_is_refused() {
        let err = parse("[sandbox]\nuid = 0\n").unwrap_err().to_string();
        assert!(err.contains("never run as root"), "{err}");
        let err = parse("[sandbox]\nprofile = \"loose\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("loose"), "{err}");
        let err = parse("[limits]\nmemory_mib = 8\n").unwrap_err().to_string();
        assert!(err.contains("memory_mib"), "{err}");
    }

    #[test]
    fn server_and_history_sections_parse_and_validate() {
        let c = parse("[server]\nlisten = \"0.0.0.0:9000\"\ntoken = \"t0k\"\nmax_body_bytes = 2048\nshutdown_grace = 5\nallowed_hosts = [\"box.lan\"]\n[history]\nmax_rows = 10\nmax_days = 0\n").unwrap();
        assert_eq!(c.server.listen, "0.0.0.0:9000");
        assert_eq!(c.server.token.as_deref(), Some("t0k"));
        assert_eq!(c.server.allowed_hosts, ["box.lan"]);
        assert_eq!(c.history.max_rows, 10);
        let d = parse("").unwrap();
        assert_eq!(d.server.listen, "127.0.0.1:8787");
        assert_eq!(d.server.max_body_bytes, 10 << 20);
        assert_eq!((d.history.max_rows, d.history.max_days), (100_000, 30));
        let err = parse("[server]\nlisten = \"here\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("listen"), "{err}");
        let err = parse("[history]\nrows = 1\n").unwrap_err().to_string();
        assert!(err.contains("rows"), "{err}");
    }

    #[test]
    fn wrong_types_are_errors() {
        let err = parse("[lifecycle]\nmax_kernels = \"many\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_kernels"), "{err}");
    }
}
