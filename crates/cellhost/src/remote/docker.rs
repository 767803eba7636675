//! `docker exec -i CONTAINER sh -c …` through the docker CLI.
//!
//! With `container` the kernel runs in an existing container. With
//! `image` each kernel gets its own container (`docker run -d IMAGE sleep
//! infinity`, plus `run_args`, default `--network none`), removed
//! (`docker rm -f`) when the kernel is shut down.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use super::transport::{run_client, BoxFuture, Client, ExecError, ExecOutput, Transport};
use crate::config::DockerConfig;

#[derive(Debug)]
pub struct DockerTransport {
    docker: PathBuf,
    env: Vec<(String, String)>,
    container: String,
    user: Option<String>,
    /// Started for this kernel: removed at shutdown.
    owned: Mutex<bool>,
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
    /// from `config.image` for one kernel.
    pub async fn connect(
        config: &DockerConfig,
        timeout: Duration,
    ) -> Result<DockerTransport, ExecError> {
        let (docker, env) = Self::client(config);
        let (container, owned) = match (&config.container, &config.image) {
            (Some(c), _) => (c.clone(), false),
            (None, Some(image)) => {
                let mut args = vec!["run".to_owned(), "-d".to_owned()];
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
        })
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

    pub fn container(&self) -> &str {
        &self.container
    }
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
            // 125-127: docker itself failed (no such container, daemon gone).
            if matches!(out.status, Some(125..=127)) && out.stdout.is_empty() {
                return Err(ExecError::Failed {
                    what: self.describe(),
                    detail: out.stderr_line(),
                });
            }
            Ok(out)
        })
    }

    fn describe(&self) -> String {
        format!(
            "docker exec {}",
            &self.container[..self.container.len().min(12)]
        )
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
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
