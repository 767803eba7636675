//! Control frames between the host and the Python runner.
//!
//! A frame is a 4-byte little-endian body length followed by fields, each
//! written as `b"<name> <len>\n"` and `<len>` raw bytes. There is no
//! escaping, so any byte string travels as is, and the format costs the
//! runner no imports (json alone costs ~8 ms at interpreter start).
//!
//! Control frames travel on dedicated pipes, never on stdout, so nothing a
//! cell prints can be mistaken for one.

use std::collections::BTreeMap;

/// Largest frame either side accepts. A runner that announces more is
/// broken or hostile; the host kills it.
pub(crate) const MAX_FRAME: usize = 256 << 20;

/// Largest frame other than a display: replies carry at most ~3 MiB (a
/// capped value and traceback), so a bigger one is never buffered.
pub(crate) const MAX_REPLY: usize = 16 << 20;

/// How every display frame body starts: the runner writes `op` first.
const DISPLAY_TAG: &[u8] = b"op 7\ndisplay";

/// Why bytes on the control pipe are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    /// The frame is larger than a reply or display may be.
    #[error("frame of {size} bytes is over the size limit ({MAX_REPLY} bytes for a reply, {MAX_FRAME} for a display)")]
    TooLarge {
        /// The frame's size in bytes, as its length prefix claims.
        size: usize,
    },
    /// A field header is not `name length\n`.
    #[error("malformed field header at byte {offset}")]
    BadHeader {
        /// Where in the frame body the bad header starts.
        offset: usize,
    },
    /// A field's length runs past the end of the frame.
    #[error("field `{name}` claims {size} bytes but only {left} remain")]
    Overrun {
        /// The field's name.
        name: String,
        /// The length its header claims, in bytes.
        size: usize,
        /// The bytes left in the frame.
        left: usize,
    },
}

/// The decoded fields of one frame.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Frame {
    fields: BTreeMap<String, Vec<u8>>,
}

impl Frame {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn with(mut self, name: &str, value: impl Into<Vec<u8>>) -> Self {
        self.fields.insert(name.to_owned(), value.into());
        self
    }

    pub(crate) fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.fields.get(name).map(Vec::as_slice)
    }

    /// A field as text (lossy: the runner sends UTF-8 with surrogateescape).
    pub(crate) fn text(&self, name: &str) -> Option<String> {
        self.bytes(name)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// Move a field out of the frame.
    pub(crate) fn take(&mut self, name: &str) -> Option<Vec<u8>> {
        self.fields.remove(name)
    }

    pub(crate) fn int(&self, name: &str) -> Option<i64> {
        std::str::from_utf8(self.bytes(name)?)
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The frame as bytes, length prefix included.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let body_len: usize = self
            .fields
            .iter()
            .map(|(k, v)| k.len() + v.len() + 24)
            .sum();
        let mut out = Vec::with_capacity(4 + body_len);
        out.extend_from_slice(&[0; 4]);
        for (name, value) in &self.fields {
            out.extend_from_slice(name.as_bytes());
            out.push(b' ');
            out.extend_from_slice(value.len().to_string().as_bytes());
            out.push(b'\n');
            out.extend_from_slice(value);
        }
        let len = (out.len() - 4) as u32;
        out[..4].copy_from_slice(&len.to_le_bytes());
        out
    }

    /// Decode one frame body (without the length prefix).
    pub(crate) fn decode(body: &[u8]) -> Result<Frame, FrameError> {
        let mut fields = BTreeMap::new();
        let mut i = 0;
        while i < body.len() {
            let nl = body[i..]
                .iter()
                .position(|&b| b == b'\n')
                .ok_or(FrameError::BadHeader { offset: i })?;
            let header = std::str::from_utf8(&body[i..i + nl])
                .map_err(|_| FrameError::BadHeader { offset: i })?;
            let (name, size) = header
                .split_once(' ')
                .ok_or(FrameError::BadHeader { offset: i })?;
            let size: usize = size
                .parse()
                .map_err(|_| FrameError::BadHeader { offset: i })?;
            if name.is_empty() {
                return Err(FrameError::BadHeader { offset: i });
            }
            let start = i + nl + 1;
            let left = body.len() - start;
            if size > left {
                return Err(FrameError::Overrun {
                    name: name.to_owned(),
                    size,
                    left,
                });
            }
            fields.insert(name.to_owned(), body[start..start + size].to_vec());
            i = start + size;
        }
        Ok(Frame { fields })
    }
}

/// Accumulates bytes from the reply pipe and yields whole frames.
///
/// A display frame whose body is over `skip_displays_over` (and within
/// [`MAX_FRAME`]) is never buffered: its bytes are discarded as they arrive and it is yielded at
/// once as `op=display, skipped=<size>`, so a runner that ignores the
/// display caps cannot make the host hold more than the cap.
#[derive(Debug)]
pub(crate) struct FrameReader {
    buf: Vec<u8>,
    skip_displays_over: usize,
    /// Bytes of a discarded display frame still to come.
    skipping: usize,
}

impl Default for FrameReader {
    fn default() -> Self {
        FrameReader::with_display_limit(MAX_FRAME)
    }
}

impl FrameReader {
    /// A reader that discards display frames with a body over `limit`.
    pub(crate) fn with_display_limit(limit: usize) -> Self {
        FrameReader {
            buf: Vec::new(),
            skip_displays_over: limit.max(DISPLAY_TAG.len()),
            skipping: 0,
        }
    }

    pub(crate) fn extend(&mut self, bytes: &[u8]) {
        let skip = self.skipping.min(bytes.len());
        self.skipping -= skip;
        self.buf.extend_from_slice(&bytes[skip..]);
    }

    /// The next complete frame, if one has arrived.
    pub(crate) fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let size = u32::from_le_bytes(self.buf[..4].try_into().expect("4 bytes")) as usize;
        if size > self.skip_displays_over && size <= MAX_FRAME {
            let seen = self.buf.len() - 4;
            if seen < DISPLAY_TAG.len() {
                return Ok(None);
            }
            if self.buf[4..].starts_with(DISPLAY_TAG) {
                if seen >= size {
                    self.buf.drain(..4 + size);
                } else {
                    self.skipping = size - seen;
                    self.buf.clear();
                }
                return Ok(Some(
                    Frame::new()
                        .with("op", "display")
                        .with("skipped", size.to_string()),
                ));
            }
        }
        if size > MAX_FRAME {
            return Err(FrameError::TooLarge { size });
        }
        if size > MAX_REPLY {
            if self.buf.len() - 4 < DISPLAY_TAG.len() {
                return Ok(None);
            }
            if !self.buf[4..].starts_with(DISPLAY_TAG) {
                return Err(FrameError::TooLarge { size });
            }
        }
        if self.buf.len() < 4 + size {
            return Ok(None);
        }
        let frame = Frame::decode(&self.buf[4..4 + size]);
        self.buf.drain(..4 + size);
        frame.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_frame_round_trips_binary_values() {
        let f = Frame::new()
            .with("op", "exec")
            .with("code", b"print(1)\n\x00\xff \n7 9\n".to_vec());
        let bytes = f.encode();
        let mut r = FrameReader::default();
        r.extend(&bytes);
        assert_eq!(r.next_frame().unwrap(), Some(f));
        assert_eq!(r.next_frame().unwrap(), None);
    }

    #[test]
    fn a_frame_split_across_reads_is_reassembled() {
        let f = Frame::new().with("status", "ok").with("value", "42");
        let bytes = f.encode();
        let mut r = FrameReader::default();
        for b in &bytes[..bytes.len() - 1] {
            r.extend(&[*b]);
            assert_eq!(r.next_frame().unwrap(), None);
        }
        r.extend(&bytes[bytes.len() - 1..]);
        assert_eq!(r.next_frame().unwrap(), Some(f));
    }

    #[test]
    fn an_oversized_length_is_refused_before_buffering() {
        let mut r = FrameReader::default();
        r.extend(&u32::MAX.to_le_bytes());
        assert!(matches!(r.next_frame(), Err(FrameError::TooLarge { .. })));
    }

    #[test]
    fn an_oversized_display_frame_is_discarded_as_it_arrives() {
        // As the runner writes it: `op` first (Frame::encode sorts fields).
        let mut body = b"op 7\ndisplaym0 9\nimage/pngd0 10000\n".to_vec();
        body.extend([7u8; 10_000]);
        let mut bytes = (body.len() as u32).to_le_bytes().to_vec();
        bytes.extend(&body);
        let next = Frame::new().with("op", "done").with("status", "ok");
        bytes.extend(next.encode());
        let mut r = FrameReader::with_display_limit(1000);
        let mut got = Vec::new();
        for chunk in bytes.chunks(333) {
            r.extend(chunk);
            assert!(r.buf.len() <= 1000, "buffered {} bytes", r.buf.len());
            while let Some(f) = r.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].text("op").as_deref(), Some("display"));
        assert_eq!(got[0].int("skipped"), Some(body.len() as i64));
        assert_eq!(got[1], next);
    }

    #[test]
    fn a_large_reply_frame_is_not_skipped() {
        let f = Frame::new()
            .with("op", "done")
            .with("value", vec![b'x'; 5000]);
        let mut r = FrameReader::with_display_limit(1000);
        r.extend(&f.encode());
        assert_eq!(r.next_frame().unwrap(), Some(f));
    }

    #[test]
    fn a_field_that_overruns_the_body_is_an_error() {
        assert!(matches!(
            Frame::decode(b"value 10\nabc"),
            Err(FrameError::Overrun { .. })
        ));
        assert!(matches!(
            Frame::decode(b"novalue\n"),
            Err(FrameError::BadHeader { .. })
        ));
    }

    #[test]
    fn int_fields_parse() {
        let f = Frame::new().with("pid", "1234").with("x", "nope");
        assert_eq!(f.int("pid"), Some(1234));
        assert_eq!(f.int("x"), None);
        assert_eq!(f.int("missing"), None);
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut r = FrameReader::default();
            r.extend(&bytes);
            let _ = r.next_frame();
            let _ = Frame::decode(&bytes);
        }

        #[test]
        fn any_fields_round_trip(fields in proptest::collection::btree_map("[a-z_]{1,12}", proptest::collection::vec(any::<u8>(), 0..64), 0..8)) {
            let mut f = Frame::new();
            for (k, v) in &fields { f = f.with(k, v.clone()); }
            let mut r = FrameReader::default();
            r.extend(&f.encode());
            prop_assert_eq!(r.next_frame().unwrap(), Some(f));
        }
    }
}

#[cfg(test)]
mod reply_limit_tests {
    use super::*;

    #[test]
    fn a_reply_announcing_more_than_the_reply_limit_is_refused_at_once() {
        let mut r = FrameReader::default();
        let mut bytes = ((MAX_REPLY + 1) as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(b"op 4\ndonestatus 2\nok");
        r.extend(&bytes);
        assert!(matches!(r.next_frame(), Err(FrameError::TooLarge { .. })));
    }
}
