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

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::sandbox::bwrap::Args;

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
    let mut a = Args::default();
    a.namespaces("cellhost-pip");
    a.identity(p.drop_to.is_some());
    // The same read-only system view as a kernel's, with the host's /etc
    // (pip needs its resolver and certificates; it runs no agent code).
    a.system(SYSTEM);
    a.flags(&[
        "--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp",
    ]);
    for d in ["/dev", "/proc", "/tmp"] {
        a.mark(Path::new(d));
    }
    a.ro_binds(p.prefixes);
    a.bind("--bind", p.packages, Path::new(PACKAGES_AT));
    a.bind("--bind", p.cache, Path::new(CACHE_AT));
    a.flags(&["--chdir", "/tmp"]);
    if let Some((setpriv, uid, gid)) = p.drop_to {
        a.push("--");
        a.push(setpriv);
        a.push(format!("--reuid={uid}"));
        a.push(format!("--regid={gid}"));
        a.flags(&[
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
        ]);
    }
    a.push("--");
    for c in &p.command {
        a.push(c);
    }
    a.into_vec()
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
