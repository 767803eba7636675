//! The bubblewrap command line of the strict profile.
//!
//! The new root is an empty tmpfs. Into it go, read-only: `/usr`, the
//! merged-usr links (`/bin`, `/lib`, ...), a minimal `/etc` (a template dir, `etc.rs`),
//! the interpreter's prefixes (a venv and its base; a pyenv prefix under
//! the host's home, never the home itself) and the caller's extra paths;
//! the kernel's staging dir at `STAGING_IN_SANDBOX`; read-write: the
//! workspace at `/workspace`; fresh: `/dev`, `/proc` (of the new pid
//! namespace), and a private `/tmp` and `/dev/shm` (size-capped tmpfs).
//! The seccomp programs (`seccomp.rs`) come as inherited fds.
//!
//! When the host is root, bwrap runs as root without a user namespace
//! (so it can bind paths only root can traverse, like `/root/.pyenv/...`)
//! and keeps only CAP_SETUID/SETGID/SETPCAP for `setpriv`, which drops to
//! the kernel uid/gid, clears groups, capabilities and the bounding set
//! and sets `no_new_privs` before exec'ing Python: no Python code ever
//! runs as root. When the host is not root, bwrap makes a user namespace
//! and the kernel runs as the host user.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::{StrictSandbox, STAGING_IN_SANDBOX, WORKSPACE_IN_SANDBOX};

/// System paths bound read-only when they exist (symlinks are recreated).
const SYSTEM: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// Everything the argv needs.
pub(crate) struct Plan<'a> {
    pub strict: &'a StrictSandbox,
    pub staging: &'a Path,
    /// `None`: a tmpfs of the sandbox's own (a template's, whose forks
    /// each mount theirs over it).
    pub workspace: Option<&'a Path>,
    /// Host dirs the interpreter needs (prefixes), bound at the same path.
    pub prefixes: &'a [PathBuf],
    /// Inside the sandbox; default the workspace.
    pub cwd: Option<&'a Path>,
    /// `Some(path of setpriv)` when the host is root.
    pub setpriv: Option<&'a Path>,
    /// `--block-fd`: the sandbox waits for a byte on it before starting.
    pub block_fd: Option<i32>,
    /// The command run inside: interpreter, script, arguments.
    pub command: Vec<OsString>,
    /// Size cap of the private /tmp and /dev/shm (tmpfs: their pages are
    /// memory that RLIMIT_AS does not count): the kernel's memory limit.
    pub tmp_bytes: Option<u64>,
    /// The session's package dir, bound read-only at
    /// [`crate::packages::PACKAGES_IN_SANDBOX`].
    pub packages: Option<&'a Path>,
    /// Fds (in the child) of the seccomp programs, loaded in this order.
    pub seccomp_fds: &'a [i32],
    /// The host dir mounted read-only at `/etc` (`etc.rs`).
    pub etc: &'a Path,
    /// A strict template (`rehome.rs`): root with the capabilities of
    /// [`rehome::template_caps`], in the host's pid namespace (its forks'
    /// pids are host pids, and each makes a pid namespace of its own).
    ///
    /// [`rehome::template_caps`]: super::rehome::template_caps
    pub template: bool,
}

/// The bwrap arguments (without the program name).
pub(crate) fn args(p: &Plan<'_>) -> Vec<OsString> {
    let mut a = Args::default();
    if p.template {
        a.flags(&[
            "--die-with-parent",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "cellhost",
            "--cap-drop",
            "ALL",
        ]);
        for cap in super::rehome::template_caps(p.strict.network) {
            a.flags(&["--cap-add", cap]);
        }
    } else {
        a.namespaces("cellhost");
    }
    if !p.strict.network {
        a.flags(&["--unshare-net"]);
    }
    if let Some(fd) = p.block_fd {
        a.push("--block-fd");
        a.push(fd.to_string());
    }
    if !p.template {
        a.identity(p.setpriv.is_some());
    }
    a.system(SYSTEM);
    a.bind("--ro-bind", p.etc, Path::new("/etc"));
    a.flags(&["--dev", "/dev", "--proc", "/proc"]);
    for tmp in ["/tmp", "/dev/shm"] {
        if let Some(bytes) = p.tmp_bytes {
            a.push("--size");
            a.push(bytes.to_string());
        }
        a.flags(&["--perms", "1777", "--tmpfs", tmp]);
        a.mark(Path::new(tmp));
    }
    a.mark(Path::new("/dev"));
    a.mark(Path::new("/proc"));
    a.ro_binds(p.prefixes.iter().chain(&p.strict.ro_binds));
    // The interpreter path itself, when no prefix shows it (a symlink in
    // a bin dir of the home, say): the link alone, or the file alone,
    // never the directory around it.
    if let Some(python) = p.command.first().map(Path::new) {
        if !a.covered(python) {
            match std::fs::read_link(python) {
                Ok(target) => a.symlink(&target, python),
                Err(_) if python.is_file() => a.bind("--ro-bind", python, python),
                Err(_) => {}
            }
        }
    }
    a.bind("--ro-bind", p.staging, Path::new(STAGING_IN_SANDBOX));
    match p.workspace {
        Some(dir) => a.bind("--bind", dir, Path::new(WORKSPACE_IN_SANDBOX)),
        None => {
            a.flags(&["--perms", "0700", "--tmpfs", WORKSPACE_IN_SANDBOX]);
            a.mark(Path::new(WORKSPACE_IN_SANDBOX));
        }
    }
    let packages = Path::new(crate::packages::PACKAGES_IN_SANDBOX);
    match p.packages {
        Some(dir) => a.bind("--ro-bind", dir, packages),
        // Where a template's forks mount their package dirs.
        None if p.template => a.dir(packages),
        None => {}
    }
    // bwrap changes dir after dropping its capabilities, when it may not
    // enter the kernel uid's 0700 workspace: the runner does it instead.
    a.flags(&["--chdir", "/"]);
    // A template's forks load the filter and drop to their uid themselves.
    let (seccomp_fds, setpriv) = if p.template {
        (&[][..], None)
    } else {
        (p.seccomp_fds, p.setpriv)
    };
    for fd in seccomp_fds {
        a.push("--add-seccomp-fd");
        a.push(fd.to_string());
    }
    if let Some(setpriv) = setpriv {
        a.push("--");
        a.push(setpriv);
        a.push(format!("--reuid={}", p.strict.uid));
        a.push(format!("--regid={}", p.strict.gid));
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
    let mut chdir = OsString::from("--chdir=");
    chdir.push(p.cwd.unwrap_or(Path::new(WORKSPACE_IN_SANDBOX)));
    a.push(chdir);
    a.out
}

/// A bwrap argv under construction that knows what the new root shows:
/// the strict profile's and pip's sandboxes are both built with it.
#[derive(Default)]
pub(crate) struct Args {
    out: Vec<OsString>,
    /// Paths that exist in the new root (mounted, or dirs we created).
    present: BTreeSet<PathBuf>,
    /// Bind-mount targets: their whole host subtree is visible. (A tmpfs
    /// such as /tmp, /dev, /proc, or a dir we created, exists but shows
    /// nothing of the host below it.)
    exposed: BTreeSet<PathBuf>,
}

impl Args {
    /// A sandbox's own pid, ipc, uts and cgroup namespaces, named
    /// `hostname`, that dies with its parent.
    pub(crate) fn namespaces(&mut self, hostname: &str) {
        self.flags(&[
            "--die-with-parent",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            hostname,
        ]);
    }

    /// Who runs inside: with `drops` (root starts it, setpriv then drops
    /// to the sandbox's uid) every capability but those the drop needs is
    /// dropped; else a user namespace of its own.
    pub(crate) fn identity(&mut self, drops: bool) {
        if drops {
            self.flags(&[
                "--cap-drop",
                "ALL",
                "--cap-add",
                "CAP_SETUID",
                "--cap-add",
                "CAP_SETGID",
                "--cap-add",
                "CAP_SETPCAP",
            ]);
        } else {
            self.flags(&["--unshare-user"]);
        }
    }

    pub(crate) fn push(&mut self, s: impl Into<OsString>) {
        self.out.push(s.into());
    }

    pub(crate) fn flags(&mut self, f: &[&str]) {
        self.out.extend(f.iter().map(OsString::from));
    }

    /// The argv built so far.
    pub(crate) fn into_vec(self) -> Vec<OsString> {
        self.out
    }

    /// The host's system dirs `dirs` read-only where they exist: a
    /// symlink among them (merged `/usr`) is recreated, a dir bound.
    pub(crate) fn system(&mut self, dirs: &[&str]) {
        for sys in dirs {
            let path = Path::new(sys);
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(path) {
                        self.push("--symlink");
                        self.push(target);
                        self.push(path);
                        self.mark(path);
                    }
                }
                Ok(m) if m.is_dir() => self.bind("--ro-bind", path, path),
                _ => {}
            }
        }
    }

    /// Host dirs bound read-only at the same path, unless a bind already
    /// shows them (a dir under a tmpfs, such as `/tmp`, is bound over it).
    pub(crate) fn ro_binds<'d>(&mut self, dirs: impl IntoIterator<Item = &'d PathBuf>) {
        for dir in dirs {
            if !self.covered(dir) && dir.exists() {
                self.bind("--ro-bind", dir, dir);
            }
        }
    }

    /// `p` exists in the new root but shows nothing of the host below it.
    pub(crate) fn mark(&mut self, p: &Path) {
        self.present.insert(p.to_path_buf());
    }

    /// `dest` is already visible through a bind mount of it or an ancestor.
    fn covered(&self, dest: &Path) -> bool {
        dest.ancestors().any(|a| self.exposed.contains(a))
    }

    /// Create `dest`'s missing ancestors 0755 (bwrap would make them 0700,
    /// which the unprivileged kernel cannot enter).
    fn ancestors(&mut self, dest: &Path) {
        let mut missing: Vec<&Path> = dest
            .ancestors()
            .skip(1)
            .take_while(|a| *a != Path::new("/") && !self.present.contains(*a))
            .collect();
        missing.reverse();
        for dir in missing {
            self.flags(&["--perms", "0755", "--dir"]);
            self.push(dir);
            self.mark(dir);
        }
    }

    /// An empty dir at `dest` (0755), with its missing ancestors.
    fn dir(&mut self, dest: &Path) {
        self.ancestors(dest);
        self.flags(&["--perms", "0755", "--dir"]);
        self.push(dest);
        self.mark(dest);
    }

    /// A symlink at `dest` pointing at `target`, as on the host.
    fn symlink(&mut self, target: &Path, dest: &Path) {
        self.ancestors(dest);
        self.push("--symlink");
        self.push(target);
        self.push(dest);
        self.mark(dest);
    }

    /// A bind mount, with its missing ancestors created first.
    pub(crate) fn bind(&mut self, how: &str, src: &Path, dest: &Path) {
        self.ancestors(dest);
        self.push(how);
        self.push(src);
        self.push(dest);
        self.mark(dest);
        self.exposed.insert(dest.to_path_buf());
    }
}

/// The first executable `name` on the host's PATH (or the usual dirs).
pub(crate) fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/bin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_args(network: bool, root: bool) -> Vec<String> {
        plan_args_with(network, root, &["/usr", "/root/.pyenv/versions/3.11.7"])
    }

    fn plan_args_with(network: bool, root: bool, prefixes: &[&str]) -> Vec<String> {
        plan_args_as(network, root, prefixes, false)
    }

    fn plan_args_as(network: bool, root: bool, prefixes: &[&str], template: bool) -> Vec<String> {
        let strict = StrictSandbox::default().network(network);
        let prefixes: Vec<PathBuf> = prefixes.iter().map(PathBuf::from).collect();
        let setpriv = PathBuf::from("/usr/bin/setpriv");
        let plan = Plan {
            strict: &strict,
            staging: Path::new("/tmp/x/kernels/k-1"),
            workspace: (!template).then_some(Path::new("/tmp/x/ws")),
            prefixes: &prefixes,
            cwd: None,
            setpriv: root.then_some(setpriv.as_path()),
            block_fd: None,
            command: vec!["/usr/bin/python3".into(), "runner.py".into()],
            tmp_bytes: Some(1 << 30),
            packages: Some(Path::new("/tmp/x/pkgs")),
            seccomp_fds: &[7, 8],
            etc: Path::new("/tmp/x/sandbox-etc-1"),
            template,
        };
        args(&plan)
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect()
    }

    fn has(args: &[String], seq: &[&str]) -> bool {
        args.windows(seq.len()).any(|w| w == seq)
    }

    #[test]
    fn no_network_unless_asked() {
        assert!(plan_args(false, true).contains(&"--unshare-net".to_owned()));
        assert!(!plan_args(true, true).contains(&"--unshare-net".to_owned()));
    }

    #[test]
    fn a_prefix_under_home_is_bound_alone_with_searchable_parents() {
        let a = plan_args(false, true);
        let p = "/root/.pyenv/versions/3.11.7";
        assert!(has(&a, &["--ro-bind", p, p]), "{a:?}");
        assert!(has(&a, &["--perms", "0755", "--dir", "/root"]), "{a:?}");
        assert!(!has(&a, &["--ro-bind", "/root", "/root"]));
        // /usr is bound once, as a system dir.
        assert_eq!(a.iter().filter(|s| *s == "/usr").count(), 2);
    }

    #[test]
    fn root_hosts_drop_to_the_kernel_uid_with_setpriv() {
        let a = plan_args(false, true);
        assert!(
            has(&a, &["--", "/usr/bin/setpriv", "--reuid=65534"]),
            "{a:?}"
        );
        assert!(!a.contains(&"--unshare-user".to_owned()));
        let a = plan_args(false, false);
        assert!(a.contains(&"--unshare-user".to_owned()));
        assert!(!a.iter().any(|s| s.contains("setpriv")));
    }

    #[test]
    fn the_staging_dir_is_read_only_and_the_workspace_writable() {
        let a = plan_args(false, true);
        assert!(has(
            &a,
            &["--ro-bind", "/tmp/x/kernels/k-1", STAGING_IN_SANDBOX]
        ));
        assert!(has(&a, &["--bind", "/tmp/x/ws", WORKSPACE_IN_SANDBOX]));
        let pkgs = crate::packages::PACKAGES_IN_SANDBOX;
        assert!(has(&a, &["--ro-bind", "/tmp/x/pkgs", pkgs]), "{a:?}");
        assert!(has(&a, &["--tmpfs", "/tmp"]));
    }

    #[test]
    fn a_prefix_under_tmp_is_bound_over_the_private_tmp() {
        // A venv in a checkout under /tmp: the private /tmp hides the host's,
        // so the prefix is bound after it, not taken as already visible.
        let dir = tempfile::tempdir().unwrap();
        let venv = dir.path().join("venv");
        std::fs::create_dir(&venv).unwrap();
        let venv = venv.to_str().unwrap();
        let a = plan_args_with(false, true, &["/usr", venv]);
        let tmpfs = a.windows(2).position(|w| w == ["--tmpfs", "/tmp"]).unwrap();
        let bind = a.windows(3).position(|w| w == ["--ro-bind", venv, venv]);
        assert!(bind.is_some_and(|b| b > tmpfs), "{a:?}");
    }

    #[test]
    fn the_private_tmp_and_shm_are_capped_at_the_memory_limit() {
        let a = plan_args(false, true);
        for tmp in ["/tmp", "/dev/shm"] {
            let at = a.windows(2).position(|w| w == ["--tmpfs", tmp]).unwrap();
            assert_eq!(a[at - 4..at], ["--size", "1073741824", "--perms", "1777"]);
        }
        let dev = a.windows(2).position(|w| w == ["--dev", "/dev"]).unwrap();
        let shm = a
            .windows(2)
            .position(|w| w == ["--tmpfs", "/dev/shm"])
            .unwrap();
        assert!(dev < shm, "{a:?}");
    }

    #[test]
    fn the_hosts_etc_is_never_bound_whole_and_seccomp_comes_before_the_command() {
        let a = plan_args(false, true);
        assert!(!has(&a, &["--ro-bind", "/etc", "/etc"]), "{a:?}");
        assert!(
            has(&a, &["--ro-bind", "/tmp/x/sandbox-etc-1", "/etc"]),
            "{a:?}"
        );
        let sc = a.iter().position(|s| s == "--add-seccomp-fd").unwrap();
        let cmd = a.iter().position(|s| s == "--").unwrap();
        assert!(sc < cmd && has(&a, &["--add-seccomp-fd", "7", "--add-seccomp-fd", "8"]));
    }

    #[test]
    fn a_strict_template_keeps_only_its_forks_capabilities_and_the_hosts_pids() {
        let a = plan_args_as(false, true, &["/usr"], true);
        assert!(!a.contains(&"--unshare-pid".to_owned()), "{a:?}");
        assert!(!a.contains(&"--unshare-user".to_owned()), "{a:?}");
        assert!(has(&a, &["--cap-drop", "ALL"]), "{a:?}");
        let added: Vec<&str> = a
            .windows(2)
            .filter(|w| w[0] == "--cap-add")
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(added, crate::sandbox::rehome::template_caps(false), "{a:?}");
        assert!(added.contains(&"CAP_NET_ADMIN"), "its forks' loopback");
        let host_net = plan_args_as(true, true, &["/usr"], true);
        assert!(
            !host_net.iter().any(|s| s == "CAP_NET_ADMIN"),
            "never over the host's network: {host_net:?}"
        );
        assert!(a.contains(&"--unshare-net".to_owned()));
        // Its own namespaces otherwise, and the same filesystem as a kernel's.
        for flag in ["--unshare-ipc", "--unshare-uts", "--die-with-parent"] {
            assert!(a.contains(&flag.to_owned()), "{flag}: {a:?}");
        }
        assert!(has(&a, &["--ro-bind", "/tmp/x/sandbox-etc-1", "/etc"]));
        // No host dir of its own to leave behind: a tmpfs workspace.
        assert!(has(&a, &["--tmpfs", WORKSPACE_IN_SANDBOX]), "{a:?}");
        // Its forks load the filter and drop to their uid themselves.
        assert!(
            !a.iter()
                .any(|s| s.contains("setpriv") || s.contains("seccomp")),
            "{a:?}"
        );
    }
}
