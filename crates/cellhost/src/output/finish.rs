//! What every backend does the same way when a cell is over: cap and clean
//! the short fields (value, error, traceback), and write the full text of
//! cut streams to a spill file.

use std::io;
use std::path::{Path, PathBuf};

use cellhost_protocol::KernelInfo;

use super::{Capture, Cleaner, OutputLimits};
use crate::sys::private_dir;

/// Value, error and traceback: the streams' cap and cleaning, without a
/// spill file (the runner already bounds them at 1 MiB).
pub(crate) fn clean_fields<const N: usize>(
    output: &OutputLimits,
    cleaner: &Cleaner,
    fields: [Option<String>; N],
) -> [Option<String>; N] {
    let limits = OutputLimits {
        spill_cap_bytes: 0,
        ..output.clone()
    };
    fields.map(|field| {
        field.map(|s| {
            let mut c = Capture::new(&limits, PathBuf::new());
            c.push(s.as_bytes());
            c.finish(cleaner).text
        })
    })
}

/// Write the full text of cut streams next to the session (not in the
/// kernel's staging dir), owner-only. Whatever sits at the path is unlinked
/// first and the file is created exclusively, so a planted symlink is never
/// followed. Returns the path, or `None` when nothing was cut (or the write
/// failed).
pub(crate) fn write_spill(
    spill_dir: &Path,
    info: &KernelInfo,
    out: Option<&str>,
    err: Option<&str>,
) -> Option<String> {
    let text = match (out, err) {
        (None, None) => return None,
        (Some(o), None) => o.to_owned(),
        (None, Some(e)) => e.to_owned(),
        (Some(o), Some(e)) => format!("--- stdout ---\n{o}\n--- stderr ---\n{e}"),
    };
    let path = spill_dir.join(format!("{}-cell-{}.txt", info.id, info.execution_count));
    let write = || -> io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        private_dir(spill_dir)?;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&path)?;
        f.write_all(text.as_bytes())
    };
    write().ok().map(|()| path.display().to_string())
}

/// The spill file of `stream` of cell `n` in a workspace.
pub(crate) fn spill_name(n: u64, stream: &str) -> String {
    format!("cell-{n}.{stream}.txt")
}

/// What the cut marker says when the full text goes to the workspace:
/// the path the next cell opens and the route a client downloads.
pub(crate) fn spill_hint(in_kernel: &Path, n: u64, stream: &str) -> String {
    let rel = format!("{}/{}", crate::files::spill::DIR, spill_name(n, stream));
    format!(
        "{} (open it in the next cell; download: GET /v1/sessions/SESSION/files/{rel})",
        in_kernel.join(&rel).display()
    )
}

/// Write the full text of cut streams into the workspace at `host`
/// (`.cellhost/output/cell-<n>.<stream>.txt`, one file per stream).
/// Returns the in-kernel path of the first one written (stdout's when
/// both were cut), or `None` when nothing was cut or the write failed
/// (a cell that planted a symlink at `.cellhost` loses its spill).
pub(crate) fn spill_to_workspace(
    host: &Path,
    in_kernel: &Path,
    n: u64,
    out: Option<&str>,
    err: Option<&str>,
) -> Option<String> {
    let mut first = None;
    for (stream, text) in [("stdout", out), ("stderr", err)] {
        let Some(text) = text else { continue };
        match crate::files::spill::write(host, &spill_name(n, stream), text) {
            Ok(rel) => {
                first.get_or_insert_with(|| in_kernel.join(rel).display().to_string());
            }
            Err(e) => eprintln!(
                "cellhost: the full {stream} of cell {n} could not be kept in the workspace {}: {e}",
                host.display()
            ),
        }
    }
    first
}
