//! A cell result for a model: one text block (output, value, error with a
//! short traceback, and a plain sentence whenever the kernel's state was
//! reset, lost or ended) plus an image block per image display. The whole
//! result also travels as structured content (see `server`).

use cellhost::{CellResult, DisplayItem, Status};
use rmcp::model::ContentBlock;

/// Traceback lines a model gets (the innermost frames).
const TRACEBACK_LINES: usize = 20;
/// Image types MCP clients render.
const IMAGE_MIMES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];

/// The text a model reads for a finished cell.
pub fn render(r: &CellResult) -> String {
    let mut out = String::new();
    if let Some(sentence) = state_sentence(r) {
        out.push_str(&sentence);
        out.push_str("\n\n");
    }
    push_block(&mut out, &r.stdout);
    if !r.stderr.is_empty() {
        out.push_str("[stderr]\n");
        push_block(&mut out, &r.stderr);
    }
    for d in &r.displays {
        match d.mime.as_str() {
            m if IMAGE_MIMES.contains(&m) => {
                out.push_str(&format!("[display {}: image {m}, attached]\n", d.display))
            }
            "text/plain" | "text/markdown" | "application/json" => push_block(&mut out, &d.data),
            m => out.push_str(&format!(
                "[display {}: {m}, {} bytes, in the structured result]\n",
                d.display,
                d.data.len()
            )),
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
            push_block(&mut out, &short_traceback(tb));
        }
        if let Some(e) = r.error_beyond_traceback() {
            push_block(&mut out, e);
        }
        if let Some(h) = &r.hint {
            out.push_str(&format!("Hint: {h}\n"));
        }
        out.push_str(&status_sentence(r));
        out.push('\n');
    }
    if let Some(p) = &r.truncated.spill_path {
        out.push_str(&format!(
            "(output was cut; the full text is in {p} inside the kernel)\n"
        ));
    }
    if r.tool_calls_made > 0 {
        out.push_str(&format!("({} tool call(s) made)\n", r.tool_calls_made));
    }
    if out.trim().is_empty() {
        out = "(no output)".to_owned();
    }
    out.trim_end().to_owned()
}

/// [`render`], first saying which session the cell ran in when the call
/// named one (`session`), so a model juggling sessions can tell them apart.
pub fn render_in(r: &CellResult, session: Option<&str>) -> String {
    match session {
        Some(s) => format!("[session {s:?}]\n{}", render(r)),
        None => render(r),
    }
}

/// The content blocks of a result: the text, then one image per image
/// display; `session` is the session the call named.
pub(crate) fn content(r: &CellResult, session: Option<&str>) -> Vec<ContentBlock> {
    let mut blocks = vec![ContentBlock::text(render_in(r, session))];
    blocks.extend(
        r.displays
            .iter()
            .filter(|d| IMAGE_MIMES.contains(&d.mime.as_str()))
            .map(|d: &DisplayItem| ContentBlock::image(d.data.clone(), d.mime.clone())),
    );
    blocks
}

/// Said first whenever the kernel is not simply the one the last call used.
fn state_sentence(r: &CellResult) -> Option<String> {
    let k = &r.kernel;
    let note = k
        .note
        .as_deref()
        .map(|n| format!(" ({n})"))
        .unwrap_or_default();
    if k.state_lost {
        Some(format!(
            "The kernel's state was lost{note}: variables, imports and definitions from \
             earlier calls are gone; re-run the setup you need."
        ))
    } else if k.state_reset {
        Some(format!(
            "The kernel was restarted before this cell{note}: earlier variables and imports \
             are gone."
        ))
    } else {
        k.note.as_deref().map(|n| format!("Note: {n}"))
    }
}

/// The last line for a cell that did not succeed.
fn status_sentence(r: &CellResult) -> String {
    let ended = if r.kernel.ended {
        " The kernel ended; the next call starts a fresh one (state is gone)."
    } else if r.kernel.state_lost {
        ""
    } else {
        " The kernel's state is kept."
    };
    match r.status {
        Status::Timeout => format!("[timeout after {:.1} s]{ended}", r.duration_seconds),
        Status::Interrupted => format!("[interrupted]{ended}"),
        Status::Error => format!("[error]{ended}"),
        Status::Success => String::new(),
        // A status a newer protocol adds: its wire name.
        other => format!("[{}]{ended}", other.as_str()),
    }
}

fn short_traceback(tb: &str) -> String {
    let lines: Vec<&str> = tb.lines().collect();
    if lines.len() <= TRACEBACK_LINES {
        return tb.to_owned();
    }
    let skipped = lines.len() - TRACEBACK_LINES;
    let mut out = format!("Traceback (most recent call last, {skipped} line(s) above cut):\n");
    out.push_str(&lines[skipped..].join("\n"));
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

#[cfg(test)]
mod tests {
    use super::*;
    use cellhost::{KernelInfo, Truncated};

    fn result(status: Status) -> CellResult {
        CellResult {
            status,
            stdout: "hi\n".into(),
            stderr: String::new(),
            value: None,
            error: None,
            traceback: None,
            hint: None,
            displays: vec![],
            value_display: None,
            truncated: Truncated::default(),
            tool_calls_made: 0,
            duration_seconds: 0.01,
            kernel: KernelInfo {
                execution_count: 3,
                reused: true,
                ..KernelInfo::default()
            },
        }
    }

    #[test]
    fn success_is_output_and_value() {
        let mut r = result(Status::Success);
        r.value = Some("42".into());
        assert_eq!(render(&r), "hi\nOut[3]: 42");
    }

    #[test]
    fn errors_show_a_short_traceback_once() {
        let mut r = result(Status::Error);
        r.error = Some("ZeroDivisionError: division by zero".into());
        let frames: Vec<String> = (0..40).map(|i| format!("  frame {i}")).collect();
        r.traceback = Some(format!(
            "Traceback (most recent call last):\n{}\nZeroDivisionError: division by zero",
            frames.join("\n")
        ));
        let text = render(&r);
        assert!(text.contains("line(s) above cut"), "{text}");
        assert!(
            text.contains("frame 39") && !text.contains("frame 3\n"),
            "{text}"
        );
        assert_eq!(text.matches("ZeroDivisionError").count(), 1, "{text}");
        assert!(
            text.ends_with("[error] The kernel's state is kept."),
            "{text}"
        );
    }

    #[test]
    fn a_hint_follows_the_error() {
        let mut r = result(Status::Error);
        r.error = Some("ModuleNotFoundError: No module named 'sklearn'".into());
        r.hint = Some("install it with `%pip install scikit-learn`".into());
        let text = render(&r);
        assert!(
            text.contains(
                "ModuleNotFoundError: No module named 'sklearn'\nHint: install it with `%pip install scikit-learn`\n[error]"
            ),
            "{text}"
        );
    }

    #[test]
    fn lost_reset_and_ended_kernels_are_said_plainly() {
        let mut r = result(Status::Error);
        r.kernel.state_lost = true;
        r.kernel.ended = true;
        r.kernel.note = Some("kernel died: signal 9".into());
        let text = render(&r);
        assert!(
            text.starts_with("The kernel's state was lost (kernel died: signal 9)"),
            "{text}"
        );
        assert!(
            text.contains("The kernel ended; the next call starts a fresh one"),
            "{text}"
        );
        let mut r = result(Status::Success);
        r.kernel.state_reset = true;
        assert!(render(&r).starts_with("The kernel was restarted before this cell"));
        let mut r = result(Status::Timeout);
        r.duration_seconds = 2.0;
        assert!(render(&r).contains("[timeout after 2.0 s] The kernel's state is kept."));
    }

    #[test]
    fn a_named_session_is_said_first() {
        let r = result(Status::Success);
        assert_eq!(render_in(&r, Some("conv-7")), "[session \"conv-7\"]\nhi");
        assert_eq!(render_in(&r, None), "hi");
        let mut quiet = result(Status::Success);
        quiet.stdout.clear();
        assert_eq!(render_in(&quiet, Some("s")), "[session \"s\"]\n(no output)");
    }

    #[test]
    fn images_become_image_blocks() {
        let mut r = result(Status::Success);
        r.displays.push(DisplayItem {
            mime: "image/png".into(),
            data: "iVBORw0KGgo=".into(),
            display: 0,
        });
        r.displays.push(DisplayItem {
            mime: "text/html".into(),
            data: "<b>x</b>".into(),
            display: 1,
        });
        let blocks = content(&r, None);
        assert_eq!(blocks.len(), 2);
        let text = render(&r);
        assert!(text.contains("image image/png, attached"), "{text}");
        assert!(text.contains("text/html, 8 bytes"), "{text}");
    }
}
