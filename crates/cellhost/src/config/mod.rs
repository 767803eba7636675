//! `cellhost.toml`: the operator's configuration file.
//!
//! Every section is optional and every key has a default, so an empty file
//! (or no file) is a valid configuration. Unknown keys are errors: a typo
//! must not silently fall back to a default. Each section lives in its own
//! module next to the concept it configures; the README documents every key.

mod lifecycle;

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use lifecycle::LifecycleConfig;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[lifecycle]`: kernel caps, idle reaping, warm pool.
    pub lifecycle: LifecycleConfig,
}

/// Why a configuration file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}; check the path given to --config")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text, path)
    }

    /// Parses config text; `path` only names the source in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        config.validate().map_err(|message| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        })?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), String> {
        self.lifecycle.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("cellhost.toml"))
    }

    #[test]
    fn empty_file_is_all_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
    }

    #[test]
    fn unknown_keys_are_errors_that_name_the_key() {
        let err = parse("[lifecycle]\nmax_kernel = 3\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_kernel"), "{err}");
        assert!(err.contains("cellhost.toml"), "{err}");
        let err = parse("[lifecycl]\n").unwrap_err().to_string();
        assert!(err.contains("lifecycl"), "{err}");
    }

    #[test]
    fn wrong_types_are_errors() {
        let err = parse("[lifecycle]\nmax_kernels = \"many\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_kernels"), "{err}");
    }
}
