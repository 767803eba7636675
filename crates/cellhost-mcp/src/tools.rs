//! The MCP tools cellhost offers and their arguments.

use std::sync::Arc;

use cellhost::ExecuteRequest;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde::Deserialize;
use serde_json::{json, Value};

pub(crate) const EXECUTE: &str = "execute_code";
pub(crate) const INTERRUPT: &str = "interrupt";
pub(crate) const RESET: &str = "reset_session";
pub(crate) const LIST: &str = "list_kernels";
pub(crate) const FORK: &str = "fork_session";

const EXECUTE_DESCRIPTION: &str = "Run Python code in a persistent kernel that belongs to this \
conversation: variables, imports, functions and files persist from call to call (like a \
Jupyter notebook). Returns what was printed (also by C code and subprocesses), the value of \
the last expression, the error with a short traceback, images as image content, and a plain \
sentence whenever the kernel's state was reset or lost. A cell that runs past `timeout` is \
interrupted (state kept) and killed only if it does not stop. Use `reset: true` to start \
from a fresh kernel. Files live in the session's workspace, the kernel's working directory \
(`/workspace` in the sandbox): files the user uploads appear there, files you write there \
persist across calls and resets and can be downloaded by the user; when output is cut, its \
full text is saved under `.cellhost/output/` there (the cut note names the file).";

/// `execute_code`'s arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecuteArgs {
    pub code: String,
    #[serde(default)]
    pub reset: bool,
    #[serde(default)]
    pub timeout: Option<f64>,
    #[serde(default)]
    pub session: Option<String>,
}

impl ExecuteArgs {
    /// The cell request these arguments make (validated like an HTTP
    /// request's), and the named session, if any.
    pub(crate) fn request(self) -> Result<(ExecuteRequest, Option<String>), String> {
        let req = ExecuteRequest {
            timeout: self.timeout,
            reset: self.reset,
            ..ExecuteRequest::new(self.code)
        };
        req.validate().map_err(|e| e.message)?;
        Ok((req, self.session))
    }
}

/// The arguments of `interrupt` and `reset_session`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionArgs {
    #[serde(default)]
    pub session: Option<String>,
}

/// `fork_session`'s arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkArgs {
    /// The new sessions.
    pub into: Vec<String>,
    #[serde(default)]
    pub session: Option<String>,
}

/// `list_kernels` takes none.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoArgs {}

/// Parse a call's arguments, with an error that says what to send.
pub(crate) fn parse<T: for<'de> Deserialize<'de> + Default>(
    tool: &str,
    args: Option<JsonObject>,
) -> Result<T, String> {
    match args {
        None => Ok(T::default()),
        Some(map) => parse_required(tool, Some(map)),
    }
}

pub(crate) fn parse_required<T: for<'de> Deserialize<'de>>(
    tool: &str,
    args: Option<JsonObject>,
) -> Result<T, String> {
    let value = Value::Object(args.unwrap_or_default());
    serde_json::from_value(value)
        .map_err(|e| format!("bad arguments for {tool}: {e}; see the tool's input schema"))
}

const SESSION_PROP: &str = "Run in this named session's kernel instead of this connection's \
(a stable id such as a conversation id; it outlives the connection).";

/// The tools; `functions` are the code-mode functions a cell may call
/// (one line each), listed in `execute_code`'s description.
pub(crate) fn definitions(functions: &[String]) -> Vec<Tool> {
    let mut description = EXECUTE_DESCRIPTION.to_owned();
    if !functions.is_empty() {
        description.push_str(
            "\n\nThe cell can call these tools as Python functions from the `tools` module \
             (`import tools`; keyword arguments only; errors raise tools.ToolError; at most 50 \
             calls per cell):\n",
        );
        for f in functions {
            description.push_str("- ");
            description.push_str(f);
            description.push('\n');
        }
    }
    let session = json!({"type": "string", "description": SESSION_PROP});
    vec![
        tool(
            EXECUTE,
            description,
            json!({
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "Python source to run."},
                    "reset": {"type": "boolean", "description": "Restart the kernel (discarding all state) before running.", "default": false},
                    "timeout": {"type": "number", "description": "Seconds before the cell is interrupted (default 60)."},
                    "session": session,
                },
                "required": ["code"],
                "additionalProperties": false,
            }),
            ToolAnnotations::new()
                .read_only(false)
                .destructive(false)
                .open_world(true),
        ),
        tool(
            INTERRUPT,
            "Interrupt the cell running in this conversation's kernel (like Ctrl-C): it ends \
             with KeyboardInterrupt and the kernel's state is kept."
                .to_owned(),
            json!({"type": "object", "properties": {"session": session}, "additionalProperties": false}),
            ToolAnnotations::new()
                .read_only(false)
                .destructive(false)
                .idempotent(true),
        ),
        tool(
            RESET,
            "Discard this conversation's kernel and all its state (variables, imports); the \
             next execute_code starts a fresh one."
                .to_owned(),
            json!({"type": "object", "properties": {"session": session}, "additionalProperties": false}),
            ToolAnnotations::new()
                .read_only(false)
                .destructive(true)
                .idempotent(true),
        ),
        tool(
            FORK,
            "Copy this conversation's live Python state (variables, functions, imports) and its \
             workspace files into new sessions, to try different approaches side by side: each \
             new session starts where this one is now and is independent from then on (run code \
             in one with execute_code's `session` argument). This session is not changed."
                .to_owned(),
            json!({
                "type": "object",
                "properties": {
                    "into": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 16, "description": "New session ids (each must not exist yet)."},
                    "session": {"type": "string", "description": "Fork this named session instead of this connection's."},
                },
                "required": ["into"],
                "additionalProperties": false,
            }),
            ToolAnnotations::new()
                .read_only(false)
                .destructive(false)
                .idempotent(false),
        ),
        tool(
            LIST,
            "List the live kernels of this cellhost: owner, state, idle time, memory, cells run."
                .to_owned(),
            json!({"type": "object", "properties": {}, "additionalProperties": false}),
            ToolAnnotations::new().read_only(true),
        ),
    ]
}

/// The tools with `execute_code`'s description followed by the kernels'
/// environment (see [`cellhost::environment::summary`]).
pub(crate) fn with_environment(tools: &[Tool], summary: &str) -> Vec<Tool> {
    tools
        .iter()
        .map(|t| {
            let mut t = t.clone();
            if t.name == EXECUTE {
                let d = t.description.as_deref().unwrap_or_default();
                t.description = Some(format!("{d}\n\n{summary}").into());
            }
            t
        })
        .collect()
}

fn tool(name: &'static str, description: String, schema: Value, notes: ToolAnnotations) -> Tool {
    let schema: JsonObject = match schema {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    };
    Tool::new(name, description, Arc::new(schema)).with_annotations(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execute_lists_the_code_mode_functions() {
        let defs = definitions(&["tools.fs.read(*, path: string): Read a file.".to_owned()]);
        let names: Vec<&str> = defs.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, [EXECUTE, INTERRUPT, RESET, FORK, LIST]);
        let d = defs[0].description.as_deref().unwrap();
        assert!(
            d.contains("- tools.fs.read(*, path: string): Read a file."),
            "{d}"
        );
        let plain = definitions(&[]);
        assert!(!plain[0]
            .description
            .as_deref()
            .unwrap()
            .contains("tools module"));
    }

    #[test]
    fn the_environment_follows_execute_codes_description_only() {
        let defs = with_environment(&definitions(&[]), "Environment: Python 3.11.7.");
        let d = defs[0].description.as_deref().unwrap();
        assert!(
            d.starts_with("Run Python code") && d.ends_with("\n\nEnvironment: Python 3.11.7."),
            "{d}"
        );
        assert!(!defs[1]
            .description
            .as_deref()
            .unwrap()
            .contains("Environment"));
    }

    #[test]
    fn bad_arguments_say_what_was_wrong() {
        let mut m = JsonObject::new();
        m.insert("cod".into(), json!("1"));
        let e = parse_required::<ExecuteArgs>(EXECUTE, Some(m)).unwrap_err();
        assert!(e.contains("cod") && e.contains("execute_code"), "{e}");
        let mut m = JsonObject::new();
        m.insert("code".into(), json!("1"));
        m.insert("timeout".into(), json!(-1));
        let a = parse_required::<ExecuteArgs>(EXECUTE, Some(m)).unwrap();
        assert!(a.request().unwrap_err().contains("above 0"));
        assert!(parse::<NoArgs>(LIST, None).is_ok());
    }
}
