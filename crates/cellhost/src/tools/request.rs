//! One tool request, served the same way whatever carried it: the local
//! kernel's Unix socket (`server.rs`) or a remote kernel's request file
//! (`remote/kernel/wait.rs`).
//!
//! [`admit`] parses the request, checks the kernel's token (constant
//! time) and applies the one authority rule: a request runs under the
//! authority of the cell running *now*, and only if it was made while
//! that cell ran. A request arriving over the socket is made as it
//! arrives; a remote request file can sit in the kernel dir past its
//! cell's end, so it carries the cell it was made in (`cell`) and a
//! request made between cells (a thread a finished cell left running) is
//! refused, never served by the next cell. [`reply`] turns the tool's
//! answer into the reply bytes, bounded by the payload limit.
//!
//! Requests the host answers itself (not a tool of the agent) belong
//! between the token check and the authority: see [`Request`].

use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::task::{JoinError, JoinHandle};

use super::authority::refused_no_cell;
use super::{Authority, ToolError};

/// What one request asks. `args` stays raw until the token is checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Request {
    pub(crate) token: String,
    pub(crate) tool: String,
    #[serde(default)]
    pub(crate) args: Option<Box<RawValue>>,
    /// The cell the request was made in (remote kernels: the request
    /// number of the cell running when the tools module wrote it; `null`
    /// when none ran). Absent on the local socket.
    #[serde(default)]
    pub(crate) cell: Option<u64>,
}

/// A call that reached its tool.
pub(crate) struct Admitted {
    pub(crate) name: String,
    pub(crate) call: JoinHandle<Result<Value, ToolError>>,
}

/// A request that never reached a tool: the reply that says why, and
/// whether to hang up (a wrong token: the sender is not this kernel).
pub(crate) struct Refused {
    pub(crate) reply: Vec<u8>,
    pub(crate) hang_up: bool,
}

impl Refused {
    fn say(message: String) -> Refused {
        Refused {
            reply: error(message),
            hang_up: false,
        }
    }
}

/// The cell running now, as the kernel knows it.
#[derive(Clone, Copy)]
pub(crate) struct Running<'a> {
    /// Its authority; `None`: no cell runs.
    pub(crate) authority: Option<&'a Arc<Authority>>,
    /// Its number, when requests say which cell they were made in.
    pub(crate) cell: Option<u64>,
}

/// Parse `body` (JSON `{"token", "tool", "args"}`), check `token` and
/// start the call under the running cell's authority, or say why not.
pub(crate) fn admit(body: &[u8], token: &str, running: Running<'_>) -> Result<Admitted, Refused> {
    admit_parsed(parse(body, token)?, running)
}

/// [`admit`] of a request already [`parse`]d (and its token checked).
pub(crate) fn admit_parsed(req: Request, running: Running<'_>) -> Result<Admitted, Refused> {
    let args = arguments(&req)?;
    let authority = match (running.authority, running.cell) {
        (Some(a), None) => Some(a),
        (Some(a), Some(now)) if req.cell == Some(now) => Some(a),
        _ => None,
    };
    let Some(authority) = authority else {
        return Err(Refused::say(refused_no_cell(&req.tool)));
    };
    match authority.dispatch(&req.tool, args) {
        Ok(call) => Ok(Admitted {
            name: req.tool,
            call,
        }),
        Err(why) => Err(Refused::say(why)),
    }
}

/// Parse a request and check its token: the first step of [`admit`], for
/// a caller that answers some requests itself (a reserved host request)
/// before handing the rest to [`admit_parsed`].
pub(crate) fn parse(body: &[u8], token: &str) -> Result<Request, Refused> {
    let req: Request = serde_json::from_slice(body).map_err(|e| {
        Refused::say(format!(
            "malformed tool request ({e}); expected JSON {{\"token\", \"tool\", \"args\"}}"
        ))
    })?;
    if !same_token(req.token.as_bytes(), token.as_bytes()) {
        return Err(Refused {
            reply: error("wrong token: this socket serves only its own kernel's cells".into()),
            hang_up: true,
        });
    }
    Ok(req)
}

/// The keyword arguments: a JSON object (absent or `null`: none).
fn arguments(req: &Request) -> Result<Value, Refused> {
    match req
        .args
        .as_ref()
        .map(|raw| serde_json::from_str::<Value>(raw.get()))
    {
        None | Some(Ok(Value::Null)) => Ok(Value::Object(Default::default())),
        Some(Ok(v @ Value::Object(_))) => Ok(v),
        _ => Err(Refused::say(format!(
            "the arguments of {:?} must be a JSON object of keyword arguments",
            req.tool
        ))),
    }
}

/// The reply to a call that ran: its result, or why it failed; a result
/// over `max` bytes is replaced by an error saying so.
pub(crate) fn reply(
    name: &str,
    done: Result<Result<Value, ToolError>, JoinError>,
    max: usize,
) -> Vec<u8> {
    let reply = match done {
        Ok(Ok(value)) => serde_json::to_vec(&json!({ "result": value })),
        Ok(Err(e)) => Ok(error(e.message().to_owned())),
        Err(e) if e.is_panic() => Ok(error(format!(
            "tool {name:?} failed: it panicked ({})",
            panic_message(e.into_panic())
        ))),
        Err(_) => Ok(error(format!("tool call {name:?} was cancelled"))),
    };
    match reply {
        Ok(r) if r.len() <= max => r,
        Ok(r) => error(format!(
            "the result of tool {name:?} is {} bytes, over the {max}-byte limit",
            r.len()
        )),
        Err(e) => error(format!(
            "the result of tool {name:?} is not valid JSON: {e}"
        )),
    }
}

/// `{"error": message}`.
pub(crate) fn error(message: String) -> Vec<u8> {
    serde_json::to_vec(&json!({ "error": message })).unwrap_or_default()
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "no message".to_owned()
    }
}

/// Equal tokens, compared in time that does not depend on where they differ.
pub(crate) fn same_token(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{FnTool, ToolSet};

    #[test]
    fn tokens_compare_whole() {
        assert!(same_token(b"abcd", b"abcd"));
        assert!(!same_token(b"abcd", b"abce"));
        assert!(!same_token(b"abcd", b"abc"));
        assert!(!same_token(b"", b"a"));
    }

    fn authority() -> Arc<Authority> {
        let noop = FnTool::new("noop", "x", json!({}), |_| {
            std::future::ready(Ok::<_, ToolError>(Value::Null))
        });
        Authority::new(Some(ToolSet::new().with(noop).unwrap()), None, 5)
    }

    fn refusal(r: Result<Admitted, Refused>) -> (String, bool) {
        let Err(r) = r else { panic!("admitted") };
        let v: Value = serde_json::from_slice(&r.reply).unwrap();
        (v["error"].as_str().unwrap().to_owned(), r.hang_up)
    }

    #[tokio::test]
    async fn a_request_runs_only_under_the_cell_it_was_made_in() {
        let a = authority();
        let now = |cell| Running {
            authority: Some(&a),
            cell,
        };
        let body = |cell: &str| format!(r#"{{"token":"t","tool":"noop","cell":{cell}}}"#);
        // The local socket: whatever runs now.
        assert!(admit(br#"{"token":"t","tool":"noop"}"#, "t", now(None)).is_ok());
        // A remote request made in this cell, in another, between cells.
        assert!(admit(body("3").as_bytes(), "t", now(Some(3))).is_ok());
        let (why, _) = refusal(admit(body("2").as_bytes(), "t", now(Some(3))));
        assert!(why.contains("no cell is running"), "{why}");
        let (why, _) = refusal(admit(body("null").as_bytes(), "t", now(Some(3))));
        assert!(why.contains("no cell is running"), "{why}");
        assert_eq!(a.made(), 2, "refused requests never reach the tool");
        let none = Running {
            authority: None,
            cell: None,
        };
        let (why, hang_up) = refusal(admit(body("3").as_bytes(), "t", none));
        assert!(why.contains("no cell is running") && !hang_up, "{why}");
    }

    #[tokio::test]
    async fn a_wrong_token_or_bad_arguments_are_refused_with_the_reason() {
        let a = authority();
        let now = Running {
            authority: Some(&a),
            cell: None,
        };
        let (why, hang_up) = refusal(admit(br#"{"token":"u","tool":"noop"}"#, "t", now));
        assert!(why.contains("wrong token") && hang_up, "{why}");
        let (why, _) = refusal(admit(
            br#"{"token":"t","tool":"noop","args":[1]}"#,
            "t",
            now,
        ));
        assert!(why.contains("must be a JSON object"), "{why}");
        let (why, _) = refusal(admit(b"nope", "t", now));
        assert!(why.contains("malformed tool request"), "{why}");
        assert_eq!(a.made(), 0);
    }
}
