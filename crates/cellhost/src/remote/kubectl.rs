//! `kubectl exec -i POD [-c CONTAINER] [-n NS] [--context C] -- sh -c …`.
//!
//! No cluster exists in cellhost's test environment: the argv is tested
//! as text, and the exec contract through a stand-in `kubectl` that
//! forwards to `docker exec` (see docs/remote.md).

use std::path::PathBuf;
use std::time::Duration;

use super::transport::{run_client, BoxFuture, Client, ExecError, ExecOutput, Transport};
use crate::config::KubectlConfig;

/// Runs scripts in one pod (and container) with `kubectl exec -i`.
#[derive(Debug, Clone)]
pub struct KubectlTransport {
    kubectl: PathBuf,
    pod: String,
    container: Option<String>,
    namespace: Option<String>,
    context: Option<String>,
}

impl KubectlTransport {
    /// A transport for `config`'s pod, container, namespace and context
    /// (`kubectl` from PATH unless `config.kubectl` names it). Nothing is
    /// run until the first exec.
    pub fn new(config: &KubectlConfig) -> KubectlTransport {
        KubectlTransport {
            kubectl: config.kubectl.clone().unwrap_or_else(|| "kubectl".into()),
            pod: config.pod.clone(),
            container: config.container.clone(),
            namespace: config.namespace.clone(),
            context: config.context.clone(),
        }
    }

    /// The argv after the program.
    pub fn command_args(&self, script: &str) -> Vec<String> {
        let mut args = vec!["exec".into(), "-i".into(), self.pod.clone()];
        if let Some(c) = &self.container {
            args.extend(["-c".into(), c.clone()]);
        }
        if let Some(n) = &self.namespace {
            args.extend(["-n".into(), n.clone()]);
        }
        if let Some(c) = &self.context {
            args.extend(["--context".into(), c.clone()]);
        }
        args.extend(["--".into(), "sh".into(), "-c".into(), script.into()]);
        args
    }
}

impl Transport for KubectlTransport {
    fn exec<'a>(
        &'a self,
        script: &'a str,
        stdin: Vec<u8>,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<ExecOutput, ExecError>> {
        Box::pin(async move {
            let client = Client {
                program: self.kubectl.clone(),
                args: self.command_args(script),
                env: vec![],
            };
            run_client(&client, stdin, timeout, &self.describe()).await
        })
    }

    fn stream_client<'a>(
        &'a self,
        script: &'a str,
    ) -> BoxFuture<'a, Result<Option<Client>, ExecError>> {
        Box::pin(async move {
            Ok(Some(Client {
                program: self.kubectl.clone(),
                args: self.command_args(script),
                env: vec![],
            }))
        })
    }

    fn describe(&self) -> String {
        format!("kubectl exec {}", self.pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argv_names_pod_container_namespace_and_context() {
        let t = KubectlTransport::new(&KubectlConfig {
            pod: "worker-0".into(),
            container: Some("py".into()),
            namespace: Some("agents".into()),
            context: Some("prod".into()),
            ..KubectlConfig::default()
        });
        assert_eq!(
            t.command_args("echo hi"),
            [
                "exec",
                "-i",
                "worker-0",
                "-c",
                "py",
                "-n",
                "agents",
                "--context",
                "prod",
                "--",
                "sh",
                "-c",
                "echo hi"
            ]
        );
        let bare = KubectlTransport::new(&KubectlConfig {
            pod: "p".into(),
            ..KubectlConfig::default()
        });
        assert_eq!(
            bare.command_args("x"),
            ["exec", "-i", "p", "--", "sh", "-c", "x"]
        );
    }
}
