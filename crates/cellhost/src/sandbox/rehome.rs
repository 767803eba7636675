//! The host's side of a strict template's forks (docs/templates.md,
//! "Strict kernels"; the kernel's side is `runner/strictfork.py`).
//!
//! A strict template is started by bwrap as root with only the
//! capabilities its forks need to sandbox themselves ([`template_caps`]),
//! no seccomp filter, no Landlock domain and no pid namespace (its forks'
//! pids are host pids). Each fork is made a strict kernel in two steps:
//!
//! - with its go (once it is in its cgroup) the spare is sent [`Go`]:
//!   whether to unshare the network, the size of its private `/tmp` and
//!   `/dev/shm`, the seccomp programs (the ones bwrap loads for a spawned
//!   kernel, in two parts: `seccomp.rs`, [`seccomp::ForkPrograms`]) and a
//!   Landlock ruleset, which it is confined by before it waits (but for
//!   the last small program, loaded once its mounts are in place), and the
//!   write end of a status pipe on which its namespace's
//!   init reports how the kernel ended (its parent is the template, so the
//!   host could not read its exit otherwise) or why the sandbox could not
//!   be made;
//! - at the hand-over, [`seal`]: the session's `/etc` files in the new
//!   staging dir, which is handed to the kernel uid as a spawn's is;
//!   detached mounts of the staging dir (read-only), the workspace and
//!   the package dir (read-only), which the fork's init moves over its
//!   template's; the uid and gid; and the egress proxy's socket.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use super::{etc, landlock, seccomp, StrictSandbox, STAGING_IN_SANDBOX, WORKSPACE_IN_SANDBOX};

/// What bwrap keeps for a strict template (and no more): mounts and
/// namespaces (SYS_ADMIN), the drop to the kernel's uid and gid (SETUID,
/// SETGID) and of the bounding set (SETPCAP), and, where its forks get a
/// network namespace of their own, bringing its loopback up (NET_ADMIN,
/// over namespaces that have nothing else: never the host's network).
pub(crate) fn template_caps(network: bool) -> &'static [&'static str] {
    const CAPS: &[&str] = &[
        "CAP_SYS_ADMIN",
        "CAP_SETUID",
        "CAP_SETGID",
        "CAP_SETPCAP",
        "CAP_NET_ADMIN",
    ];
    if network {
        &CAPS[..4]
    } else {
        CAPS
    }
}

/// The go of a strict template's spare.
pub(crate) struct Go {
    /// `g`, the config's length (4 bytes, big-endian) and the config.
    pub message: Vec<u8>,
    /// Sent with it after the status pipe's write end: the Landlock
    /// ruleset, where the kernel has Landlock.
    pub landlock: Option<OwnedFd>,
}

/// The go of a strict template's spare whose kernel will have `strict`'s
/// profile (the template's: the same for every kernel of its flavour);
/// `tmp_bytes` caps its `/tmp` and `/dev/shm`; `rlimit_memory`: its memory
/// is bounded by rlimits only (the seccomp variant).
///
/// # Errors
/// No seccomp filter could be built for this host.
pub(crate) fn go(
    strict: &StrictSandbox,
    tmp_bytes: Option<u64>,
    rlimit_memory: bool,
) -> Result<Go, String> {
    let (programs, sealed): (Vec<String>, Vec<String>) = if strict.bench_omit.seccomp {
        (Vec::new(), Vec::new())
    } else {
        let p = seccomp::fork_programs(rlimit_memory)
            .map_err(|e| format!("the seccomp filter: {}", e.0))?;
        (
            p.before.programs.iter().map(|p| hex(p)).collect(),
            vec![hex(&p.sealed)],
        )
    };
    let cfg = serde_json::json!({
        "net": !strict.network,
        "tmp_bytes": tmp_bytes,
        "seccomp": programs,
        "sealed": sealed,
        "sys": {
            "move_mount": libc::SYS_move_mount,
            "landlock_restrict_self": libc::SYS_landlock_restrict_self,
        },
    })
    .to_string();
    let mut message = Vec::with_capacity(5 + cfg.len());
    message.push(b'g');
    message.extend_from_slice(&(cfg.len() as u32).to_be_bytes());
    message.extend_from_slice(cfg.as_bytes());
    let landlock = landlock::prepare(strict.network || strict.egress.is_some())
        .map(landlock::Prepared::into_fd);
    Ok(Go { message, landlock })
}

/// What a fork is sealed with at its hand-over.
pub(crate) struct Seal {
    /// The `strict` member of the hand-over's payload.
    pub spec: serde_json::Value,
    /// Sent after the five pipes, in the order `spec` indexes them.
    pub fds: Vec<OwnedFd>,
    /// The `/etc` template the fork's root binds (held while it lives).
    pub etc: Arc<etc::Template>,
    /// The egress proxy's socket in the new staging dir, bound.
    pub egress: Option<std::os::unix::net::UnixListener>,
}

/// Where the kernel's files are: its staging dir, workspace and package
/// dir on the host.
pub(crate) struct Places<'a> {
    pub staging: &'a Path,
    pub workspace: &'a Path,
    pub packages: Option<&'a Path>,
}

/// What else the fork needs to become `strict`'s kernel.
///
/// # Errors
/// Why not, in words (nothing is left behind but files in the staging
/// dir, which goes with the fork).
pub(crate) fn seal(strict: &StrictSandbox, at: &Places<'_>) -> Result<Seal, String> {
    if strict.uid == 0 || strict.gid == 0 {
        return Err("a kernel never runs as root (uid or gid 0)".into());
    }
    let io = |what: &str| {
        let what = what.to_owned();
        move |e: std::io::Error| format!("{what}: {e}")
    };
    etc::write(at.staging, strict.uid, strict.gid, strict.network)
        .map_err(io("the sandbox's /etc files"))?;
    let etc = etc::template(at.staging.parent().unwrap_or(at.staging))
        .map_err(io("the sandbox's /etc"))?;
    let egress = match &strict.egress {
        Some(_) => Some(
            crate::egress::proxy::EgressProxy::bind(at.staging)
                .map_err(io("the egress proxy socket"))?,
        ),
        None => None,
    };
    super::launch::hand_staging_to(at.staging, strict.uid, strict.gid)
        .map_err(io("hand the staging dir to the kernel uid"))?;
    let mut fds = Vec::new();
    let mut mounts = Vec::new();
    let mut bind = |path: &Path, target: &str, read_only: bool| -> Result<(), String> {
        let fd = crate::sys::mount::detached_bind(path, read_only)
            .map_err(|e| format!("a detached mount of {}: {e}", path.display()))?;
        mounts.push(serde_json::json!([target, fds.len()]));
        fds.push(fd);
        Ok(())
    };
    bind(at.staging, STAGING_IN_SANDBOX, true)?;
    bind(at.workspace, WORKSPACE_IN_SANDBOX, false)?;
    if let Some(dir) = at.packages {
        bind(dir, crate::packages::PACKAGES_IN_SANDBOX, true)?;
    }
    let spec = serde_json::json!({
        "uid": strict.uid,
        "gid": strict.gid,
        "fds": fds.len(),
        "mounts": mounts,
    });
    Ok(Seal {
        spec,
        fds,
        etc,
        egress,
    })
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// What a strict fork's init wrote on its status pipe: the kernel's wait
/// status (`status N`), or why its sandbox could not be made (`error: …`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Told {
    pub status: Option<i32>,
    pub error: Option<String>,
}

impl Told {
    pub(crate) fn parse(text: &str) -> Told {
        let mut told = Told::default();
        for line in text.lines() {
            if let Some(n) = line.strip_prefix("status ") {
                told.status = n.trim().parse().ok();
            } else if let Some(e) = line.strip_prefix("error: ") {
                told.error = Some(e.trim().to_owned());
            }
        }
        told
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_go_message_is_g_then_the_configs_length_and_the_config() {
        let strict = StrictSandbox::default();
        let m = go(&strict, Some(1 << 20), false).unwrap().message;
        assert_eq!(m[0], b'g');
        let len = u32::from_be_bytes(m[1..5].try_into().unwrap()) as usize;
        assert_eq!(len, m.len() - 5);
        let cfg: serde_json::Value = serde_json::from_slice(&m[5..]).unwrap();
        assert_eq!(cfg["net"], true, "network off: a namespace of its own");
        assert_eq!(cfg["tmp_bytes"], 1 << 20);
        // The kernel's filter in its two parts (seccomp.rs checks that
        // together they are the kernel's).
        let fork = seccomp::fork_programs(false).unwrap();
        let want: Vec<String> = fork.before.programs.iter().map(|p| hex(p)).collect();
        assert_eq!(cfg["seccomp"], serde_json::json!(want));
        assert_eq!(cfg["sealed"], serde_json::json!([hex(&fork.sealed)]));
        let on = go(&StrictSandbox::default().network(true), None, false).unwrap();
        let cfg: serde_json::Value = serde_json::from_slice(&on.message[5..]).unwrap();
        assert_eq!(
            (cfg["net"].as_bool(), cfg["tmp_bytes"].is_null()),
            (Some(false), true)
        );
    }

    #[test]
    fn the_status_pipe_says_how_the_kernel_ended_or_why_it_never_started() {
        assert_eq!(
            Told::parse("status 9\n"),
            Told {
                status: Some(9),
                error: None
            }
        );
        let t = Told::parse("error: the fork's sandbox: mount proc: EPERM\n");
        assert_eq!(t.status, None);
        assert_eq!(
            t.error.as_deref(),
            Some("the fork's sandbox: mount proc: EPERM")
        );
        assert_eq!(Told::parse("garbage"), Told::default());
    }

    #[test]
    fn hex_is_two_lowercase_digits_a_byte() {
        assert_eq!(hex(&[0, 15, 255]), "000fff");
    }
}
