//! `[[tools]]`: tools the daemon offers to cells, served by HTTP endpoints
//! (webhooks) of the agent framework.

use std::collections::BTreeMap;

use serde::Deserialize;

/// One `[[tools]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    /// The name cells call it by (`tools.NAME(...)`).
    pub name: String,
    /// The docstring a model reads.
    #[serde(default)]
    pub description: String,
    /// JSON schema of the keyword arguments: an inline table, or a string
    /// holding JSON. Default: any keyword arguments.
    #[serde(default)]
    pub parameters: Option<toml::Value>,
    /// Where a call is POSTed (`http://` only).
    pub url: String,
    /// Seconds a call may take (default 60).
    #[serde(default = "default_timeout")]
    pub timeout: f64,
    /// Extra request headers (e.g. `Authorization`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

fn default_timeout() -> f64 {
    60.0
}

impl ToolConfig {
    /// The parameters as a JSON schema object.
    pub fn schema(&self) -> Result<serde_json::Value, String> {
        let value = match &self.parameters {
            None => return Ok(serde_json::json!({"type": "object"})),
            Some(toml::Value::String(text)) => serde_json::from_str(text).map_err(|e| {
                format!(
                    "[[tools]] {:?}: parameters is not valid JSON ({e}); give a JSON schema \
                     object or an inline table",
                    self.name
                )
            })?,
            Some(other) => serde_json::to_value(other).map_err(|e| e.to_string())?,
        };
        if !value.is_object() {
            return Err(format!(
                "[[tools]] {:?}: parameters must be a JSON schema object, like \
                 {{type = \"object\", properties = {{...}}}}",
                self.name
            ));
        }
        Ok(value)
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        let probe =
            crate::tools::FnTool::new(self.name.clone(), "", serde_json::Value::Null, |_| {
                std::future::ready(Ok(serde_json::Value::Null))
            });
        crate::tools::ToolSet::new()
            .with(probe)
            .map_err(|e| format!("[[tools]]: {e}"))?;
        if !self.url.starts_with("http://") || self.url.parse::<url_probe::Uri>().is_err() {
            return Err(format!(
                "[[tools]] {:?}: url {:?} must be an http:// URL (put a TLS proxy in front of \
                 an https endpoint)",
                self.name, self.url
            ));
        }
        if !(self.timeout > 0.0 && self.timeout <= 86_400.0) {
            return Err(format!(
                "[[tools]] {:?}: timeout must be between 0 and 86400 seconds, not {}",
                self.name, self.timeout
            ));
        }
        self.schema().map(|_| ())
    }
}

/// A light URL check (authority present, no spaces): the server parses it
/// for real.
mod url_probe {
    pub(super) struct Uri;
    impl std::str::FromStr for Uri {
        type Err = ();
        fn from_str(s: &str) -> Result<Uri, ()> {
            let rest = s.strip_prefix("http://").ok_or(())?;
            let host = rest.split('/').next().unwrap_or("");
            if host.is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(());
            }
            Ok(Uri)
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use std::path::Path;

    #[test]
    fn tools_take_a_table_or_json_schema_and_bad_entries_are_named() {
        let c = Config::parse(
            r#"
[[tools]]
name = "search"
description = "Search."
url = "http://127.0.0.1:9000/search"
parameters = { type = "object", properties = { q = { type = "string" } }, required = ["q"] }

[[tools]]
name = "fetch"
url = "http://localhost:9000/fetch"
parameters = '{"type": "object"}'
timeout = 5
headers = { Authorization = "Bearer x" }
"#,
            Path::new("c.toml"),
        )
        .unwrap();
        assert_eq!(c.tools.len(), 2);
        assert_eq!(c.tools[0].schema().unwrap()["required"][0], "q");
        assert_eq!(c.tools[1].timeout, 5.0);
        for (bad, says) in [
            ("name = \"a b\"\nurl = \"http://x/\"", "invalid tool name"),
            (
                "name = \"a\"\nurl = \"https://x/\"",
                "must be an http:// URL",
            ),
            (
                "name = \"a\"\nurl = \"http://x/\"\nparameters = '[1'",
                "not valid JSON",
            ),
            (
                "name = \"a\"\nurl = \"http://x/\"\nparameters = '[1]'",
                "must be a JSON schema object",
            ),
            ("name = \"a\"\nurl = \"http://x/\"\ntimeout = 0", "timeout"),
            (
                "name = \"a\"\nurl = \"http://x/\"\ncolour = 1",
                "unknown field",
            ),
        ] {
            let e = Config::parse(&format!("[[tools]]\n{bad}\n"), Path::new("c.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = Config::parse(
            "[[tools]]\nname = \"a\"\nurl = \"http://x/\"\n[[tools]]\nname = \"a\"\nurl = \"http://y/\"\n",
            Path::new("c.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("already registered"), "{e}");
    }
}
