//! The strict sandbox's `/etc`: built for the kernel, never the host's.
//!
//! The host's `/etc` holds its accounts, its services' configs and, often,
//! cellhost's own config with the daemon token. The sandbox's `/etc` is a
//! template dir built per host process and runtime dir while kernels hold
//! it (`<runtime>/sandbox-etc-<pid>-<start>`, 0755, root-owned; a tmpfs of
//! its own on a root host, so mountinfo shows no host path) and bound
//! read-only as one mount: copies of what Python, libc, OpenSSL and common
//! wheels read from the host's `/etc` ([`FROM_HOST`]: the loader cache, CA
//! certificates, the time zone, `mime.types`, fontconfig, ...), and links
//! into the kernel's staging dir for the files generated per kernel
//! ([`generated`]): `passwd`/`group` naming only root, nobody and the
//! kernel's uid, `hosts`, `hostname`, `nsswitch.conf`, and `resolv.conf`
//! (a copy of the host's, only with the network on; else the link dangles).
//!
//! One bind mount rather than one per entry: bwrap scans the mount table
//! for every bind it makes read-only, which costs ~1 ms per mount on a host
//! with many mounts. The copy is taken when the host process first starts
//! a strict kernel; a host `/etc` change (new CA certificates) shows after
//! a restart. A host entry that is a symlink into `/usr` (`localtime`,
//! `os-release`) stays the same link (tools read the zone name from it);
//! any other is copied from its target.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use super::STAGING_IN_SANDBOX;

/// Host entries under `/etc` the sandbox gets when they exist.
pub(crate) const FROM_HOST: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl/certs",
    "ssl/cert.pem",
    "ssl/openssl.cnf",
    "pki/ca-trust",
    "pki/tls/certs",
    "pki/tls/cert.pem",
    "pki/tls/openssl.cnf",
    "crypto-policies",
    "localtime",
    "timezone",
    "mime.types",
    "magic",
    "magic.mime",
    "fonts",
    "alternatives",
    "os-release",
    "protocols",
    "services",
    "gai.conf",
    "host.conf",
];

/// Generated per kernel, linked as `/etc/<name>`.
pub(crate) const GENERATED: &[&str] = &[
    "passwd",
    "group",
    "hosts",
    "hostname",
    "nsswitch.conf",
    "resolv.conf",
];

/// Where the generated files are put in the staging dir.
pub(crate) const STAGING_SUBDIR: &str = "etc";

/// Largest host file copied (a bigger one is left out).
const MAX_COPY: u64 = 16 << 20;

/// A built template dir; removed (its tmpfs detached) when the last
/// kernel holding it goes.
pub(crate) struct Template {
    pub dir: PathBuf,
}

impl Drop for Template {
    fn drop(&mut self) {
        let _ = crate::sys::mount::remove_dir(&self.dir);
    }
}

/// The template for kernels whose staging dirs are under `staging_root`,
/// built when no live kernel holds one. On a root host it is a tmpfs of
/// its own, so the sandbox's mountinfo shows root `/` of a filesystem
/// named `cellhost` at `/etc`, not the runtime dir.
pub(crate) fn template(staging_root: &Path) -> io::Result<Arc<Template>> {
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    if let Some(t) = built.get(staging_root).and_then(Weak::upgrade) {
        return Ok(t);
    }
    let runtime = staging_root.parent().unwrap_or(staging_root);
    sweep(runtime);
    let pid = std::process::id();
    let start = crate::kernel::process_start_time(pid).unwrap_or(0);
    let dir = runtime.join(format!(
        "{PREFIX}{pid}-{start}-{}",
        crate::kernel::random_hex(4)
    ));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)?;
    let t = Arc::new(Template { dir });
    if nix::unistd::geteuid().is_root() {
        crate::sys::mount::mount_tmpfs(&t.dir, "mode=0755")?;
    }
    build(&t.dir)?;
    built.insert(staging_root.to_path_buf(), Arc::downgrade(&t));
    Ok(t)
}

/// The live template of each staging root.
static BUILT: Mutex<Option<HashMap<PathBuf, Weak<Template>>>> = Mutex::new(None);

/// Detach the template of `staging_root` now (a manager dropped without
/// shutdown, whose kernels go later): running sandboxes keep their own
/// mount of it, and the next kernel gets a new one. The dir goes with the
/// last kernel holding it.
pub(crate) fn release(staging_root: &Path) {
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let t = built
        .as_mut()
        .and_then(|b| b.remove(staging_root))
        .and_then(|w| w.upgrade());
    if let Some(t) = t {
        crate::sys::mount::detach(&t.dir);
    }
}

const PREFIX: &str = "sandbox-etc-";

/// Remove templates that hosts no longer running left in `runtime`.
fn sweep(runtime: &Path) {
    let Ok(rd) = std::fs::read_dir(runtime) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let mut parts = rest.split('-');
        let (Some(Ok(pid)), Some(Ok(start_time))) = (
            parts.next().map(str::parse::<u32>),
            parts.next().map(str::parse::<u64>),
        ) else {
            continue;
        };
        let alive = crate::kernel::record::ProcessId { pid, start_time }.is_same_live_process();
        if !alive && e.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = crate::sys::mount::remove_dir(&e.path());
        }
    }
}

fn build(dir: &Path) -> io::Result<()> {
    let etc = Path::new("/etc");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let mut entries: Vec<PathBuf> = FROM_HOST.iter().map(PathBuf::from).collect();
    // Debian's `sitecustomize.py` in /usr/lib/python3.X is a link into
    // /etc/python3.X; a dangling one breaks interpreter start-up.
    if let Ok(rd) = std::fs::read_dir(etc) {
        let mut python: Vec<PathBuf> = rd
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| PathBuf::from(e.file_name()))
            .collect();
        python.sort();
        entries.extend(python);
    }
    for rel in entries {
        let (src, dst) = (etc.join(&rel), dir.join(&rel));
        if std::fs::symlink_metadata(&src).is_err() {
            continue;
        }
        if let Some(parent) = dst.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)?;
        }
        match (std::fs::read_link(&src), src.canonicalize()) {
            (Ok(target), Ok(resolved)) if resolved.starts_with("/usr") => {
                std::os::unix::fs::symlink(target, &dst)?
            }
            (Ok(_), Ok(resolved)) => copy(&resolved, &dst)?,
            (Ok(_), Err(_)) => {} // dangling
            (Err(_), _) => copy(&src, &dst)?,
        }
    }
    std::os::unix::fs::symlink("/proc/self/mounts", dir.join("mtab"))?;
    let staged = Path::new(STAGING_IN_SANDBOX).join(STAGING_SUBDIR);
    for name in GENERATED {
        std::os::unix::fs::symlink(staged.join(name), dir.join(name))?;
    }
    Ok(())
}

/// Copy a file or a tree (links inside kept as links), world-readable.
/// Unreadable entries (`ssl/private`-like) are left out.
fn copy(src: &Path, dst: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(src)?;
    if meta.file_type().is_symlink() {
        return std::os::unix::fs::symlink(std::fs::read_link(src)?, dst);
    }
    if meta.is_file() {
        if meta.len() <= MAX_COPY && meta.permissions().mode() & 0o004 != 0 {
            std::fs::copy(src, dst)?;
            std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o644))?;
        }
        return Ok(());
    }
    if meta.is_dir() && meta.permissions().mode() & 0o005 == 0o005 {
        std::fs::DirBuilder::new().mode(0o755).create(dst)?;
        for e in std::fs::read_dir(src)?.flatten() {
            copy(&e.path(), &dst.join(e.file_name()))?;
        }
    }
    Ok(())
}

/// The generated files' contents for a kernel running as `uid`/`gid`.
pub(crate) fn generated(uid: u32, gid: u32) -> Vec<(&'static str, String)> {
    let mut passwd = String::from("root:x:0:0:root:/root:/usr/sbin/nologin\n");
    let mut group = String::from("root:x:0:\n");
    if uid != 65534 {
        passwd += &format!("cellhost:x:{uid}:{gid}:cellhost kernel:/workspace:/bin/sh\n");
    }
    if gid != 65534 {
        group += &format!("cellhost:x:{gid}:\n");
    }
    passwd += "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
    group += "nogroup:x:65534:\n";
    let hosts =
        "127.0.0.1\tlocalhost\n127.0.1.1\tcellhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";
    let nsswitch = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n";
    vec![
        ("passwd", passwd),
        ("group", group),
        ("hosts", hosts.to_owned()),
        ("hostname", "cellhost\n".to_owned()),
        ("nsswitch.conf", nsswitch.to_owned()),
    ]
}

/// Write the generated files into `<staging>/etc` (0755 dir, 0644 files:
/// the staging dir is mounted read-only, so the kernel cannot change them).
pub(crate) fn write(staging: &Path, uid: u32, gid: u32, network: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = staging.join(STAGING_SUBDIR);
    std::fs::DirBuilder::new().mode(0o755).create(&dir)?;
    let mut files = generated(uid, gid);
    if network {
        if let Ok(host) = std::fs::read_to_string("/etc/resolv.conf") {
            files.push(("resolv.conf", host));
        }
    }
    for (name, content) in files {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(dir.join(name))?;
        f.write_all(content.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_names_the_kernel_uid_and_nobody_once() {
        let files = generated(200_001, 200_001);
        let passwd = &files.iter().find(|(n, _)| *n == "passwd").unwrap().1;
        assert!(passwd.contains("cellhost:x:200001:200001:"), "{passwd}");
        let files = generated(65534, 65534);
        let passwd = &files.iter().find(|(n, _)| *n == "passwd").unwrap().1;
        assert_eq!(passwd.matches(":65534:").count(), 1, "{passwd}");
    }

    #[test]
    fn the_template_links_every_generated_file_and_copies_no_host_secret() {
        let runtime = tempfile::tempdir().unwrap();
        let staging_root = runtime.path().join("kernels");
        let t = template(&staging_root).unwrap();
        let dir = t.dir.clone();
        assert_eq!(template(&staging_root).unwrap().dir, dir, "built once");
        for name in GENERATED {
            let link = std::fs::read_link(dir.join(name)).unwrap();
            assert!(link.starts_with(STAGING_IN_SANDBOX), "{link:?}");
        }
        for secret in ["shadow", "pip.conf", "gitconfig", "ssl/private", "cellhost"] {
            assert!(
                std::fs::symlink_metadata(dir.join(secret)).is_err(),
                "{secret}"
            );
        }
        if Path::new("/etc/ld.so.cache").exists() {
            assert!(dir.join("ld.so.cache").is_file());
        }
    }
}
