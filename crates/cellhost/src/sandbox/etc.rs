//! The strict sandbox's `/etc`: built for the kernel, never the host's.
//!
//! The host's `/etc` holds its accounts, its services' configs and, often,
//! cellhost's own config with the daemon token. The sandbox gets an empty
//! `/etc` with, from the host, read-only and only when present, what
//! Python, libc, OpenSSL and common wheels read ([`FROM_HOST`]: the loader
//! cache, CA certificates, the time zone, `mime.types`, fontconfig, ...),
//! `resolv.conf` only with the network on, and, generated per kernel in its
//! staging dir ([`generated`]) and linked from `/etc`: `passwd`/`group`
//! naming only root, nobody and the kernel's uid, `hosts`, `hostname` and
//! `nsswitch.conf`. No mount of a generated file shows a host path.
//!
//! A host entry that is a symlink into `/usr` (`localtime`, `os-release`)
//! is recreated as the same link (tools read the zone name from it); any
//! other is bound at its resolved target.

use std::path::{Path, PathBuf};

use super::bwrap::Args;
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

/// Generated files, linked as `/etc/<name>`.
pub(crate) const GENERATED: &[&str] = &["passwd", "group", "hosts", "hostname", "nsswitch.conf"];

/// Where the generated files are put in the staging dir.
pub(crate) const STAGING_SUBDIR: &str = "etc";

/// The bwrap arguments that build `/etc`.
pub(super) fn args(a: &mut Args, network: bool) {
    let etc = Path::new("/etc");
    a.flags(&["--perms", "0755", "--dir", "/etc"]);
    a.mark(etc);
    let mut entries: Vec<PathBuf> = FROM_HOST.iter().map(|e| etc.join(e)).collect();
    // Debian's `sitecustomize.py` in /usr/lib/python3.X is a link into
    // /etc/python3.X; a dangling one breaks interpreter start-up.
    if let Ok(dir) = std::fs::read_dir(etc) {
        let mut python: Vec<PathBuf> = dir
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        python.sort();
        entries.extend(python);
    }
    if network {
        entries.push(etc.join("resolv.conf"));
    }
    for path in entries {
        from_host(a, &path);
    }
    a.symlink(Path::new("/proc/self/mounts"), &etc.join("mtab"));
    let staged = Path::new(STAGING_IN_SANDBOX).join(STAGING_SUBDIR);
    for name in GENERATED {
        a.symlink(&staged.join(name), &etc.join(name));
    }
}

fn from_host(a: &mut Args, path: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.file_type().is_symlink() {
        let (Ok(target), Ok(resolved)) = (std::fs::read_link(path), path.canonicalize()) else {
            return; // dangling
        };
        if resolved.starts_with("/usr") {
            a.symlink(&target, path);
        } else {
            a.bind("--ro-bind", &resolved, path);
        }
    } else if meta.is_file() || meta.is_dir() {
        a.bind("--ro-bind", path, path);
    }
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
pub(crate) fn write(staging: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = staging.join(STAGING_SUBDIR);
    std::fs::DirBuilder::new().mode(0o755).create(&dir)?;
    for (name, content) in generated(uid, gid) {
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
        assert!(GENERATED.iter().all(|g| files.iter().any(|(n, _)| n == g)));
    }

    #[test]
    fn every_generated_file_is_linked_and_resolv_conf_only_with_network() {
        let render = |network| {
            let mut a = Args::default();
            args(&mut a, network);
            a.out
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        let off = render(false);
        for name in GENERATED {
            let dest = format!("/etc/{name}");
            assert!(off.contains(&dest), "{off:?}");
        }
        assert!(!off.iter().any(|s| s == "/etc/resolv.conf"));
        if Path::new("/etc/resolv.conf").exists() {
            assert!(render(true).iter().any(|s| s == "/etc/resolv.conf"));
        }
    }
}
