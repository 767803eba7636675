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
    /// Seconds a request's headers may take (a new connection's first
    /// request from accept, any other from its first byte).
    pub header_timeout_seconds: u64,
    /// Seconds a kept-alive connection may wait for its next request (and
    /// a response may go unread) before it is closed.
    pub idle_timeout_seconds: u64,
    /// Seconds a request body may pause; after this long it must also
    /// have come at `min_body_bytes_per_second` on average.
    pub body_timeout_seconds: u64,
    /// Slowest average rate a request body may arrive at (0: no check).
    pub min_body_bytes_per_second: u64,
    /// Open connections at once (lowered to half the open-file limit);
    /// past it new connections get a 503 and are closed.
    pub max_connections: usize,
    /// Open connections from one peer address at once.
    pub max_connections_per_peer: usize,
    /// Cells of one session (its children included) that may wait behind
    /// its running cell; past it a request gets 429 with Retry-After.
    pub max_queued_cells_per_session: usize,
    /// Bytes of code one session may have in cells waiting or running
    /// (429 past it).
    pub max_queued_bytes_per_session: usize,
    /// Bytes of code of all cells waiting or running (429 past it).
    pub max_queued_bytes: usize,
    /// Events queued for one watcher of a session's event stream before
    /// it is dropped as too slow (`GET /v1/sessions/{session}/events`).
    pub events_buffer: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: DEFAULT_LISTEN.to_owned(),
            token: None,
            max_body_bytes: 10 * 1024 * 1024,
            shutdown_grace: 30,
            allowed_hosts: Vec::new(),
            header_timeout_seconds: 10,
            idle_timeout_seconds: 60,
            body_timeout_seconds: 15,
            min_body_bytes_per_second: 16 * 1024,
            max_connections: 512,
            max_connections_per_peer: 256,
            max_queued_cells_per_session: 16,
            max_queued_bytes_per_session: 64 * 1024 * 1024,
            max_queued_bytes: 256 * 1024 * 1024,
            events_buffer: crate::events::DEFAULT_WATCHER_BUFFER,
        }
    }
}

impl ServerConfig {
    /// [`shutdown_grace`](ServerConfig#structfield.shutdown_grace) as a
    /// `Duration`.
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
        for (key, v) in [
            ("header_timeout_seconds", self.header_timeout_seconds),
            ("idle_timeout_seconds", self.idle_timeout_seconds),
            ("body_timeout_seconds", self.body_timeout_seconds),
            ("max_connections", self.max_connections as u64),
            (
                "max_connections_per_peer",
                self.max_connections_per_peer as u64,
            ),
        ] {
            if v == 0 {
                return Err(format!("[server] {key} must be at least 1"));
            }
        }
        for (key, v) in [
            (
                "max_queued_bytes_per_session",
                self.max_queued_bytes_per_session,
            ),
            ("max_queued_bytes", self.max_queued_bytes),
        ] {
            if v < self.max_body_bytes {
                return Err(format!(
                    "[server] {key} = {v} is below max_body_bytes = {}: a cell of the largest \
                     allowed body could never run; raise it or lower max_body_bytes",
                    self.max_body_bytes
                ));
            }
        }
        if matches!(&self.token, Some(t) if t.trim().is_empty()) {
            return Err("[server] token must not be empty (remove the key for no token)".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_keys_have_sane_defaults_and_bad_values_are_refused() {
        let d = ServerConfig::default();
        assert!(d.validate().is_ok());
        assert!(d.header_timeout_seconds < d.idle_timeout_seconds);
        assert!(d.max_connections_per_peer <= d.max_connections);
        let zero = ServerConfig {
            header_timeout_seconds: 0,
            ..ServerConfig::default()
        };
        assert!(zero
            .validate()
            .unwrap_err()
            .contains("header_timeout_seconds"));
        let small = ServerConfig {
            max_queued_bytes_per_session: 1024,
            ..ServerConfig::default()
        };
        let err = small.validate().unwrap_err();
        assert!(
            err.contains("max_queued_bytes_per_session") && err.contains("max_body_bytes"),
            "{err}"
        );
    }
}
