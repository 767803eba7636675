//! OpenSSH: one multiplexed connection (ControlMaster) per host.
//!
//! The master is started explicitly (`ssh -M -N -f`, its stderr in a log
//! file: a backgrounded master would otherwise hold the first command's
//! stderr pipe open) under a per-host lock, so concurrent first calls
//! share one connection. Commands then ride it with `ControlMaster=no`;
//! if the master is gone, ssh falls back to a direct connection and the
//! next call starts a new master. `BatchMode=yes` (never a prompt), a
//! known_hosts file of cellhost's own, keepalives so a dead link is
//! noticed. [`Transport::shutdown`] stops the master (`ssh -O stop`).

use std::path::PathBuf;
use std::time::Duration;

use super::transport::{
    run_client, shell_quote, BoxFuture, Client, ExecError, ExecOutput, Transport,
};
use crate::config::SshConfig;

/// One ssh host.
#[derive(Debug)]
pub struct SshTransport {
    ssh: PathBuf,
    host: String,
    user: Option<String>,
    port: Option<u16>,
    /// Options shared by the master and every command.
    options: Vec<String>,
    control_path: PathBuf,
    master_log: PathBuf,
    connect_timeout: Duration,
    master: tokio::sync::Mutex<()>,
}

impl SshTransport {
    /// A transport to `host` with `config`'s settings; the control socket
    /// and known_hosts live in `dir` (0700).
    pub fn new(config: &SshConfig, host: &str, dir: &std::path::Path) -> SshTransport {
        let keepalive = config.keepalive_seconds.unwrap_or(5).max(1);
        let connect = config.connect_timeout_seconds.unwrap_or(10).max(1);
        let known = config
            .known_hosts
            .clone()
            .unwrap_or_else(|| dir.join("known_hosts"));
        let mut options = vec![
            "-o".into(),
            "BatchMode=yes".into(),
            "-o".into(),
            format!("UserKnownHostsFile={}", known.display()),
            "-o".into(),
            format!(
                "StrictHostKeyChecking={}",
                config
                    .strict_host_key_checking
                    .as_deref()
                    .unwrap_or("accept-new")
            ),
            "-o".into(),
            format!("ConnectTimeout={connect}"),
            "-o".into(),
            format!("ServerAliveInterval={keepalive}"),
            "-o".into(),
            "ServerAliveCountMax=3".into(),
            "-o".into(),
            "LogLevel=ERROR".into(),
        ];
        if let Some(id) = &config.identity {
            options.extend(["-i".into(), id.display().to_string()]);
            options.extend(["-o".into(), "IdentitiesOnly=yes".into()]);
        }
        if let Some(p) = config.port {
            options.extend(["-p".into(), p.to_string()]);
        }
        if let Some(u) = &config.user {
            options.extend(["-l".into(), u.clone()]);
        }
        let ssh: PathBuf = config.ssh.clone().unwrap_or_else(|| "ssh".into());
        // The control socket is this transport's alone: everything that
        // shapes the connection (program, every option including the
        // identity, host) plus this process and a random part, so two
        // managers (or two configs for one host) never ride, or stop,
        // each other's master.
        let tag = super::short_hash(&format!(
            "{}\0{}\0{host}\0{}\0{}",
            ssh.display(),
            options.join("\0"),
            std::process::id(),
            crate::sys::random_hex(8)
        ));
        SshTransport {
            ssh,
            host: host.to_owned(),
            user: config.user.clone(),
            port: config.port,
            options,
            control_path: dir.join(format!("cm-{tag}")),
            master_log: dir.join(format!("master-{tag}.log")),
            connect_timeout: Duration::from_secs(connect),
            master: tokio::sync::Mutex::new(()),
        }
    }

    /// The argv of one command on the host (without the program).
    pub fn command_args(&self, script: &str) -> Vec<String> {
        let mut args = self.options.clone();
        args.extend([
            "-T".into(),
            "-o".into(),
            "ControlMaster=no".into(),
            "-o".into(),
            format!("ControlPath={}", self.control_path.display()),
            "--".into(),
            self.host.clone(),
            format!("sh -c {}", shell_quote(script)),
        ]);
        args
    }

    /// Start the master unless its socket is there.
    async fn ensure_master(&self) -> Result<(), ExecError> {
        let _one = self.master.lock().await;
        if self.control_path.exists() {
            return Ok(());
        }
        let log = std::fs::File::create(&self.master_log).map_err(|e| ExecError::Failed {
            what: self.describe(),
            detail: format!("cannot create {}: {e}", self.master_log.display()),
        })?;
        let mut args = self.options.clone();
        args.extend([
            "-M".into(),
            "-N".into(),
            "-f".into(),
            "-o".into(),
            "ControlPersist=600".into(),
            "-o".into(),
            format!("ControlPath={}", self.control_path.display()),
            "--".into(),
            self.host.clone(),
        ]);
        let mut cmd = tokio::process::Command::new(&self.ssh);
        cmd.args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        let what = self.describe();
        let status = tokio::time::timeout(self.connect_timeout * 2, async {
            cmd.spawn()?.wait().await
        })
        .await
        .map_err(|_| ExecError::Timeout {
            what: what.clone(),
            after: self.connect_timeout * 2,
        })?
        .map_err(|e| ExecError::Client {
            program: self.ssh.display().to_string(),
            detail: e.to_string(),
        })?;
        if !status.success() {
            let text = std::fs::read_to_string(&self.master_log).unwrap_or_default();
            return Err(ExecError::Failed {
                what,
                detail: format!("cannot connect: {}", cause(last_line(&text))),
            });
        }
        Ok(())
    }
}

impl SshTransport {
    /// What made a command fail with ssh's own status 255. ssh runs with
    /// `LogLevel=ERROR`, so a connection that drops mid-command (the
    /// server went away) ends with nothing on stderr: then one fresh
    /// connection (`true`, no master) finds out whether the host answers
    /// now, and if not, why.
    async fn why_failed(&self, line: String) -> String {
        if !line.is_empty() {
            return cause(&line);
        }
        let mut args = self.options.clone();
        args.extend([
            "-T".into(),
            "-o".into(),
            "ControlPath=none".into(),
            "--".into(),
            self.host.clone(),
            "true".into(),
        ]);
        let probe = Client {
            program: self.ssh.clone(),
            args,
            env: vec![],
        };
        let after = self.connect_timeout + Duration::from_secs(2);
        match run_client(&probe, vec![], Some(after), "ssh").await {
            Ok(o) if o.status == Some(0) => "the connection dropped while the command ran (the                  server closed it or restarted; a new connection works)"
                .to_owned(),
            Ok(o) if o.stderr_line().is_empty() => format!(
                "the connection dropped while the command ran, and a new connection fails without                  a reason (ssh exit status {:?})",
                o.status
            ),
            Ok(o) => format!(
                "the connection dropped while the command ran; a new connection fails: {}",
                cause(&o.stderr_line())
            ),
            Err(e) => format!(
                "the connection dropped while the command ran; a new connection fails: {e}"
            ),
        }
    }
}

fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
}

/// ssh's last error line, said as what failed and what to check.
fn cause(line: &str) -> String {
    let has = |s: &str| line.contains(s);
    let (what, check) = if has("Connection refused") {
        (
            "connection refused",
            "check host and port: does sshd run there?",
        )
    } else if has("timed out") {
        (
            "connection timed out",
            "check host and port: is the host up and reachable (network, firewall)?",
        )
    } else if has("Host key verification failed") || has("IDENTIFICATION HAS CHANGED") {
        (
            "host key check failed",
            "the host's key is not the one in known_hosts; if it was reinstalled, remove its old              key there (or set known_hosts / strict_host_key_checking)",
        )
    } else if has("Permission denied") || has("Too many authentication failures") {
        (
            "authentication failed",
            "check user and identity: is the key in the user's authorized_keys there?",
        )
    } else if has("Could not resolve hostname") || has("Name or service not known") {
        ("host name does not resolve", "check host")
    } else if has("No route to host") || has("Network is unreachable") {
        ("no route to the host", "check host and the network")
    } else if has("closed by") || has("Connection reset") || has("Connection closed") {
        (
            "the server closed the connection",
            "check the server's sshd log",
        )
    } else if line.is_empty() {
        return "ssh failed and said nothing (exit status 255); check host, port, user and                 identity"
            .to_owned();
    } else {
        return format!("{line}; check host, port, user and identity");
    };
    format!("{what} ({line}); {check}")
}

impl Transport for SshTransport {
    fn exec<'a>(
        &'a self,
        script: &'a str,
        stdin: Vec<u8>,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<ExecOutput, ExecError>> {
        Box::pin(async move {
            self.ensure_master().await?;
            let client = Client {
                program: self.ssh.clone(),
                args: self.command_args(script),
                env: vec![],
            };
            let out = run_client(&client, stdin, timeout, &self.describe()).await;
            if let Ok(o) = &out {
                if o.status == Some(255) {
                    // ssh's own failure: the connection, not the script.
                    let _ = std::fs::remove_file(&self.control_path);
                    return Err(ExecError::Failed {
                        what: self.describe(),
                        detail: self.why_failed(o.stderr_line()).await,
                    });
                }
            }
            out
        })
    }

    fn stream_client<'a>(
        &'a self,
        script: &'a str,
    ) -> BoxFuture<'a, Result<Option<Client>, ExecError>> {
        Box::pin(async move {
            self.ensure_master().await?;
            Ok(Some(Client {
                program: self.ssh.clone(),
                args: self.command_args(script),
                env: vec![],
            }))
        })
    }

    fn describe(&self) -> String {
        let user = self
            .user
            .as_deref()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        let port = self.port.map(|p| format!(":{p}")).unwrap_or_default();
        format!("ssh {user}{}{port}", self.host)
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _one = self.master.lock().await;
            if !self.control_path.exists() {
                let _ = std::fs::remove_file(&self.master_log);
                return;
            }
            let mut args = self.options.clone();
            args.extend([
                "-o".into(),
                format!("ControlPath={}", self.control_path.display()),
                // `stop`, not `exit`: sessions still running (a teardown
                // exec) finish; the master goes when they have.
                "-O".into(),
                "stop".into(),
                "--".into(),
                self.host.clone(),
            ]);
            let client = Client {
                program: self.ssh.clone(),
                args,
                env: vec![],
            };
            let _ = run_client(&client, vec![], Some(Duration::from_secs(5)), "ssh -O stop").await;
            let _ = std::fs::remove_file(&self.control_path);
            let _ = std::fs::remove_file(&self.master_log);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_transport_has_its_own_control_socket_and_the_host_follows_dashdash() {
        let dir = tempfile::tempdir().unwrap();
        let config = SshConfig {
            user: Some("u".into()),
            port: Some(22),
            ..SshConfig::default()
        };
        let a = SshTransport::new(&config, "h", dir.path());
        let b = SshTransport::new(&config, "h", dir.path());
        assert_ne!(a.control_path, b.control_path, "another manager's socket");
        let args = a.command_args("true");
        let dd = args.iter().position(|x| x == "--").unwrap();
        assert_eq!(args[dd + 1], "h");
    }

    #[test]
    fn an_ssh_failure_says_what_failed_and_what_to_check() {
        let c = cause("ssh: connect to host 127.0.0.1 port 2299: Connection refused");
        assert!(c.starts_with("connection refused (ssh: connect"), "{c}");
        assert!(
            c.ends_with("check host and port: does sshd run there?"),
            "{c}"
        );
        assert!(cause("Host key verification failed.").starts_with("host key check failed"));
        assert!(cause("u@h: Permission denied (publickey).").starts_with("authentication failed"));
        assert!(
            cause("ssh: connect to host h port 22: Connection timed out")
                .starts_with("connection timed out")
        );
        assert!(cause("").contains("said nothing"));
    }
}
