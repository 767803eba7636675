//! What makes two kernels interchangeable (who a kernel belongs to is
//! `crate::owner`).

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

// Owner naming lives in `crate::owner`; these are its old paths.
pub use crate::owner::{
    belongs_to_session, child_owner, is_child, validate_owner, OwnerError, CHILD_SEPARATOR,
};

/// What a kernel is started with, besides its owner. Kernels with equal
/// specs and owners are the same kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct KernelSpec {
    /// Interpreter (default: the manager's).
    pub python: Option<PathBuf>,
    /// Working directory (default: the manager's).
    pub cwd: Option<PathBuf>,
    /// The tools the kernel's cells may call (sorted, so order never makes
    /// a second kernel).
    pub tools: BTreeSet<String>,
    /// Where the kernel runs: `"local"` or a `[backends.NAME]`; `None`
    /// means the manager's default backend. The manager moves it into
    /// [`KernelKey::backend`] (it is `None` inside a key).
    #[serde(skip)]
    pub backend: Option<String>,
}

impl KernelSpec {
    /// Run the kernel on this interpreter (a path or a bare name on
    /// PATH).
    pub fn python(mut self, python: impl Into<PathBuf>) -> Self {
        self.python = Some(python.into());
        self
    }

    /// Start the kernel in this directory.
    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Run on backend `name` (`"local"` or a configured remote backend).
    pub fn backend(mut self, name: impl Into<String>) -> Self {
        self.backend = Some(name.into());
        self
    }

    /// Let the kernel's cells call these tools (names registered in
    /// [`ManagerOptions::tools`](super::ManagerOptions::tools)).
    pub fn tools<I, S>(mut self, tools: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tools = tools.into_iter().map(Into::into).collect();
        self
    }

    /// `true` when a pooled kernel (started with the defaults) fits.
    pub(crate) fn is_default_process(&self) -> bool {
        self.python.is_none() && self.cwd.is_none()
    }
}

/// `(owner, backend, interpreter, cwd, sorted tool set)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct KernelKey {
    /// The session id (a child's is `parent::child`).
    pub owner: String,
    /// Where the kernel runs: `"local"` or a `[backends.NAME]`.
    pub backend: String,
    /// Interpreter, cwd and tools (its `backend` is always `None`).
    #[serde(flatten)]
    pub spec: KernelSpec,
}

impl fmt::Display for KernelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.owner, self.backend)?;
        if let Some(p) = &self.spec.python {
            write!(f, " python={}", p.display())?;
        }
        if let Some(c) = &self.spec.cwd {
            write!(f, " cwd={}", c.display())?;
        }
        if !self.spec.tools.is_empty() {
            let tools: Vec<&str> = self.spec.tools.iter().map(String::as_str).collect();
            write!(f, " tools={}", tools.join(","))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_named_and_recognised() {
        let c = child_owner("conv-1", "a").unwrap();
        assert_eq!(c, "conv-1::child::a");
        assert!(is_child(&c));
        assert!(!is_child("conv-1"));
        assert!(belongs_to_session(&c, "conv-1"));
        assert!(belongs_to_session("conv-1", "conv-1"));
        assert!(!belongs_to_session("conv-10", "conv-1"));
        assert!(!belongs_to_session("conv-1::childish", "conv-1"));
    }

    #[test]
    fn bad_names_say_what_to_do() {
        let e = validate_owner("").unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
        assert!(validate_owner("a\nb").is_err());
        assert!(validate_owner(&"x".repeat(600)).is_err());
        let e = child_owner("p", "x::y").unwrap_err().to_string();
        assert!(e.contains("child id"), "{e}");
        assert!(child_owner("p", "").is_err());
    }

    #[test]
    fn tool_order_never_makes_a_second_key() {
        let a = KernelSpec::default().tools(["b", "a"]);
        let b = KernelSpec::default().tools(["a", "b", "a"]);
        assert_eq!(a, b);
    }
}
