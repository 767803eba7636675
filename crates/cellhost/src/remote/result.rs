//! A remote cell's result blob, turned into a [`CellResult`] through the
//! same output pipeline as local cells (cap, spill, clean, redact).
//!
//! Blob: `CELLHOST1 <frames> <stdout> <stderr>\n` then the three parts.
//! The frames are runner.py's own (displays, then the `done` reply).

use std::path::Path;

use cellhost_protocol::{CellResult, KernelInfo, Truncated};

use crate::kernel::frame::{Frame, FrameReader};
use crate::kernel::{Displays, Report};
use crate::output::{finish, Capture, Cleaner, OutputLimits};
use crate::sys::private_dir;

/// A parsed result blob.
#[derive(Debug, Default)]
pub(crate) struct Blob {
    pub reply: Option<Frame>,
    pub displays: Vec<Frame>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes the cell wrote to each stream; more than `stdout`/`stderr`
    /// hold when the remote side cut them (its own head and tail).
    pub stdout_total: u64,
    pub stderr_total: u64,
}

/// Parse a blob; `Err` says what is wrong with it.
pub(crate) fn parse(bytes: &[u8]) -> Result<Blob, String> {
    let nl = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("no header line")?;
    let head = std::str::from_utf8(&bytes[..nl]).map_err(|_| "header is not text")?;
    let mut parts = head.split(' ');
    if parts.next() != Some("CELLHOST1") {
        return Err(format!(
            "unknown header {:?}",
            head.chars().take(40).collect::<String>()
        ));
    }
    let sizes: Vec<usize> = parts
        .map(|p| p.parse::<usize>().map_err(|_| format!("bad size {p:?}")))
        .collect::<Result<_, _>>()?;
    let (f, o, e, o_total, e_total) = match sizes[..] {
        [f, o, e] => (f, o, e, o, e),
        [f, o, e, ot, et] => (f, o, e, ot, et),
        _ => return Err("header needs three or five sizes".into()),
    };
    let body = &bytes[nl + 1..];
    if body.len() != f.saturating_add(o).saturating_add(e) {
        return Err(format!(
            "truncated: {} bytes for a body of {}",
            body.len(),
            f + o + e
        ));
    }
    let mut blob = Blob {
        stdout: body[f..f + o].to_vec(),
        stderr: body[f + o..].to_vec(),
        stdout_total: o_total as u64,
        stderr_total: e_total as u64,
        ..Blob::default()
    };
    let mut reader = FrameReader::default();
    reader.extend(&body[..f]);
    while let Some(frame) = reader.next_frame().map_err(|e| format!("bad frame: {e}"))? {
        match frame.text("op").as_deref() {
            Some("display") => blob.displays.push(frame),
            Some("done") => blob.reply = Some(frame),
            other => return Err(format!("unexpected frame op {other:?}")),
        }
    }
    Ok(blob)
}

/// Turns raw cell output into the bounded, cleaned result.
pub(crate) struct Finisher<'a> {
    pub output: &'a OutputLimits,
    pub cleaner: &'a Cleaner,
    pub spill_dir: &'a Path,
    /// The session's remote workspace (the runner's cwd): the full text
    /// of cut streams goes there (written by the caller, over the
    /// transport) and the cut markers name it; `None`: into `spill_dir`.
    pub workspace: Option<&'a str>,
}

/// Cut streams the caller keeps in the remote workspace: the spill file's
/// name (`cell-<n>.<stream>.txt`) and the full text.
pub(crate) type Pending = Vec<(String, String)>;

impl Finisher<'_> {
    pub(crate) fn finish(
        &self,
        report: Report,
        info: KernelInfo,
        blob: &Blob,
        displays: &mut Displays,
        seconds: f64,
    ) -> (CellResult, Pending) {
        let [value, error, traceback, hint] = finish::clean_fields(
            self.output,
            self.cleaner,
            [report.value, report.error, report.traceback, report.hint],
        );
        // Raw spill files of cut streams go here.
        let _ = private_dir(self.spill_dir);
        let tag = super::short_hash(&format!("{}-{}", info.id, info.execution_count));
        let n = info.execution_count;
        let capture = |bytes: &[u8], total: u64, stream: &str| {
            let mut c = Capture::new(
                self.output,
                self.spill_dir.join(format!("remote-{tag}.{stream}.raw")),
            );
            if let Some(ws) = self.workspace {
                c.spill_hint(finish::spill_hint(Path::new(ws), n, stream));
            }
            c.push(bytes);
            // What the remote side cut before sending (its marker is in
            // `bytes`, counted in `total` as the bytes it replaced).
            c.count_unseen(total.saturating_sub(bytes.len() as u64));
            c.finish(self.cleaner)
        };
        let out = capture(&blob.stdout, blob.stdout_total, "stdout");
        let err = capture(&blob.stderr, blob.stderr_total, "stderr");
        let mut pending = Pending::new();
        let spill_path = match self.workspace {
            Some(_) => {
                for (stream, full) in [("stdout", &out.full), ("stderr", &err.full)] {
                    if let Some(text) = full {
                        pending.push((finish::spill_name(n, stream), text.clone()));
                    }
                }
                None
            }
            None => finish::write_spill(
                self.spill_dir,
                &info,
                out.full.as_deref(),
                err.full.as_deref(),
            ),
        };
        let value_display = displays.value_display();
        let (items, dropped, note) = displays.finish();
        let result = CellResult {
            status: report.status,
            stdout: out.text,
            stderr: err.text,
            value,
            error,
            traceback,
            hint,
            displays: items,
            value_display,
            truncated: Truncated {
                stdout: out.truncated,
                stderr: err.truncated,
                spill_path,
                displays_dropped: dropped,
                displays_note: note,
            },
            tool_calls_made: 0,
            duration_seconds: seconds,
            kernel: info,
        };
        (result, pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_splits_into_frames_and_streams() {
        let reply = Frame::new()
            .with("op", "done")
            .with("status", "ok")
            .encode();
        let mut blob = format!("CELLHOST1 {} 3 2\n", reply.len()).into_bytes();
        blob.extend(&reply);
        blob.extend(b"outer");
        let b = parse(&blob).unwrap();
        assert_eq!(b.stdout, b"out");
        assert_eq!(b.stderr, b"er");
        assert_eq!(b.reply.unwrap().text("status").as_deref(), Some("ok"));
    }

    #[test]
    fn a_cut_or_foreign_blob_is_refused_with_the_reason() {
        assert!(parse(b"CELLHOST1 0 5 0\nabc")
            .unwrap_err()
            .contains("truncated"));
        assert!(parse(b"HTTP/1.1 200\n")
            .unwrap_err()
            .contains("unknown header"));
        assert!(parse(b"").unwrap_err().contains("no header"));
    }
}
