//! Finding the Python interpreter a kernel runs on.
//!
//! `python3` on PATH is often a shim (pyenv, asdf) that re-resolves the real
//! binary on every start, at 60–100 ms a time. We resolve once per host
//! process: a path that already names a native executable is used as given
//! (a venv's `bin/python` symlink is kept, so the venv's site-packages stay
//! importable); anything else (a shell-script shim) is asked once for
//! `sys.executable`.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// A resolved interpreter: a real executable, ready to spawn directly.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Interpreter {
    path: PathBuf,
}

/// Why no usable interpreter was found.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum InterpreterError {
    /// A bare name (`python3`) matched no executable file in any `PATH`
    /// directory.
    #[error("no `{name}` found on PATH; install Python 3.8+ or pass --python PATH")]
    NotOnPath {
        /// The name looked up.
        name: String,
    },
    /// The path (or what `PATH` gave) is missing or has no execute bit.
    #[error("python interpreter {path} does not exist or is not executable; pass --python PATH")]
    NotExecutable {
        /// The absolute path checked.
        path: PathBuf,
    },
    /// A script (a pyenv or asdf shim) was run to learn its
    /// `sys.executable`, and that failed: it could not be started, exited
    /// non-zero, or printed no executable path.
    #[error("failed to ask {path} for its real executable: {reason}")]
    Probe {
        /// The script that was run.
        path: PathBuf,
        /// What went wrong (the OS error, or its exit status and stderr).
        reason: String,
    },
}

impl Interpreter {
    /// Resolve `python` (a path, or a bare name looked up on PATH). Results
    /// are cached per input for the life of the process.
    pub fn resolve(python: Option<&Path>) -> Result<Interpreter, InterpreterError> {
        let requested = Self::requested(python);
        if let Some(hit) = Self::cache()
            .lock()
            .expect("interpreter cache")
            .get(&requested)
        {
            return Ok(hit.clone());
        }
        let found = Self::resolve_uncached(&requested)?;
        Self::cache()
            .lock()
            .expect("interpreter cache")
            .insert(requested, found.clone());
        Ok(found)
    }

    /// [`Interpreter::resolve`]'s answer when it is known already (no file
    /// is looked at and nothing runs: callable from async code).
    pub fn resolved(python: Option<&Path>) -> Option<Interpreter> {
        let requested = Self::requested(python);
        Self::cache()
            .lock()
            .expect("interpreter cache")
            .get(&requested)
            .cloned()
    }

    fn requested(python: Option<&Path>) -> PathBuf {
        match python {
            Some(p) => p.to_path_buf(),
            None => std::env::var_os("CELLHOST_PYTHON")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("python3")),
        }
    }

    fn cache() -> &'static Mutex<HashMap<PathBuf, Interpreter>> {
        static CACHE: OnceLock<Mutex<HashMap<PathBuf, Interpreter>>> = OnceLock::new();
        CACHE.get_or_init(Default::default)
    }

    fn resolve_uncached(requested: &Path) -> Result<Interpreter, InterpreterError> {
        let path = if requested.components().count() == 1 && !requested.is_absolute() {
            find_on_path(requested).ok_or_else(|| InterpreterError::NotOnPath {
                name: requested.display().to_string(),
            })?
        } else {
            std::path::absolute(requested).unwrap_or_else(|_| requested.to_path_buf())
        };
        if !is_executable(&path) {
            return Err(InterpreterError::NotExecutable { path });
        }
        if is_native_binary(&path) {
            return Ok(Interpreter { path });
        }
        // A script (shim): ask it once where the real interpreter lives.
        let out = std::process::Command::new(&path)
            .args(["-c", "import sys; sys.stdout.write(sys.executable)"])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| InterpreterError::Probe {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        let real = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if !out.status.success() || real.as_os_str().is_empty() || !is_executable(&real) {
            return Err(InterpreterError::Probe {
                path,
                reason: format!(
                    "it exited with {} and printed {:?}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(Interpreter { path: real })
    }

    /// Use `path` as is, without probing (tests, callers that know).
    pub fn from_path(path: impl Into<PathBuf>) -> Interpreter {
        Interpreter { path: path.into() }
    }

    /// The executable to spawn: a native binary (or a venv's symlink to
    /// one, kept so the venv's site-packages stay importable), or the path
    /// given to [`Interpreter::from_path`] unchecked.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn find_on_path(name: &Path) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// ELF or Mach-O magic (following symlinks): spawnable without a shell.
fn is_native_binary(p: &Path) -> bool {
    let mut magic = [0u8; 4];
    match std::fs::File::open(p).and_then(|mut f| f.read_exact(&mut magic)) {
        Ok(()) => {
            magic == *b"\x7fELF"
                || magic == [0xcf, 0xfa, 0xed, 0xfe]
                || magic == [0xca, 0xfe, 0xba, 0xbe]
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_interpreter_is_a_clear_error() {
        let err = Interpreter::resolve(Some(Path::new("/nonexistent/python9"))).unwrap_err();
        assert!(err.to_string().contains("--python"), "{err}");
    }

    #[test]
    fn a_shell_shim_is_resolved_to_the_real_binary() {
        let dir = tempfile::tempdir().unwrap();
        let real = Interpreter::resolve(None).unwrap();
        let shim = dir.path().join("python3");
        std::fs::write(
            &shim,
            format!("#!/bin/sh\nexec {} \"$@\"\n", real.path().display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
        let got = Interpreter::resolve(Some(&shim)).unwrap();
        assert_ne!(got.path(), shim.as_path());
        assert!(is_native_binary(got.path()), "{}", got.path().display());
    }

    #[test]
    fn a_native_binary_path_is_kept_as_given() {
        let real = Interpreter::resolve(None).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("python");
        std::os::unix::fs::symlink(real.path(), &link).unwrap();
        let got = Interpreter::resolve(Some(&link)).unwrap();
        assert_eq!(got.path(), link.as_path());
    }
}
