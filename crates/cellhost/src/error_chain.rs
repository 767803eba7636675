//! An error as one line with its causes: error messages name what failed
//! and never repeat their `#[source]`, so a printer walks the chain.

use std::error::Error;

/// `e`'s message and each of its sources', joined by `": "`. A source
/// whose text the line already ends with (a wrapper that still repeats
/// it) is not printed twice.
pub fn error_chain(e: &(dyn Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !text.is_empty() && !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        next = s.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("failed to open {0}")]
    struct Open(&'static str, #[source] std::io::Error);

    #[test]
    fn the_chain_names_each_cause_once() {
        let e = Open("x.db", std::io::Error::other("disk full"));
        assert_eq!(error_chain(&e), "failed to open x.db: disk full");
        let plain = std::io::Error::other("alone");
        assert_eq!(error_chain(&plain), "alone");
    }
}
