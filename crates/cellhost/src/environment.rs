//! What code in a new session's kernel runs in, told to the model (the MCP
//! `execute_code` description) and to HTTP clients (`GET /v1/environment`):
//! the Python version, the sandbox profile and network mode, the working
//! directory, the agent's dialect (`!cmd`, `%pip`, the magics) and the
//! notable packages that are importable.
//!
//! The interpreter is asked once: a subprocess of it prints its version
//! and runs `importlib.util.find_spec` over [`NOTABLE_PACKAGES`] (which
//! finds a package without importing it), with the kernels' environment,
//! from `/` so nothing in a working dir can stand in for a package. The
//! answer is cached per interpreter for the life of the process; a failed
//! probe is not cached (the next call asks again) and leaves the version
//! and packages out.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

pub use cellhost_protocol::Environment;

use crate::env::ChildEnv;
use crate::interpreter::Interpreter;
use crate::registry::ManagerOptions;
use crate::sandbox::WORKSPACE_IN_SANDBOX;

/// Import names a model is told about when importable, in this order.
pub const NOTABLE_PACKAGES: &[&str] = &[
    "numpy",
    "pandas",
    "matplotlib",
    "scipy",
    "sklearn",
    "seaborn",
    "plotly",
    "statsmodels",
    "sympy",
    "networkx",
    "polars",
    "pyarrow",
    "duckdb",
    "sqlalchemy",
    "PIL",
    "cv2",
    "torch",
    "tensorflow",
    "jax",
    "requests",
    "httpx",
    "bs4",
    "lxml",
    "openpyxl",
    "yaml",
    "tabulate",
    "tqdm",
];

/// The dialect a cell may use (runner/dialect.py is what implements it; a
/// test keeps the two in step).
pub const MAGICS: &[&str] = &[
    "!cmd",
    "x = !cmd",
    "%pip install|uninstall|list|show",
    "%cd",
    "%pwd",
    "%env",
    "%time",
    "%timeit",
    "%who",
    "%matplotlib inline",
    "%%bash",
    "%%sh",
    "%%writefile",
    "%%time",
    "%%timeit",
];

/// How long the probe may take (a cold interpreter on a busy host).
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// Prints the version, then each importable name of its arguments.
const PROBE: &str = "import sys, importlib.util as u
print('%d.%d.%d' % sys.version_info[:3])
for n in sys.argv[1:]:
    try:
        if u.find_spec(n) is not None:
            print(n)
    except Exception:
        pass
";

#[derive(Debug, Clone)]
struct Probe {
    version: String,
    packages: Vec<String>,
}

/// The environment of a new session's kernel under these options.
pub async fn describe(opts: &ManagerOptions) -> Environment {
    let backend = opts
        .default_backend
        .clone()
        .filter(|b| b != "local")
        .unwrap_or_else(|| "local".to_owned());
    let kernel = &opts.kernel;
    if backend != "local" {
        let mut env = Environment {
            backend,
            sandbox: "remote".to_owned(),
            network: "unknown".to_owned(),
            magics: MAGICS.iter().map(|m| (*m).to_owned()).collect(),
            ..Environment::default()
        };
        env.summary = summary(&env);
        return env;
    }
    let strict = kernel.sandbox.is_strict();
    let cwd = match (&kernel.cwd, strict) {
        (Some(c), _) => Some(c.display().to_string()),
        (None, true) => Some(WORKSPACE_IN_SANDBOX.to_owned()),
        (None, false) => std::env::current_dir()
            .ok()
            .map(|c| c.display().to_string()),
    };
    let probe = match Interpreter::resolve(kernel.python.as_deref()) {
        Ok(python) => probe(python.path(), &kernel.env, strict).await.ok(),
        Err(_) => None,
    };
    let mut env = Environment {
        backend,
        python_version: probe.as_ref().map(|p| p.version.clone()),
        sandbox: kernel.sandbox.name().to_owned(),
        network: kernel.sandbox.network_mode().to_owned(),
        cwd,
        magics: MAGICS.iter().map(|m| (*m).to_owned()).collect(),
        packages: probe.map(|p| p.packages).unwrap_or_default(),
        summary: String::new(),
    };
    env.summary = summary(&env);
    env
}

/// The paragraph a model reads.
pub fn summary(env: &Environment) -> String {
    let mut s = String::from("Environment: ");
    match &env.python_version {
        Some(v) => s.push_str(&format!("Python {v}")),
        None => s.push_str("Python"),
    }
    if env.backend != "local" {
        s.push_str(&format!(
            " on the remote backend {:?} (ask `import sys; sys.version` for details).",
            env.backend
        ));
    } else {
        s.push_str(&format!(", sandbox profile {:?}", env.sandbox));
        s.push_str(&match env.network.as_str() {
            "off" => ", network off (no internet access from code; packages still install \
                      with `%pip install NAME`)"
                .to_owned(),
            "allowlist" => {
                ", network only to allow-listed hosts (through cellhost's proxy)".to_owned()
            }
            other => format!(", network {other:?}"),
        });
        s.push('.');
        if let Some(cwd) = &env.cwd {
            if cwd == WORKSPACE_IN_SANDBOX {
                s.push_str(&format!(
                    " The working directory is {cwd}: files written there persist for the session."
                ));
            } else {
                s.push_str(&format!(" The working directory is {cwd}."));
            }
        }
    }
    s.push_str(
        " Cells also take IPython's dialect: `!cmd` runs a shell command (output streams, the \
         status is in `_exit_code`, `files = !ls` captures the lines; `{expr}` and `$name` \
         expand), `%pip install NAME` installs a package for this session, and ",
    );
    let magics: Vec<&str> = env
        .magics
        .iter()
        .map(String::as_str)
        .filter(|m| m.starts_with('%') && !m.starts_with("%pip"))
        .collect();
    s.push_str(&magics.join(", "));
    s.push_str(" work. Matplotlib figures come back as images.");
    if !env.packages.is_empty() {
        s.push_str(&format!(" Importable: {}.", env.packages.join(", ")));
    }
    s
}

async fn probe(python: &Path, env: &ChildEnv, strict: bool) -> Result<Probe, String> {
    static CACHE: OnceLock<Mutex<HashMap<(PathBuf, bool), Probe>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (python.to_path_buf(), strict);
    if let Some(hit) = cache.lock().expect("probe cache").get(&key) {
        return Ok(hit.clone());
    }
    let mut cmd = tokio::process::Command::new(python);
    if strict {
        cmd.arg("-s"); // as strict kernels run: no user site dir
    }
    cmd.arg("-c")
        .arg(PROBE)
        .args(NOTABLE_PACKAGES)
        .env_clear()
        .envs(env.vars.iter().map(|(k, v)| (k, v)))
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(PROBE_TIMEOUT, cmd.output())
        .await
        .map_err(|_| {
            format!(
                "{} did not answer within {PROBE_TIMEOUT:?}",
                python.display()
            )
        })?
        .map_err(|e| format!("could not run {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!("{} exited with {}", python.display(), out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let version = lines
        .next()
        .filter(|v| v.split('.').all(|p| p.parse::<u32>().is_ok()))
        .ok_or_else(|| format!("{} printed no version", python.display()))?
        .to_owned();
    let found: Vec<&str> = lines.collect();
    let packages = NOTABLE_PACKAGES
        .iter()
        .filter(|n| found.contains(n))
        .map(|n| (*n).to_owned())
        .collect();
    let p = Probe { version, packages };
    cache.lock().expect("probe cache").insert(key, p.clone());
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_magics_named_are_the_ones_the_runner_supports() {
        let dialect = include_str!("runner/dialect.py");
        for m in MAGICS {
            let name = m
                .trim_start_matches('%')
                .split([' ', '|'])
                .next()
                .unwrap_or("");
            if m.starts_with('%') {
                assert!(
                    dialect.contains(&format!("\"{name}\"")),
                    "{m} is told to the model but dialect.py does not name {name:?}"
                );
            }
        }
    }

    #[test]
    fn the_summary_says_network_workspace_and_pip() {
        let env = Environment {
            backend: "local".into(),
            python_version: Some("3.11.7".into()),
            sandbox: "strict".into(),
            network: "off".into(),
            cwd: Some("/workspace".into()),
            magics: MAGICS.iter().map(|m| (*m).to_owned()).collect(),
            packages: vec!["numpy".into(), "pandas".into()],
            summary: String::new(),
        };
        let s = summary(&env);
        for part in [
            "Python 3.11.7",
            "\"strict\"",
            "network off",
            "/workspace",
            "%pip install NAME",
            "!cmd",
            "%cd",
            "%%bash",
            "Importable: numpy, pandas.",
        ] {
            assert!(s.contains(part), "{part:?} missing from {s}");
        }
    }
}
