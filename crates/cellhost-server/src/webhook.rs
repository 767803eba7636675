//! Tools served by the agent framework over HTTP (`[[tools]]` in
//! cellhost.toml): a cell's call is POSTed as JSON to the tool's URL.
//!
//! Request: `{"tool": NAME, "args": {...}}`. Answer (2xx, JSON):
//! `{"result": ...}`, or `{"error": "why"}` to raise `tools.ToolError` in
//! the cell. Any other answer, a non-2xx status, a timeout or an answer
//! over the payload limit fails the call with a message saying so.

use std::collections::BTreeMap;
use std::time::Duration;

use cellhost::config::ToolConfig;
use cellhost::tools::{Tool, ToolError, ToolFuture, ToolSet, DEFAULT_MAX_PAYLOAD};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One webhook tool.
pub struct WebhookTool {
    name: String,
    description: String,
    parameters: Value,
    url: Uri,
    timeout: Duration,
    headers: BTreeMap<String, String>,
    client: HttpClient,
}

/// The tools of `configs`, sharing one HTTP client.
///
/// # Errors
/// A line naming the bad entry.
pub fn toolset(configs: &[ToolConfig]) -> Result<ToolSet, String> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    let mut set = ToolSet::new();
    for c in configs {
        let url: Uri = c
            .url
            .parse()
            .map_err(|e| format!("[[tools]] {:?}: bad url {:?}: {e}", c.name, c.url))?;
        let tool = WebhookTool {
            name: c.name.clone(),
            description: c.description.clone(),
            parameters: c.schema()?,
            url,
            timeout: Duration::from_secs_f64(c.timeout),
            headers: c.headers.clone(),
            client: client.clone(),
        };
        set = set.with(tool).map_err(|e| format!("[[tools]]: {e}"))?;
    }
    Ok(set)
}

impl Tool for WebhookTool {
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
        let body = json!({"tool": self.name, "args": args}).to_string();
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(self.url.clone())
            .header("content-type", "application/json")
            .header("accept", "application/json");
        for (k, v) in &self.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let req = req.body(Full::new(Bytes::from(body)));
        let client = self.client.clone();
        let (name, url, timeout) = (self.name.clone(), self.url.clone(), self.timeout);
        Box::pin(async move {
            let req = req.map_err(|e| {
                ToolError::new(format!(
                    "tool {name:?}: bad request header in cellhost.toml: {e}"
                ))
            })?;
            let exchange = async {
                let resp = client.request(req).await.map_err(|e| {
                    ToolError::new(format!(
                        "tool {name:?}: its endpoint {url} is unreachable: {e}"
                    ))
                })?;
                let status = resp.status();
                let body = Limited::new(resp.into_body(), DEFAULT_MAX_PAYLOAD)
                    .collect()
                    .await
                    .map_err(|e| {
                        ToolError::new(format!(
                            "tool {name:?}: reading the answer of {url} failed (over \
                             {DEFAULT_MAX_PAYLOAD} bytes?): {e}"
                        ))
                    })?
                    .to_bytes();
                Ok::<_, ToolError>((status, body))
            };
            let (status, body) =
                tokio::time::timeout(timeout, exchange)
                    .await
                    .map_err(|_| {
                        ToolError::new(format!(
                            "tool {name:?}: its endpoint {url} did not answer within {} s",
                            timeout.as_secs_f64()
                        ))
                    })??;
            let text = || String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
            if !status.is_success() {
                return Err(ToolError::new(format!(
                    "tool {name:?}: its endpoint answered {status}: {}",
                    text()
                )));
            }
            match serde_json::from_slice::<Value>(&body) {
                Ok(Value::Object(mut o)) if o.contains_key("error") => {
                    Err(ToolError::new(match o.remove("error") {
                        Some(Value::String(s)) => s,
                        Some(other) => other.to_string(),
                        None => String::new(),
                    }))
                }
                Ok(Value::Object(mut o)) if o.contains_key("result") => {
                    Ok(o.remove("result").unwrap_or(Value::Null))
                }
                _ => Err(ToolError::new(format!(
                    "tool {name:?}: its endpoint must answer JSON {{\"result\": ...}} or \
                     {{\"error\": \"...\"}}, not: {}",
                    text()
                ))),
            }
        })
    }
}
