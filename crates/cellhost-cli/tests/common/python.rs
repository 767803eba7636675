//! The test venvs' interpreters and the Python scenario scripts the tests
//! drive real clients with (each prints `OK <scenario>` when its
//! assertions held).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The interpreter `var` names (`CELLHOST_TEST_VENV_PYTHON`,
/// `CELLHOST_JUPYTER_VENV_PYTHON`). Fails, never skips, without it.
pub(crate) fn venv(var: &str) -> PathBuf {
    let path = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        panic!("{var} is not set: run the tests with scripts/test, which builds the venvs")
    });
    assert!(path.exists(), "{} does not exist", path.display());
    path
}

/// The test venv's interpreter (numpy, matplotlib, the MCP, OpenAI and
/// Anthropic SDKs, and the Python client from its wheel).
pub(crate) fn test_venv() -> PathBuf {
    venv("CELLHOST_TEST_VENV_PYTHON")
}

/// Run `script` with `args` on `python`: it must exit 0 and print
/// `OK <args[0]>`.
pub(crate) fn scenario(python: &Path, script: &Path, args: &[&str]) {
    let out = Command::new(python)
        .arg(script)
        .args(args)
        .env_remove("CELLHOST_URL")
        .env_remove("CELLHOST_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(&format!("OK {}", args[0])),
        "scenario {} of {} failed ({}):\n{stdout}\n{stderr}",
        args[0],
        script.display(),
        out.status
    );
}
