//! The environment a kernel starts with.
//!
//! Built from an allow-list of harmless names (PATH, HOME, locale, temp
//! dirs, ...) minus anything whose name looks like a secret, plus names the
//! operator passes through on purpose. The values of secret-looking host
//! variables are remembered so the output pipeline can redact them if they
//! ever show up in a cell's output anyway, together with the host's own
//! secrets that a cell could learn ([`config_secrets`]: the daemon's
//! token, tool credentials).

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
    /// The variables the kernel starts with, in host order: allow-listed,
    /// non-secret names plus the operator's passthrough names.
    pub vars: Vec<(OsString, OsString)>,
    /// Values of secret-named host variables (scrubbed or passed through):
    /// redacted wherever they appear in output.
    pub secrets: Vec<String>,
}

impl ChildEnv {
    /// Also redact `values` (secrets the host holds that are not in its
    /// environment); values shorter than 8 bytes are ignored when output
    /// is cleaned.
    pub fn add_secrets(&mut self, values: impl IntoIterator<Item = String>) {
        self.secrets.extend(values);
    }

    /// Build from the host's environment. `passthrough` names are copied
    /// even when the allow-list or the secret scrub would drop them: the
    /// operator asked for them explicitly.
    pub fn from_host(passthrough: &[String]) -> ChildEnv {
        Self::from_vars(std::env::vars_os(), passthrough)
    }

    /// As [`ChildEnv::from_host`], from `vars` instead of the daemon's
    /// own environment. Names that are not UTF-8 are dropped. A
    /// secret-named value that is not UTF-8 is not remembered for
    /// redaction (it is still passed when named in `passthrough`).
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

/// The secrets a config file holds, to redact from every cell's output:
/// the daemon's token (`[server] token` and `CELLHOST_TOKEN`), `[[tools]]`
/// header values and `[[mcp_servers]]` env values.
///
/// A header or env value goes in when its name looks like a secret
/// ([`is_secret_name`], or a header such as `Cookie`), or when the value
/// itself looks like a credential (16 bytes or more, no space, letters
/// and digits); `Content-Type = "application/json"` or `NODE_ENV =
/// "production"` would otherwise vanish from every cell's output. A value
/// with an auth scheme (`Bearer abc…`, `Token abc…`) goes in whole and as
/// its credential alone.
pub fn config_secrets(config: &crate::config::Config) -> Vec<String> {
    let mut out = Vec::new();
    out.extend(config.server.token.iter().cloned());
    if let Ok(token) = std::env::var("CELLHOST_TOKEN") {
        out.push(token);
    }
    let named = config
        .tools
        .iter()
        .flat_map(|t| t.headers.iter())
        .chain(config.mcp_servers.iter().flat_map(|s| s.env.iter()));
    for (name, value) in named {
        let lower = name.to_ascii_lowercase();
        let secret_name =
            is_secret_name(name) || lower.contains("cookie") || lower.contains("session");
        if !(secret_name || looks_like_a_credential(value)) {
            continue;
        }
        out.push(value.clone());
        if let Some((_, credential)) = value.trim().split_once([' ', '\t']) {
            out.push(credential.trim().to_owned());
        }
    }
    out.retain(|v| !v.trim().is_empty());
    out
}

/// Long, unbroken, letters and digits: how API keys and tokens look.
fn looks_like_a_credential(value: &str) -> bool {
    value.len() >= 16
        && !value.contains(char::is_whitespace)
        && value.bytes().any(|b| b.is_ascii_alphabetic())
        && value.bytes().any(|b| b.is_ascii_digit())
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

    #[test]
    fn a_configs_token_tool_headers_and_mcp_env_values_are_secrets() {
        let config = crate::config::Config::parse(
            concat!(
                "[server]\ntoken = \"daemon-token-1234\"\n",
                "[[tools]]\nname = \"t\"\nurl = \"http://127.0.0.1:9/t\"\n",
                "headers = { Authorization = \"Bearer tool-cred-5678\", ",
                "\"Content-Type\" = \"application/json\", \"X-Trace\" = \"a1b2c3d4e5f6g7h8i9\" }\n",
                "[[mcp_servers]]\nname = \"m\"\ncommand = \"true\"\n",
                "env = { GITHUB_TOKEN = \"ghp_mcp-env-value\", NODE_ENV = \"production\" }\n",
            ),
            std::path::Path::new("cellhost.toml"),
        )
        .unwrap();
        let secrets = config_secrets(&config);
        for value in [
            "daemon-token-1234",
            "Bearer tool-cred-5678",
            "tool-cred-5678",
            "a1b2c3d4e5f6g7h8i9",
            "ghp_mcp-env-value",
        ] {
            assert!(
                secrets.iter().any(|s| s == value),
                "{value}: {}",
                secrets.len()
            );
        }
        for value in ["application/json", "production"] {
            assert!(!secrets.iter().any(|s| s == value), "{value}");
        }
    }
}
