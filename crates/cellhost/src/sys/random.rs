//! Random ids and secrets from the OS random source.

/// `bytes` random bytes as lowercase hex (twice as many characters).
///
/// # Panics
/// When the OS random source fails (no entropy source at all).
pub(crate) fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("OS random source");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}
