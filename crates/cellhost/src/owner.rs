//! Owner names: who a kernel belongs to. A session's owner is its stable
//! id; a delegated sub-agent's is `"{parent}::child::{child_id}"`
//! ([`child_owner`]), pinned against eviction while alive and disposed with
//! its parent.

/// The separator in a delegated child's owner: `"{parent}::child::{id}"`.
pub const CHILD_SEPARATOR: &str = "::child::";

/// Longest accepted owner name, in bytes.
pub const MAX_OWNER_LEN: usize = 512;

/// A bad owner or child name, with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {name:?}: {why}")]
pub struct OwnerError {
    what: &'static str,
    name: String,
    why: &'static str,
}

/// Checks an owner (session id, or a child's full owner name).
pub fn validate_owner(owner: &str) -> Result<(), OwnerError> {
    let bad = |why| {
        Err(OwnerError {
            what: "session id",
            name: owner.chars().take(80).collect(),
            why,
        })
    };
    if owner.is_empty() {
        return bad("it is empty; pass the conversation's stable session id");
    }
    if owner.len() > MAX_OWNER_LEN {
        return bad("it is longer than 512 bytes; use a shorter stable id");
    }
    if owner.chars().any(char::is_control) {
        return bad("it contains control characters; use printable characters only");
    }
    Ok(())
}

/// The owner of child `child` delegated by `parent`.
pub fn child_owner(parent: &str, child: &str) -> Result<String, OwnerError> {
    validate_owner(parent)?;
    if child.is_empty() || child.contains("::") || child.chars().any(char::is_control) {
        return Err(OwnerError {
            what: "child id",
            name: child.chars().take(80).collect(),
            why: "it must be non-empty, printable and free of \"::\"",
        });
    }
    let owner = format!("{parent}{CHILD_SEPARATOR}{child}");
    validate_owner(&owner)?;
    Ok(owner)
}

/// `true` when `owner` is a delegated child (pinned against eviction).
pub fn is_child(owner: &str) -> bool {
    owner.contains(CHILD_SEPARATOR)
}

/// `true` when `owner` is `session` itself or one of its descendants.
pub fn belongs_to_session(owner: &str, session: &str) -> bool {
    owner == session
        || owner
            .strip_prefix(session)
            .is_some_and(|rest| rest.starts_with(CHILD_SEPARATOR))
}

/// The session an owner belongs to: the owner itself, or the top parent of
/// a delegated child.
pub fn session_of(owner: &str) -> &str {
    owner.split(CHILD_SEPARATOR).next().unwrap_or(owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_session_is_its_top_parent() {
        let child = child_owner("s", "a").unwrap();
        let grandchild = child_owner(&child, "b").unwrap();
        assert_eq!(session_of(&grandchild), "s");
        assert_eq!(session_of("s"), "s");
        assert!(is_child(&grandchild) && belongs_to_session(&grandchild, "s"));
        assert!(!belongs_to_session("s2", "s"));
    }
}
