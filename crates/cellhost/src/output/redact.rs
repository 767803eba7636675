//! Secret redaction: the last step of cleaning, so a token a cell prints
//! never reaches a model, a log or the history database.
//!
//! Two kinds of secrets are replaced by `[REDACTED:<kind>]`:
//!
//! - **Known token formats**, matched by one regex compiled once per
//!   process: AWS access key ids, GitHub tokens, `sk-…` API keys
//!   (OpenAI/Anthropic style), Stripe keys, Slack tokens, Google API keys,
//!   JWTs, PEM private-key blocks (through the END line, or through the end
//!   of the text when END is missing) and `Bearer <token>` (the word
//!   `Bearer` is kept).
//! - **Exact values** of secrets the host knows ([`Secrets`]: the env
//!   secrets it scrubbed, the daemon's token, tool credentials), matched
//!   by a literal alternation compiled once per kernel.
//!
//! Tokens are found wherever they start, not only at a word boundary: in
//! `repr` and JSON text a token follows the letter of an escape (`\nghp_…`),
//! and code glues names to values (`KEY_ghp_…`). Formats whose prefix is
//! distinctive (`ghp_`, `AKIA`, `eyJ…`, `xoxb-`, `AIza`) match anywhere.
//! The two whose prefix occurs in prose (`sk-` in "task-list", `bearer` in
//! "cupbearer") are judged by what precedes them ([`glued`]): after a
//! letter or digit that is not an escape's, `sk-…` must look random (a
//! digit or a capital) and `Bearer` is a word, not a credential.
//!
//! Text without any candidate costs one literal-prefiltered scan per regex
//! and no allocation (the common output is `"1\n"`).
//!
//! Output that was cut (see `capture.rs`) can split a secret across the cut
//! so that no whole-token pattern matches either half. [`redact_cut_end`]
//! and [`redact_cut_start`] handle the text on either side of a cut: a
//! trailing fragment that starts like a known token or like a secret value,
//! and a leading fragment that ends like a secret value, the rest of a JWT,
//! or the body of a private key whose BEGIN line was cut. The live tap
//! (`stream.rs`) instead never cuts where a secret could straddle
//! (`hold.rs`).

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::{Captures, Regex};

/// Secret values shorter than this are not redacted: short values (`"1"`,
/// `"true"`, a port number) occur in ordinary output far too often.
pub(crate) const MIN_SECRET_LEN: usize = 8;

/// The shortest fragment of a secret value redacted at a cut. Shorter
/// fragments give away little and would match ordinary text by chance.
const MIN_FRAGMENT_LEN: usize = 4;

/// How far back from a cut [`redact_cut_end`] looks for the start of a
/// token fragment.
const CUT_END_WINDOW: usize = 512;

/// All known token formats, leftmost-first: a private-key block is consumed
/// whole before any token inside it could match on its own. No pattern is
/// anchored at a word boundary (see the module docs); what precedes a
/// match is judged in [`accept`].
static KNOWN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?P<private_key>-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----(?s:.*?)",
        r"(?:-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\z))",
        r"|(?P<aws_access_key>(?:AKIA|ASIA)[A-Z0-9]{16})",
        r"|(?P<github_token>gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{20,})",
        r"|(?P<api_key>sk-[A-Za-z0-9_\-]{20,})",
        r"|(?P<stripe_key>[rs]k_(?:live|test)_[A-Za-z0-9]{16,})",
        r"|(?P<slack_token>xox[abposr]-[A-Za-z0-9\-]{10,})",
        r"|(?P<google_api_key>AIza[0-9A-Za-z_\-]{35,})",
        r"|(?P<jwt>eyJ[A-Za-z0-9_\-]+\.eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*)",
        r"|(?P<bearer>(?P<bearer_word>(?i:bearer)[ \t]+)[A-Za-z0-9\-._~+/]{6,}=*)",
    ))
    .expect("the known-token regex is valid")
});

/// Group names of [`KNOWN`] that name a token kind, in pattern order.
const KINDS: &[&str] = &[
    "private_key",
    "aws_access_key",
    "github_token",
    "api_key",
    "stripe_key",
    "slack_token",
    "google_api_key",
    "jwt",
    "bearer",
];

/// A trailing fragment that starts like a known token: what is left in the
/// head when a cut falls inside one. Judged by [`glued`] like [`KNOWN`].
static PARTIAL_AT_END: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?:(?P<aws_access_key>(?:AKIA|ASIA)[A-Z0-9]*)",
        r"|(?P<github_token>(?:gh[pousr]_[A-Za-z0-9]*|github_pat_[A-Za-z0-9_]*))",
        r"|(?P<api_key>sk-[A-Za-z0-9_\-]*)",
        r"|(?P<stripe_key>[rs]k_(?:live|test)_[A-Za-z0-9]*)",
        r"|(?P<slack_token>xox[abposr]-[A-Za-z0-9\-]*)",
        r"|(?P<google_api_key>AIza[0-9A-Za-z_\-]*)",
        r"|(?P<jwt>eyJ[A-Za-z0-9_\-.]*)",
        r"|(?P<bearer>(?P<bearer_word>(?i:bearer)[ \t]+)[A-Za-z0-9\-._~+/]+=*))\z",
    ))
    .expect("the partial-token regex is valid")
});

/// The rest of a JWT whose start was cut: header remainder, then a payload.
static JWT_REST_AT_START: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\A[A-Za-z0-9_\-]*\.eyJ[A-Za-z0-9_\-]*\.[A-Za-z0-9_\-]*")
        .expect("the JWT-rest regex is valid")
});

static PEM_BEGIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----").expect("PEM BEGIN regex is valid")
});

static PEM_END: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----").expect("PEM END regex is valid")
});

/// Exact secret values to redact, built once per kernel. Its `Debug`
/// shows how many values it holds, never the values.
pub(crate) struct Secrets {
    /// Distinct values of at least [`MIN_SECRET_LEN`] bytes, longest first,
    /// so that a secret containing another is redacted whole.
    values: Vec<String>,
    /// Indexes into `values` of the values holding a line break: the only
    /// ones a cut at a line end can split.
    multi_line: Vec<usize>,
    /// One literal alternation over `values`; `None` when there are none,
    /// or (never in practice) when it is too large for the regex engine, in
    /// which case `values` are replaced one by one.
    regex: Option<Regex>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("values", &self.values.len())
            .finish_non_exhaustive()
    }
}

impl Secrets {
    pub(crate) fn new(values: impl IntoIterator<Item = String>) -> Self {
        let mut values: Vec<String> = values
            .into_iter()
            .filter(|v| v.len() >= MIN_SECRET_LEN)
            .collect();
        values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        values.dedup();
        let multi_line = (0..values.len())
            .filter(|&i| values[i].contains(['\n', '\r']))
            .collect();
        let regex = if values.is_empty() {
            None
        } else {
            let pattern = values
                .iter()
                .map(|v| regex::escape(v))
                .collect::<Vec<_>>()
                .join("|");
            regex::RegexBuilder::new(&pattern)
                .size_limit(64 << 20)
                .build()
                .ok()
        };
        Secrets {
            values,
            multi_line,
            regex,
        }
    }

    fn redact_exact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if self.values.is_empty() {
            return Cow::Borrowed(text);
        }
        if let Some(regex) = &self.regex {
            return regex.replace_all(text, "[REDACTED:secret]");
        }
        let mut out = Cow::Borrowed(text);
        for value in &self.values {
            if out.contains(value.as_str()) {
                out = Cow::Owned(out.replace(value.as_str(), "[REDACTED:secret]"));
            }
        }
        out
    }

    /// How far before a cut between `before` and `after` a secret value
    /// could start and still cross the cut: the longest proper prefix of a
    /// value that `before` ends with and that `after` agrees with so far
    /// (`after` is a prefix of the value's rest, or the rest of `after`).
    /// `None`: no value can straddle this cut.
    pub(crate) fn straddle(&self, before: &[u8], after: &[u8]) -> Option<usize> {
        let last = *before.last()?;
        let check = |value: &str| {
            let value = value.as_bytes();
            (1..value.len())
                .rev()
                .filter(|&k| value[k - 1] == last)
                .find(|&k| {
                    let rest = &value[k..];
                    before.ends_with(&value[..k])
                        && (after.starts_with(rest) || rest.starts_with(after))
                })
        };
        if last == b'\n' || last == b'\r' {
            self.multi_line
                .iter()
                .filter_map(|&i| check(&self.values[i]))
                .max()
        } else {
            self.values.iter().filter_map(|v| check(v)).max()
        }
    }
}

/// Replaces every secret in `text`: exact values first (they are the most
/// specific), then known token formats. Borrows when nothing matched.
pub(crate) fn redact<'a>(text: &'a str, secrets: &Secrets) -> Cow<'a, str> {
    match secrets.redact_exact(text) {
        Cow::Borrowed(text) => redact_known(text),
        Cow::Owned(text) => match redact_known(&text) {
            Cow::Borrowed(_) => Cow::Owned(text),
            Cow::Owned(redacted) => Cow::Owned(redacted),
        },
    }
}

fn redact_known(text: &str) -> Cow<'_, str> {
    let mut out: Option<String> = None;
    let mut kept = 0;
    let mut at = 0;
    while at < text.len() {
        let Some(caps) = KNOWN.captures_at(text, at) else {
            break;
        };
        let whole = caps.get(0).expect("group 0 always matches");
        match accept(text, &caps) {
            Ok(replacement) => {
                let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
                out.push_str(&text[kept..whole.start()]);
                out.push_str(&replacement);
                kept = whole.end();
                at = whole.end();
            }
            Err(resume) => at = resume,
        }
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut out) => {
            out.push_str(&text[kept..]);
            Cow::Owned(out)
        }
    }
}

/// The replacement of one [`KNOWN`] match, or (`Err`) where to look next
/// when the match is not a token after all.
fn accept(text: &str, caps: &Captures<'_>) -> Result<String, usize> {
    let whole = caps.get(0).expect("group 0 always matches");
    let (start, end) = (whole.start(), whole.end());
    let bytes = text.as_bytes();
    // The next character boundary: where a rejected match's scan resumes
    // when a token could start inside it.
    let next = || (start + 1..=text.len()).find(|&i| text.is_char_boundary(i));
    // A rejected `sk-`-style run is made of letters, `-` and `_`: no token
    // starts inside it but a `bearer` at its very end.
    let near_end = || end.saturating_sub(6).max(start + 1);
    let kind = kind_of(caps);
    match kind {
        "aws_access_key"
            if bytes
                .get(end)
                .is_some_and(|b| b.is_ascii_uppercase() || b.is_ascii_digit()) =>
        {
            // Part of a longer id, not an access key id.
            return Err(next().unwrap_or(text.len()));
        }
        "api_key" | "stripe_key" if glued(bytes, start) && !looks_random(whole.as_str()) => {
            return Err(near_end());
        }
        "bearer" => {
            if glued(bytes, start) {
                return Err(next().unwrap_or(text.len()));
            }
            let word = caps.name("bearer_word").map_or("", |m| m.as_str());
            let token = &whole.as_str()[word.len()..];
            if !looks_like_a_token(token) {
                return Err(end);
            }
            return Ok(format!("{word}[REDACTED:bearer]"));
        }
        _ => {}
    }
    Ok(format!("[REDACTED:{kind}]"))
}

/// `true` when the match at `start` is glued to a letter or digit before
/// it that does not end an escape (`\n`, `\t`, `\x41`, `\u00e9`, `\101`):
/// inside a word, where `sk-` and `bearer` are more often prose.
pub(crate) fn glued(bytes: &[u8], start: usize) -> bool {
    let Some(&prev) = start.checked_sub(1).and_then(|i| bytes.get(i)) else {
        return false;
    };
    if !prev.is_ascii_alphanumeric() {
        return false;
    }
    !ends_with_escape(&bytes[..start])
}

/// `true` when `before` ends with a backslash escape: `\` and a letter,
/// `\x` and two hex digits, `\u` and four, `\U` and eight, or up to three
/// octal digits.
fn ends_with_escape(before: &[u8]) -> bool {
    let n = before.len();
    let backslash_at = |i: usize| n > i && before[n - i - 1] == b'\\';
    let hex =
        |len: usize| before.len() >= len && before[n - len..].iter().all(u8::is_ascii_hexdigit);
    if before.last().is_some_and(u8::is_ascii_alphabetic) && backslash_at(1) {
        return true;
    }
    for (marker, digits) in [(b'x', 2), (b'u', 4), (b'U', 8)] {
        if hex(digits) && n > digits && before[n - digits - 1] == marker && backslash_at(digits + 1)
        {
            return true;
        }
    }
    (1..=3).any(|len| {
        n > len && before[n - len..].iter().all(|b| (b'0'..=b'7').contains(b)) && backslash_at(len)
    })
}

/// A real key is random: somewhere a digit or a capital letter. Prose
/// glued to `sk-` ("task-management-system-overview") has neither.
fn looks_random(token: &str) -> bool {
    token
        .bytes()
        .any(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
}

/// Prose such as "Bearer authentication" is not a credential: a token has
/// a digit or a symbol, or is too long to be a word.
fn looks_like_a_token(token: &str) -> bool {
    token.len() >= 16 || token.bytes().any(|b| !b.is_ascii_alphabetic())
}

fn kind_of(caps: &Captures<'_>) -> &'static str {
    KINDS
        .iter()
        .copied()
        .find(|kind| caps.name(kind).is_some())
        .unwrap_or("secret")
}

/// Redacts a fragment at the end of `text`, which is followed by a cut: a
/// token format's start, or the start of a secret value
/// ([`MIN_FRAGMENT_LEN`] bytes or more).
pub(crate) fn redact_cut_end(mut text: String, secrets: &Secrets) -> String {
    let mut from = text.len().saturating_sub(CUT_END_WINDOW);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    // `captures_at` sees the text before `from`, so what precedes a
    // fragment is judged as in the whole text.
    while let Some(caps) = PARTIAL_AT_END.captures_at(&text, from) {
        let start = caps.get(0).expect("group 0 always matches").start();
        let kind = kind_of(&caps);
        let prose =
            matches!(kind, "api_key" | "stripe_key" | "bearer") && glued(text.as_bytes(), start);
        if prose {
            // A later fragment may still start inside this one.
            from = (start + 1..=text.len())
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(text.len());
            continue;
        }
        let replacement = match caps.name("bearer_word") {
            Some(word) => format!("{}[REDACTED:{kind}]", word.as_str()),
            None => format!("[REDACTED:{kind}]"),
        };
        text.replace_range(start.., &replacement);
        break;
    }

    let bytes = text.as_bytes();
    let longest = secrets
        .values
        .iter()
        .filter_map(|value| {
            let value = value.as_bytes();
            (MIN_FRAGMENT_LEN..value.len())
                .rev()
                .find(|&k| bytes.ends_with(&value[..k]))
        })
        .max();
    if let Some(k) = longest {
        let start = text.len() - k;
        if text.is_char_boundary(start) {
            text.replace_range(start.., "[REDACTED:secret]");
        }
    }
    text
}

/// Redacts a fragment at the start of `text`, which follows a cut: the end
/// of a secret value ([`MIN_FRAGMENT_LEN`] bytes or more), the rest of a
/// JWT, or a private key whose BEGIN line was cut (through its END line).
pub(crate) fn redact_cut_start(mut text: String, secrets: &Secrets) -> String {
    if let Some(end) = PEM_END.find(&text) {
        let begun = PEM_BEGIN
            .find(&text)
            .is_some_and(|begin| begin.start() < end.start());
        if !begun {
            text.replace_range(..end.end(), "[REDACTED:private_key]");
        }
    }
    if let Some(rest) = JWT_REST_AT_START.find(&text) {
        text.replace_range(..rest.end(), "[REDACTED:jwt]");
    }

    let bytes = text.as_bytes();
    let longest = secrets
        .values
        .iter()
        .filter_map(|value| {
            let value = value.as_bytes();
            (MIN_FRAGMENT_LEN..value.len())
                .rev()
                .find(|&k| bytes.starts_with(&value[value.len() - k..]))
        })
        .max();
    if let Some(k) = longest {
        if text.is_char_boundary(k) {
            text.replace_range(..k, "[REDACTED:secret]");
        }
    }
    text
}

#[cfg(test)]
#[path = "redact_tests.rs"]
mod tests;
