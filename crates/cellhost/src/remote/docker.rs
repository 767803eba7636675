//! `docker exec -i CONTAINER sh -c …` through the docker CLI.
//!
//! With `container` the kernel runs in an existing container. With
//! `image` each kernel gets its own container (`docker run -d IMAGE sleep
//! infinity`, plus `run_args`, default `--network none`), removed
//! (`docker rm -f`) when the kernel is shut down (or its transport
//! dropped). Such containers carry the label `cellhost.manager=ID`, and
//! the manager's shutdown removes any of its own that are left.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use super::transport::{run_client, BoxFuture, Client, ExecError, ExecOutput, Transport};
use crate::config::DockerConfig;

/// The label of containers started for a kernel: the manager's id.
pub(super) const LABEL: &str = "cellhost.manager";

/// Remove every container labelled as started by `manager`.
pub(super) async fn remove_labelled(config: &DockerConfig, manager: &str) {
    let (docker, env) = DockerTransport::client(config);
    let list = Client {
        program: docker.clone(),
        args: vec![
            "ps".into(),
            "-aq".into(),
            "--filter".into(),
            format!("label={LABEL}={manager}"),
        ],
        env: env.clone(),
    };
    let Ok(out) = run_client(&list, vec![], Some(Duration::from_secs(30)), "docker ps").await
    else {
        return;
    };
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if ids.is_empty() {
        return;
    }
    let mut args = vec!["rm".to_owned(), "-f".to_owned()];
    args.extend(ids);
    let rm = Client {
        program: docker,
        args,
        env,
    };
    let _ = run_client(&rm, vec![], Some(Duration::from_secs(30)), "docker rm").await;
}

/// Runs scripts in one container with `docker exec -i`: an existing
/// container, or one started for a single kernel (image mode) and removed
/// with it.
#[derive(Debug)]
pub struct DockerTransport {
    docker: PathBuf,
    env: Vec<(String, String)>,
    container: String,
    user: Option<String>,
    /// Started for this kernel: removed at shutdown.
    owned: Mutex<bool>,
    /// The session's workspace volume mounted here: file operations exec
    /// into this container while it is up (told when it goes).
    volume: Option<(super::dockervol::Made, String)>,
}

impl DockerTransport {
    fn client(config: &DockerConfig) -> (PathBuf, Vec<(String, String)>) {
        let docker = config.docker.clone().unwrap_or_else(|| "docker".into());
        let env = config
            .docker_host
            .iter()
            .map(|h| ("DOCKER_HOST".to_owned(), h.clone()))
            .collect();
        (docker, env)
    }

    /// A transport into `config.container`, or into a container started
    /// from `config.image` for one kernel (with the session's workspace
    /// volume `volume` mounted, when it has one).
    pub async fn connect(
        config: &DockerConfig,
        timeout: Duration,
        manager: &str,
        volume: Option<&str>,
    ) -> Result<DockerTransport, ExecError> {
        let (docker, env) = Self::client(config);
        let (container, owned) = match (&config.container, &config.image) {
            (Some(c), _) => (c.clone(), false),
            (None, Some(image)) => {
                let mut args = vec![
                    "run".to_owned(),
                    "-d".to_owned(),
                    "--label".to_owned(),
                    format!("{LABEL}={manager}"),
                ];
                if let Some(v) = volume {
                    args.extend(["--mount".into(), super::dockervol::mount_arg(v)]);
                }
                args.extend(
                    config
                        .run_args
                        .clone()
                        .unwrap_or_else(|| vec!["--network".into(), "none".into()]),
                );
                args.extend([image.clone(), "sleep".into(), "infinity".into()]);
                let client = Client {
                    program: docker.clone(),
                    args,
                    env: env.clone(),
                };
                let out = run_client(&client, vec![], Some(timeout), "docker run").await?;
                let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                if out.status != Some(0) || id.is_empty() {
                    return Err(ExecError::Failed {
                        what: format!("docker run {image}"),
                        detail: format!(
                            "{}; check the image name and that dockerd is reachable",
                            out.stderr_line()
                        ),
                    });
                }
                (id, true)
            }
            (None, None) => {
                return Err(ExecError::Failed {
                    what: "docker".into(),
                    detail: "no container or image configured".into(),
                })
            }
        };
        Ok(DockerTransport {
            docker,
            env,
            container,
            user: config.user.clone(),
            owned: Mutex::new(owned),
            volume: None,
        })
    }

    /// A transport into the existing `container` with `config`'s client,
    /// user and daemon (no `docker run`).
    pub(crate) fn existing_of(config: &DockerConfig, container: &str) -> DockerTransport {
        let (docker, env) = Self::client(config);
        DockerTransport {
            docker,
            env,
            container: container.to_owned(),
            user: config.user.clone(),
            owned: Mutex::new(false),
            volume: None,
        }
    }

    /// A transport into an existing container (for tests).
    #[cfg(test)]
    fn existing(container: &str) -> DockerTransport {
        DockerTransport {
            docker: "docker".into(),
            env: vec![],
            container: container.to_owned(),
            user: None,
            owned: Mutex::new(false),
            volume: None,
        }
    }

    /// The argv after the program.
    pub fn command_args(&self, script: &str) -> Vec<String> {
        let mut args = vec!["exec".into(), "-i".into()];
        if let Some(u) = &self.user {
            args.extend(["-u".into(), u.clone()]);
        }
        args.extend([
            self.container.clone(),
            "sh".into(),
            "-c".into(),
            script.into(),
        ]);
        args
    }

    /// The container's name or id (the id `docker run` printed, in image
    /// mode).
    pub fn container(&self) -> &str {
        &self.container
    }

    /// File operations on `volume` may exec into this container until it
    /// is shut down or dropped.
    pub(crate) fn track(&mut self, made: super::dockervol::Made, volume: String) {
        made.up(&volume, &self.container);
        self.volume = Some((made, volume));
    }

    fn untrack(&self) {
        if let Some((made, v)) = &self.volume {
            made.down(v, &self.container);
        }
    }
}

/// Docker itself failed, so the script never ran: exit 125-127 (no such
/// container, the daemon gone or refusing) with nothing on stdout.
pub(super) fn docker_failed(out: &ExecOutput) -> bool {
    matches!(out.status, Some(125..=127)) && out.stdout.is_empty()
}

/// `out`, or the transport error [`docker_failed`] means (`what` names
/// the transport).
pub(super) fn docker_checked(out: ExecOutput, what: String) -> Result<ExecOutput, ExecError> {
    if docker_failed(&out) {
        return Err(ExecError::Failed {
            what,
            detail: out.stderr_line(),
        });
    }
    Ok(out)
}

impl Transport for DockerTransport {
    fn exec<'a>(
        &'a self,
        script: &'a str,
        stdin: Vec<u8>,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<ExecOutput, ExecError>> {
        Box::pin(async move {
            let client = Client {
                program: self.docker.clone(),
                args: self.command_args(script),
                env: self.env.clone(),
            };
            let out = run_client(&client, stdin, timeout, &self.describe()).await?;
            docker_checked(out, self.describe())
        })
    }

    fn stream_client<'a>(
        &'a self,
        script: &'a str,
    ) -> BoxFuture<'a, Result<Option<Client>, ExecError>> {
        Box::pin(async move {
            Ok(Some(Client {
                program: self.docker.clone(),
                args: self.command_args(script),
                env: self.env.clone(),
            }))
        })
    }

    fn describe(&self) -> String {
        // By chars: a configured container name may be any text.
        format!(
            "docker exec {}",
            self.container.chars().take(12).collect::<String>()
        )
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.untrack();
            let owned = std::mem::take(&mut *self.owned.lock().unwrap_or_else(|e| e.into_inner()));
            if owned {
                let client = Client {
                    program: self.docker.clone(),
                    args: vec!["rm".into(), "-f".into(), self.container.clone()],
                    env: self.env.clone(),
                };
                let _ =
                    run_client(&client, vec![], Some(Duration::from_secs(30)), "docker rm").await;
            }
        })
    }
}

impl Drop for DockerTransport {
    /// A kernel's own container still there (its shutdown never ran):
    /// removed in the background.
    fn drop(&mut self) {
        self.untrack();
        let owned = std::mem::take(&mut *self.owned.lock().unwrap_or_else(|e| e.into_inner()));
        if owned {
            let _ = std::process::Command::new(&self.docker)
                .args(["rm", "-f", &self.container])
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_cuts_a_non_ascii_name_by_chars() {
        let t = DockerTransport::existing("ééééééééééééééé");
        assert_eq!(t.describe(), format!("docker exec {}", "é".repeat(12)));
    }
}
