//! The generated Python module `tools`: the client (`runner/tools.py`)
//! followed by one function per tool, with keyword-only arguments from the
//! tool's JSON schema and its description as the docstring.
//!
//! A tool whose name is not a Python identifier (after `-` → `_`), or that
//! would shadow the module's own names, is reachable through
//! `tools.call(name, ...)` only. Dotted names become namespaces:
//! `fs.read` is `tools.fs.read`.

use std::collections::BTreeSet;
use std::fmt::Write;

use serde_json::Value;

use super::{Tool, ToolSet};

/// The client half of the module.
const CLIENT: &str = include_str!("../runner/tools.py");

/// Names the module defines itself; a tool cannot take them.
const RESERVED: &[&str] = &["call", "ToolError", "MAX_PAYLOAD", "names"];

const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// A Python string literal for `s` (JSON's escapes are Python's).
fn py_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

/// A usable Python name: ASCII identifier, not a keyword, no leading `_`.
fn py_name(s: &str) -> Option<String> {
    let s = s.replace('-', "_");
    let mut chars = s.chars();
    let first = chars.next()?;
    let ok = (first.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&s.as_str());
    ok.then_some(s)
}

pub(super) fn module_source(set: &ToolSet) -> String {
    let mut out = String::with_capacity(CLIENT.len() + 512 * set.len());
    out.push_str(CLIENT);
    out.push_str("\n\n# --- part 2: generated, one function per tool ---\n");
    let names: Vec<String> = set.names().map(py_str).collect();
    let _ = writeln!(out, "names = [{}]", names.join(", "));
    // Top-level names taken so far (functions and namespaces).
    let mut taken: BTreeSet<String> = BTreeSet::new();
    let mut namespaces: BTreeSet<String> = BTreeSet::new();
    for (i, tool) in set.iter().enumerate() {
        let Some(path) = tool
            .name()
            .split('.')
            .map(py_name)
            .collect::<Option<Vec<String>>>()
        else {
            continue;
        };
        let top = &path[0];
        if RESERVED.contains(&top.as_str()) {
            continue;
        }
        if path.len() == 1 {
            if !taken.insert(top.clone()) {
                continue;
            }
            function(&mut out, top, tool.as_ref());
            continue;
        }
        // A namespace: each prefix must be a namespace, never a function.
        let mut ok = true;
        for depth in 1..path.len() {
            let prefix = path[..depth].join(".");
            if depth == 1 && taken.contains(&prefix) && !namespaces.contains(&prefix) {
                ok = false;
                break;
            }
            if !namespaces.contains(&prefix) {
                if depth > 1 && taken.contains(&prefix) {
                    ok = false;
                    break;
                }
                let _ = writeln!(
                    out,
                    "{prefix} = _Namespace({})",
                    py_str(&path[..depth].join("."))
                );
                namespaces.insert(prefix.clone());
                taken.insert(prefix);
            }
        }
        let full = path.join(".");
        if !ok || !taken.insert(full.clone()) {
            continue;
        }
        let private = format!("_cellhost_tool_{i}");
        function(&mut out, &private, tool.as_ref());
        let leaf = &path[path.len() - 1];
        let _ = writeln!(
            out,
            "{private}.__name__ = {}\n{private}.__qualname__ = {}\n{full} = {private}\ndel {private}",
            py_str(leaf),
            py_str(&full)
        );
    }
    out
}

/// `def NAME(*, required, optional=_UNSET, **_kw): "doc"; return _invoke(…)`.
fn function(out: &mut String, def_name: &str, tool: &dyn Tool) {
    let schema = tool.parameters();
    let props = schema.get("properties").and_then(Value::as_object);
    let required: BTreeSet<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut req_params = Vec::new();
    let mut opt_params = Vec::new();
    let mut odd_names = false;
    let mut doc = tool.description().trim().to_owned();
    let mut doc_params = String::new();
    for (name, prop) in props.into_iter().flatten() {
        let ty = prop.get("type").map(type_name).unwrap_or_default();
        let what = prop
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("");
        let need = if required.contains(name.as_str()) {
            "required"
        } else {
            "optional"
        };
        let ty = if ty.is_empty() {
            need.to_owned()
        } else {
            format!("{ty}, {need}")
        };
        let _ = writeln!(doc_params, "    {name} ({ty}): {what}");
        // A name that is not an identifier (or is one of ours) travels
        // through **_kw.
        match py_name(name).filter(|n| n == name && n != "_kw") {
            Some(n) if required.contains(name.as_str()) => req_params.push(n),
            Some(n) => opt_params.push(n),
            None => odd_names = true,
        }
    }
    if !doc_params.is_empty() {
        doc.push_str("\n\nParameters (keyword only):\n");
        doc.push_str(&doc_params);
    }
    let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
    let mut sig: Vec<String> = Vec::new();
    if !req_params.is_empty() || !opt_params.is_empty() {
        sig.push("*".to_owned());
    }
    sig.extend(req_params.iter().cloned());
    sig.extend(opt_params.iter().map(|n| format!("{n}=_UNSET")));
    let open = odd_names || !closed;
    if open {
        sig.push("**_kw".to_owned());
    }
    let packed: Vec<String> = req_params
        .iter()
        .chain(&opt_params)
        .map(|n| format!("{n}={n}"))
        .collect();
    let kw = if open { "_kw" } else { "{}" };
    let _ = write!(
        out,
        "\n\ndef {def_name}({}):\n    {}\n    return _invoke({}, _pack({kw}{}{}))\n",
        sig.join(", "),
        py_str(&doc),
        py_str(tool.name()),
        if packed.is_empty() { "" } else { ", " },
        packed.join(", "),
    );
}

/// How a model calls `tool` from a cell, on one line: the Python call
/// with its keyword arguments and types, then the description's first
/// line. Used to list the functions in a front end's tool description.
pub(super) fn signature(tool: &dyn Tool) -> String {
    let schema = tool.parameters();
    let required: BTreeSet<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut params: Vec<String> = Vec::new();
    let props = schema.get("properties").and_then(Value::as_object);
    for (name, prop) in props.into_iter().flatten() {
        let ty = prop.get("type").map(type_name).unwrap_or_default();
        let ty = if ty.is_empty() {
            String::new()
        } else {
            format!(": {ty}")
        };
        let opt = if required.contains(name.as_str()) {
            ""
        } else {
            " = None"
        };
        params.push(format!("{name}{ty}{opt}"));
    }
    let path = tool
        .name()
        .split('.')
        .map(py_name)
        .collect::<Option<Vec<String>>>()
        .filter(|p| !RESERVED.contains(&p[0].as_str()));
    let call = match path {
        Some(p) if params.is_empty() => format!("tools.{}()", p.join(".")),
        Some(p) => format!("tools.{}(*, {})", p.join("."), params.join(", ")),
        None if params.is_empty() => format!("tools.call({})", py_str(tool.name())),
        None => format!(
            "tools.call({}, *, {})",
            py_str(tool.name()),
            params.join(", ")
        ),
    };
    let first = tool
        .description()
        .trim()
        .lines()
        .next()
        .unwrap_or("")
        .trim();
    if first.is_empty() {
        call
    } else {
        format!("{call}: {first}")
    }
}

fn type_name(ty: &Value) -> String {
    match ty {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" | "),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{FnTool, ToolError};
    use serde_json::json;

    fn tool(
        name: &str,
        params: Value,
    ) -> FnTool<impl Fn(Value) -> std::future::Ready<Result<Value, ToolError>>> {
        FnTool::new(name, "Does \"things\".\nTwo lines.", params, |_| {
            std::future::ready(Ok(Value::Null))
        })
    }

    #[test]
    fn functions_get_keyword_arguments_and_docstrings() {
        let set = ToolSet::new()
            .with(tool(
                "web_search",
                json!({"type": "object",
                       "properties": {"query": {"type": "string", "description": "what"},
                                      "limit": {"type": "integer"},
                                      "from": {"type": "string"}},
                       "required": ["query"]}),
            ))
            .unwrap()
            .with(tool(
                "fs.read-file",
                json!({"type": "object", "additionalProperties": false}),
            ))
            .unwrap()
            .with(tool("call", json!({})))
            .unwrap()
            .with(tool("9lives", json!({})))
            .unwrap();
        let src = module_source(&set);
        assert!(
            src.contains("def web_search(*, query, limit=_UNSET, **_kw):"),
            "{src}"
        );
        assert!(src.contains("_invoke(\"web_search\", _pack(_kw, query=query, limit=limit))"));
        assert!(src.contains("query (string, required): what"));
        assert!(src.contains("from (string, optional)"));
        assert!(src.contains("fs = _Namespace(\"fs\")"));
        assert!(src.contains("fs.read_file = _cellhost_tool_"));
        assert!(src.contains("_invoke(\"fs.read-file\", _pack({}))"));
        let generated = &src[src.find("# --- part 2").unwrap()..];
        assert!(
            !generated.contains("def call("),
            "reserved names stay the module's"
        );
        assert!(src.contains("names = [\"9lives\", \"call\", \"fs.read-file\", \"web_search\"]"));
        let sigs = set.signatures();
        assert_eq!(
            sigs,
            [
                "tools.call(\"9lives\"): Does \"things\".",
                "tools.call(\"call\"): Does \"things\".",
                "tools.fs.read_file(): Does \"things\".",
                "tools.web_search(*, from: string = None, limit: integer = None, query: string): Does \"things\".",
            ]
        );
    }
}
