//! Serving one `%pip` request: check it, run pip in its sandbox, stream
//! its output, enforce the timeout and the size cap, and say how it ended.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::line::{self, Request};
use super::sandbox::{self, PipSandbox, CACHE_AT, PACKAGES_AT};
use super::Installer;
use crate::tools::Authority;

/// Lines of pip's output quoted in the error of a failed run.
const TAIL_LINES: usize = 15;

/// Serve one request on `wr`: zero or more `{"output"}` frames, then one
/// `{"result"}` or `{"error"}` frame. An error writing means the cell has
/// gone (interrupted): pip is killed.
pub(crate) async fn serve<W: AsyncWrite + Unpin>(
    installer: Option<&Installer>,
    authority: Option<Arc<Authority>>,
    args: &Value,
    wr: &mut W,
) -> io::Result<()> {
    let outcome = match (installer, authority) {
        (_, None) => Err(
            "`%pip` runs only while a cell runs (this call came from a thread \
                          left over from a finished cell)"
                .to_owned(),
        ),
        (None, _) => Err(
            "this kernel has no package dir (it was started outside a session \
                          manager without a sandbox workspace), so `%pip` is unavailable"
                .to_owned(),
        ),
        (Some(inst), Some(auth)) => run(inst, &auth, args, wr).await?,
    };
    let reply = match outcome {
        Ok(result) => json!({ "result": result }),
        Err(message) => json!({ "error": message }),
    };
    write_frame(wr, &reply).await
}

async fn write_frame<W: AsyncWrite + Unpin>(wr: &mut W, v: &Value) -> io::Result<()> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    wr.write_all(&frame).await
}

type Outcome = Result<Value, String>;

async fn run<W: AsyncWrite + Unpin>(
    inst: &Installer,
    auth: &Arc<Authority>,
    args: &Value,
    wr: &mut W,
) -> io::Result<Outcome> {
    let policy = &inst.policy;
    if !policy.enabled {
        return Ok(Err(
            "`%pip` is turned off on this host ([packages] enabled = false in cellhost.toml)"
                .into(),
        ));
    }
    let Some(text) = args.get("line").and_then(Value::as_str) else {
        return Ok(Err(
            "malformed %pip request: expected {\"line\": \"install …\"}".into(),
        ));
    };
    let req = match line::parse(text, policy) {
        Ok(r) => r,
        Err(why) => return Ok(Err(why)),
    };
    let Some(dir) = inst.dir() else {
        return Ok(Err(
            "this kernel has no package dir, so `%pip` is unavailable".into(),
        ));
    };
    let _one = inst.busy.lock().await;
    let prepared = tokio::task::spawn_blocking({
        let (dir, cache, uid, gid) = (dir.clone(), inst.cache.clone(), inst.uid, inst.gid);
        move || -> Result<(), String> {
            super::ensure_dir(&dir, uid, gid)
                .and_then(|()| super::ensure_dir(&cache, uid, gid))
                .map_err(|e| {
                    format!(
                        "the package dir {} could not be prepared: {e}",
                        dir.display()
                    )
                })
        }
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    if let Err(why) = prepared {
        return Ok(Err(why));
    }
    let cap = (policy.max_mib > 0).then_some(policy.max_mib << 20);
    let before = entries(&dir);
    if let Some(cap) = cap {
        let used = super::dir_bytes(&dir);
        if matches!(req, Request::Install { .. }) && used >= cap {
            return Ok(Err(format!(
                "this session's packages take {} MiB, at the [packages] max_mib cap of {} MiB; \
                 no more can be installed in this session",
                used >> 20,
                cap >> 20
            )));
        }
    }
    let cmd = match command(inst, &dir, &req) {
        Ok(c) => c,
        Err(why) => return Ok(Err(why)),
    };
    let timeout = Duration::from_secs(policy.timeout_seconds);
    let (status, tail) = match stream(cmd, auth, timeout, wr).await? {
        Ok(done) => done,
        Err(why) => return Ok(Err(why)),
    };
    if status != 0 {
        let mut msg = format!("pip {} failed (exit status {status}):\n{tail}", verb(&req));
        if policy.only_binary
            && (tail.contains("satisfies the requirement")
                || tail.contains("no usable")
                || tail.contains("--no-build")
                || tail.contains("only_binary")
                || tail.contains("--only-binary"))
        {
            msg.push_str(
                "\nnote: [packages] only_binary = true in cellhost.toml allows wheels only (no \
                 package code runs at install time); a package published only as a source \
                 distribution cannot be installed here",
            );
        }
        return Ok(Err(msg));
    }
    if let Some(cap) = cap {
        let used = super::dir_bytes(&dir);
        if used > cap {
            let removed = remove_new(&dir, &before);
            return Ok(Err(format!(
                "the install would bring this session's packages to {} MiB, over the [packages] \
                 max_mib cap of {} MiB; what it added was removed ({removed} entries)",
                used >> 20,
                cap >> 20
            )));
        }
    }
    Ok(Ok(json!({
        "status": status,
        "path": inst.seen_at(&dir).to_string_lossy(),
    })))
}

fn verb(req: &Request) -> &'static str {
    match req {
        Request::Install { .. } => "install",
        Request::List => "list",
        Request::Show(_) => "show",
        Request::Uninstall(_) => "uninstall",
    }
}

/// `uninstall` from a `--target` dir (pip cannot): RECORD-driven removal.
const UNINSTALL: &str = include_str!("../runner/pipuninstall.py");

/// The `uv` binary `%pip install` runs, when `[packages] installer`
/// picks uv (`auto`: when one is found).
pub(crate) fn uv_for(policy: &crate::config::PackagesConfig) -> Result<Option<PathBuf>, String> {
    use crate::config::PipInstaller;
    let found = || {
        policy
            .uv
            .clone()
            .or_else(|| crate::sandbox::launch::find_program("uv"))
    };
    match policy.installer {
        PipInstaller::Pip => Ok(None),
        PipInstaller::Auto => Ok(found()),
        PipInstaller::Uv => found().map(Some).ok_or_else(|| {
            "[packages] installer = \"uv\" but no `uv` was found on PATH; install it \
             (pip install uv) or set [packages] uv to its path"
                .to_owned()
        }),
    }
}

/// bwrap running pip for `req`.
fn command(inst: &Installer, dir: &Path, req: &Request) -> Result<tokio::process::Command, String> {
    let bwrap = crate::sandbox::launch::find_program("bwrap").ok_or(
        "`%pip` runs pip in a bubblewrap sandbox on the host, but no `bwrap` was found on PATH; \
         install it (Debian: apt-get install bubblewrap)",
    )?;
    let prefixes = crate::sandbox::launch::prefixes(&inst.python).map_err(|e| e.to_string())?;
    let root = nix::unistd::geteuid().is_root();
    let setpriv = if root {
        Some(crate::sandbox::launch::find_program("setpriv").ok_or(
            "`%pip` needs `setpriv` (util-linux) to run pip as an unprivileged uid; install it",
        )?)
    } else {
        None
    };
    let policy = &inst.policy;
    let uv = match req {
        Request::Install { .. } => uv_for(policy)?,
        _ => None,
    };
    let mut prefixes = prefixes;
    let mut pip: Vec<OsString> = match (&uv, req) {
        (Some(uv), _) => {
            // Bound read-only at its own path, like the interpreter.
            if let Some(dir) = uv.parent() {
                prefixes.push(dir.to_path_buf());
            }
            vec![uv.clone().into(), "pip".into()]
        }
        (None, Request::Uninstall(_)) => vec![
            inst.python.clone().into(),
            "-s".into(),
            "-c".into(),
            UNINSTALL.into(),
        ],
        (None, _) => vec![
            inst.python.clone().into(),
            "-s".into(),
            "-m".into(),
            "pip".into(),
        ],
    };
    let mut add = |s: &str| pip.push(s.into());
    match req {
        Request::Install {
            specs,
            upgrade,
            no_deps,
            pre,
            quiet,
        } => {
            let by_uv = uv.is_some();
            add("install");
            add("--target");
            add(PACKAGES_AT);
            if by_uv {
                add("--python");
                add(&inst.python.to_string_lossy());
                add("--cache-dir");
                add(CACHE_AT);
                add("--no-progress");
            } else {
                add("--no-input");
                add("--disable-pip-version-check");
                add("--no-warn-script-location");
                add("--progress-bar=off");
            }
            if policy.only_binary {
                if by_uv {
                    add("--only-binary");
                    add(":all:");
                } else {
                    add("--only-binary=:all:");
                }
            }
            if let Some(url) = &policy.index_url {
                add("--index-url");
                add(url);
            }
            for url in &policy.extra_index_urls {
                add("--extra-index-url");
                add(url);
            }
            let pre_flag = if by_uv { "--prerelease=allow" } else { "--pre" };
            for (on, flag) in [
                (*upgrade, "--upgrade"),
                (*no_deps, "--no-deps"),
                (*pre, pre_flag),
                (*quiet, "-q"),
            ] {
                if on {
                    add(flag);
                }
            }
            for s in specs {
                add(s);
            }
        }
        Request::Uninstall(names) => {
            add(PACKAGES_AT);
            for n in names {
                add(n);
            }
        }
        Request::List => {
            add("list");
            add("--path");
            add(PACKAGES_AT);
            add("--disable-pip-version-check");
        }
        Request::Show(names) => {
            add("show");
            add("--disable-pip-version-check");
            for n in names {
                add(n);
            }
        }
    }
    let args = sandbox::args(&PipSandbox {
        packages: dir,
        cache: &inst.cache,
        prefixes: &prefixes,
        drop_to: setpriv.as_deref().map(|p| (p, inst.uid, inst.gid)),
        command: pip,
    });
    let mut cmd = tokio::process::Command::new(bwrap);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/tmp")
        .env("TMPDIR", "/tmp")
        .env("LANG", "C.UTF-8")
        .env("PIP_CACHE_DIR", CACHE_AT)
        .env("UV_CACHE_DIR", CACHE_AT)
        .env("UV_NO_CONFIG", "1")
        .env("PYTHONNOUSERSITE", "1")
        .env("PYTHONUNBUFFERED", "1")
        // `pip show` finds what `--target` installed.
        .env("PYTHONPATH", PACKAGES_AT)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .process_group(0);
    // An operator's proxy for reaching the index.
    for var in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
    ] {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
    Ok(cmd)
}

/// Run `cmd` with stdout and stderr on one pipe, forwarding its output
/// as it comes; `(status, last lines)`, or why it was stopped.
async fn stream<W: AsyncWrite + Unpin>(
    mut cmd: tokio::process::Command,
    auth: &Arc<Authority>,
    timeout: Duration,
    wr: &mut W,
) -> io::Result<Result<(i32, String), String>> {
    let (rd, wr_end) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => return Ok(Err(format!("could not create pip's output pipe: {e}"))),
    };
    let wr2 = match wr_end.try_clone() {
        Ok(w) => w,
        Err(e) => return Ok(Err(format!("could not create pip's output pipe: {e}"))),
    };
    cmd.stdout(Stdio::from(wr_end)).stderr(Stdio::from(wr2));
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ok(Err(format!("could not start pip's sandbox (bwrap): {e}"))),
    };
    drop(cmd);
    let rd = std::os::fd::OwnedFd::from(rd);
    let mut out = match tokio::net::unix::pipe::Receiver::from_owned_fd(rd) {
        Ok(r) => r,
        Err(e) => return Ok(Err(format!("could not read pip's output: {e}"))),
    };
    let pgid = child.id();
    let kill = |pgid: Option<u32>| {
        if let Some(p) = pgid.and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    };
    let mut tail = Tail::default();
    let mut buf = vec![0u8; 16 * 1024];
    let mut carry: Vec<u8> = Vec::new();
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let retired = auth.retired();
    tokio::pin!(retired);
    loop {
        tokio::select! {
            n = out.read(&mut buf) => {
                let n = n.unwrap_or(0);
                if n == 0 {
                    break;
                }
                carry.extend_from_slice(&buf[..n]);
                let text = take_text(&mut carry);
                if !text.is_empty() {
                    tail.push(&text);
                    if let Err(e) = write_frame(wr, &json!({ "output": text })).await {
                        kill(pgid);
                        let _ = child.wait().await;
                        return Err(e);
                    }
                }
            }
            () = &mut deadline => {
                kill(pgid);
                let _ = child.wait().await;
                return Ok(Err(format!(
                    "pip was stopped after {} s ([packages] timeout_seconds in cellhost.toml); \
                     its last lines:\n{}", timeout.as_secs(), tail.text()
                )));
            }
            () = &mut retired => {
                kill(pgid);
                let _ = child.wait().await;
                return Ok(Err("pip was stopped: the cell ended".into()));
            }
        }
    }
    if !carry.is_empty() {
        let rest = String::from_utf8_lossy(&carry).into_owned();
        tail.push(&rest);
        write_frame(wr, &json!({ "output": rest })).await?;
    }
    let status = match child.wait().await {
        Ok(s) => s.code().unwrap_or(-1),
        Err(e) => return Ok(Err(format!("could not wait for pip: {e}"))),
    };
    Ok(Ok((status, tail.text())))
}

/// The valid UTF-8 prefix of `carry` (a character split across reads
/// waits for its rest), removed from it.
fn take_text(carry: &mut Vec<u8>) -> String {
    let valid = match std::str::from_utf8(carry) {
        Ok(_) => carry.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => {
            let s = String::from_utf8_lossy(carry).into_owned();
            carry.clear();
            return s;
        }
    };
    let rest = carry.split_off(valid);
    String::from_utf8(std::mem::replace(carry, rest)).unwrap_or_default()
}

/// The last lines of pip's output.
#[derive(Default)]
struct Tail {
    text: String,
}

impl Tail {
    fn push(&mut self, s: &str) {
        self.text.push_str(s);
        if self.text.len() > 64 * 1024 {
            let cut = self.text.len() - 32 * 1024;
            let cut = (cut..self.text.len())
                .find(|i| self.text.is_char_boundary(*i))
                .unwrap_or(0);
            self.text.drain(..cut);
        }
    }

    fn text(&self) -> String {
        let lines: Vec<&str> = self.text.trim_end().lines().collect();
        lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
    }
}

/// Top-level entries of `dir`.
fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Remove what is in `dir` now but not in `before` (never following a
/// symlink). Returns how many entries went.
fn remove_new(dir: &Path, before: &[PathBuf]) -> usize {
    let mut n = 0;
    for e in entries(dir) {
        if before.contains(&e) {
            continue;
        }
        let gone = match std::fs::symlink_metadata(&e) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&e).is_ok(),
            Ok(_) => std::fs::remove_file(&e).is_ok(),
            Err(_) => false,
        };
        n += usize::from(gone);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_characters_wait_for_their_rest() {
        let mut carry = "ab\u{e9}".as_bytes().to_vec();
        let last = carry.pop().unwrap();
        assert_eq!(take_text(&mut carry), "ab");
        carry.push(last);
        assert_eq!(take_text(&mut carry), "\u{e9}");
        assert!(carry.is_empty());
    }

    #[test]
    fn the_tail_keeps_the_last_lines() {
        let mut t = Tail::default();
        for i in 0..100 {
            t.push(&format!("line {i}\n"));
        }
        let text = t.text();
        assert!(
            text.starts_with("line 85") && text.ends_with("line 99"),
            "{text}"
        );
    }
}
