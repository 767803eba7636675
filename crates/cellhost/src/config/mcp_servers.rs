//! `[[mcp_servers]]`: downstream MCP servers (code mode). Each is started
//! as a stdio MCP client; its tools become callable from cells as
//! `tools.NAME.TOOL(...)`. The shape follows Claude Desktop's
//! `mcpServers` entries: a command, its arguments and environment.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// One `[[mcp_servers]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The namespace its tools get in cells (`tools.NAME.…`): letters,
    /// digits, `_` and `-`.
    pub name: String,
    /// The program to start (looked up on `PATH`), e.g. `npx`.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables (the rest is inherited).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the host's).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Seconds one tool call may take (default 60).
    #[serde(default = "default_call_timeout")]
    pub timeout: f64,
    /// Seconds the server may take to start and list its tools (default
    /// 60: `npx` may download the package first).
    #[serde(default = "default_start_timeout")]
    pub start_timeout: f64,
}

fn default_call_timeout() -> f64 {
    60.0
}

fn default_start_timeout() -> f64 {
    60.0
}

impl McpServerConfig {
    pub(super) fn validate(&self) -> Result<(), String> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(format!(
                "[[mcp_servers]]: name {:?} must be 1-64 letters, digits, '_' or '-' \
                 (it becomes tools.NAME in cells)",
                self.name
            ));
        }
        if self.command.trim().is_empty() {
            return Err(format!(
                "[[mcp_servers]] {:?}: command is empty; give the program that starts the \
                 server, e.g. command = \"npx\"",
                self.name
            ));
        }
        for (what, secs) in [
            ("timeout", self.timeout),
            ("start_timeout", self.start_timeout),
        ] {
            if !(secs > 0.0 && secs <= 86_400.0) {
                return Err(format!(
                    "[[mcp_servers]] {:?}: {what} must be between 0 and 86400 seconds, not {secs}",
                    self.name
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use std::path::Path;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("cellhost.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn entries_parse_in_claude_desktop_shape() {
        let c = parse(
            "[[mcp_servers]]\nname = \"filesystem\"\ncommand = \"npx\"\n\
             args = [\"-y\", \"@modelcontextprotocol/server-filesystem\", \"/tmp\"]\n\
             env = { DEBUG = \"1\" }\n",
        )
        .unwrap();
        let s = &c.mcp_servers[0];
        assert_eq!(s.name, "filesystem");
        assert_eq!(s.args.len(), 3);
        assert_eq!(s.env["DEBUG"], "1");
        assert_eq!(s.timeout, 60.0);
    }

    #[test]
    fn bad_entries_say_what_to_fix() {
        let err = parse("[[mcp_servers]]\nname = \"a.b\"\ncommand = \"x\"\n").unwrap_err();
        assert!(err.contains("tools.NAME"), "{err}");
        let err = parse("[[mcp_servers]]\nname = \"a\"\ncommand = \" \"\n").unwrap_err();
        assert!(err.contains("command is empty"), "{err}");
        let err =
            parse("[[mcp_servers]]\nname = \"a\"\ncommand = \"x\"\ntimeout = 0\n").unwrap_err();
        assert!(err.contains("timeout"), "{err}");
        let err = parse(
            "[[mcp_servers]]\nname = \"a\"\ncommand = \"x\"\n[[mcp_servers]]\nname = \"a\"\ncommand = \"y\"\n",
        )
        .unwrap_err();
        assert!(err.contains("unique"), "{err}");
        let err = parse("[[mcp_servers]]\nname = \"a\"\ncommand = \"x\"\nargz = []\n").unwrap_err();
        assert!(err.contains("argz"), "{err}");
    }

    #[test]
    fn a_server_name_cannot_shadow_a_tool() {
        let err = parse(
            "[[tools]]\nname = \"fs\"\nurl = \"http://127.0.0.1:1/\"\n\
             [[mcp_servers]]\nname = \"fs\"\ncommand = \"x\"\n",
        )
        .unwrap_err();
        assert!(err.contains("fs"), "{err}");
    }
}
