//! Helpers for the rich-output tests.

use std::time::Duration;

use base64::Engine;
use cellhost::{CellResult, DisplayItem, DisplayLimits, Status};

use super::{kernel_with, options, venv_python, TestKernel};

pub async fn venv_kernel() -> TestKernel {
    venv_kernel_with(DisplayLimits::default()).await
}

pub async fn venv_kernel_with(limits: DisplayLimits) -> TestKernel {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(&dir).python(venv_python()).display_limits(limits);
    kernel_with(opts, dir).await
}

/// A kernel on the default python with these caps.
pub async fn kernel_limits(limits: DisplayLimits) -> TestKernel {
    let dir = tempfile::tempdir().unwrap();
    kernel_with(options(&dir).display_limits(limits), dir).await
}

pub fn ok(r: &CellResult) {
    assert_eq!(r.status, Status::Success, "{r:#?}");
}

/// The items of display `n`.
pub fn display(r: &CellResult, n: u32) -> Vec<&DisplayItem> {
    r.displays.iter().filter(|d| d.display == n).collect()
}

/// How many displays the cell produced.
pub fn count(r: &CellResult) -> usize {
    r.displays.last().map_or(0, |d| d.display as usize + 1)
}

/// The `mime` item of display `n`.
pub fn item<'a>(r: &'a CellResult, n: u32, mime: &str) -> &'a DisplayItem {
    r.displays
        .iter()
        .find(|d| d.display == n && d.mime == mime)
        .unwrap_or_else(|| panic!("display {n} has no {mime}: {:#?}", r.displays))
}

pub async fn wait_for_file(path: &std::path::Path) {
    for _ in 0..500 {
        if path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} never appeared", path.display());
}

/// Decode a base64 PNG, check its signature, return (width, height).
pub fn png_size(item: &DisplayItem) -> (u32, u32) {
    assert_eq!(item.mime, "image/png");
    let png = base64::engine::general_purpose::STANDARD
        .decode(&item.data)
        .expect("valid base64");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&png[12..16], b"IHDR");
    let be = |i: usize| u32::from_be_bytes(png[i..i + 4].try_into().unwrap());
    (be(16), be(20))
}
