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

/// `text` safe to print on a terminal: every control character but
/// newline and tab (ESC, the C1 controls U+0080–U+009F such as CSI, BEL,
/// a bare CR, DEL) is shown as a visible escape (`\x1b`, `\u{9b}`), so
/// stored text cannot move the cursor, retitle the window or hide a line.
pub(crate) fn for_terminal(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !unsafe_char(c) {
            out.push(c);
        } else if (c as u32) < 0x80 {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::for_terminal;

    #[test]
    fn terminal_controls_become_visible_escapes() {
        assert_eq!(for_terminal("print(1)\n\tx"), "print(1)\n\tx");
        assert_eq!(
            for_terminal("a\u{1b}]0;owned\u{7}b\u{9b}2Jc\rd\u{7f}"),
            "a\\x1b]0;owned\\x07b\\u{9b}2Jc\\x0dd\\x7f"
        );
        // Printable text outside ASCII is left alone.
        assert_eq!(for_terminal("é ✓ 日本"), "é ✓ 日本");
    }
}
