//! `[packages]`: `%pip install` carried out by the host (see
//! [`crate::packages`]), and `[kernel] preload`.

use serde::Deserialize;

/// `[packages]` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PackagesConfig {
    /// `%pip` works at all (default true).
    pub enabled: bool,
    /// The package index (`None`: pip's default, PyPI).
    pub index_url: Option<String>,
    /// More indexes searched besides `index_url` (`--extra-index-url`).
    pub extra_index_urls: Vec<String>,
    /// Name patterns (`*` matches any run of characters; names compare
    /// normalized, PEP 503): when not empty, only matching names install.
    pub allow: Vec<String>,
    /// Name patterns that never install (checked before `allow`).
    pub deny: Vec<String>,
    /// Wheels only (default true): no package code runs at install time.
    pub only_binary: bool,
    /// Longest one `%pip` may run, in seconds (default 300).
    pub timeout_seconds: u64,
    /// Most MiB a session's package dir may hold (default 2048; 0: no cap).
    pub max_mib: u64,
    /// What runs `%pip install` on the host: `"auto"` (default: `uv pip`
    /// when `uv` is found, else pip), `"pip"`, or `"uv"` (an error when no
    /// `uv` is found).
    pub installer: PipInstaller,
    /// The `uv` binary (default: `uv` on PATH).
    pub uv: Option<std::path::PathBuf>,
}

/// `[packages] installer`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PipInstaller {
    /// `uv pip` when a `uv` is found, else pip.
    #[default]
    Auto,
    /// Always the kernel interpreter's pip.
    Pip,
    /// Always `uv pip` (an error when no `uv` is found).
    Uv,
}

impl Default for PackagesConfig {
    fn default() -> Self {
        PackagesConfig {
            enabled: true,
            index_url: None,
            extra_index_urls: Vec::new(),
            allow: Vec::new(),
            deny: Vec::new(),
            only_binary: true,
            timeout_seconds: 300,
            max_mib: 2048,
            installer: PipInstaller::Auto,
            uv: None,
        }
    }
}

impl PackagesConfig {
    pub(super) fn validate(&self) -> Result<(), String> {
        for url in self.index_url.iter().chain(&self.extra_index_urls) {
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(format!(
                    "[packages] index URLs must start with https:// or http://, not {url:?}"
                ));
            }
        }
        if let Some(p) = self.allow.iter().chain(&self.deny).find(|p| {
            p.is_empty()
                || !p
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.*".contains(c))
        }) {
            return Err(format!(
                "[packages] allow/deny patterns are package names with `*` wildcards, not {p:?}"
            ));
        }
        if self.timeout_seconds == 0 {
            return Err("[packages] timeout_seconds must be at least 1".into());
        }
        Ok(())
    }
}

/// `[kernel]` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct KernelConfig {
    /// Modules pooled kernels import before they are handed out
    /// (`"numpy"`, `"matplotlib.pyplot"`); a missing one is skipped.
    pub preload: Vec<String>,
    /// After the imports, run the built-in warm-ups of the preloaded
    /// pandas, numpy and matplotlib.pyplot (first-call costs paid in the
    /// pool), then freeze the heap for the GC. Default true.
    pub warmup: bool,
    /// New local kernels that can be (not strict, nothing installed in
    /// their session's package dir yet) are forks of a warm template of
    /// their flavour, which has started Python and imported the runner
    /// and `preload` once (docs/templates.md). Default true.
    pub template: bool,
}

impl Default for KernelConfig {
    fn default() -> Self {
        KernelConfig {
            preload: Vec::new(),
            warmup: true,
            template: true,
        }
    }
}

impl KernelConfig {
    pub(super) fn validate(&self) -> Result<(), String> {
        if let Some(m) = self.preload.iter().find(|m| !is_module_name(m)) {
            return Err(format!(
                "[kernel] preload entries must be dotted module names like \"matplotlib.pyplot\", not {m:?}"
            ));
        }
        Ok(())
    }
}

/// `a`, `a.b_c`: identifiers joined by dots.
pub(crate) fn is_module_name(m: &str) -> bool {
    !m.is_empty()
        && m.split('.').all(|part| {
            part.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use std::path::Path;

    #[test]
    fn packages_and_preload_parse_and_validate() {
        let c = Config::parse(
            "[packages]\nindex_url = \"http://127.0.0.1:1/simple\"\ndeny = [\"evil*\"]\nonly_binary = false\n[kernel]\npreload = [\"numpy\", \"matplotlib.pyplot\"]\n",
            Path::new("c.toml"),
        )
        .unwrap();
        assert_eq!(c.packages.deny, ["evil*"]);
        assert!(!c.packages.only_binary && c.packages.enabled);
        assert_eq!(c.kernel.preload, ["numpy", "matplotlib.pyplot"]);
        assert!(c.kernel.warmup, "on by default");
        let off = Config::parse("[kernel]\nwarmup = false\n", Path::new("c.toml")).unwrap();
        assert!(!off.kernel.warmup);
        for bad in [
            "[packages]\nindex_url = \"file:///etc\"\n",
            "[packages]\ndeny = [\"a b\"]\n",
            "[kernel]\npreload = [\"os; rm\"]\n",
        ] {
            assert!(Config::parse(bad, Path::new("c.toml")).is_err(), "{bad}");
        }
    }
}
