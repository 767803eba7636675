//! A kernel's private Unix sockets (the tool RPC and the egress proxy):
//! bound in its private staging dir, 0600, non-blocking; and the task that
//! serves one, aborted when its owner drops it.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Bind `dir/name` (in a private dir, so no one can reach it before it
/// is 0600), non-blocking for tokio.
///
/// # Errors
/// The bind or the chmod failed.
pub(crate) fn bind_private_socket(dir: &Path, name: &str) -> io::Result<UnixListener> {
    let path = dir.join(name);
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// A spawned task that is aborted when this guard drops.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[tokio::test]
    async fn the_socket_is_owner_only_and_the_task_ends_with_its_guard() {
        let dir = tempfile::tempdir().unwrap();
        let l = bind_private_socket(dir.path(), "s.sock").unwrap();
        let mode = std::fs::metadata(dir.path().join("s.sock")).unwrap().mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(l);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let guard = AbortOnDrop(tokio::spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        }));
        drop(guard);
        assert!(
            rx.await.is_err(),
            "the task was aborted (its sender dropped)"
        );
    }
}
