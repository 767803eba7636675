//! Rich outputs on the host side: display frames from the runner become
//! the running cell's [`DisplayItem`]s, under per-display and per-cell caps.
//!
//! The runner (`runner.py` with `display.py`) sends each display as its own
//! frame on the reply pipe while the cell runs: `op=display`, then items
//! `m0`/`d0`, `m1`/`d1`, ... (mime, raw data). The host numbers displays
//! in arrival order (the `display` index groups the items of one bundle),
//! cleans text items like stdout (ANSI strip for `text/plain`, secret
//! redaction for every text mime), base64-encodes binary ones, and passes
//! each display to the cell's event sink as it arrives.
//!
//! Caps are enforced twice: the runner drops what is over them without
//! sending it (and says so in its reply), and the host drops what still
//! comes over them. A display frame over the per-display cap is never
//! buffered (see [`super::frame::FrameReader`]), so host memory per cell
//! stays at about the per-cell cap whatever the kernel sends.
//!
//! A display that arrives between cells (a thread of an earlier cell)
//! belongs to the next cell, like late stdout.

use base64::Engine;
use cellhost_protocol::{is_text_mime, DisplayItem};
use tokio::sync::mpsc::UnboundedSender;

use super::frame::Frame;
use crate::output::Cleaner;

/// Most items one display may carry (a bundle has a handful).
const MAX_ITEMS: usize = 32;

/// Bytes a display frame may carry above the per-display cap: field
/// headers and mime names.
pub(crate) const FRAME_SLACK: usize = 4096;

/// Size caps of rich outputs. Sizes count the raw bytes of every item of
/// a display (before base64), as the runner sends them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisplayLimits {
    /// Max bytes of one display, all its items together (default 5 MiB;
    /// at most 256 MiB, what one control frame may carry).
    pub max_display_bytes: usize,
    /// Max bytes of all the displays of one cell (default 20 MiB).
    pub max_cell_bytes: usize,
    /// Max number of displays of one cell (default 1000).
    pub max_cell_displays: u32,
}

impl Default for DisplayLimits {
    fn default() -> Self {
        DisplayLimits {
            max_display_bytes: 5 << 20,
            max_cell_bytes: 20 << 20,
            max_cell_displays: 1000,
        }
    }
}

/// Something a running cell produced, sent as it happens (see
/// [`super::Cell::events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CellEvent {
    /// One display: its items, which share one `display` index. The same
    /// items are in the cell's result.
    Display(Vec<DisplayItem>),
    /// Cleaned stdout text, released at line ends (see
    /// [`crate::output::stream`]); the result still has all of it.
    Stdout(String),
    /// Cleaned stderr text, as [`CellEvent::Stdout`].
    Stderr(String),
    /// Streaming of `stream` stopped at the per-cell cap (`after_bytes`),
    /// right after its stop line; the result has the stream's head and tail.
    StreamStopped {
        /// The stream that stopped.
        stream: cellhost_protocol::OutputStream,
        /// The cap it reached, in bytes.
        after_bytes: u64,
    },
    /// The display of the cell's last value, when its type has a rich
    /// repr (`_repr_html_`, a DataFrame, a figure, ...): its items, with
    /// the value's `text/plain`. Like [`CellEvent::Display`] it is in the
    /// result's `displays`, at the index `value_display` names; a
    /// consumer that shows displays treats it as one (Jupyter sends it as
    /// the `execute_result`).
    Value(Vec<DisplayItem>),
}

/// The displays of the cell being run (or of the next one, between cells).
#[derive(Debug)]
pub(crate) struct Displays {
    limits: DisplayLimits,
    cleaner: Cleaner,
    items: Vec<DisplayItem>,
    count: u32,
    bytes: usize,
    dropped: u32,
    first_reason: Option<String>,
    /// The index of the display that is the last value's (a frame with
    /// `value`).
    value: Option<u32>,
    sink: Option<UnboundedSender<CellEvent>>,
}

impl Displays {
    pub(crate) fn new(limits: DisplayLimits, cleaner: Cleaner) -> Displays {
        Displays {
            limits,
            cleaner,
            items: Vec::new(),
            count: 0,
            bytes: 0,
            dropped: 0,
            first_reason: None,
            value: None,
            sink: None,
        }
    }

    /// A cell starts with `sink` as its event sink. Displays that arrived
    /// since the last cell settled belong to this cell: the sink gets them
    /// first.
    pub(crate) fn begin(&mut self, sink: Option<UnboundedSender<CellEvent>>) {
        self.sink = sink;
        if let Some(sink) = &self.sink {
            for group in self.items.chunk_by(|a, b| a.display == b.display) {
                let _ = sink.send(CellEvent::Display(group.to_vec()));
            }
        }
    }

    /// The cell could not run: let go of its sink (its displays stay for
    /// the next cell).
    pub(crate) fn abandon(&mut self) {
        self.sink = None;
    }

    /// Take one `op=display` frame.
    pub(crate) fn accept(&mut self, mut frame: Frame) {
        if let Some(size) = frame.int("skipped") {
            let size = usize::try_from(size).unwrap_or(usize::MAX);
            return self.drop_one(format!(
                "a display of {} is over the per-display cap of {}",
                human(size.saturating_sub(FRAME_SLACK)),
                human(self.limits.max_display_bytes)
            ));
        }
        let mut raw = Vec::new();
        let mut size = 0usize;
        for i in 0..MAX_ITEMS {
            let (Some(mime), Some(data)) =
                (frame.take(&format!("m{i}")), frame.take(&format!("d{i}")))
            else {
                break;
            };
            size += data.len();
            raw.push((String::from_utf8_lossy(&mime).into_owned(), data));
        }
        let is_value = frame.take("value").is_some();
        if raw.is_empty() {
            return;
        }
        let l = &self.limits;
        if size > l.max_display_bytes {
            let what = kinds(&raw);
            return self.drop_one(format!(
                "a display ({what}) of {} is over the per-display cap of {}",
                human(size),
                human(l.max_display_bytes)
            ));
        }
        if self.count >= l.max_cell_displays {
            let n = l.max_cell_displays;
            return self.drop_one(format!("the cell reached its cap of {n} displays"));
        }
        if self.bytes + size > l.max_cell_bytes {
            let cap = human(l.max_cell_bytes);
            return self.drop_one(format!(
                "the cell's displays reached the per-cell cap of {cap}"
            ));
        }
        let index = self.count;
        self.count += 1;
        self.bytes += size;
        let group: Vec<DisplayItem> = raw
            .into_iter()
            .map(|(mime, data)| {
                let data = if mime == "text/plain" {
                    self.cleaner.clean(&data)
                } else if is_text_mime(&mime) {
                    self.cleaner.redact(&String::from_utf8_lossy(&data))
                } else {
                    base64::engine::general_purpose::STANDARD.encode(&data)
                };
                DisplayItem {
                    mime,
                    data,
                    display: index,
                }
            })
            .collect();
        if is_value {
            self.value = Some(index);
        }
        if let Some(sink) = &self.sink {
            let _ = sink.send(if is_value {
                CellEvent::Value(group.clone())
            } else {
                CellEvent::Display(group.clone())
            });
        }
        self.items.extend(group);
    }

    /// Displays the runner dropped itself (reported in its reply).
    pub(crate) fn runner_dropped(&mut self, count: u32, reason: Option<String>) {
        if count == 0 {
            return;
        }
        self.dropped = self.dropped.saturating_add(count);
        if self.first_reason.is_none() {
            self.first_reason = reason;
        }
    }

    fn drop_one(&mut self, reason: String) {
        self.dropped = self.dropped.saturating_add(1);
        if self.first_reason.is_none() {
            self.first_reason = Some(reason);
        }
    }

    /// The index of the display that is the cell's last value, if one is
    /// (call before [`Displays::finish`]).
    pub(crate) fn value_display(&self) -> Option<u32> {
        self.value
    }

    /// The cell settled: its displays, how many were dropped and a note
    /// saying why. What arrives from now on belongs to the next cell.
    pub(crate) fn finish(&mut self) -> (Vec<DisplayItem>, u32, Option<String>) {
        self.sink = None;
        self.value = None;
        self.count = 0;
        self.bytes = 0;
        let dropped = std::mem::take(&mut self.dropped);
        let reason = self.first_reason.take();
        let note = (dropped > 0).then(|| {
            let (n, s) = (dropped, if dropped == 1 { "" } else { "s" });
            let why = reason.unwrap_or_else(|| "over a size cap".into());
            format!(
                "{n} display{s} dropped: {why}. Show less (e.g. a lower dpi or a smaller figsize, fewer figures per cell) or raise the caps (KernelOptions::display)."
            )
        });
        (std::mem::take(&mut self.items), dropped, note)
    }
}

/// `image/png, text/html` (the non-text items, else `text/plain`).
fn kinds(raw: &[(String, Vec<u8>)]) -> String {
    let rich: Vec<&str> = raw
        .iter()
        .map(|(m, _)| m.as_str())
        .filter(|m| *m != "text/plain")
        .collect();
    if rich.is_empty() {
        "text/plain".into()
    } else {
        rich.join(", ")
    }
}

/// `5.0 MiB`, `12.5 KiB`, `300 bytes`.
pub(crate) fn human(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1 << 20) as f64)
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(items: &[(&str, &[u8])]) -> Frame {
        let mut f = Frame::new().with("op", "display");
        for (i, (m, d)) in items.iter().enumerate() {
            f = f
                .with(&format!("m{i}"), *m)
                .with(&format!("d{i}"), d.to_vec());
        }
        f
    }

    fn limits(display: usize, cell: usize, count: u32) -> DisplayLimits {
        DisplayLimits {
            max_display_bytes: display,
            max_cell_bytes: cell,
            max_cell_displays: count,
        }
    }

    #[test]
    fn binary_items_are_base64_and_text_is_cleaned() {
        let mut d = Displays::new(DisplayLimits::default(), Cleaner::default());
        d.accept(frame(&[
            ("image/png", b"\x89PNG\r\n"),
            ("text/plain", b"\x1b[31mred\x1b[0m"),
        ]));
        d.accept(frame(&[("text/html", b"<b>x</b>")]));
        let (items, dropped, note) = d.finish();
        assert_eq!(dropped, 0);
        assert!(note.is_none());
        assert_eq!(items.len(), 3);
        assert_eq!((items[0].data.as_str(), items[0].display), ("iVBORw0K", 0));
        assert_eq!((items[1].data.as_str(), items[1].display), ("red", 0));
        assert_eq!((items[2].data.as_str(), items[2].display), ("<b>x</b>", 1));
    }

    #[test]
    fn the_value_frame_is_marked_and_sent_as_a_value_event() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut d = Displays::new(DisplayLimits::default(), Cleaner::default());
        d.begin(Some(tx));
        d.accept(frame(&[("text/html", b"<i>shown</i>")]));
        d.accept(frame(&[("text/html", b"<b>v</b>"), ("text/plain", b"V()")]).with("value", "1"));
        assert_eq!(d.value_display(), Some(1));
        assert!(matches!(rx.try_recv(), Ok(CellEvent::Display(_))));
        let Ok(CellEvent::Value(items)) = rx.try_recv() else {
            panic!("the value's display is a Value event")
        };
        assert_eq!((items[0].data.as_str(), items[0].display), ("<b>v</b>", 1));
        let (items, _, _) = d.finish();
        assert_eq!(items.len(), 3);
        assert_eq!(d.value_display(), None, "the next cell starts without one");
    }

    #[test]
    fn caps_drop_displays_with_a_note_and_indices_stay_dense() {
        let mut d = Displays::new(limits(10, 15, 2), Cleaner::default());
        d.accept(frame(&[("text/plain", b"0123456789ab")])); // over 10
        d.accept(frame(&[("text/plain", b"012345678")])); // kept, 9
        d.accept(frame(&[("text/plain", b"0123456")])); // 16 > 15
        d.accept(frame(&[("text/plain", b"01")])); // kept, 11
        d.accept(frame(&[("text/plain", b"0")])); // third display: over count
        let (items, dropped, note) = d.finish();
        assert_eq!(items.iter().map(|i| i.display).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(dropped, 3);
        let note = note.unwrap();
        assert!(
            note.starts_with(
                "3 displays dropped: a display (text/plain) of 12 bytes is over the per-display cap of 10 bytes"
            ),
            "{note}"
        );
        // The next cell starts from zero.
        d.accept(frame(&[("text/plain", b"012345678")]));
        assert_eq!(d.finish().0.len(), 1);
    }

    #[test]
    fn a_skipped_frame_counts_as_dropped() {
        let mut d = Displays::new(limits(1 << 20, 1 << 30, 10), Cleaner::default());
        d.accept(
            Frame::new()
                .with("op", "display")
                .with("skipped", (3usize << 20).to_string()),
        );
        d.runner_dropped(2, Some("runner said so".into()));
        let (items, dropped, note) = d.finish();
        assert!(items.is_empty());
        assert_eq!(dropped, 3);
        assert!(note
            .unwrap()
            .contains("over the per-display cap of 1.0 MiB"));
    }

    #[test]
    fn displays_between_cells_go_to_the_next_cells_sink_first() {
        let mut d = Displays::new(DisplayLimits::default(), Cleaner::default());
        d.accept(frame(&[("text/plain", b"late")]));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        d.begin(Some(tx));
        d.accept(frame(&[("text/plain", b"now")]));
        let got: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(got.len(), 2);
        let CellEvent::Display(first) = &got[0] else {
            panic!("a display event expected: {:?}", got[0]);
        };
        assert_eq!(first[0].data, "late");
        let (items, _, _) = d.finish();
        assert_eq!(items.len(), 2);
    }
}
