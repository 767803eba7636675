//! Tool RPC: code in a cell calls the agent's tools.
//!
//! A [`Tool`] has a name, a description, JSON-schema parameters and an
//! async `call`. Tools are collected in a [`ToolSet`] (registered with the
//! manager, or passed with a [`Cell`](crate::Cell)). Each kernel gets a
//! generated Python module `tools` with one function per tool in its set
//! (`stub.rs`, over the client in `runner/tools.py`); calls travel over a
//! per-kernel Unix socket with a per-kernel token (`server.rs`) and run
//! under the current cell's authority: its allow-list and its budget
//! (`authority.rs`). A call made when no cell runs is refused.

pub(crate) mod authority;
pub(crate) mod request;
mod server;
mod stub;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;

pub(crate) use authority::{Authority, AuthoritySlot};
pub(crate) use server::{ToolServer, TOKEN_ENV};

/// Calls a cell may make by default (`max_tool_calls`).
pub const DEFAULT_MAX_TOOL_CALLS: u32 = 50;

/// Largest request or result on the tool socket by default, in bytes
/// (10 MB; [`KernelOptions::max_tool_payload`](crate::KernelOptions)).
pub const DEFAULT_MAX_PAYLOAD: usize = 10 * 1024 * 1024;

/// What a tool call returns.
pub type ToolFuture = Pin<Box<dyn Future<Output = Result<Value, ToolError>> + Send + 'static>>;

/// A tool the agent offers to cells.
///
/// `call` returns a `'static` future: clone what it needs out of `self`.
/// A tool that panics fails only its own call.
pub trait Tool: Send + Sync + 'static {
    /// The name cells call it by: letters, digits, `_`, `-` and `.` (a
    /// dotted name like `fs.read` becomes `tools.fs.read`).
    fn name(&self) -> &str;
    /// One or more sentences for the model (the function's docstring).
    fn description(&self) -> &str;
    /// JSON schema of the keyword arguments (an `object` schema).
    fn parameters(&self) -> &Value;
    /// Run one call with the cell's keyword arguments as a JSON object.
    /// `args` comes from cell code and is not checked against
    /// [`parameters`](Tool::parameters): treat it as untrusted input. The
    /// `Ok` value is handed to the cell as the function's return value;
    /// an `Err` is raised there as `tools.ToolError`. The future is
    /// dropped (the call cancelled) when the cell ends first.
    fn call(&self, args: Value) -> ToolFuture;
}

/// A tool call that failed: raised in the cell as `tools.ToolError`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    message: String,
}

impl ToolError {
    /// An error whose message the cell sees verbatim (so say what went
    /// wrong and what to do, and leak nothing the cell must not know).
    pub fn new(message: impl Into<String>) -> ToolError {
        ToolError {
            message: message.into(),
        }
    }

    /// The message, as the cell sees it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ToolError {}

impl From<String> for ToolError {
    fn from(message: String) -> Self {
        ToolError { message }
    }
}

impl From<&str> for ToolError {
    fn from(message: &str) -> Self {
        ToolError::new(message)
    }
}

/// A [`Tool`] made of a closure.
///
/// ```
/// use cellhost::tools::{FnTool, ToolSet};
/// use serde_json::json;
/// let add = FnTool::new(
///     "add",
///     "Add two numbers.",
///     json!({"type": "object",
///            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
///            "required": ["a", "b"]}),
///     |args| async move {
///         let a = args["a"].as_f64().ok_or("a must be a number")?;
///         let b = args["b"].as_f64().ok_or("b must be a number")?;
///         Ok(json!(a + b))
///     },
/// );
/// let tools = ToolSet::new().with(add).unwrap();
/// assert_eq!(tools.names().collect::<Vec<_>>(), ["add"]);
/// ```
pub struct FnTool<F> {
    name: String,
    description: String,
    parameters: Value,
    f: F,
}

impl<F, Fut> FnTool<F>
where
    F: Fn(Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
{
    /// A tool called `name` (checked when added to a [`ToolSet`]) that
    /// runs `f` on each call's arguments; `parameters` is its JSON schema,
    /// `description` its docstring (see [`Tool`]).
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        f: F,
    ) -> FnTool<F> {
        FnTool {
            name: name.into(),
            description: description.into(),
            parameters,
            f,
        }
    }
}

impl<F, Fut> Tool for FnTool<F>
where
    F: Fn(Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
{
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
        Box::pin((self.f)(args))
    }
}

/// A bad tool registration, with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolSetError {
    /// The name (given) is not 1 to 128 of `[A-Za-z0-9_.-]` with a letter,
    /// digit or `_` at each end and no `..`.
    #[error(
        "invalid tool name {0:?}: use 1 to 128 letters, digits, `_`, `-` or `.` (not at either end)"
    )]
    BadName(String),
    /// A tool of this name is already in the set.
    #[error("a tool named {0:?} is already registered; tool names must be unique")]
    Duplicate(String),
    /// [`ToolSet::subset`] was asked for a tool the set does not have.
    #[error("unknown tool {unknown:?}; the registered tools are: {known}")]
    Unknown {
        /// The name asked for.
        unknown: String,
        /// The set's names, comma-separated (`(none)` when empty).
        known: String,
    },
    /// A cell's allow-list names a tool its kernel was not started with.
    #[error(
        "the cell's allow-list names {tool:?}, which is not among the kernel's tools ({kernel}); \
         allow a subset of the tools the kernel was asked for"
    )]
    NotInKernel {
        /// The allow-listed name.
        tool: String,
        /// The kernel's tool names, comma-separated (`(none)` when empty).
        kernel: String,
    },
}

/// Named tools, sorted by name. Cheap to clone.
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: Arc<BTreeMap<String, Arc<dyn Tool>>>,
    /// The generated `tools` module, built on first use.
    module: Arc<std::sync::OnceLock<Arc<str>>>,
}

impl fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolSet {
    /// A set with no tools; add them with [`with`](ToolSet::with).
    pub fn new() -> ToolSet {
        ToolSet::default()
    }

    /// Add `tool`; its name must be valid and new.
    pub fn with(self, tool: impl Tool) -> Result<ToolSet, ToolSetError> {
        self.with_arc(Arc::new(tool))
    }

    /// Add a shared `tool` (one instance in several sets); its name must
    /// be valid and new.
    pub fn with_arc(self, tool: Arc<dyn Tool>) -> Result<ToolSet, ToolSetError> {
        let name = tool.name().to_owned();
        if !valid_name(&name) {
            return Err(ToolSetError::BadName(name));
        }
        if self.tools.contains_key(&name) {
            return Err(ToolSetError::Duplicate(name));
        }
        let mut tools = (*self.tools).clone();
        tools.insert(name, tool);
        Ok(ToolSet {
            tools: Arc::new(tools),
            module: Arc::default(),
        })
    }

    /// No tools registered.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// How many tools are registered.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// One line per tool saying how a cell calls it (Python call with
    /// typed keyword arguments, then the description's first line), for a
    /// model to read in a front end's tool description.
    pub fn signatures(&self) -> Vec<String> {
        self.iter().map(|t| stub::signature(t.as_ref())).collect()
    }

    /// The tool names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// The tool called `name`, if registered.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// The tools, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.tools.values()
    }

    /// The tools named in `names`, which must all be in this set.
    pub fn subset(&self, names: &BTreeSet<String>) -> Result<ToolSet, ToolSetError> {
        let mut tools = BTreeMap::new();
        for name in names {
            match self.tools.get(name) {
                Some(t) => {
                    tools.insert(name.clone(), t.clone());
                }
                None => {
                    return Err(ToolSetError::Unknown {
                        unknown: name.clone(),
                        known: self.known(),
                    })
                }
            }
        }
        Ok(ToolSet {
            tools: Arc::new(tools),
            module: Arc::default(),
        })
    }

    /// The names, comma-separated, for error messages.
    pub(crate) fn known(&self) -> String {
        Self::known_names(self.tools.keys())
    }

    pub(crate) fn known_names<'a>(names: impl IntoIterator<Item = &'a String>) -> String {
        let names: Vec<&str> = names.into_iter().map(String::as_str).collect();
        if names.is_empty() {
            return "(none)".to_owned();
        }
        names.join(", ")
    }

    /// The Python source of this set's `tools` module (client + functions).
    pub(crate) fn module_source(&self) -> Arc<str> {
        self.module
            .get_or_init(|| stub::module_source(self).into())
            .clone()
    }

    /// `true` when both are the same set (same registration).
    pub(crate) fn same(&self, other: &ToolSet) -> bool {
        Arc::ptr_eq(&self.tools, &other.tools)
    }
}

/// Tool names: 1 to 128 of `[A-Za-z0-9_.-]`, no `.` or `-` at either end.
fn valid_name(name: &str) -> bool {
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    (1..=128).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && ends_ok(name.chars().next())
        && ends_ok(name.chars().last())
        && !name.contains("..")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn noop(name: &str) -> FnTool<impl Fn(Value) -> std::future::Ready<Result<Value, ToolError>>> {
        FnTool::new(name, "No-op.", json!({"type": "object"}), |_| {
            std::future::ready(Ok(Value::Null))
        })
    }

    #[test]
    fn names_are_checked_and_unique() {
        assert!(ToolSet::new().with(noop("web_search")).is_ok());
        assert!(ToolSet::new().with(noop("fs.read-file")).is_ok());
        for bad in ["", ".a", "a.", "a..b", "a b", "é", "-x"] {
            let e = ToolSet::new().with(noop(bad)).err();
            assert!(
                matches!(e, Some(ToolSetError::BadName(_))),
                "{bad:?}: {e:?}"
            );
        }
        let e = ToolSet::new()
            .with(noop("a"))
            .unwrap()
            .with(noop("a"))
            .err()
            .unwrap();
        assert_eq!(e, ToolSetError::Duplicate("a".into()));
    }

    #[test]
    fn a_subset_names_what_is_unknown() {
        let set = ToolSet::new()
            .with(noop("a"))
            .unwrap()
            .with(noop("b"))
            .unwrap();
        let sub = set.subset(&["b".to_owned()].into()).unwrap();
        assert_eq!(sub.names().collect::<Vec<_>>(), ["b"]);
        let e = set.subset(&["c".to_owned()].into()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown tool \"c\"; the registered tools are: a, b"
        );
    }
}
