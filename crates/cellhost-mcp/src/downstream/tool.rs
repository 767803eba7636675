//! A downstream server's tool as a cellhost [`Tool`]: `SERVER.TOOL`.

use std::sync::Arc;
use std::time::Duration;

use cellhost::tools::{Tool, ToolError, ToolFuture};
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use serde_json::Value;

use super::Server;

pub(crate) struct McpTool {
    server: Arc<Server>,
    /// The tool's name on its server.
    remote: String,
    /// `SERVER.TOOL`.
    name: String,
    description: String,
    parameters: Value,
    /// The output schema is `{result: …}` only: SDKs wrap a plain return
    /// value that way (structured content must be an object); cells get
    /// the value itself.
    wrapped: bool,
}

impl McpTool {
    pub(crate) fn new(server: Arc<Server>, tool: &rmcp::model::Tool) -> McpTool {
        let remote = tool.name.to_string();
        let name = format!("{}.{}", server.config.name, remote);
        let description = tool
            .description
            .as_deref()
            .or(tool.title.as_deref())
            .unwrap_or("")
            .to_owned();
        let parameters = Value::Object(tool.input_schema.as_ref().clone());
        let wrapped = tool.output_schema.as_ref().is_some_and(|o| {
            o.get("properties")
                .and_then(Value::as_object)
                .is_some_and(|p| p.len() == 1 && p.contains_key("result"))
        });
        McpTool {
            server,
            remote,
            name,
            description,
            parameters,
            wrapped,
        }
    }
}

impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> &Value {
        &self.parameters
    }

    fn call(&self, args: Value) -> ToolFuture {
        let server = self.server.clone();
        let remote = self.remote.clone();
        let wrapped = self.wrapped;
        Box::pin(async move {
            let peer = server.peer().map_err(ToolError::new)?;
            let Value::Object(args) = args else {
                return Err(ToolError::new("arguments must be keyword arguments"));
            };
            let name = &server.config.name;
            let limit = Duration::from_secs_f64(server.config.timeout);
            let call =
                peer.call_tool(CallToolRequestParams::new(remote.clone()).with_arguments(args));
            let result = match tokio::time::timeout(limit, call).await {
                Err(_) => {
                    return Err(ToolError::new(format!(
                        "{name}.{remote} took longer than {} s (its [[mcp_servers]] timeout)",
                        server.config.timeout
                    )))
                }
                Ok(Err(e)) => {
                    return Err(ToolError::new(format!(
                        "{name}.{remote} failed: {e}{}",
                        server
                            .peer()
                            .err()
                            .map(|down| format!(" ({down})"))
                            .unwrap_or_default()
                    )))
                }
                Ok(Ok(r)) => r,
            };
            value_of(result, wrapped)
                .map_err(|text| ToolError::new(format!("{name}.{remote}: {text}")))
        })
    }
}

/// What a cell gets back: the structured content when there is one, else
/// the text (one block: a string; several: joined), else the content
/// blocks as JSON. An `isError` result is an error with its text.
fn value_of(r: CallToolResult, wrapped: bool) -> Result<Value, String> {
    let texts: Vec<&str> = r
        .content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::Text(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect();
    if r.is_error == Some(true) {
        let text = texts.join("\n");
        return Err(if text.is_empty() {
            "the tool reported an error".to_owned()
        } else {
            text
        });
    }
    if let Some(v) = r.structured_content {
        return Ok(match v {
            Value::Object(mut m) if wrapped && m.len() == 1 && m.contains_key("result") => {
                m.remove("result").unwrap_or(Value::Null)
            }
            v => v,
        });
    }
    if texts.len() == r.content.len() {
        return Ok(Value::String(texts.join("\n")));
    }
    serde_json::to_value(&r.content).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn results_become_python_values() {
        let text = CallToolResult::success(vec![ContentBlock::text("hello")]);
        assert_eq!(value_of(text, false).unwrap(), json!("hello"));
        let mut structured = CallToolResult::success(vec![ContentBlock::text("{\"a\": 1}")]);
        structured.structured_content = Some(json!({"a": 1}));
        assert_eq!(value_of(structured, false).unwrap(), json!({"a": 1}));
        let mut plain = CallToolResult::success(vec![ContentBlock::text("5")]);
        plain.structured_content = Some(json!({"result": 5}));
        assert_eq!(value_of(plain.clone(), true).unwrap(), json!(5));
        assert_eq!(value_of(plain, false).unwrap(), json!({"result": 5}));
        let err = CallToolResult::error(vec![ContentBlock::text("no such file")]);
        assert_eq!(value_of(err, false).unwrap_err(), "no such file");
        let image = CallToolResult::success(vec![ContentBlock::image("AAAA", "image/png")]);
        let v = value_of(image, false).unwrap();
        assert_eq!(v[0]["mimeType"], "image/png", "{v}");
    }
}
