//! The environment a kernel starts with.
//!
//! Built from an allow-list of harmless names (PATH, HOME, locale, temp
//! dirs, ...) minus anything whose name looks like a secret, plus names the
//! operator passes through on purpose. The values of secret-looking host
//! variables are remembered so the output pipeline can redact them if they
//! ever show up in a cell's output anyway.

use std::ffi::OsString;

const ALLOWED: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "TERM",
    "TMPDIR",
    "TMP",
    "TEMP",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "VIRTUAL_ENV",
    "PYTHONPATH",
];
const ALLOWED_PREFIXES: &[&str] = &["LC_", "XDG_"];
const SECRET_WORDS: &[&str] = &[
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "CREDS",
    "AUTH",
    "BEARER",
    "DSN",
    "WEBHOOK",
    "APIKEY",
];

/// `true` when an environment variable's name suggests it holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_WORDS.iter().any(|w| upper.contains(w))
}

fn is_allowed(name: &str) -> bool {
    ALLOWED.contains(&name) || ALLOWED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The environment of a kernel process and the secrets to redact.
#[derive(Debug, Clone, Default)]
pub struct ChildEnv {
    pub vars: Vec<(OsString, OsString)>,
    /// Values of secret-named host variables (scrubbed or passed through):
    /// redacted wherever they appear in output.
    pub secrets: Vec<String>,
}

impl ChildEnv {
    /// Build from the host's environment. `passthrough` names are copied
    /// even when the allow-list or the secret scrub would drop them: the
    /// operator asked for them explicitly.
    pub fn from_host(passthrough: &[String]) -> ChildEnv {
        Self::from_vars(std::env::vars_os(), passthrough)
    }

    pub fn from_vars(
        vars: impl IntoIterator<Item = (OsString, OsString)>,
        passthrough: &[String],
    ) -> ChildEnv {
        let mut env = ChildEnv::default();
        for (name, value) in vars {
            let Some(n) = name.to_str() else { continue };
            let secret = is_secret_name(n);
            if secret {
                if let Some(v) = value.to_str() {
                    env.secrets.push(v.to_owned());
                }
            }
            let explicit = passthrough.iter().any(|p| p == n);
            if explicit || (is_allowed(n) && !secret) {
                env.vars.push((name, value));
            }
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn names(env: &ChildEnv) -> Vec<String> {
        env.vars
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn only_allowed_names_reach_the_child() {
        let env = ChildEnv::from_vars(
            vars(&[
                ("PATH", "/bin"),
                ("LC_ALL", "C"),
                ("XDG_DATA_HOME", "/x"),
                ("RANDOM_THING", "1"),
                ("LD_PRELOAD", "/evil.so"),
            ]),
            &[],
        );
        assert_eq!(names(&env), ["PATH", "LC_ALL", "XDG_DATA_HOME"]);
    }

    #[test]
    fn secret_names_are_scrubbed_even_when_allowed_and_remembered() {
        let env = ChildEnv::from_vars(
            vars(&[
                ("XDG_API_KEY", "sekrit-value-1"),
                ("OPENAI_API_KEY", "sk-abc"),
                ("GITHUB_TOKEN", "ghp_x"),
                ("db_dsn", "postgres://u:p@h/db"),
            ]),
            &[],
        );
        assert!(names(&env).is_empty());
        assert_eq!(env.secrets.len(), 4);
    }

    #[test]
    fn passthrough_names_are_kept_explicitly() {
        let env = ChildEnv::from_vars(
            vars(&[("MY_SETTING", "on"), ("HF_TOKEN", "hf_x")]),
            &["MY_SETTING".into(), "HF_TOKEN".into()],
        );
        assert_eq!(names(&env), ["MY_SETTING", "HF_TOKEN"]);
        assert_eq!(env.secrets, ["hf_x"]);
    }
}
