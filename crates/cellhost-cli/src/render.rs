//! Text rendering of cell results for a person reading a terminal.

use cellhost::percent::ScriptCell;
use cellhost::{CellResult, Status};

use crate::displays::Shown;

/// The line that announces a cell, printed before it runs so a long cell
/// shows what is running.
pub(crate) fn cell_header(cell: &ScriptCell) -> String {
    let title = cell
        .title
        .as_deref()
        .map(|t| format!(" · {t}"))
        .unwrap_or_default();
    format!("── cell {} (line {}){title} ──\n", cell.index, cell.line)
}

/// A notebook-like transcript of one finished cell: its output, its
/// displays (images by path), its value, its error and a note whenever the
/// kernel's state changed.
pub(crate) fn cell_body(r: &CellResult, shown: &[Shown]) -> String {
    let mut out = String::new();
    push_block(&mut out, &r.stdout);
    push_block(&mut out, &r.stderr);
    for (i, s) in shown.iter().enumerate() {
        match s {
            Shown::Image { path, mime, size } => {
                let size = size.map(|(w, h)| format!(" {w}×{h}")).unwrap_or_default();
                out.push_str(&format!("[{mime}{size}: {}]\n", path.display()));
            }
            // The last value's display repeats `Out[n]`: shown once.
            Shown::Text(t) if i + 1 == shown.len() && Some(t) == r.value.as_ref() => {}
            Shown::Text(t) => push_block(&mut out, t),
            Shown::Failed(why) => out.push_str(&format!("(display not saved: {why})\n")),
        }
    }
    if let Some(note) = &r.truncated.displays_note {
        out.push_str(&format!("({note})\n"));
    }
    if let Some(v) = &r.value {
        out.push_str(&format!("Out[{}]: {v}\n", r.kernel.execution_count));
    }
    if r.status != Status::Success {
        if let Some(tb) = r.traceback.as_deref().filter(|t| !t.trim().is_empty()) {
            push_block(&mut out, tb);
        }
        if let Some(e) = r.error_beyond_traceback() {
            out.push_str(&format!("{e}\n"));
        }
        if let Some(h) = &r.hint {
            out.push_str(&format!("hint: {h}\n"));
        }
        out.push_str(&format!("[{}]\n", r.status.as_str()));
    }
    if let Some(p) = &r.truncated.spill_path {
        out.push_str(&format!("(output cut; full text in {p})\n"));
    }
    if let Some(note) = &r.kernel.note {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}

fn push_block(out: &mut String, text: &str) {
    if text.is_empty() {
        return;
    }
    out.push_str(text);
    if !text.ends_with('\n') {
        out.push('\n');
    }
}
