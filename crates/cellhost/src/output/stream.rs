//! Live output: a cell's stdout or stderr streamed while it runs, cleaned
//! like the final result.
//!
//! A [`LineTap`] sits on a [`Capture`](super::Capture) and sees every raw
//! byte it gets. It releases text only at safe points so that cleaning
//! piece by piece redacts what cleaning the whole would:
//!
//! - whole lines (ending in `\n` or `\r`), so a token split across two
//!   reads is cleaned in one piece;
//! - never inside a PEM private-key block: from its BEGIN line the text is
//!   held until the END line, then cleaned as one block (a block that
//!   grows past [`KEY_HOLD_MAX`] is released as one redaction and the rest
//!   of it is dropped);
//! - never where a secret could straddle the cut (`hold.rs`): a line end
//!   inside a multi-line secret value waits for the value's next line;
//! - a line longer than [`HOLD_MAX`] without a newline is released up to
//!   its last separator that no secret can straddle (not the space after
//!   `Bearer`, not inside a secret value); without one, all but its last
//!   [`HOLD_BACK`] bytes, cut before a token that starts near there.
//!
//! Streaming is bounded: after `budget` raw bytes (the per-cell cap) the
//! tap sends one line saying it stopped; the cell result still has the
//! head and tail of everything. Text still held when the cell ends is
//! released by [`LineTap::flush`].

use super::clean::{Cleaner, Edges};
use super::group_digits;
use super::hold;

/// Longest text held waiting for a newline.
pub const HOLD_MAX: usize = 16 * 1024;

/// Bytes kept back when a line over [`HOLD_MAX`] without a space is
/// released: longer than any secret pattern, so one straddling two reads
/// is never split across events.
pub const HOLD_BACK: usize = 256;

/// Longest private-key block held waiting for its END line.
pub const KEY_HOLD_MAX: usize = 64 * 1024;

/// Where released, cleaned text goes.
pub type Emit = Box<dyn FnMut(String) + Send>;

/// Told once, after the stop line, that streaming stopped at the cap (its
/// argument: the cap in bytes), so a consumer learns it as a fact rather
/// than by reading the text.
pub type OnStop = Box<dyn FnOnce(u64) + Send>;

/// Streams one output stream's cleaned text at safe points.
pub struct LineTap {
    name: &'static str,
    emit: Emit,
    cleaner: Cleaner,
    pending: Vec<u8>,
    /// Where the last (incomplete) line of `pending` starts: lines before
    /// it were scanned already, so a push scans only what is new (a line
    /// written a byte at a time stays linear).
    line_start: usize,
    budget: usize,
    limit: usize,
    in_key: bool,
    /// A key block overflowed: drop lines until its END line.
    dropping_key: bool,
    stopped: bool,
    /// The last release was a forced cut inside a run of token characters:
    /// the next piece starts after a cut.
    after_cut: bool,
    on_stop: Option<OnStop>,
}

impl std::fmt::Debug for LineTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineTap")
            .field("name", &self.name)
            .field("pending", &self.pending.len())
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl LineTap {
    /// `name` is the stream's name in the stop notice (`stdout`);
    /// `budget` the raw bytes streamed before it stops.
    pub fn new(name: &'static str, budget: usize, cleaner: Cleaner, emit: Emit) -> LineTap {
        LineTap {
            name,
            emit,
            cleaner,
            pending: Vec::new(),
            line_start: 0,
            budget,
            limit: budget,
            in_key: false,
            dropping_key: false,
            stopped: false,
            after_cut: false,
            on_stop: None,
        }
    }

    /// Call `f` once when streaming stops at the cap (after the stop line
    /// was emitted).
    pub fn on_stop(mut self, f: OnStop) -> LineTap {
        self.on_stop = Some(f);
        self
    }

    /// Raw bytes the stream carried.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.stopped || bytes.is_empty() {
            return;
        }
        let scan_from = self.pending.len();
        self.pending.extend_from_slice(bytes);
        let release = self.release_point(scan_from);
        if self.dropping_key {
            // Everything up to `release` belongs to the dropped block.
            self.drain_front(release);
            return;
        }
        let release = hold::settle(&self.pending, release, self.cleaner.secrets());
        self.release(release);
        if !self.in_key
            && self.pending.len() > HOLD_MAX
            && hold::key_opens(&self.pending[self.line_start..])
        {
            // A BEGIN marker on a long line: held like a key block.
            self.in_key = true;
        }
        if self.in_key && self.pending.len() > KEY_HOLD_MAX {
            // The cleaner redacts an unterminated block through the end.
            let held = std::mem::take(&mut self.pending);
            self.line_start = 0;
            self.send(&held);
            self.dropping_key = true;
        } else if !self.in_key && self.pending.len() > HOLD_MAX {
            let (at, forced) =
                hold::long_line_cut(&self.pending, HOLD_BACK, self.cleaner.secrets());
            if forced && at > 0 {
                let chunk = self.drain_front(at);
                self.send_part(&chunk, true);
                self.after_cut = true;
            } else if !forced {
                self.release(at);
            }
        }
    }

    /// Release whatever is held (the cell ended).
    pub fn flush(&mut self) {
        if self.stopped || self.dropping_key {
            self.pending.clear();
            self.line_start = 0;
            return;
        }
        let n = self.pending.len();
        self.release(n);
    }

    /// The end of the last complete line that is safe to release, tracking
    /// key blocks through the lines that start at or after `scan_from`'s
    /// line.
    fn release_point(&mut self, scan_from: usize) -> usize {
        // Start at the beginning of the line `scan_from` is in.
        let mut start = self.line_start.min(scan_from);
        let mut release = if self.in_key || self.dropping_key {
            0
        } else {
            start
        };
        // Bytes of the incomplete line before `scan_from` hold no line end.
        let mut from = scan_from.max(start);
        while let Some(off) = self.pending[from..]
            .iter()
            .position(|&b| b == b'\n' || b == b'\r')
        {
            let end = from + off + 1;
            let line = &self.pending[start..end];
            if !self.in_key && contains(line, b"-----BEGIN ") && contains(line, b"PRIVATE KEY") {
                self.in_key = true;
            }
            if self.in_key && contains(line, b"-----END ") && contains(line, b"PRIVATE KEY") {
                self.in_key = false;
                if self.dropping_key {
                    self.dropping_key = false;
                    // Drop through the END line, release nothing of it.
                    self.pending.drain(..end);
                    self.line_start = 0;
                    start = 0;
                    from = 0;
                    release = 0;
                    continue;
                }
            }
            if !self.in_key {
                release = end;
            }
            start = end;
            from = end;
        }
        self.line_start = start;
        if self.dropping_key {
            return self.pending.len();
        }
        release
    }

    /// Drop the first `at` bytes of `pending`.
    fn drain_front(&mut self, at: usize) -> Vec<u8> {
        self.line_start = self.line_start.saturating_sub(at);
        self.pending.drain(..at).collect()
    }

    fn release(&mut self, at: usize) {
        if at == 0 {
            return;
        }
        let chunk = self.drain_front(at);
        self.send(&chunk);
    }

    fn send(&mut self, raw: &[u8]) {
        self.send_part(raw, false);
    }

    /// Clean and emit `raw`; `cut_after`: a forced cut follows it.
    fn send_part(&mut self, raw: &[u8], cut_after: bool) {
        if self.stopped || raw.is_empty() {
            return;
        }
        if raw.len() <= self.budget {
            self.budget -= raw.len();
            let edges = Edges {
                cut_before: std::mem::take(&mut self.after_cut),
                cut_after,
            };
            let text = self.cleaner.clean_part(raw, edges);
            if !text.is_empty() {
                (self.emit)(text);
            }
            return;
        }
        let mut cut = self.budget;
        while cut > 0 && cut < raw.len() && raw[cut] & 0xC0 == 0x80 {
            cut -= 1;
        }
        let mut text = self.cleaner.clean_part(
            &raw[..cut],
            Edges {
                cut_before: false,
                cut_after: true,
            },
        );
        text.push_str(&format!(
            "\n[cellhost: streaming of {} stopped after {} bytes; the cell result has its head and tail]\n",
            self.name,
            group_digits(self.limit as u64)
        ));
        (self.emit)(text);
        self.stopped = true;
        self.pending = Vec::new();
        if let Some(f) = self.on_stop.take() {
            f(self.limit as u64);
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
