//! What `cellhost run` does with a cell's displays: images (PNG, JPEG,
//! GIF, SVG) are written to the display folder as `cell<N>-<M>.<ext>`
//! (cell N of the script, its M-th display) and shown by path; other
//! displays are shown by their text form.
//!
//! The folder is created on the first image, so a run without images
//! leaves nothing behind. Names are stable: a rerun overwrites them.

use std::path::{Path, PathBuf};

use base64::Engine;
use cellhost::{CellResult, DisplayItem};

/// Image mimes written to files, in order of preference, with extensions.
const IMAGES: &[(&str, &str)] = &[
    ("image/png", "png"),
    ("image/jpeg", "jpg"),
    ("image/gif", "gif"),
    ("image/svg+xml", "svg"),
];

/// Text forms shown for a display without an image, in order of preference.
const TEXTS: &[&str] = &[
    "text/plain",
    "text/markdown",
    "text/latex",
    "application/json",
];

/// How one display is shown in the transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shown {
    /// Written to `path`; `size` in pixels when known (PNG).
    Image {
        path: PathBuf,
        mime: String,
        size: Option<(u32, u32)>,
    },
    /// No image: its text form.
    Text(String),
    /// The image could not be written; the sentence says why and what to do.
    Failed(String),
}

/// The default folder: `<script-stem>_displays` next to the script, or
/// `cellhost_displays` in the current directory for standard input.
pub(crate) fn default_dir(script: &Path) -> PathBuf {
    if script.as_os_str() == "-" {
        return PathBuf::from("cellhost_displays");
    }
    let stem = script
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "cellhost".into());
    script
        .parent()
        .unwrap_or(Path::new(""))
        .join(format!("{stem}_displays"))
}

pub(crate) struct DisplaySaver {
    dir: PathBuf,
}

impl DisplaySaver {
    pub(crate) fn new(dir: PathBuf) -> DisplaySaver {
        DisplaySaver { dir }
    }

    /// Save the images of cell `cell` and say how each display is shown.
    pub(crate) fn save(&mut self, cell: usize, r: &CellResult) -> Vec<Shown> {
        let mut shown = Vec::new();
        for group in r.displays.chunk_by(|a, b| a.display == b.display) {
            let n = group[0].display as usize + 1;
            shown.push(self.save_one(cell, n, group));
        }
        shown
    }

    fn save_one(&mut self, cell: usize, n: usize, group: &[DisplayItem]) -> Shown {
        let image = IMAGES
            .iter()
            .find_map(|(mime, ext)| group.iter().find(|d| d.mime == *mime).map(|d| (d, ext)));
        let Some((item, ext)) = image else {
            let text = TEXTS
                .iter()
                .find_map(|mime| group.iter().find(|d| d.mime == *mime))
                .map(|d| d.data.clone())
                .unwrap_or_else(|| format!("[display {n}: {}]", mimes(group)));
            return Shown::Text(text);
        };
        let path = self.dir.join(format!("cell{cell}-{n}.{ext}"));
        let bytes = if item.is_base64() {
            match base64::engine::general_purpose::STANDARD.decode(&item.data) {
                Ok(b) => b,
                Err(e) => {
                    return Shown::Failed(format!(
                        "display {n} ({}) is not valid base64 ({e}); it was not saved",
                        item.mime
                    ))
                }
            }
        } else {
            item.data.clone().into_bytes()
        };
        let write = std::fs::create_dir_all(&self.dir).and_then(|()| std::fs::write(&path, &bytes));
        match write {
            Ok(()) => Shown::Image {
                size: png_size(&bytes),
                path,
                mime: item.mime.clone(),
            },
            Err(e) => Shown::Failed(format!(
                "cannot save display {n} to {}: {e}; choose a writable folder with --display-dir DIR",
                path.display()
            )),
        }
    }
}

/// How each display of `r` is shown without saving anything (`cellhost
/// attach` only reads): its text form, else a line naming its image.
pub(crate) fn unsaved(r: &CellResult) -> Vec<Shown> {
    r.displays
        .chunk_by(|a, b| a.display == b.display)
        .map(|group| {
            let n = group[0].display as usize + 1;
            if let Some((mime, _)) = IMAGES
                .iter()
                .find(|(mime, _)| group.iter().any(|d| d.mime == *mime))
            {
                return Shown::Text(format!("[display {n}: {mime}]"));
            }
            let text = TEXTS
                .iter()
                .find_map(|mime| group.iter().find(|d| d.mime == *mime))
                .map(|d| d.data.clone())
                .unwrap_or_else(|| format!("[display {n}: {}]", mimes(group)));
            Shown::Text(text)
        })
        .collect()
}

fn mimes(group: &[DisplayItem]) -> String {
    group
        .iter()
        .map(|d| d.mime.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Width and height from a PNG's IHDR chunk.
pub(crate) fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    if png.len() < 24 || &png[..8] != b"\x89PNG\r\n\x1a\n" || &png[12..16] != b"IHDR" {
        return None;
    }
    let be = |i: usize| u32::from_be_bytes([png[i], png[i + 1], png[i + 2], png[i + 3]]);
    Some((be(16), be(20)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_folder_sits_next_to_the_script() {
        assert_eq!(
            default_dir(Path::new("work/plots.py")),
            PathBuf::from("work/plots_displays")
        );
        assert_eq!(default_dir(Path::new("a.py")), PathBuf::from("a_displays"));
        assert_eq!(
            default_dir(Path::new("-")),
            PathBuf::from("cellhost_displays")
        );
    }

    #[test]
    fn png_sizes_come_from_the_header_and_garbage_has_none() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend(640u32.to_be_bytes());
        png.extend(480u32.to_be_bytes());
        assert_eq!(png_size(&png), Some((640, 480)));
        assert_eq!(png_size(b"GIF89a"), None);
    }
}
