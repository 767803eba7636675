//! The workspace of a session on an image-mode docker backend: a named
//! docker volume per session, so its files outlive the container of each
//! kernel (issue 16: a remote workspace outlives the runner).
//!
//! The volume (`cellhost-ws-<scope hash>-<session hash>`, labelled
//! `cellhost.workspace=<scope>` so a sweep finds a manager's volumes) is
//! mounted at [`MOUNT`] in every kernel container of the session, and the
//! workspace helper's base is [`MOUNT`], so the tree inside is the one
//! other backends have under their temp dir. A file operation runs in a
//! kernel container of the session that is up (`docker exec -i`), else
//! in a short-lived container of the same image on the same volume
//! (`docker run --rm -i … IMAGE sh -c …`, the backend's `run_args` and
//! `user` too; about 4× the latency of an exec): so it works before the
//! first cell and between kernels. An exec that docker could not start
//! (the container went in between) runs again in a short-lived one.
//! Disposing the session removes the volume.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::docker::LABEL;
use super::transport::{run_client, BoxFuture, Client, ExecError, ExecOutput, Transport};
use crate::config::DockerConfig;

/// Where the volume is mounted in every container (the helper's base).
pub(crate) const MOUNT: &str = "/cellhost-ws";
/// The label naming the manager scope (a hash of its data dir) a
/// workspace volume belongs to.
pub(crate) const WS_LABEL: &str = "cellhost.workspace";

/// The volume of `owner`'s session (children share their session's: their
/// workspaces nest under its home, as on other backends).
pub(crate) fn volume_name(scope: &str, owner: &str) -> String {
    let session = crate::owner::session_of(owner);
    let s = super::short_hash(scope);
    format!("cellhost-ws-{}-{}", &s[..12], super::short_hash(session))
}

/// `--mount` of `volume` at [`MOUNT`].
pub(crate) fn mount_arg(volume: &str) -> String {
    format!("type=volume,src={volume},dst={MOUNT}")
}

fn client(config: &DockerConfig, args: Vec<String>) -> Client {
    Client {
        program: config.docker.clone().unwrap_or_else(|| "docker".into()),
        args,
        env: config
            .docker_host
            .iter()
            .map(|h| ("DOCKER_HOST".to_owned(), h.clone()))
            .collect(),
    }
}

#[derive(Debug, Default)]
struct Known {
    /// Volumes known to exist (made by this process), so each is created
    /// (and labelled) once, not before every operation.
    made: HashSet<String>,
    /// Volume -> the kernel containers up with it mounted.
    up: HashMap<String, Vec<String>>,
}

/// What this manager knows of its workspace volumes. Cheap to clone.
#[derive(Debug, Default, Clone)]
pub(crate) struct Made(Arc<Mutex<Known>>);

impl Made {
    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn has(&self, v: &str) -> bool {
        self.known().made.contains(v)
    }
    fn add(&self, v: &str) {
        self.known().made.insert(v.to_owned());
    }
    fn forget(&self, v: &str) {
        self.known().made.remove(v);
    }
    /// Kernel container `c` is up with volume `v` mounted.
    pub(crate) fn up(&self, v: &str, c: &str) {
        self.known()
            .up
            .entry(v.to_owned())
            .or_default()
            .push(c.to_owned());
    }
    /// Kernel container `c` is going (called before it is removed).
    pub(crate) fn down(&self, v: &str, c: &str) {
        let mut k = self.known();
        if let Some(list) = k.up.get_mut(v) {
            list.retain(|x| x != c);
            if list.is_empty() {
                k.up.remove(v);
            }
        }
    }
    fn container_of(&self, v: &str) -> Option<String> {
        self.known().up.get(v).and_then(|l| l.last().cloned())
    }
}

/// Create the labelled volume (idempotent). With a `user`, its root is
/// made 1777 (as /tmp) by a root container once, so the user can make its
/// private `cellhost-ws-<uid>` dir in it.
///
/// # Errors
/// [`ExecError`] when docker fails.
pub(crate) async fn ensure(
    config: &DockerConfig,
    made: &Made,
    scope: &str,
    volume: &str,
    timeout: Duration,
) -> Result<(), ExecError> {
    if made.has(volume) {
        return Ok(());
    }
    let create = client(
        config,
        vec![
            "volume".into(),
            "create".into(),
            "--label".into(),
            format!("{WS_LABEL}={scope}"),
            volume.into(),
        ],
    );
    let out = run_client(&create, vec![], Some(timeout), "docker volume create").await?;
    if out.status != Some(0) {
        return Err(ExecError::Failed {
            what: format!("docker volume create {volume}"),
            detail: out.stderr_line(),
        });
    }
    if config.user.is_some() {
        let mut args = vec![
            "run".into(),
            "--rm".into(),
            "-u".into(),
            "0".into(),
            "--mount".into(),
            mount_arg(volume),
            "--entrypoint".into(),
            "chmod".into(),
        ];
        args.extend(run_args(config));
        args.extend([image(config), "1777".into(), MOUNT.into()]);
        let out = run_client(&client(config, args), vec![], Some(timeout), "docker run").await?;
        if out.status != Some(0) {
            return Err(ExecError::Failed {
                what: format!("docker run (open the workspace volume {volume} to its user)"),
                detail: out.stderr_line(),
            });
        }
    }
    made.add(volume);
    Ok(())
}

/// Remove the volume (best effort: a volume still in use stays, and says
/// so on the daemon's stderr).
pub(crate) async fn remove(config: &DockerConfig, made: &Made, volume: &str) {
    made.forget(volume);
    let rm = client(config, vec!["volume".into(), "rm".into(), volume.into()]);
    match run_client(
        &rm,
        vec![],
        Some(Duration::from_secs(30)),
        "docker volume rm",
    )
    .await
    {
        Ok(out) if out.status == Some(0) => {}
        Ok(out) if out.stderr_line().contains("no such volume") => {}
        Ok(out) => eprintln!(
            "cellhost: the workspace volume {volume} could not be removed: {}",
            out.stderr_line()
        ),
        Err(e) => eprintln!("cellhost: the workspace volume {volume} could not be removed: {e}"),
    }
}

fn run_args(config: &DockerConfig) -> Vec<String> {
    config
        .run_args
        .clone()
        .unwrap_or_else(|| vec!["--network".into(), "none".into()])
}

fn image(config: &DockerConfig) -> String {
    config.image.clone().unwrap_or_default()
}

/// Runs each exec in a fresh `docker run --rm -i` container of the image
/// with the session's volume mounted.
#[derive(Debug)]
pub(crate) struct VolumeTransport {
    config: DockerConfig,
    made: Made,
    scope: String,
    volume: String,
    /// `cellhost.manager` label: a container a killed client left is
    /// removed at the manager's shutdown.
    manager: String,
    timeout: Duration,
}

impl VolumeTransport {
    pub(crate) fn new(
        config: &DockerConfig,
        made: Made,
        scope: &str,
        owner: &str,
        manager: &str,
        timeout: Duration,
    ) -> VolumeTransport {
        VolumeTransport {
            config: config.clone(),
            made,
            scope: scope.to_owned(),
            volume: volume_name(scope, owner),
            manager: manager.to_owned(),
            timeout,
        }
    }

    /// `docker exec -i` into a kernel container of the session that is up.
    fn exec_client(&self, script: &str) -> Option<Client> {
        let c = self.made.container_of(&self.volume)?;
        let mut args: Vec<String> = vec!["exec".into(), "-i".into()];
        if let Some(u) = &self.config.user {
            args.extend(["-u".into(), u.clone()]);
        }
        args.extend([c, "sh".into(), "-c".into(), script.into()]);
        Some(client(&self.config, args))
    }

    /// `docker run --rm -i` of a short-lived container on the volume.
    async fn run_client_for(&self, script: &str) -> Result<Client, ExecError> {
        ensure(
            &self.config,
            &self.made,
            &self.scope,
            &self.volume,
            self.timeout,
        )
        .await?;
        let mut args: Vec<String> = vec![
            "run".into(),
            "--rm".into(),
            "-i".into(),
            "--label".into(),
            format!("{LABEL}={}", self.manager),
            "--mount".into(),
            mount_arg(&self.volume),
        ];
        if let Some(u) = &self.config.user {
            args.extend(["-u".into(), u.clone()]);
        }
        args.extend(run_args(&self.config));
        args.extend([image(&self.config), "sh".into(), "-c".into(), script.into()]);
        Ok(client(&self.config, args))
    }
}

impl Transport for VolumeTransport {
    fn exec<'a>(
        &'a self,
        script: &'a str,
        stdin: Vec<u8>,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<ExecOutput, ExecError>> {
        Box::pin(async move {
            // docker itself failed (or the daemon refused: the container
            // went or stopped): the script never ran, so it runs again in
            // a container of its own.
            let failed = super::docker::docker_failed;
            if let Some(client) = self.exec_client(script) {
                let out = run_client(&client, stdin.clone(), timeout, &self.describe()).await?;
                let refused = out.stdout.is_empty()
                    && String::from_utf8_lossy(&out.stderr).contains("Error response from daemon");
                if !failed(&out) && !refused {
                    return Ok(out);
                }
            }
            let client = self.run_client_for(script).await?;
            let out = run_client(&client, stdin, timeout, &self.describe()).await?;
            super::docker::docker_checked(out, self.describe())
        })
    }

    fn stream_client<'a>(
        &'a self,
        script: &'a str,
    ) -> BoxFuture<'a, Result<Option<Client>, ExecError>> {
        Box::pin(async move {
            match self.exec_client(script) {
                Some(c) => Ok(Some(c)),
                None => self.run_client_for(script).await.map(Some),
            }
        })
    }

    fn describe(&self) -> String {
        format!("docker volume {}", self.volume)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_and_its_children_share_one_volume_per_scope() {
        let a = volume_name("scope1", "s1");
        assert_eq!(a, volume_name("scope1", "s1::child::c"));
        assert_ne!(a, volume_name("scope2", "s1"));
        assert_ne!(a, volume_name("scope1", "s2"));
        assert!(a.starts_with("cellhost-ws-") && a.len() <= 64, "{a}");
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }
}
