//! Jupyter messaging protocol 5.3 wire types, in the JSON-over-WebSocket
//! form a Kernel Gateway speaks: one text frame per message, with the
//! `channel` (`shell`, `control`, `iopub`, `stdin`) beside `header`,
//! `parent_header`, `metadata`, `content` and `buffers`.
//!
//! Incoming messages are parsed strictly enough to route them (a header
//! with `msg_type` and `msg_id`); their `content` stays a JSON value read
//! by the handler of its type. Outgoing messages are built by [`reply`]
//! and [`Outgoing::new`], with a fresh header each.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// The protocol version cellhost speaks.
pub(crate) const PROTOCOL_VERSION: &str = "5.3";

/// A message header (`header` and `parent_header`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Header {
    pub msg_id: String,
    pub msg_type: String,
    /// The other fields are read leniently: clients differ (Jupyter
    /// Server's gateway client sends `date` as a Unix timestamp number).
    #[serde(default)]
    pub username: Value,
    #[serde(default)]
    pub session: Value,
    #[serde(default)]
    pub date: Value,
    #[serde(default)]
    pub version: Value,
}

/// A message a client sent.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Incoming {
    pub header: Header,
    /// Kept as sent (extra fields included), to echo as `parent_header`.
    #[serde(skip)]
    pub raw_header: Value,
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default)]
    pub content: Value,
}

/// Why a text frame is not a message.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ParseError {
    #[error("the frame is not JSON (send one Jupyter message as a JSON object per frame)")]
    NotJson(#[source] serde_json::Error),
    #[error(
        "the message has no valid header (a message needs header.msg_id and \
         header.msg_type, Jupyter messaging 5.3)"
    )]
    BadHeader(#[source] serde_json::Error),
}

impl Incoming {
    /// Parse one text frame.
    ///
    /// # Errors
    /// [`ParseError`] when the frame is not JSON or has no usable header.
    pub(crate) fn parse(text: &str) -> Result<Incoming, ParseError> {
        let value: Value = serde_json::from_str(text).map_err(ParseError::NotJson)?;
        let raw_header = value.get("header").cloned().unwrap_or(Value::Null);
        let mut msg: Incoming = serde_json::from_value(value).map_err(ParseError::BadHeader)?;
        msg.raw_header = raw_header;
        Ok(msg)
    }

    pub(crate) fn msg_type(&self) -> &str {
        &self.header.msg_type
    }

    /// The channel, `shell` when the client left it out.
    pub(crate) fn channel(&self) -> &str {
        self.channel.as_deref().unwrap_or("shell")
    }

    /// A string field of the content.
    pub(crate) fn str_field(&self, name: &str) -> Option<&str> {
        self.content.get(name).and_then(Value::as_str)
    }

    pub(crate) fn bool_field(&self, name: &str) -> Option<bool> {
        self.content.get(name).and_then(Value::as_bool)
    }
}

/// A message cellhost sends.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Outgoing {
    pub header: Header,
    pub parent_header: Value,
    pub metadata: Value,
    pub content: Value,
    pub channel: &'static str,
    pub buffers: Vec<Value>,
    /// Copies of the header's, as jupyter_client puts them on every message.
    pub msg_id: String,
    pub msg_type: String,
}

impl Outgoing {
    /// A message on `channel`, answering `parent` (or unparented).
    pub(crate) fn new(
        channel: &'static str,
        msg_type: &str,
        session: &str,
        parent: Option<&Incoming>,
        content: Value,
    ) -> Outgoing {
        let msg_id = super::new_uuid();
        Outgoing {
            header: Header {
                msg_id: msg_id.clone(),
                msg_type: msg_type.to_owned(),
                username: json!("cellhost"),
                session: json!(session),
                date: json!(super::iso_time(crate::execute::unix_now())),
                version: json!(PROTOCOL_VERSION),
            },
            parent_header: parent
                .map_or_else(|| Value::Object(Map::new()), |p| p.raw_header.clone()),
            metadata: json!({}),
            content,
            channel,
            buffers: Vec::new(),
            msg_id,
            msg_type: msg_type.to_owned(),
        }
    }

    pub(crate) fn with_metadata(mut self, metadata: Value) -> Outgoing {
        self.metadata = metadata;
        self
    }

    pub(crate) fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }
}

/// The reply to `req` (`x_request` → `x_reply`) on the request's channel.
pub(crate) fn reply(req: &Incoming, session: &str, content: Value) -> Outgoing {
    let channel = if req.channel() == "control" {
        "control"
    } else {
        "shell"
    };
    let ty = reply_type(req.msg_type());
    Outgoing::new(channel, &ty, session, Some(req), content)
}

/// `x_request` → `x_reply`; anything else gets `_reply` appended.
pub(crate) fn reply_type(request: &str) -> String {
    match request.strip_suffix("_request") {
        Some(base) => format!("{base}_reply"),
        None => format!("{request}_reply"),
    }
}

/// An iopub `status` message.
pub(crate) fn status(state: &str, session: &str, parent: Option<&Incoming>) -> Outgoing {
    Outgoing::new(
        "iopub",
        "status",
        session,
        parent,
        json!({ "execution_state": state }),
    )
}

/// An iopub `stream` message.
pub(crate) fn stream(name: &str, text: &str, session: &str, parent: Option<&Incoming>) -> Outgoing {
    Outgoing::new(
        "iopub",
        "stream",
        session,
        parent,
        json!({ "name": name, "text": text }),
    )
}

/// `(ename, evalue)` of a one-line error such as
/// `ZeroDivisionError: division by zero`.
pub(crate) fn split_error(line: &str) -> (String, String) {
    match line.split_once(": ") {
        Some((name, value)) if !name.is_empty() && !name.contains(' ') => {
            (name.to_owned(), value.to_owned())
        }
        _ => match line.trim() {
            l if !l.contains(' ') && !l.is_empty() => (l.to_owned(), String::new()),
            l => ("Error".to_owned(), l.to_owned()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_parses_and_its_reply_echoes_the_header_as_parent() {
        let text = r#"{"header":{"msg_id":"m1","msg_type":"kernel_info_request","session":"s","username":"u","date":"","version":"5.3","extra":1},
                       "parent_header":{},"metadata":{},"content":{},"channel":"shell"}"#;
        let req = Incoming::parse(text).unwrap();
        assert_eq!(req.msg_type(), "kernel_info_request");
        let out: Value = serde_json::from_str(&reply(&req, "k", json!({})).to_text()).unwrap();
        assert_eq!(out["header"]["msg_type"], "kernel_info_reply");
        assert_eq!(out["channel"], "shell");
        assert_eq!(out["parent_header"]["msg_id"], "m1");
        assert_eq!(out["parent_header"]["extra"], 1);
        assert_eq!(out["header"]["version"], "5.3");
    }

    #[test]
    fn a_numeric_date_is_accepted() {
        let text = r#"{"header":{"msg_id":"m","msg_type":"kernel_info_request","date":1764600000.5},"content":{}}"#;
        assert_eq!(
            Incoming::parse(text).unwrap().msg_type(),
            "kernel_info_request"
        );
    }

    #[test]
    fn malformed_frames_say_what_is_missing() {
        assert!(matches!(Incoming::parse("{"), Err(ParseError::NotJson(_))));
        let e = Incoming::parse(r#"{"header":{"msg_id":"x"}}"#).unwrap_err();
        assert!(e.to_string().contains("msg_type"), "{e}");
    }

    #[test]
    fn a_parse_error_names_its_cause_once() {
        use std::error::Error;
        for text in ["{", r#"{"header":{"msg_id":"x"}}"#] {
            let e = Incoming::parse(text).unwrap_err();
            let cause = e.source().expect("the serde error").to_string();
            assert!(!e.to_string().contains(&cause), "{e}");
            assert!(cellhost::error_chain(&e).ends_with(&cause), "{e}");
        }
    }

    #[test]
    fn error_lines_split_into_name_and_value() {
        assert_eq!(
            split_error("ZeroDivisionError: division by zero"),
            ("ZeroDivisionError".into(), "division by zero".into())
        );
        assert_eq!(
            split_error("KeyboardInterrupt"),
            ("KeyboardInterrupt".into(), String::new())
        );
        assert_eq!(
            split_error("the kernel died"),
            ("Error".into(), "the kernel died".into())
        );
    }
}
