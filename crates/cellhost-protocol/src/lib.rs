//! Wire types of cellhost: the public cell-result contract.
//!
//! These types are what every front end (library, `cellhost run --json`, the
//! HTTP API, MCP structured content) hands to its caller, and what it takes
//! from it: the cell request ([`ExecuteRequest`], validated once for HTTP,
//! MCP and the CLI) and the events of a streamed run ([`ExecuteEvent`]).
//! They carry no I/O and depend on serde (and serde_json for the request
//! body and event data) only, so any transport can reuse them. The JSON
//! shape is documented in `docs/result.md` and `docs/http-api.md`.
//!
//! Fields that do not apply are omitted (`Option::None` is skipped); the
//! `kernel.*` booleans are always present.
//!
//! The optional `openapi` feature derives OpenAPI schemas (utoipa) for the
//! daemon's generated document; without it the crate needs serde only.

#![warn(missing_docs, unreachable_pub)]

use serde::{Deserialize, Serialize};

mod events;
mod request;
mod snapshot;

pub use events::{
    CellAnswer, Count, ErrorBody, ErrorDetail, ExecuteEvent, NotRecorded, OutputStream,
};
pub use request::{check_timeout, ExecuteRequest, RequestError, MAX_TIMEOUT_SECONDS, MAX_TOOLS};
pub use snapshot::{
    ForkPath, ForkReport, ForkRequest, ForkTarget, ForkTargets, Forked, RestoreFrom, Restored,
    Skipped, SnapshotReport,
};

/// How a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Status {
    /// The cell ran to completion (including a deliberate `sys.exit(0)`).
    Success,
    /// The cell raised, exited non-zero, or the kernel died under it.
    Error,
    /// The cell ran past its timeout and was interrupted (or killed).
    Timeout,
    /// The caller interrupted the cell.
    Interrupted,
}

impl Status {
    /// The lowercase wire name (`"success"`, `"error"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Success => "success",
            Status::Error => "error",
            Status::Timeout => "timeout",
            Status::Interrupted => "interrupted",
        }
    }
}

/// One rich output item (`display()`, plots).
///
/// A cell's `displays` is a flat list in arrival order; the items of one
/// display (one `display(obj)` call, one figure: e.g. `image/png` plus its
/// `text/plain` fallback) share the same `display` index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DisplayItem {
    /// e.g. `image/png`, `text/html`, `text/plain`.
    pub mime: String,
    /// Text mimes (`text/*`, `*+xml` like SVG, `*json`) as is; binary
    /// data (PNG, JPEG...) in base64 (standard alphabet, padded).
    pub data: String,
    /// 0-based index of the display within the cell this item belongs to.
    #[serde(default)]
    pub display: u32,
}

impl DisplayItem {
    /// `true` when `data` is base64 of binary data rather than text.
    pub fn is_base64(&self) -> bool {
        !is_text_mime(&self.mime)
    }
}

/// Whether a mime type travels as text (`text/*`, `*+xml`, `*json`,
/// `application/javascript`); every other mime travels as base64.
pub fn is_text_mime(mime: &str) -> bool {
    mime.starts_with("text/")
        || mime.ends_with("+xml")
        || mime.ends_with("json")
        || mime == "application/javascript"
}

/// Whether output was cut, and where the full text went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Truncated {
    /// stdout was cut to its head and tail.
    pub stdout: bool,
    /// stderr was cut to its head and tail.
    pub stderr: bool,
    /// A file holding the cleaned full output (up to the spill cap) when
    /// stdout or stderr was cut.
    pub spill_path: Option<String>,
    /// Displays dropped because they were over a size cap.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub displays_dropped: u32,
    /// Why displays were dropped and what to do about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub displays_note: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What a registered kernel is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum KernelState {
    /// Its process is being started.
    Starting,
    /// Alive, no cell running or queued.
    Idle,
    /// A cell is running or queued.
    Busy,
}

/// One line of the kernel registry's list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KernelSummary {
    /// The session (or `{session}::child::{child}`) the kernel belongs to.
    pub owner: String,
    /// The registry key: owner, backend, interpreter, cwd, tool set.
    pub key: String,
    /// The current process's id (`k-…`); empty while starting.
    pub id: String,
    /// `"local"`, or the name of a `[backends.NAME]`.
    pub backend: String,
    /// The kernel process's pid (on its host), when it has one.
    pub pid: Option<u32>,
    /// What it is doing.
    pub state: KernelState,
    /// Cells run in the current process.
    pub execution_count: u64,
    /// Cells waiting behind the running one.
    pub queued: usize,
    /// Unix time (seconds) the registry entry was created.
    pub created: f64,
    /// Unix time (seconds) of the last call.
    pub last_used: f64,
    /// Seconds since the last call.
    pub idle_seconds: f64,
    /// Resident memory of the kernel process, when known.
    pub rss_bytes: Option<u64>,
}

/// Which kernel ran the cell and what happened to its state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KernelInfo {
    /// Identifies one kernel process; a new process gets a new id.
    pub id: String,
    /// `"local"` for kernels on this machine.
    pub backend: String,
    /// The kernel process's pid (on its host), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// `true` when the cell ran in the same process as the previous cell.
    pub reused: bool,
    /// Cells run in this kernel process so far, this one included.
    pub execution_count: u64,
    /// The caller asked for a reset: earlier state was discarded on purpose.
    pub state_reset: bool,
    /// State the caller had was lost without being asked for (killed
    /// after a timeout, crashed, evicted, ...).
    pub state_lost: bool,
    /// This cell ended the kernel (`sys.exit()`); the next cell gets a
    /// fresh one.
    pub ended: bool,
    /// A plain sentence whenever state was reset, lost or the kernel ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// On the first cell after a snapshot was loaded into a fresh kernel:
    /// what was restored, what was not, and why it was taken.
    /// `state_lost` is false only when nothing was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<Restored>,
    /// The session this kernel's state was forked from, on every cell of
    /// a forked kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<String>,
}

/// The result of one cell: the public contract of every front end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CellResult {
    /// How the cell ended.
    pub status: Status,
    /// Cleaned stdout (head and tail when cut: see `truncated`).
    pub stdout: String,
    /// Cleaned stderr (head and tail when cut: see `truncated`).
    pub stderr: String,
    /// `repr()` of the last expression, when the cell ends in one that is
    /// not `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// One line, e.g. `ZeroDivisionError: division by zero`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The traceback, user frames only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceback: Option<String>,
    /// What to do about the error, when cellhost knows (a missing module:
    /// how to install it; no network: the network mode; an unsupported
    /// magic: the supported ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// Rich output (`display()`, plots), in arrival order.
    #[serde(default)]
    pub displays: Vec<DisplayItem>,
    /// The `display` index of the last value's rich repr (its HTML table,
    /// PNG, ...: the bundle IPython's display formatter would make, with
    /// the value's `text/plain`), when the value has one. Absent for plain
    /// values, and when that display was dropped for a size cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_display: Option<u32>,
    /// What was cut.
    #[serde(default)]
    pub truncated: Truncated,
    /// Tool RPC calls the cell made.
    #[serde(default)]
    pub tool_calls_made: u64,
    /// Wall time of the cell, in seconds.
    pub duration_seconds: f64,
    /// Which kernel ran it and what happened to its state.
    pub kernel: KernelInfo,
}

impl CellResult {
    /// `true` when the cell succeeded.
    pub fn is_success(&self) -> bool {
        self.status == Status::Success
    }

    /// The error line, unless the traceback already ends with it (a
    /// rendering shows the traceback, then this).
    pub fn error_beyond_traceback(&self) -> Option<&str> {
        let e = self.error.as_deref()?;
        let last = self
            .traceback
            .as_deref()
            .and_then(|t| t.lines().rev().find(|l| !l.trim().is_empty()));
        (last.map(str::trim) != Some(e.trim())).then_some(e)
    }
}

/// What code in a new session's kernel runs in: `GET /v1/environment`,
/// and the MCP `execute_code` description (its `summary`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Environment {
    /// The backend new sessions' kernels run on: `"local"`, or the name
    /// of a `[backends.NAME]` (remote: the fields below that only a local
    /// interpreter can tell are absent).
    pub backend: String,
    /// e.g. `"3.11.7"`; absent when it could not be found out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_version: Option<String>,
    /// `"strict"` (bubblewrap) or `"none"`.
    pub sandbox: String,
    /// `"off"` (no network), `"allowlist"` (through cellhost's proxy) or
    /// `"host"` (the host's network).
    pub network: String,
    /// The kernel's working directory, where relative paths go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// `!cmd`, `%pip` and the magics cells may use.
    #[serde(default)]
    pub magics: Vec<String>,
    /// Notable importable packages (import names: `numpy`, `sklearn`...).
    #[serde(default)]
    pub packages: Vec<String>,
    /// All of it as a paragraph for a model's prompt.
    pub summary: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CellResult {
        CellResult {
            status: Status::Error,
            stdout: "hi\n".into(),
            stderr: String::new(),
            value: None,
            error: Some("ZeroDivisionError: division by zero".into()),
            traceback: Some("Traceback ...".into()),
            hint: None,
            displays: vec![
                DisplayItem {
                    mime: "image/png".into(),
                    data: "iVBORw0KGgo=".into(),
                    display: 0,
                },
                DisplayItem {
                    mime: "text/plain".into(),
                    data: "<Figure>".into(),
                    display: 0,
                },
            ],
            value_display: None,
            truncated: Truncated::default(),
            tool_calls_made: 0,
            duration_seconds: 0.004,
            kernel: KernelInfo {
                id: "k-1".into(),
                backend: "local".into(),
                pid: Some(1234),
                reused: true,
                execution_count: 2,
                ..KernelInfo::default()
            },
        }
    }

    #[test]
    fn cell_result_round_trips_through_json() {
        let r = sample();
        let text = serde_json::to_string(&r).unwrap();
        let back: CellResult = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn absent_fields_are_omitted_and_kernel_flags_always_present() {
        let mut r = sample();
        r.error = None;
        r.traceback = None;
        let v = serde_json::to_value(&r).unwrap();
        assert!(v.get("value").is_none());
        assert!(v.get("error").is_none());
        let k = &v["kernel"];
        for flag in ["reused", "state_reset", "state_lost", "ended"] {
            assert!(k[flag].is_boolean(), "{flag} missing");
        }
        assert!(k.get("note").is_none());
        assert_eq!(v["status"], "error");
        assert_eq!(v["truncated"]["spill_path"], serde_json::Value::Null);
    }

    #[test]
    fn display_items_without_an_index_still_parse() {
        // Results written before displays were grouped have no `display`.
        let item: DisplayItem =
            serde_json::from_str(r#"{"mime": "image/png", "data": "AA=="}"#).unwrap();
        assert_eq!(item.display, 0);
        assert!(item.is_base64());
        let svg = DisplayItem {
            mime: "image/svg+xml".into(),
            data: "<svg/>".into(),
            display: 1,
        };
        assert!(!svg.is_base64());
        assert!(!is_text_mime("image/jpeg"));
        assert!(is_text_mime("application/json") && is_text_mime("text/html"));
    }

    #[test]
    fn drop_counts_appear_only_when_displays_were_dropped() {
        let mut r = sample();
        let v = serde_json::to_value(&r).unwrap();
        assert!(v["truncated"].get("displays_dropped").is_none());
        r.truncated.displays_dropped = 2;
        r.truncated.displays_note = Some("over the cap".into());
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["truncated"]["displays_dropped"], 2);
        let back: CellResult = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn status_names_match_the_contract() {
        for (s, name) in [
            (Status::Success, "success"),
            (Status::Error, "error"),
            (Status::Timeout, "timeout"),
            (Status::Interrupted, "interrupted"),
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), name);
            assert_eq!(s.as_str(), name);
        }
    }
}
