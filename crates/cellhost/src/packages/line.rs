//! What a `%pip` line asks, checked against `[packages]` before anything
//! runs: a small grammar (install / list / show with a few flags and
//! plain requirement specifiers), never pip's whole command line, so a
//! cell cannot point pip at another index, a local path, a URL or a
//! requirements file.

use crate::config::PackagesConfig;

/// One `%pip` request, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    Install {
        /// Requirement specifiers (`name`, `name==1.0`, `name[extra]>=2`).
        specs: Vec<String>,
        upgrade: bool,
        no_deps: bool,
        pre: bool,
        quiet: bool,
    },
    List,
    Show(Vec<String>),
    /// Names to remove from the session's package dir.
    Uninstall(Vec<String>),
}

const USAGE: &str = "supported: `%pip install [-U] [--no-deps] [--pre] [-q] NAME[==VERSION]…`, \
                     `%pip uninstall NAME…`, `%pip list`, `%pip show NAME…`";

/// Parse `line` (what follows `%pip`) and check it against `policy`.
pub(crate) fn parse(line: &str, policy: &PackagesConfig) -> Result<Request, String> {
    let words = split(line)?;
    let Some((verb, rest)) = words.split_first() else {
        return Err(format!("`%pip` needs a command; {USAGE}"));
    };
    match verb.as_str() {
        "install" => {
            let (mut upgrade, mut no_deps, mut pre, mut quiet) = (false, false, false, false);
            let mut specs = Vec::new();
            for w in rest {
                match w.as_str() {
                    "-U" | "--upgrade" => upgrade = true,
                    "--no-deps" => no_deps = true,
                    "--pre" => pre = true,
                    "-q" | "--quiet" => quiet = true,
                    // Accepted and meaningless here: the host decides.
                    "--user" | "--no-cache-dir" | "--upgrade-strategy=only-if-needed" => {}
                    w if w.starts_with("--index-url")
                        || w.starts_with("-i")
                        || w.starts_with("--extra-index-url") =>
                    {
                        return Err(format!(
                            "`{w}` is not allowed: the package index is set by the operator \
                             ([packages] index_url in cellhost.toml)"
                        ))
                    }
                    w if w.starts_with('-') => {
                        return Err(format!("`%pip install {w}` is not supported; {USAGE}"))
                    }
                    w => specs.push(check_spec(w, policy)?),
                }
            }
            if specs.is_empty() {
                return Err(format!(
                    "`%pip install` needs at least one package name; {USAGE}"
                ));
            }
            Ok(Request::Install {
                specs,
                upgrade,
                no_deps,
                pre,
                quiet,
            })
        }
        "list" | "freeze" if rest.is_empty() => Ok(Request::List),
        "show" if !rest.is_empty() => {
            let names = rest
                .iter()
                .map(|w| {
                    let (name, tail) = split_name(w);
                    if name.is_empty() || !tail.is_empty() {
                        Err(format!("`%pip show` takes package names, not {w:?}"))
                    } else {
                        Ok(name.to_owned())
                    }
                })
                .collect::<Result<_, _>>()?;
            Ok(Request::Show(names))
        }
        "uninstall" => {
            let names: Vec<String> = rest
                .iter()
                .filter(|w| !matches!(w.as_str(), "-y" | "--yes"))
                .map(|w| {
                    let (name, tail) = split_name(w);
                    if name.is_empty() || !tail.is_empty() || w.starts_with('-') {
                        Err(format!(
                            "`%pip uninstall` takes package names, not {w:?}; {USAGE}"
                        ))
                    } else {
                        Ok(name.to_owned())
                    }
                })
                .collect::<Result<_, _>>()?;
            if names.is_empty() {
                return Err(format!("`%pip uninstall` needs a package name; {USAGE}"));
            }
            Ok(Request::Uninstall(names))
        }
        other => Err(format!("`%pip {other}` is not supported; {USAGE}")),
    }
}

/// Words split on whitespace, with enclosing quotes removed (`"a>=1"`).
/// Nothing goes through a shell: every word is checked on its own.
fn split(line: &str) -> Result<Vec<String>, String> {
    Ok(line
        .split_whitespace()
        .map(|w| w.trim_matches(|c| c == '"' || c == '\''))
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The name at the start of a specifier, and the rest.
fn split_name(spec: &str) -> (&str, &str) {
    let end = spec
        .find(|c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
        .unwrap_or(spec.len());
    (&spec[..end], &spec[end..])
}

/// A plain requirement specifier whose name `policy` allows.
fn check_spec(spec: &str, policy: &PackagesConfig) -> Result<String, String> {
    let (name, mut tail) = split_name(spec);
    let bad = || {
        format!(
            "{spec:?} is not a package name with an optional version (like `tabulate` or \
             `tabulate==0.9`); URLs, paths and requirement files are not supported"
        )
    };
    if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(bad());
    }
    if let Some(rest) = tail.strip_prefix('[') {
        let Some((extras, after)) = rest.split_once(']') else {
            return Err(bad());
        };
        if !extras
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.,".contains(c))
        {
            return Err(bad());
        }
        tail = after;
    }
    for clause in tail.split(',').filter(|c| !c.is_empty()) {
        let version = ["==", ">=", "<=", "~=", "!=", ">", "<"]
            .iter()
            .find_map(|op| clause.strip_prefix(op))
            .ok_or_else(bad)?;
        if version.is_empty()
            || !version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".*+!-".contains(c))
        {
            return Err(bad());
        }
    }
    refused(name, policy).map_or(Ok(spec.to_owned()), Err)
}

/// Why `[packages]` refuses `name`, if it does.
pub(crate) fn refused(name: &str, policy: &PackagesConfig) -> Option<String> {
    let norm = normalize(name);
    if let Some(p) = policy.deny.iter().find(|p| glob(&normalize(p), &norm)) {
        return Some(format!(
            "`{name}` is refused by the [packages] deny pattern {p:?} in cellhost.toml"
        ));
    }
    if !policy.allow.is_empty() && !policy.allow.iter().any(|p| glob(&normalize(p), &norm)) {
        return Some(format!(
            "`{name}` is not on the [packages] allow list ({}) in cellhost.toml",
            policy.allow.join(", ")
        ));
    }
    None
}

/// PEP 503: lowercase, runs of `-`, `_`, `.` become one `-`.
pub(crate) fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if "-_.".contains(c) {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// `*` matches any run of characters; everything else itself.
pub(crate) fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(at) => rest = &rest[at + mid.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> PackagesConfig {
        PackagesConfig {
            deny: vec!["evil*".into(), "*-bad".into()],
            ..PackagesConfig::default()
        }
    }

    #[test]
    fn install_lines_parse_into_checked_specs() {
        let r = parse(
            "install -U tabulate==0.9 'numpy>=1,<3' rich[jupyter] -q",
            &policy(),
        );
        assert_eq!(
            r.unwrap(),
            Request::Install {
                specs: vec![
                    "tabulate==0.9".into(),
                    "numpy>=1,<3".into(),
                    "rich[jupyter]".into()
                ],
                upgrade: true,
                no_deps: false,
                pre: false,
                quiet: true
            }
        );
        assert_eq!(parse("list", &policy()).unwrap(), Request::List);
        assert_eq!(
            parse("show a b", &policy()).unwrap(),
            Request::Show(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            parse("uninstall -y a b", &policy()).unwrap(),
            Request::Uninstall(vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn what_could_escape_the_policy_is_refused_with_the_reason() {
        for (line, why) in [
            ("install -r reqs.txt", "not supported"),
            ("install --index-url=http://x/ a", "set by the operator"),
            ("install ./pkg", "not a package name"),
            ("install https://x/y.whl", "not a package name"),
            ("install a;rm", "not a package name"),
            ("install Evil_Thing", "deny pattern \"evil*\""),
            ("install very.bad", "deny pattern \"*-bad\""),
            ("install", "at least one"),
            ("uninstall", "needs a package name"),
            ("uninstall ./a", "takes package names"),
            ("uninstall -r x", "takes package names"),
            ("download a", "not supported"),
        ] {
            let e = parse(line, &policy()).unwrap_err();
            assert!(e.contains(why), "{line}: {e}");
        }
        let allow = PackagesConfig {
            allow: vec!["tiny*".into()],
            ..PackagesConfig::default()
        };
        assert!(parse("install tinypkg", &allow).is_ok());
        let e = parse("install other", &allow).unwrap_err();
        assert!(e.contains("allow list (tiny*)"), "{e}");
    }

    #[test]
    fn globs_match_normalized_names() {
        assert!(glob("a*b*c", "axxbyyc"));
        assert!(!glob("a*b*c", "axxc"));
        assert!(glob("*", ""));
        assert!(!glob("ab*ba", "aba"));
        assert_eq!(normalize("Foo__Bar.baz"), "foo-bar-baz");
    }
}
