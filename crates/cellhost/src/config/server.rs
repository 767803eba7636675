//! `[server]`: how `cellhost serve` listens and shuts down.

use std::time::Duration;

use serde::Deserialize;

/// Default address of the daemon (loopback only).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";

/// `[server]` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to bind (`--listen` wins).
    pub listen: String,
    /// Bearer token every route but `/healthz` requires (`CELLHOST_TOKEN`
    /// wins). Required to bind a non-loopback address.
    pub token: Option<String>,
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
    /// Seconds running cells get to finish at shutdown before kernels are
    /// killed.
    pub shutdown_grace: u64,
    /// Host names (`name` or `name:port`) browsers may reach a tokenless
    /// daemon by, besides loopback literals, `localhost` and the bound
    /// address; any other `Host` is refused (403, against DNS rebinding).
    pub allowed_hosts: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: DEFAULT_LISTEN.to_owned(),
            token: None,
            max_body_bytes: 10 * 1024 * 1024,
            shutdown_grace: 30,
            allowed_hosts: Vec::new(),
        }
    }
}

impl ServerConfig {
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace)
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(format!(
                "[server] listen = {:?} is not an address like 127.0.0.1:8787",
                self.listen
            ));
        }
        if self.max_body_bytes < 1024 {
            return Err("[server] max_body_bytes must be at least 1024".into());
        }
        if matches!(&self.token, Some(t) if t.trim().is_empty()) {
            return Err("[server] token must not be empty (remove the key for no token)".into());
        }
        Ok(())
    }
}
