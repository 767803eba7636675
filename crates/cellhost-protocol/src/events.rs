//! The Server-Sent Events of a streamed execute request
//! (`Accept: text/event-stream`), and the answer a cell's request gets.
//!
//! While the cell runs: `stdout`, `stderr` and `display` events, and a
//! `stream_stopped` event when a stream's live output reached the cap
//! (the result still has its head and tail); then one `result` (or
//! `error`) event, and the stream ends. Each event's data is one JSON
//! object.

use serde::{Deserialize, Serialize};

use crate::{CellResult, DisplayItem};

/// One of a cell's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl OutputStream {
    /// `"stdout"` or `"stderr"`.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }
}

/// A cell's answer: its result, and (only when its history row could not
/// be written) a `history` field saying so. Additive to the cell-result
/// contract: clients that do not know the field still get the result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellAnswer {
    /// The cell result.
    #[serde(flatten)]
    pub result: CellResult,
    /// Present only when the daemon could not record the cell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<NotRecorded>,
}

/// `"history": {"recorded": false, "error": "…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotRecorded {
    /// Always `false`.
    pub recorded: bool,
    /// Why the row could not be written and what to do.
    pub error: String,
}

/// An error answer's detail: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `bad_json`, `unknown_session`.
    pub code: String,
    /// What was wrong and what to do.
    pub message: String,
}

/// The body of an error answer (and of an `error` event).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The answer of the interrupt and dispose routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Count {
    /// How many cells were interrupted / kernels disposed.
    pub count: usize,
}

/// One event of a streamed execute request.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ExecuteEvent {
    /// Cleaned stdout text, at line ends.
    Stdout(String),
    /// Cleaned stderr text, at line ends.
    Stderr(String),
    /// One display's items (they share one `display` index).
    Display(Vec<DisplayItem>),
    /// The display of the cell's last value (its rich repr: a DataFrame's
    /// HTML, a figure): sent as `display` with `"value": true`; the
    /// result's `value_display` names its index.
    Value(Vec<DisplayItem>),
    /// Live output of `stream` stopped after `after_bytes` bytes (the
    /// per-cell cap); the result has the stream's head and tail.
    StreamStopped {
        /// The stream that stopped.
        stream: OutputStream,
        /// The cap it reached, in bytes.
        after_bytes: u64,
    },
    /// The cell's answer: the last event.
    Result(Box<CellAnswer>),
    /// The cell could not run: the last event.
    Error(ErrorDetail),
}

#[derive(Serialize, Deserialize)]
struct Text {
    text: String,
}

#[derive(Serialize, Deserialize)]
struct Items {
    items: Vec<DisplayItem>,
    #[serde(default, skip_serializing_if = "is_false")]
    value: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Serialize, Deserialize)]
struct Stopped {
    stream: OutputStream,
    after_bytes: u64,
}

impl ExecuteEvent {
    /// The SSE event name: `stdout`, `stderr`, `display`,
    /// `stream_stopped`, `result` or `error`.
    pub fn name(&self) -> &'static str {
        match self {
            ExecuteEvent::Stdout(_) => "stdout",
            ExecuteEvent::Stderr(_) => "stderr",
            ExecuteEvent::Display(_) | ExecuteEvent::Value(_) => "display",
            ExecuteEvent::StreamStopped { .. } => "stream_stopped",
            ExecuteEvent::Result(_) => "result",
            ExecuteEvent::Error(_) => "error",
        }
    }

    /// The SSE event's data: one JSON object.
    pub fn data(&self) -> String {
        let json = match self {
            ExecuteEvent::Stdout(text) | ExecuteEvent::Stderr(text) => {
                serde_json::to_string(&Text { text: text.clone() })
            }
            ExecuteEvent::Display(items) => serde_json::to_string(&Items {
                items: items.clone(),
                value: false,
            }),
            ExecuteEvent::Value(items) => serde_json::to_string(&Items {
                items: items.clone(),
                value: true,
            }),
            ExecuteEvent::StreamStopped {
                stream,
                after_bytes,
            } => serde_json::to_string(&Stopped {
                stream: *stream,
                after_bytes: *after_bytes,
            }),
            ExecuteEvent::Result(answer) => serde_json::to_string(answer),
            ExecuteEvent::Error(detail) => serde_json::to_string(&ErrorBody {
                error: detail.clone(),
            }),
        };
        json.unwrap_or_else(|_| "{}".to_owned())
    }

    /// The event an SSE `event:` name and `data:` carry; `Ok(None)` for a
    /// name this version does not know (a newer server's), which a client
    /// skips.
    ///
    /// # Errors
    /// The data is not what the event's name promises.
    pub fn parse(name: &str, data: &str) -> Result<Option<ExecuteEvent>, serde_json::Error> {
        Ok(Some(match name {
            "stdout" => ExecuteEvent::Stdout(serde_json::from_str::<Text>(data)?.text),
            "stderr" => ExecuteEvent::Stderr(serde_json::from_str::<Text>(data)?.text),
            "display" => {
                let d: Items = serde_json::from_str(data)?;
                if d.value {
                    ExecuteEvent::Value(d.items)
                } else {
                    ExecuteEvent::Display(d.items)
                }
            }
            "stream_stopped" => {
                let s: Stopped = serde_json::from_str(data)?;
                ExecuteEvent::StreamStopped {
                    stream: s.stream,
                    after_bytes: s.after_bytes,
                }
            }
            "result" => ExecuteEvent::Result(Box::new(serde_json::from_str(data)?)),
            "error" => ExecuteEvent::Error(serde_json::from_str::<ErrorBody>(data)?.error),
            _ => return Ok(None),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(e: ExecuteEvent) {
        let back = ExecuteEvent::parse(e.name(), &e.data()).unwrap();
        assert_eq!(back, Some(e));
    }

    #[test]
    fn every_event_round_trips_through_its_name_and_data() {
        round_trip(ExecuteEvent::Stdout("hi\n".into()));
        round_trip(ExecuteEvent::Stderr("oops\n".into()));
        round_trip(ExecuteEvent::Display(vec![DisplayItem {
            mime: "text/plain".into(),
            data: "<Figure>".into(),
            display: 0,
        }]));
        round_trip(ExecuteEvent::Value(vec![DisplayItem {
            mime: "text/html".into(),
            data: "<table></table>".into(),
            display: 1,
        }]));
        round_trip(ExecuteEvent::StreamStopped {
            stream: OutputStream::Stderr,
            after_bytes: 50_000,
        });
        round_trip(ExecuteEvent::Error(ErrorDetail {
            code: "internal".into(),
            message: "the cell's task ended without a result".into(),
        }));
    }

    #[test]
    fn the_wire_shapes_stay_as_documented() {
        assert_eq!(ExecuteEvent::Stdout("a".into()).data(), r#"{"text":"a"}"#);
        let stop = ExecuteEvent::StreamStopped {
            stream: OutputStream::Stdout,
            after_bytes: 7,
        };
        assert_eq!(stop.data(), r#"{"stream":"stdout","after_bytes":7}"#);
        let err = ExecuteEvent::Error(ErrorDetail {
            code: "c".into(),
            message: "m".into(),
        });
        assert_eq!(err.data(), r#"{"error":{"code":"c","message":"m"}}"#);
        assert_eq!(ExecuteEvent::parse("keepalive", "{}").unwrap(), None);
        assert!(ExecuteEvent::parse("stdout", "{}").is_err());
    }
}
