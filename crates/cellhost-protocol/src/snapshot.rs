//! Wire types of snapshots, restores and forks of a session's live
//! interpreter state (see `docs/snapshots.md`).
//!
//! A snapshot is the session's user namespace, serialized one global at a
//! time between cells; what cannot be serialized is listed in
//! [`Skipped`], never dropped silently. A restore loads a snapshot into a
//! fresh kernel before its next cell, and that cell's
//! [`KernelInfo::restored`](crate::KernelInfo::restored) says so. A fork
//! gives new sessions independent copies of a source's state and files.

use serde::{Deserialize, Serialize};

/// One global a snapshot could not keep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Skipped {
    /// The global's name.
    pub name: String,
    /// Its type, e.g. `socket` or `generator`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Why it could not be kept, e.g. `cannot pickle 'socket' object`.
    pub why: String,
}

/// Why a snapshot was loaded into a fresh kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RestoreFrom {
    /// The kernel was evicted to keep the kernel cap.
    Evicted,
    /// The kernel was reaped after its idle timeout.
    Reaped,
    /// The daemon (or the manager) stopped and started again.
    Restart,
    /// A snapshot taken on request (`POST …/snapshot`) was loaded after
    /// the kernel went for another reason.
    Snapshot,
    /// The session is a fork made by snapshot and restore.
    Fork,
}

/// What the first cell after a restore is told (`kernel.restored`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Restored {
    /// Globals restored.
    pub names: u64,
    /// Globals the snapshot could not keep (so the state is not whole:
    /// `state_lost` is true when this is not empty).
    #[serde(default)]
    pub skipped: Vec<Skipped>,
    /// Why the snapshot was taken.
    pub from: RestoreFrom,
    /// How old the snapshot was when it was loaded, in whole seconds.
    #[serde(default)]
    pub age_seconds: u64,
}

/// What `POST /v1/sessions/{session}/snapshot` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotReport {
    /// Globals kept.
    pub names: u64,
    /// Globals that could not be kept.
    #[serde(default)]
    pub skipped: Vec<Skipped>,
    /// Size of the snapshot as stored (compressed), in bytes.
    pub bytes: u64,
    /// How long taking it took, in seconds.
    pub seconds: f64,
}

/// How a fork copied the source's interpreter state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ForkPath {
    /// The source's process forked; the child was re-homed as a kernel of
    /// its own (copy-on-write memory: the cost does not grow with the
    /// state).
    Process,
    /// The source was snapshotted and the snapshot restored into a fresh
    /// kernel (where a process fork cannot keep every isolation
    /// guarantee: strict and remote kernels).
    Snapshot,
}

/// The body of `POST /v1/sessions/{session}/fork`: one new session or
/// several.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForkRequest {
    /// The new session, or a list of them (each a session id, or
    /// `{"session", "child"}` for a delegated child).
    pub into: ForkTargets,
}

/// One new session of a fork: a session id, or a session's delegated
/// child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum ForkTarget {
    /// `"s2"`.
    Session(String),
    /// `{"session": "s2", "child": "worker"}`.
    Child {
        /// The session.
        session: String,
        /// Its child's id.
        child: String,
    },
}

impl ForkTarget {
    /// The session, and the child when it is one.
    pub fn parts(&self) -> (&str, Option<&str>) {
        match self {
            ForkTarget::Session(s) => (s, None),
            ForkTarget::Child { session, child } => (session, Some(child)),
        }
    }
}

/// One new session or several.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum ForkTargets {
    /// `"s2"` (or one child).
    One(ForkTarget),
    /// `["a", "b", {"session": "c", "child": "w"}]`.
    Many(Vec<ForkTarget>),
}

impl ForkTargets {
    /// The targets as a list.
    pub fn to_vec(&self) -> Vec<ForkTarget> {
        match self {
            ForkTargets::One(t) => vec![t.clone()],
            ForkTargets::Many(v) => v.clone(),
        }
    }
}

/// One new session a fork made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Forked {
    /// The new session.
    pub session: String,
    /// The new session's child id, when the target was a child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<String>,
    /// Its kernel's id (`k-…`), when one is live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_id: Option<String>,
    /// Which path ran.
    pub path: ForkPath,
    /// Why the process path was not taken, when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
    /// Workspace bytes copied into the new session.
    pub workspace_bytes: u64,
    /// How long this session's fork took, in seconds.
    pub seconds: f64,
}

/// What `POST /v1/sessions/{session}/fork` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForkReport {
    /// The source session.
    pub from: String,
    /// Each new session, in the order asked for.
    pub into: Vec<Forked>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_targets_take_a_name_or_a_list() {
        let one: ForkRequest = serde_json::from_str(r#"{"into": "s2"}"#).unwrap();
        assert_eq!(one.into.to_vec(), vec![ForkTarget::Session("s2".into())]);
        let many: ForkRequest =
            serde_json::from_str(r#"{"into": ["a", {"session": "b", "child": "c"}]}"#).unwrap();
        let parts: Vec<_> = many.into.to_vec();
        let parts: Vec<_> = parts.iter().map(ForkTarget::parts).collect();
        assert_eq!(parts, vec![("a", None), ("b", Some("c"))]);
        assert!(serde_json::from_str::<ForkRequest>(r#"{"into": 3}"#).is_err());
    }

    #[test]
    fn skipped_names_its_type_field_type() {
        let s = Skipped {
            name: "sock".into(),
            kind: "socket".into(),
            why: "cannot pickle 'socket' object".into(),
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["type"], "socket");
        let r = Restored {
            names: 3,
            skipped: vec![s],
            from: RestoreFrom::Evicted,
            age_seconds: 2,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["from"], "evicted");
        assert_eq!(serde_json::from_value::<Restored>(v).unwrap(), r);
    }
}
