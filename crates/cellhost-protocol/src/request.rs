//! The cell request: what `POST /v1/sessions/{session}/execute`, MCP's
//! `execute_code` and `cellhost exec` ask for, validated in one place.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Longest timeout a cell may ask for (one day).
pub const MAX_TIMEOUT_SECONDS: f64 = 86_400.0;

/// Most tools one request may allow.
pub const MAX_TOOLS: usize = 256;

/// One cell to run: the body of an execute request.
///
/// HTTP takes every field; MCP's `execute_code` sets `code`, `reset` and
/// `timeout`; `cellhost exec` sends what its flags say. Every front end
/// validates it with [`ExecuteRequest::validate`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    /// Python source of the cell.
    pub code: String,
    /// Seconds before the cell is interrupted (then killed if it does not
    /// stop); default: the server's. Above 0, at most
    /// [`MAX_TIMEOUT_SECONDS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// Restart the session's kernel (discarding its state) before running.
    #[serde(default, skip_serializing_if = "is_false")]
    pub reset: bool,
    /// Run in this delegated child's own kernel (`{session}::child::{child}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<String>,
    /// Tools the cell may call (Tool RPC), by name; default: every tool the
    /// server has. A different tool set gets a different kernel. At most
    /// [`MAX_TOOLS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Most tool calls the cell may make (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
    /// The backend to run on: `"local"` or a `[backends.NAME]` of
    /// cellhost.toml; default: the session's, else `default_backend`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Why a request was refused: a stable machine code (`bad_json`,
/// `invalid_request`) and a sentence saying what was wrong and what to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    /// `bad_json` (not JSON at all) or `invalid_request` (JSON, but not a
    /// valid request).
    pub code: &'static str,
    /// What was wrong and what to send instead.
    pub message: String,
}

impl RequestError {
    fn invalid(message: String) -> RequestError {
        RequestError {
            code: "invalid_request",
            message,
        }
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RequestError {}

const EXAMPLE: &str = "send JSON like {\"code\": \"1 + 1\"}";

impl ExecuteRequest {
    /// A request to run `code` with every other field at its default.
    pub fn new(code: impl Into<String>) -> ExecuteRequest {
        ExecuteRequest {
            code: code.into(),
            ..ExecuteRequest::default()
        }
    }

    /// Parse and validate a JSON request body.
    ///
    /// # Errors
    /// A [`RequestError`] that says what was wrong: an empty body, an
    /// array, invalid JSON, an unknown or mistyped field, a bad value.
    pub fn parse(body: &[u8]) -> Result<ExecuteRequest, RequestError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(RequestError {
                code: "bad_json",
                message: format!("the request body is empty; {EXAMPLE}"),
            });
        }
        // serde would also take a struct as a positional array
        // (`["1 + 1", 5]`): only an object is a request.
        let first = body.iter().find(|b| !b.is_ascii_whitespace());
        if first.is_some_and(|&b| b == b'[') {
            return Err(RequestError::invalid(format!(
                "the request body must be a JSON object, not an array; {EXAMPLE}"
            )));
        }
        let req: ExecuteRequest = serde_json::from_slice(body).map_err(|e| {
            use serde_json::error::Category;
            match e.classify() {
                Category::Data => RequestError::invalid(format!("{e}; {EXAMPLE}")),
                _ => RequestError {
                    code: "bad_json",
                    message: format!("the request body is not valid JSON ({e}); {EXAMPLE}"),
                },
            }
        })?;
        req.validate()?;
        Ok(req)
    }

    /// Check the values serde cannot: the timeout's range, the number of
    /// tools.
    ///
    /// # Errors
    /// An `invalid_request` [`RequestError`] naming the bad value.
    pub fn validate(&self) -> Result<(), RequestError> {
        if let Some(t) = self.timeout {
            check_timeout(t)?;
        }
        let tools = self.tools.as_deref().unwrap_or_default();
        if tools.len() > MAX_TOOLS {
            return Err(RequestError::invalid(format!(
                "at most {MAX_TOOLS} tools may be allowed per cell, not {}",
                tools.len()
            )));
        }
        Ok(())
    }

    /// The timeout as a duration, when one was asked for and is valid.
    pub fn timeout_duration(&self) -> Option<Duration> {
        self.timeout.and_then(|t| check_timeout(t).ok())
    }
}

/// A timeout in seconds as a [`Duration`], if it is above 0, finite and at
/// most [`MAX_TIMEOUT_SECONDS`].
///
/// # Errors
/// An `invalid_request` [`RequestError`] saying the allowed range.
pub fn check_timeout(seconds: f64) -> Result<Duration, RequestError> {
    if seconds > 0.0 && seconds.is_finite() && seconds <= MAX_TIMEOUT_SECONDS {
        Ok(Duration::from_secs_f64(seconds))
    } else {
        Err(RequestError::invalid(format!(
            "timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_SECONDS}, not {seconds}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_and_omits_its_defaults() {
        let r = ExecuteRequest::new("1 + 1");
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"code":"1 + 1"}"#);
        let full = ExecuteRequest {
            timeout: Some(2.5),
            reset: true,
            tools: Some(vec!["fs.read".into()]),
            ..ExecuteRequest::new("x")
        };
        let back = ExecuteRequest::parse(serde_json::to_string(&full).unwrap().as_bytes());
        assert_eq!(back.unwrap(), full);
    }

    #[test]
    fn bad_bodies_say_what_was_wrong() {
        let code = |body: &str| ExecuteRequest::parse(body.as_bytes()).unwrap_err().code;
        assert_eq!(code("  "), "bad_json");
        assert_eq!(code("{"), "bad_json");
        assert_eq!(code(r#"["1 + 1"]"#), "invalid_request");
        assert_eq!(code(r#"{"cod": "1"}"#), "invalid_request");
        assert_eq!(code(r#"{"code": "1", "timeout": 0}"#), "invalid_request");
        assert_eq!(
            code(r#"{"code": "1", "timeout": 86401}"#),
            "invalid_request"
        );
        let many: Vec<String> = (0..=MAX_TOOLS).map(|i| format!("t{i}")).collect();
        let r = ExecuteRequest {
            tools: Some(many),
            ..ExecuteRequest::new("1")
        };
        assert!(r
            .validate()
            .unwrap_err()
            .message
            .contains("at most 256 tools"));
    }

    #[test]
    fn the_timeout_range_is_checked_once_for_everyone() {
        assert_eq!(check_timeout(1.5).unwrap(), Duration::from_millis(1500));
        assert!(check_timeout(MAX_TIMEOUT_SECONDS).is_ok());
        for bad in [
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            MAX_TIMEOUT_SECONDS + 1.0,
        ] {
            let e = check_timeout(bad).unwrap_err();
            assert!(e.message.contains("above 0 and at most 86400"), "{e}");
        }
        let r = ExecuteRequest {
            timeout: Some(-3.0),
            ..ExecuteRequest::new("1")
        };
        assert_eq!(r.timeout_duration(), None);
    }
}
