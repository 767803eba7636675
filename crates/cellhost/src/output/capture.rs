//! Bounded capture of one output stream of one cell.
//!
//! A [`Capture`] keeps every byte until the stream passes
//! [`OutputLimits::cap_bytes`]. At that point it *cuts*: it keeps the first
//! `head_percent` of the cap as the head, a fixed-size ring of the most
//! recent bytes as the tail, and from then on writes every byte to a raw
//! spill file (until [`OutputLimits::spill_cap_bytes`]) so the full text can
//! still be handed back. Memory stays at about `cap_bytes` plus one pushed
//! chunk however much the cell prints.
//!
//! Nothing is decoded or cleaned while the cell runs; [`Capture::finish`]
//! cleans head and tail separately (so the cut marker between them is never
//! mangled), reads the full text back from the spill file, and deletes it.
//! Spill-file I/O errors never fail a cell: the result just says the full
//! text could not be kept.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use super::clean::{Cleaner, Edges};
use super::{group_digits, OutputLimits};

/// Bytes of one stream (stdout or stderr) of one cell. Memory stays bounded
/// (about cap_bytes + one chunk) whatever is pushed.
#[derive(Debug)]
pub struct Capture {
    cap_bytes: usize,
    head_bytes: usize,
    spill_cap_bytes: u64,
    /// Until the cut, every byte pushed; after it, the head.
    kept: Vec<u8>,
    /// The most recent bytes; allocated at the cut.
    tail: Ring,
    cut: bool,
    total_bytes: u64,
    /// Of `total_bytes`, those that never reached this capture
    /// ([`Capture::count_unseen`]).
    unseen: u64,
    spill: Spill,
    /// Streams cleaned text while the cell runs (only when asked).
    tap: Option<super::LineTap>,
    /// Where the cut marker says the full text is (default
    /// `truncated.spill_path`).
    spill_hint: Option<String>,
}

/// The result of [`Capture::finish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// Cleaned text kept for the cell result: everything, or when cut, the
    /// head, a marker saying how many bytes were cut, and the tail.
    pub text: String,
    /// The stream passed `cap_bytes` and `text` is head + marker + tail.
    pub truncated: bool,
    /// When cut: the cleaned full text (at most `spill_cap_bytes` of raw
    /// output, then a line saying the rest was not kept). `None` when not
    /// cut, or when the spill file failed (`text`'s marker says why).
    pub full: Option<String>,
    /// Raw bytes the stream carried, cut or not.
    pub total_bytes: u64,
}

/// The raw spill file, created at the cut.
#[derive(Debug)]
struct Spill {
    path: PathBuf,
    /// Open while bytes still go to it.
    writer: Option<BufWriter<File>>,
    /// Bytes handed to `writer` so far.
    written: u64,
    /// We created the file at `path` and have not deleted it yet.
    created: bool,
    /// Why the full text cannot be kept, once something failed.
    failed: Option<String>,
}

impl Capture {
    /// `raw_spill_path`: where to write the raw bytes once the stream exceeds cap_bytes
    /// (file created lazily, only when the cap is exceeded, with mode 0600).
    pub fn new(limits: &OutputLimits, raw_spill_path: PathBuf) -> Self {
        Capture {
            cap_bytes: limits.cap_bytes,
            head_bytes: limits.head_bytes(),
            spill_cap_bytes: limits.spill_cap_bytes,
            kept: Vec::new(),
            tail: Ring::new(limits.tail_bytes()),
            cut: false,
            total_bytes: 0,
            unseen: 0,
            spill: Spill {
                path: raw_spill_path,
                writer: None,
                written: 0,
                created: false,
                failed: None,
            },
            tap: None,
            spill_hint: None,
        }
    }

    /// Name where the full text will be in the cut marker (a path the
    /// next cell can open, a route to download it).
    pub fn spill_hint(&mut self, hint: String) {
        self.spill_hint = Some(hint);
    }

    /// Whether more was pushed than is kept (the result will carry a cut
    /// marker).
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// Also stream what is pushed from now on, cleaned, through `tap`.
    pub fn tap(&mut self, tap: super::LineTap) {
        self.tap = Some(tap);
    }

    /// Stop streaming: drop the tap (and the event sink it holds) without
    /// flushing it.
    pub fn untap(&mut self) {
        self.tap = None;
    }

    /// Appends bytes the stream carried.
    pub fn push(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if let Some(tap) = &mut self.tap {
            tap.push(bytes);
        }
        let fits = self.kept.len() as u64 + bytes.len() as u64 <= self.cap_bytes as u64;
        if self.cut {
            self.spill.write(bytes, self.spill_cap_bytes);
            self.tail.push(bytes);
        } else if fits {
            self.grow_kept(bytes.len());
            self.kept.extend_from_slice(bytes);
        } else {
            self.cut_at(bytes);
        }
        self.total_bytes += bytes.len() as u64;
    }

    /// Counts `n` bytes the stream carried that never reach this capture
    /// (a remote host cut them before sending the rest): the cut marker
    /// and `total_bytes` include them, so they say what the cell wrote.
    pub fn count_unseen(&mut self, n: u64) {
        self.total_bytes += n;
        self.unseen += n;
    }

    /// Raw bytes pushed so far.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Nothing was pushed (or only empty chunks).
    pub fn is_empty(&self) -> bool {
        self.total_bytes == 0
    }

    /// Last `n` bytes pushed (for "stderr tail" error messages), cleaned. Cheap.
    ///
    /// Once the stream was cut, at most the kept tail is available (the
    /// tail share of `cap_bytes`). The start moves forward past a split
    /// UTF-8 character.
    pub fn tail_text(&self, n: usize, cleaner: &Cleaner) -> String {
        let (bytes, cut_before) = if self.cut {
            let tail = self.tail.last(n);
            let whole_stream = tail.len() as u64 == self.total_bytes;
            (tail, !whole_stream)
        } else {
            let start = self.kept.len().saturating_sub(n);
            (self.kept[start..].to_vec(), start > 0)
        };
        let start = if cut_before {
            utf8_tail_start(&bytes)
        } else {
            0
        };
        cleaner.clean_part(
            &bytes[start..],
            Edges {
                cut_before,
                cut_after: false,
            },
        )
    }

    /// Finish: returns the cleaned kept text (head + marker + tail when cut) and,
    /// when cut, the cleaned full text read back from the raw spill file (at most
    /// spill_cap_bytes of raw input; if the stream was longer than that, the full
    /// text ends with a line saying the spill itself was capped). The raw spill
    /// file is deleted. I/O errors on the spill file never panic: they degrade to
    /// `full: None` plus a sentence in `text`'s marker.
    pub fn finish(mut self, cleaner: &Cleaner) -> Captured {
        if let Some(mut tap) = self.tap.take() {
            tap.flush();
        }
        let total_bytes = self.total_bytes;
        if !self.cut {
            return Captured {
                text: cleaner.clean(&self.kept),
                truncated: self.unseen > 0,
                full: None,
                total_bytes,
            };
        }

        let full = self.read_back_spill(cleaner);
        self.spill.delete();

        let kept = std::mem::take(&mut self.kept);
        let head = &kept[..utf8_head_end(&kept)];
        let tail = self.tail.to_vec();
        let tail = &tail[utf8_tail_start(&tail)..];
        let cut = total_bytes - head.len() as u64 - tail.len() as u64;
        let marker = match &full {
            Ok(Some(_)) => format!(
                "\n[... {} bytes cut: output too long; the full text is in {} ...]\n",
                group_digits(cut),
                self.spill_hint.as_deref().unwrap_or("truncated.spill_path")
            ),
            Ok(None) => format!("\n[... {} bytes cut: output too long ...]\n", group_digits(cut)),
            Err(reason) => format!(
                "\n[... {} bytes cut: output too long; the full text could not be kept: {reason} ...]\n",
                group_digits(cut)
            ),
        };

        let mut text = cleaner.clean_part(
            head,
            Edges {
                cut_before: false,
                cut_after: true,
            },
        );
        text.push_str(&marker);
        text.push_str(&cleaner.clean_part(
            tail,
            Edges {
                cut_before: true,
                cut_after: false,
            },
        ));
        Captured {
            text,
            truncated: true,
            full: full.ok().flatten(),
            total_bytes,
        }
    }

    /// Grows `kept` for `additional` more bytes without its capacity ever
    /// passing `cap_bytes` (plain `Vec` doubling could reach twice that).
    fn grow_kept(&mut self, additional: usize) {
        let needed = self.kept.len() + additional;
        if needed <= self.kept.capacity() {
            return;
        }
        let target = (self.kept.capacity() * 2)
            .max(4096)
            .min(self.cap_bytes)
            .max(needed);
        self.kept.reserve_exact(target - self.kept.len());
    }

    /// The first push past the cap: everything so far plus `bytes` goes to
    /// the spill file, then `kept` shrinks to the head and the ring takes
    /// the tail.
    fn cut_at(&mut self, bytes: &[u8]) {
        self.cut = true;
        if self.spill_cap_bytes > 0 {
            self.spill.open();
            self.spill.write(&self.kept, self.spill_cap_bytes);
            self.spill.write(bytes, self.spill_cap_bytes);
        }

        self.tail.allocate();
        self.tail.push(&self.kept);
        self.tail.push(bytes);

        if self.kept.len() >= self.head_bytes {
            self.kept.truncate(self.head_bytes);
        } else {
            // `kept` + `bytes` is longer than the cap, so `bytes` holds the
            // rest of the head.
            let missing = self.head_bytes - self.kept.len();
            self.kept.reserve_exact(missing);
            self.kept.extend_from_slice(&bytes[..missing]);
        }
        self.kept.shrink_to_fit();
    }

    /// The cleaned full text from the spill file (`None` when spilling is
    /// off), or why there is none.
    fn read_back_spill(&mut self, cleaner: &Cleaner) -> Result<Option<String>, String> {
        if self.spill_cap_bytes == 0 {
            return Ok(None);
        }
        if let Some(reason) = &self.spill.failed {
            return Err(reason.clone());
        }
        let writer = self
            .spill
            .writer
            .take()
            .ok_or_else(|| "the spill file was not open".to_string())?;
        writer
            .into_inner()
            .map_err(|err| format!("failed to write the spill file: {}", err.error()))?;
        let mut raw = Vec::new();
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.spill.path)
            .and_then(|file| file.take(self.spill_cap_bytes).read_to_end(&mut raw))
            .map_err(|err| format!("failed to read the spill file back: {err}"))?;

        let capped = (raw.len() as u64) + self.unseen < self.total_bytes;
        let end = if capped {
            utf8_head_end(&raw)
        } else {
            raw.len()
        };
        let mut full = cleaner.clean_part(
            &raw[..end],
            Edges {
                cut_before: false,
                cut_after: capped,
            },
        );
        if capped {
            full.push_str(&format!(
                "\n[... output too long: this full text stops after {} bytes; the remaining {} bytes were not kept ...]\n",
                group_digits(end as u64),
                group_digits(self.total_bytes - end as u64)
            ));
        }
        Ok(Some(full))
    }

    /// Bytes held in memory by this capture's buffers.
    #[cfg(test)]
    fn buffered_bytes(&self) -> usize {
        self.kept.capacity()
            + self.tail.buf.capacity()
            + self.spill.writer.as_ref().map_or(0, BufWriter::capacity)
    }
}

impl Drop for Capture {
    /// A capture dropped without [`Capture::finish`] (the cell was
    /// abandoned) still removes its raw spill file.
    fn drop(&mut self) {
        self.spill.delete();
    }
}

impl Spill {
    fn open(&mut self) {
        let create = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&self.path)
        };
        // `create_new` never follows a symlink and never reuses a file with
        // other permissions; a stale file from an earlier run is replaced.
        let file = match create() {
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                fs::remove_file(&self.path).and_then(|()| create())
            }
            other => other,
        };
        match file {
            Ok(file) => {
                self.created = true;
                self.writer = Some(BufWriter::new(file));
            }
            Err(err) => self.failed = Some(format!("failed to create the spill file: {err}")),
        }
    }

    /// Writes what still fits under `cap`; on error stops writing for good.
    fn write(&mut self, bytes: &[u8], cap: u64) {
        let Some(writer) = &mut self.writer else {
            return;
        };
        let room = cap.saturating_sub(self.written);
        let n = (bytes.len() as u64).min(room) as usize;
        if n == 0 {
            return;
        }
        match writer.write_all(&bytes[..n]) {
            Ok(()) => self.written += n as u64,
            Err(err) => {
                self.failed = Some(format!("failed to write the spill file: {err}"));
                self.writer = None;
            }
        }
    }

    fn delete(&mut self) {
        self.writer = None;
        if self.created {
            self.created = false;
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// A fixed-size ring holding the last `cap` bytes pushed.
#[derive(Debug)]
struct Ring {
    cap: usize,
    /// Grows to `cap`, then is overwritten in place from `start`.
    buf: Vec<u8>,
    /// Index of the oldest byte once `buf` is full (0 until then).
    start: usize,
}

impl Ring {
    fn new(cap: usize) -> Self {
        Ring {
            cap,
            buf: Vec::new(),
            start: 0,
        }
    }

    fn allocate(&mut self) {
        self.buf.reserve_exact(self.cap);
    }

    fn push(&mut self, mut data: &[u8]) {
        if self.cap == 0 {
            return;
        }
        if data.len() >= self.cap {
            self.buf.clear();
            self.buf.extend_from_slice(&data[data.len() - self.cap..]);
            self.start = 0;
            return;
        }
        if self.buf.len() < self.cap {
            let n = (self.cap - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        while !data.is_empty() {
            let n = (self.cap - self.start).min(data.len());
            self.buf[self.start..self.start + n].copy_from_slice(&data[..n]);
            self.start = (self.start + n) % self.cap;
            data = &data[n..];
        }
    }

    /// Oldest to newest.
    fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.buf.len());
        out.extend_from_slice(&self.buf[self.start..]);
        out.extend_from_slice(&self.buf[..self.start]);
        out
    }

    /// The newest `n` bytes (all of them if fewer are held).
    fn last(&self, n: usize) -> Vec<u8> {
        let n = n.min(self.buf.len());
        let (older, newer) = (&self.buf[self.start..], &self.buf[..self.start]);
        let mut out = Vec::with_capacity(n);
        if n > newer.len() {
            out.extend_from_slice(&older[older.len() - (n - newer.len())..]);
            out.extend_from_slice(newer);
        } else {
            out.extend_from_slice(&newer[newer.len() - n..]);
        }
        out
    }
}

/// Where a head that ends at `bytes.len()` should end so it does not split
/// a UTF-8 character: moved back by at most 3 bytes.
fn utf8_head_end(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(3) {
        let b = bytes[len - back];
        if b & 0xc0 == 0x80 {
            continue;
        }
        let width = match b {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            _ => 4,
        };
        return if back < width { len - back } else { len };
    }
    len
}

/// Where a tail should start so it does not begin inside a UTF-8
/// character: moved forward past at most 3 continuation bytes.
fn utf8_tail_start(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .take(3)
        .take_while(|&&b| b & 0xc0 == 0x80)
        .count()
}

#[cfg(test)]
#[path = "capture_tests.rs"]
mod tests;
