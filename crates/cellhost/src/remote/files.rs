//! Workspace files on a remote backend: the session's directory on the
//! remote host, container or pod (the runner's cwd, which outlives the
//! runner), read and written over the backend's exec transport.
//!
//! Every operation is one exec of `wsfiles.py` (in argv: the helper's
//! source, the operation, the workspace's key and the relative path; never
//! a secret, never file content). Transfers are streamed through the
//! client's stdin/stdout one chunk at a time: an upload goes as
//! length-prefixed frames ended by an empty one (a cut-off upload is
//! never renamed into place), a download comes as one answer line and
//! then the bytes. The path rules (component-wise `O_NOFOLLOW` opens,
//! FIFOs/devices refused, mode 0644/0755) are enforced by the helper on
//! the remote side.

use std::io;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use sha2::Digest;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, ReadBuf};

use super::transport::{shell_quote, Client, Transport};
use crate::files::{Entry, FileError, Listing, RelPath, Written};

const SOURCE: &str = include_str!("../runner/wsfiles.py");
/// Bytes per upload frame and per read of the body.
const CHUNK: usize = 256 * 1024;
const MIB: u64 = 1024 * 1024;

/// One owner's workspace on a remote backend. Cheap to clone.
#[derive(Clone)]
pub struct RemoteWorkspace {
    transport: Arc<dyn Transport>,
    python: String,
    /// The configured `tmpdir` ("": the remote temp dir).
    base: String,
    /// `<scope>/<session…>/ws` under `<base>/cellhost-ws-<uid>/`.
    key: String,
    quota: Option<u64>,
    /// Bound of each control exec (stat, list, remove).
    timeout: Duration,
}

impl std::fmt::Debug for RemoteWorkspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteWorkspace")
            .field("transport", &self.transport.describe())
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// `[packages]` as the remote `%pip` reads it (remotepip.py).
pub(crate) fn policy_json(p: &crate::config::PackagesConfig) -> serde_json::Value {
    serde_json::json!({
        "enabled": p.enabled,
        "index_url": p.index_url,
        "extra_index_urls": p.extra_index_urls,
        "allow": p.allow,
        "deny": p.deny,
        "only_binary": p.only_binary,
        "timeout_seconds": p.timeout_seconds,
        "max_mib": p.max_mib,
    })
}

/// The key of `owner`'s workspace (`P::child::C` nests under P's home).
pub(crate) fn key_of(scope: &str, owner: &str) -> String {
    format!("{}/ws", home_key(scope, owner))
}

/// The key of `owner`'s home (its workspace and its children's).
pub(crate) fn home_key(scope: &str, owner: &str) -> String {
    let mut key = scope.to_owned();
    for (i, part) in owner.split(crate::registry::CHILD_SEPARATOR).enumerate() {
        if i > 0 {
            key.push_str("/children");
        }
        key.push('/');
        key.push_str(&crate::registry::workspace_dir_name(part));
    }
    key
}

fn remote_err(about: &'static str, detail: impl std::fmt::Display) -> FileError {
    FileError::Io {
        about,
        err: io::Error::other(detail.to_string()),
    }
}

/// The helper's `ERR code message` as a [`FileError`].
fn refused(rel: &RelPath, code: &str, message: &str) -> FileError {
    let path = rel.display();
    match code {
        "invalid_path" => FileError::InvalidPath {
            path,
            why: message.to_owned(),
        },
        "not_found" => FileError::NotFound { path },
        "is_a_directory" => FileError::IsADirectory {
            path,
            hint: "; remove it first, or name a file inside it",
        },
        "not_a_directory" => FileError::NotADirectory { path },
        "not_a_regular_file" => FileError::NotRegular { path },
        "quota_exceeded" => {
            let mut n = message.split(' ').map(|x| x.parse::<u64>().unwrap_or(0));
            let (q, u) = (n.next().unwrap_or(0), n.next().unwrap_or(0));
            FileError::QuotaExceeded {
                quota_mib: q / MIB,
                used_mib: u / MIB,
            }
        }
        "too_large" => FileError::TooLarge {
            limit_mib: message.parse::<u64>().unwrap_or(0) / MIB,
        },
        "bad_body" => FileError::Body(io::Error::other(message.to_owned())),
        _ => remote_err("work on the remote workspace", message),
    }
}

/// The last `OK …` / `ERR …` line of a helper's output.
fn answer(rel: &RelPath, stdout: &[u8], stderr: &[u8]) -> Result<String, FileError> {
    let text = String::from_utf8_lossy(stdout);
    for line in text.lines().rev() {
        if let Some(rest) = line.strip_prefix("OK ") {
            return Ok(rest.to_owned());
        }
        if let Some(rest) = line.strip_prefix("ERR ") {
            let (code, msg) = rest.split_once(' ').unwrap_or((rest, ""));
            return Err(refused(rel, code, msg));
        }
    }
    let err = String::from_utf8_lossy(stderr);
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    Err(remote_err(
        "run the workspace helper on the remote side",
        format!("no answer (is python on the remote side?) {last}"),
    ))
}

impl RemoteWorkspace {
    pub(crate) fn new(
        transport: Arc<dyn Transport>,
        python: String,
        base: Option<String>,
        key: String,
        quota: Option<u64>,
        timeout: Duration,
    ) -> RemoteWorkspace {
        RemoteWorkspace {
            transport,
            python,
            base: base.unwrap_or_default(),
            key,
            quota,
            timeout,
        }
    }

    /// The key under the remote workspace base.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The workspace quota in bytes (`[limits] workspace_mib`), enforced
    /// by the remote helper on upload; `None`: no quota.
    pub fn quota(&self) -> Option<u64> {
        self.quota
    }

    /// Where this lives, for messages.
    pub fn describe(&self) -> String {
        self.transport.describe()
    }

    fn script(&self, op: &str, key: &str, rel: &str, args: &[String]) -> String {
        let mut s = format!(
            "exec {} -c {} {op} {} {} {}",
            shell_quote(&self.python),
            shell_quote(SOURCE),
            shell_quote(&self.base),
            shell_quote(key),
            shell_quote(rel)
        );
        for a in args {
            s.push(' ');
            s.push_str(&shell_quote(a));
        }
        s
    }

    /// One control exec; its `OK` payload.
    async fn control(&self, op: &str, rel: &RelPath, args: &[String]) -> Result<String, FileError> {
        self.control_with(op, rel, args, Vec::new()).await
    }

    async fn control_with(
        &self,
        op: &str,
        rel: &RelPath,
        args: &[String],
        stdin: Vec<u8>,
    ) -> Result<String, FileError> {
        let script = self.script(op, &self.key, &rel.display(), args);
        let out = self
            .transport
            .exec(&script, stdin, Some(self.timeout))
            .await
            .map_err(|e| remote_err("reach the remote workspace", e))?;
        answer(rel, &out.stdout, &out.stderr)
    }

    async fn spawn(&self, script: &str) -> Result<tokio::process::Child, FileError> {
        let client: Client = self
            .transport
            .stream_client(script)
            .await
            .map_err(|e| remote_err("reach the remote workspace", e))?
            .ok_or_else(|| {
                remote_err(
                    "stream a remote file",
                    format!("{} cannot stream files", self.transport.describe()),
                )
            })?;
        tokio::process::Command::new(&client.program)
            .args(&client.args)
            .envs(client.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| remote_err("start the transport client", e))
    }

    /// Make the workspace (when missing) and answer its absolute path on
    /// the remote side: the runner's cwd. `packages`: the `[packages]`
    /// policy the runner's `%pip` follows, written beside it.
    pub(crate) async fn make_root(
        &self,
        packages: Option<serde_json::Value>,
    ) -> Result<String, FileError> {
        let req = match packages {
            Some(p) => serde_json::json!({ "packages": p }),
            None => serde_json::json!({}),
        };
        let v = self
            .control_with(
                "root",
                &RelPath::parse("")?,
                &[],
                req.to_string().into_bytes(),
            )
            .await?;
        let v: serde_json::Value =
            serde_json::from_str(&v).map_err(|e| remote_err("read the helper's answer", e))?;
        Ok(v["path"].as_str().unwrap_or_default().to_owned())
    }

    /// Remove the home of the workspace (`home` key), best effort.
    pub(crate) async fn drop_home(&self, home: &str) {
        let script = self.script("drop", home, "", &[]);
        let _ = self
            .transport
            .exec(&script, Vec::new(), Some(self.timeout))
            .await;
    }

    /// Upload: `body` streamed into a temporary file renamed into place.
    pub async fn write<R: AsyncRead + Unpin>(
        &self,
        rel: &RelPath,
        mut body: R,
        max_bytes: Option<u64>,
    ) -> Result<Written, FileError> {
        if rel.is_root() {
            return Err(FileError::IsADirectory {
                path: String::new(),
                hint: " (the workspace root); name a file, e.g. data/sales.csv",
            });
        }
        let args = [
            max_bytes.unwrap_or(0).to_string(),
            self.quota.unwrap_or(0).to_string(),
        ];
        let script = self.script("write", &self.key, &rel.display(), &args);
        let mut child = self.spawn(&script).await?;
        let mut stdin = child.stdin.take().expect("piped");
        let mut stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let collect = async {
            let mut o = Vec::new();
            let mut e = Vec::new();
            let mut so = (&mut stdout).take(1 << 20);
            let mut se = (&mut stderr).take(1 << 20);
            let _ = tokio::join!(so.read_to_end(&mut o), se.read_to_end(&mut e));
            (o, e)
        };
        let feed = async move {
            let mut hasher = sha2::Sha256::new();
            let mut size: u64 = 0;
            let mut buf = vec![0u8; CHUNK];
            loop {
                let n = body.read(&mut buf).await.map_err(FileError::Body)?;
                if n == 0 {
                    break;
                }
                size += n as u64;
                if let Some(max) = max_bytes {
                    if size > max {
                        return Err(FileError::TooLarge {
                            limit_mib: max / MIB,
                        });
                    }
                }
                hasher.update(&buf[..n]);
                let head = (n as u32).to_be_bytes();
                // A helper that refused (quota, a directory) exits early:
                // its answer says why, so a broken pipe is not the error.
                if stdin.write_all(&head).await.is_err()
                    || stdin.write_all(&buf[..n]).await.is_err()
                {
                    break;
                }
            }
            let _ = stdin.write_all(&0u32.to_be_bytes()).await;
            let _ = stdin.flush().await;
            // Dropped here, also on an error: closing stdin without the
            // last frame tells the helper to drop the temporary file.
            drop(stdin);
            Ok((size, hasher))
        };
        let ((o, e), fed) = tokio::join!(collect, feed);
        let _ = child.wait().await;
        let answered = answer(rel, &o, &e);
        let ((size, hasher), v) = match (fed, answered) {
            // The helper's refusal (quota, a directory) explains a
            // broken pipe better than the pipe does.
            (Err(f), Err(a)) if a.code() == "bad_body" => return Err(f),
            (_, Err(a)) => return Err(a),
            (Err(f), Ok(_)) => return Err(f),
            (Ok(x), Ok(v)) => (x, v),
        };
        let v: serde_json::Value =
            serde_json::from_str(&v).map_err(|e| remote_err("read the helper's answer", e))?;
        Ok(Written {
            path: rel.display(),
            size: v["size"].as_u64().unwrap_or(size),
            sha256: crate::files::hex(&hasher.finalize()),
            created: v["created"].as_bool().unwrap_or(true),
        })
    }

    /// `Some((size, modified, etag))` of a regular file, `None` for a
    /// directory.
    pub async fn stat(&self, rel: &RelPath) -> Result<Option<(u64, f64, String)>, FileError> {
        let v = self.control("stat", rel, &[]).await?;
        let v: serde_json::Value =
            serde_json::from_str(&v).map_err(|e| remote_err("read the helper's answer", e))?;
        if v["kind"] == "dir" {
            return Ok(None);
        }
        Ok(Some((
            v["size"].as_u64().unwrap_or(0),
            v["modified"].as_f64().unwrap_or(0.0),
            v["etag"].as_str().unwrap_or_default().to_owned(),
        )))
    }

    /// A reader of `len` bytes of `rel` from `start`, streamed; `etag`
    /// (from [`stat`](Self::stat)) must still match, else the read fails
    /// (the file changed in between).
    pub async fn read(
        &self,
        rel: &RelPath,
        start: u64,
        len: u64,
        etag: Option<&str>,
    ) -> Result<RemoteReader, FileError> {
        let script = self.script(
            "read",
            &self.key,
            &rel.display(),
            &[start.to_string(), len.to_string()],
        );
        let mut child = self.spawn(&script).await?;
        drop(child.stdin.take());
        let mut stdout = BufReader::with_capacity(CHUNK, child.stdout.take().expect("piped"));
        let mut line = Vec::new();
        (&mut stdout)
            .take(64 << 10)
            .read_until(b'\n', &mut line)
            .await
            .map_err(|e| remote_err("read a remote file", e))?;
        let mut err = Vec::new();
        if line.is_empty() {
            if let Some(mut e) = child.stderr.take() {
                let _ = (&mut e).take(1 << 16).read_to_end(&mut err).await;
            }
        }
        let v = answer(rel, &line, &err)?;
        let v: serde_json::Value =
            serde_json::from_str(&v).map_err(|e| remote_err("read the helper's answer", e))?;
        if let Some(want) = etag {
            if v["etag"].as_str() != Some(want) {
                return Err(remote_err(
                    "read a remote file",
                    "the file changed while it was being read; ask again",
                ));
            }
        }
        Ok(RemoteReader {
            inner: stdout.take(len),
            _child: child,
        })
    }

    /// The entries of the remote directory `rel`, as the local
    /// [`Workspace::list`](crate::files::Workspace::list): names sorted,
    /// breadth first with `recursive`, at most `max` entries (`truncated`
    /// then), symlinks listed and never followed.
    ///
    /// # Errors
    /// `invalid_path`, `not_found`, `not_a_directory` from the helper;
    /// `io` when the backend cannot be reached or has no workspace.
    pub async fn list(
        &self,
        rel: &RelPath,
        recursive: bool,
        max: usize,
    ) -> Result<Listing, FileError> {
        let args = [u8::from(recursive).to_string(), max.to_string()];
        let v = self.control("list", rel, &args).await?;
        #[derive(serde::Deserialize)]
        struct L {
            entries: Vec<E>,
            truncated: bool,
        }
        #[derive(serde::Deserialize)]
        struct E {
            name: String,
            path: String,
            #[serde(rename = "type")]
            kind: String,
            size: u64,
            modified: f64,
        }
        let l: L =
            serde_json::from_str(&v).map_err(|e| remote_err("read the helper's answer", e))?;
        use crate::files::EntryType as T;
        Ok(Listing {
            entries: l
                .entries
                .into_iter()
                .map(|e| Entry {
                    name: e.name,
                    path: e.path,
                    kind: match e.kind.as_str() {
                        "file" => T::File,
                        "dir" => T::Dir,
                        "symlink" => T::Symlink,
                        _ => T::Other,
                    },
                    size: e.size,
                    modified: e.modified,
                })
                .collect(),
            truncated: l.truncated,
        })
    }

    /// Remove the file (or symlink, itself) at `rel`; a directory only
    /// when empty, or with everything in it when `recursive`.
    ///
    /// # Errors
    /// `invalid_path` (also the root itself), `not_found`,
    /// `is_a_directory` (non-empty without `recursive`); `io` when the
    /// backend cannot be reached.
    pub async fn remove(&self, rel: &RelPath, recursive: bool) -> Result<(), FileError> {
        if rel.is_root() {
            return Err(FileError::InvalidPath {
                path: String::new(),
                why:
                    "the workspace root itself is not removed; DELETE the session to drop its files"
                        .into(),
            });
        }
        self.control("rm", rel, &[u8::from(recursive).to_string()])
            .await
            .map(|_| ())
    }

    /// Keep the full text of a cut stream at `.cellhost/output/<name>`
    /// (the newest [`spill::KEEP`](crate::files::spill::KEEP) spill files
    /// stay, as locally). Returns the path relative to the workspace.
    pub(crate) async fn spill(&self, name: &str, text: &str) -> Result<String, FileError> {
        let rel = RelPath::parse(&format!("{}/{name}", crate::files::spill::DIR))?;
        let keep = crate::files::spill::KEEP.to_string();
        self.control_with("spill", &rel, &[keep], text.as_bytes().to_vec())
            .await?;
        Ok(rel.display())
    }

    /// Bytes of the regular files in the workspace (symlinks not
    /// followed; 0 when it does not exist yet or the answer is garbled).
    ///
    /// # Errors
    /// `io` when the backend cannot be reached.
    pub async fn usage(&self) -> Result<u64, FileError> {
        let v = self.control("usage", &RelPath::parse("")?, &[]).await?;
        Ok(v.trim().parse().unwrap_or(0))
    }
}

/// The bytes of a remote file as they arrive; the transport client is
/// killed when this is dropped.
pub struct RemoteReader {
    inner: tokio::io::Take<BufReader<tokio::process::ChildStdout>>,
    _child: tokio::process::Child,
}

impl std::fmt::Debug for RemoteReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemoteReader")
    }
}

impl AsyncRead for RemoteReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_nest_children_under_the_parents_home() {
        let k = key_of("m1", "s1::child::c");
        assert!(k.starts_with("m1/s1-"), "{k}");
        assert!(k.contains("/children/c-") && k.ends_with("/ws"), "{k}");
        assert!(k.starts_with(&home_key("m1", "s1")));
    }
}
