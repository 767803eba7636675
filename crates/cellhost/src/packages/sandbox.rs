//! The bubblewrap command line pip runs under on the host.
//!
//! pip needs the network (the index) and the interpreter it installs for,
//! and nothing of the daemon: the new root is an empty tmpfs with, read-only,
//! the system dirs and the interpreter's prefixes; read-write, only the
//! session's package dir at [`PACKAGES_AT`] and the shared download cache at
//! [`CACHE_AT`]; a private `/tmp`. The network namespace is the host's
//! (pip must reach the index, which in tests is on the host's loopback).
//! When the host is root, pip runs as the unprivileged uid/gid through
//! `setpriv` (no capabilities, `no_new_privs`), as kernels do; otherwise in
//! a new user namespace as the host user.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The package dir inside pip's sandbox.
pub(crate) const PACKAGES_AT: &str = "/packages";
/// The download cache inside pip's sandbox.
pub(crate) const CACHE_AT: &str = "/cache";

const SYSTEM: &[&str] = &[
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

pub(crate) struct PipSandbox<'a> {
    pub packages: &'a Path,
    pub cache: &'a Path,
    /// The interpreter's prefixes (bound read-only at the same path).
    pub prefixes: &'a [PathBuf],
    /// `Some((setpriv, uid, gid))` when the host is root.
    pub drop_to: Option<(&'a Path, u32, u32)>,
    /// The command run inside.
    pub command: Vec<OsString>,
}

/// The bwrap arguments (without the program name).
pub(crate) fn args(p: &PipSandbox<'_>) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::new();
    for f in [
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "cellhost-pip",
    ] {
        out.push(f.into());
    }
    match p.drop_to {
        Some(_) => {
            for f in [
                "--cap-drop",
                "ALL",
                "--cap-add",
                "CAP_SETUID",
                "--cap-add",
                "CAP_SETGID",
                "--cap-add",
                "CAP_SETPCAP",
            ] {
                out.push(f.into());
            }
        }
        None => out.push("--unshare-user".into()),
    }
    let mut present: BTreeSet<PathBuf> = BTreeSet::new();
    let mut exposed: Vec<PathBuf> = Vec::new();
    for sys in SYSTEM {
        let path = Path::new(sys);
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    push(&mut out, &[&"--symlink", &target, &path]);
                }
            }
            Ok(m) if m.is_dir() => {
                push(&mut out, &[&"--ro-bind", &path, &path]);
                exposed.push(path.to_path_buf());
            }
            _ => {}
        }
        present.insert(path.to_path_buf());
    }
    for f in [
        "--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp",
    ] {
        out.push(f.into());
    }
    for d in ["/dev", "/proc", "/tmp"] {
        present.insert(PathBuf::from(d));
    }
    for dir in p.prefixes {
        let covered =
            dir.ancestors().any(|a| exposed.iter().any(|e| e == a)) && !dir.starts_with("/tmp");
        if covered || !dir.exists() {
            continue;
        }
        // Missing ancestors 0755 (bwrap would make them 0700, which the
        // unprivileged uid cannot enter).
        let mut missing: Vec<&Path> = dir
            .ancestors()
            .skip(1)
            .take_while(|a| *a != Path::new("/") && !present.contains(*a))
            .collect();
        missing.reverse();
        for m in missing {
            push(&mut out, &[&"--perms", &"0755", &"--dir", &m]);
            present.insert(m.to_path_buf());
        }
        push(&mut out, &[&"--ro-bind", &dir.as_path(), &dir.as_path()]);
        present.insert(dir.clone());
        exposed.push(dir.clone());
    }
    push(&mut out, &[&"--bind", &p.packages, &Path::new(PACKAGES_AT)]);
    push(&mut out, &[&"--bind", &p.cache, &Path::new(CACHE_AT)]);
    push(&mut out, &[&"--chdir", &"/tmp"]);
    if let Some((setpriv, uid, gid)) = p.drop_to {
        out.push("--".into());
        out.push(setpriv.into());
        out.push(format!("--reuid={uid}").into());
        out.push(format!("--regid={gid}").into());
        for f in [
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
        ] {
            out.push(f.into());
        }
    }
    out.push("--".into());
    out.extend(p.command.iter().cloned());
    out
}

fn push(out: &mut Vec<OsString>, items: &[&dyn AsRefOs]) {
    out.extend(items.iter().map(|i| i.os()));
}

trait AsRefOs {
    fn os(&self) -> OsString;
}

impl AsRefOs for &str {
    fn os(&self) -> OsString {
        (*self).into()
    }
}

impl AsRefOs for &Path {
    fn os(&self) -> OsString {
        self.as_os_str().to_owned()
    }
}

impl AsRefOs for PathBuf {
    fn os(&self) -> OsString {
        self.as_os_str().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_package_dir_and_the_cache_are_writable() {
        let prefixes = [
            PathBuf::from("/usr"),
            PathBuf::from("/root/.pyenv/versions/3.11.7"),
        ];
        let a: Vec<String> = args(&PipSandbox {
            packages: Path::new("/data/ws/s/pkgs"),
            cache: Path::new("/data/pip-cache"),
            prefixes: &prefixes,
            drop_to: Some((Path::new("/usr/bin/setpriv"), 65534, 65534)),
            command: vec!["python".into(), "-m".into(), "pip".into()],
        })
        .into_iter()
        .map(|s| s.into_string().unwrap())
        .collect();
        let binds: Vec<&[String]> = a.windows(3).filter(|w| w[0] == "--bind").collect();
        assert_eq!(binds.len(), 2, "{a:?}");
        assert_eq!(binds[0][1..], ["/data/ws/s/pkgs", PACKAGES_AT]);
        assert_eq!(binds[1][1..], ["/data/pip-cache", CACHE_AT]);
        assert!(
            !a.contains(&"--unshare-net".to_owned()),
            "pip needs the index"
        );
        assert!(a.windows(2).any(|w| w == ["--", "/usr/bin/setpriv"]));
        assert!(a
            .windows(4)
            .any(|w| w == ["--perms", "0755", "--dir", "/root"]));
        assert!(
            !a.iter().any(|s| s == "/data"),
            "nothing else of the daemon: {a:?}"
        );
    }
}
