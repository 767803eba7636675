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
//! - **Exact values** of secrets the host scrubbed from the child's
//!   environment ([`Secrets`]), matched by a literal alternation compiled
//!   once per kernel.
//!
//! Text without any candidate costs one literal-prefiltered scan per regex
//! and no allocation (the common output is `"1\n"`).
//!
//! Output that was cut (see `capture.rs`) can split a secret across the cut
//! so that no whole-token pattern matches either half. [`redact_cut_end`]
//! and [`redact_cut_start`] handle the text on either side of a cut: a
//! trailing fragment that starts like a known token or like a secret value,
//! and a leading fragment that ends like a secret value, the rest of a JWT,
//! or the body of a private key whose BEGIN line was cut.

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
/// whole before any token inside it could match on its own. `(?-u:\b)` is
/// an ASCII word boundary, which keeps the fast DFA engines usable on
/// non-ASCII text.
static KNOWN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?P<private_key>-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----(?s:.*?)",
        r"(?:-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\z))",
        r"|(?P<aws_access_key>(?-u:\b)(?:AKIA|ASIA)[A-Z0-9]{16}(?-u:\b))",
        r"|(?P<github_token>(?-u:\b)(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{20,}))",
        r"|(?P<api_key>(?-u:\b)sk-[A-Za-z0-9_\-]{20,})",
        r"|(?P<stripe_key>(?-u:\b)[rs]k_(?:live|test)_[A-Za-z0-9]{16,})",
        r"|(?P<slack_token>(?-u:\b)xox[abposr]-[A-Za-z0-9\-]{10,})",
        r"|(?P<google_api_key>(?-u:\b)AIza[0-9A-Za-z_\-]{35,})",
        r"|(?P<jwt>(?-u:\b)eyJ[A-Za-z0-9_\-]+\.eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*)",
        r"|(?P<bearer>(?P<bearer_word>(?-u:\b)(?i:bearer)[ \t]+)[A-Za-z0-9\-._~+/]{6,}=*)",
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
/// head when a cut falls inside one.
static PARTIAL_AT_END: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?:(?P<aws_access_key>(?-u:\b)(?:AKIA|ASIA)[A-Z0-9]*)",
        r"|(?P<github_token>(?-u:\b)(?:gh[pousr]_[A-Za-z0-9]*|github_pat_[A-Za-z0-9_]*))",
        r"|(?P<api_key>(?-u:\b)sk-[A-Za-z0-9_\-]*)",
        r"|(?P<stripe_key>(?-u:\b)[rs]k_(?:live|test)_[A-Za-z0-9]*)",
        r"|(?P<slack_token>(?-u:\b)xox[abposr]-[A-Za-z0-9\-]*)",
        r"|(?P<google_api_key>(?-u:\b)AIza[0-9A-Za-z_\-]*)",
        r"|(?P<jwt>(?-u:\b)eyJ[A-Za-z0-9_\-.]*)",
        r"|(?P<bearer>(?P<bearer_word>(?-u:\b)(?i:bearer)[ \t]+)[A-Za-z0-9\-._~+/]+=*))\z",
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
        Secrets { values, regex }
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
    KNOWN.replace_all(text, |caps: &Captures<'_>| {
        let whole = caps.get(0).map_or("", |m| m.as_str());
        let kind = kind_of(caps);
        if kind == "bearer" {
            let word = caps.name("bearer_word").map_or("", |m| m.as_str());
            let token = &whole[word.len()..];
            if !looks_like_a_token(token) {
                return whole.to_string();
            }
            return format!("{word}[REDACTED:bearer]");
        }
        format!("[REDACTED:{kind}]")
    })
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
    let mut window_start = text.len().saturating_sub(CUT_END_WINDOW);
    while !text.is_char_boundary(window_start) {
        window_start += 1;
    }
    // `captures_at` still sees the text before the window, so `\b` at
    // the window's start means a real word boundary.
    if let Some(caps) = PARTIAL_AT_END.captures_at(&text, window_start) {
        let start = caps.get(0).expect("group 0 always matches").start();
        let kind = kind_of(&caps);
        let replacement = match caps.name("bearer_word") {
            Some(word) => format!("{}[REDACTED:{kind}]", word.as_str()),
            None => format!("[REDACTED:{kind}]"),
        };
        text.replace_range(start.., &replacement);
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
mod tests {
    use super::*;

    fn none() -> Secrets {
        Secrets::new(Vec::new())
    }

    fn redacted(text: &str) -> String {
        redact(text, &none()).into_owned()
    }

    #[test]
    fn aws_access_key_ids_are_redacted() {
        assert_eq!(
            redacted("key=AKIAIOSFODNN7EXAMPLE rest"),
            "key=[REDACTED:aws_access_key] rest"
        );
        assert_eq!(
            redacted("ASIAY34FZKBOKMUTVV7A"),
            "[REDACTED:aws_access_key]"
        );
    }

    #[test]
    fn github_tokens_are_redacted() {
        let classic = format!("ghp_{}", "a1B2c3D4e5".repeat(4));
        assert_eq!(
            redacted(&format!("token: {classic}\n")),
            "token: [REDACTED:github_token]\n"
        );
        for prefix in ["gho_", "ghu_", "ghs_", "ghr_"] {
            let token = format!("{prefix}{}", "Z9y8X7w6V5".repeat(4));
            assert_eq!(redacted(&token), "[REDACTED:github_token]", "{prefix}");
        }
        let fine_grained = format!(
            "github_pat_11ABCDEFG0{}_{}",
            "x".repeat(12),
            "Yz9".repeat(20)
        );
        assert_eq!(redacted(&fine_grained), "[REDACTED:github_token]");
    }

    #[test]
    fn sk_api_keys_are_redacted_including_project_and_anthropic_keys() {
        for key in [
            "sk-abcdefghijklmnopqrstuvwxyz0123456789ABCD",
            "sk-proj-Ab3dEf6hIj9lMn2pQr5tUv8xYz1-_cd4",
            "sk-ant-api03-Qw3rTy-Ui0pAs_Df9gHj8kLz7xCv6bNm5-AAAA",
        ] {
            assert_eq!(
                redacted(&format!("OPENAI={key};")),
                "OPENAI=[REDACTED:api_key];",
                "{key}"
            );
        }
    }

    #[test]
    fn stripe_keys_are_redacted() {
        assert_eq!(
            redacted("sk_live_51H8abcdEFGHijklMNOP"),
            "[REDACTED:stripe_key]"
        );
    }

    #[test]
    fn slack_tokens_are_redacted() {
        for token in [
            "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
            "xoxp-1234-5678-abcdef",
            "xoxa-2-abcdef123456",
        ] {
            assert_eq!(redacted(token), "[REDACTED:slack_token]", "{token}");
        }
    }

    #[test]
    fn google_api_keys_are_redacted() {
        let key = format!("AIza{}", "SyA1b2C3d4E5f6G7h8I9j0K_L-m3N4o5P6q"); // 35 after AIza
        assert_eq!(key.len(), 39);
        assert_eq!(redacted(&format!("k={key}")), "k=[REDACTED:google_api_key]");
    }

    #[test]
    fn jwts_are_redacted() {
        let jwt = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        assert_eq!(
            redacted(&format!("id_token={jwt}\n")),
            "id_token=[REDACTED:jwt]\n"
        );
    }

    #[test]
    fn private_key_blocks_are_redacted_through_the_end_line() {
        let text = "before\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\nabc+/=\n-----END RSA PRIVATE KEY-----\nafter\n";
        assert_eq!(redacted(text), "before\n[REDACTED:private_key]\nafter\n");
        let pkcs8 = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----";
        assert_eq!(redacted(pkcs8), "[REDACTED:private_key]");
        let openssh =
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----";
        assert_eq!(redacted(openssh), "[REDACTED:private_key]");
    }

    #[test]
    fn a_private_key_block_without_end_is_redacted_to_the_end_of_the_text() {
        let text = "key:\n-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEI\nmore lines\n";
        assert_eq!(redacted(text), "key:\n[REDACTED:private_key]");
    }

    #[test]
    fn public_keys_and_certificates_are_left_alone() {
        let text = "-----BEGIN PUBLIC KEY-----\nMFkwEw\n-----END PUBLIC KEY-----\n-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        assert_eq!(redacted(text), text);
    }

    #[test]
    fn bearer_tokens_are_redacted_keeping_the_word_bearer() {
        assert_eq!(
            redacted("Authorization: Bearer abc123.def-456_ghi"),
            "Authorization: Bearer [REDACTED:bearer]"
        );
        assert_eq!(
            redacted("authorization: bearer 0123456789abcdef=="),
            "authorization: bearer [REDACTED:bearer]"
        );
        assert_eq!(
            redacted("BEARER\tdGhpcyBpcyBhIHRva2Vu"),
            "BEARER\t[REDACTED:bearer]"
        );
        assert_eq!(redacted("Bearer hunter2"), "Bearer [REDACTED:bearer]");
    }

    #[test]
    fn a_jwt_after_bearer_is_redacted_once() {
        let text = "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl";
        assert_eq!(redacted(text), "Bearer [REDACTED:bearer]");
    }

    #[test]
    fn normal_text_is_untouched() {
        for text in [
            "1\n",
            "",
            "sky-high risk-free task-management-system-overview-thing",
            "Bearer",
            "the Bearer token goes in a header",
            "use Bearer authentication for this endpoint",
            "Bearer tokens expire; Bearer:",
            "Authorization: Bearer $TOKEN",
            "AKIA is a prefix; AKIAshort; AKIAIOSFODNN7EXAMPLEX2",
            "ghp_short gho_ github_pat_",
            "eyJhbGciOiJIUzI1NiJ9 alone is just base64",
            "xoxb- nothing",
            "AIzaShort",
            "disk-space-usage-is-fine-today ok",
            "naïve café ünïcödé — 日本語",
            "Traceback (most recent call last):\n  File \"<cell>\", line 1\nZeroDivisionError: division by zero\n",
        ] {
            assert_eq!(redacted(text), text, "{text:?}");
        }
    }

    #[test]
    fn text_without_candidates_is_borrowed() {
        assert!(matches!(redact("1\n", &none()), Cow::Borrowed(_)));
        let secrets = Secrets::new(vec!["hunter2hunter2".to_string()]);
        assert!(matches!(redact("x = 1\n", &secrets), Cow::Borrowed(_)));
    }

    #[test]
    fn exact_secret_values_are_redacted() {
        let secrets = Secrets::new(vec!["s3cr3t-v4lue!".to_string()]);
        assert_eq!(
            redact("db password is s3cr3t-v4lue! ok", &secrets),
            "db password is [REDACTED:secret] ok"
        );
    }

    #[test]
    fn exact_secret_values_with_regex_metacharacters_are_matched_literally() {
        let secrets = Secrets::new(vec!["a.b*c+d?(e)[f]".to_string()]);
        assert_eq!(redact("xa.b*c+d?(e)[f]x", &secrets), "x[REDACTED:secret]x");
        assert_eq!(redact("aXbbbcdde", &secrets), "aXbbbcdde");
    }

    #[test]
    fn secret_values_shorter_than_eight_bytes_are_ignored() {
        let secrets = Secrets::new(vec!["1234567".to_string(), "true".to_string()]);
        assert_eq!(redact("1234567 true", &secrets), "1234567 true");
    }

    #[test]
    fn the_longest_of_overlapping_secret_values_wins() {
        let secrets = Secrets::new(vec!["abcdefgh".to_string(), "abcdefgh-ijkl".to_string()]);
        assert_eq!(redact("abcdefgh-ijkl", &secrets), "[REDACTED:secret]");
    }

    #[test]
    fn debug_output_never_shows_secret_values() {
        let secrets = Secrets::new(vec!["correct-horse-battery".to_string()]);
        let shown = format!("{secrets:?}");
        assert!(!shown.contains("correct-horse"), "{shown}");
        assert!(shown.contains("values: 1"), "{shown}");
    }

    #[test]
    fn a_known_token_start_before_a_cut_is_redacted() {
        let s = redact_cut_end("x = ghp_abc12".to_string(), &none());
        assert_eq!(s, "x = [REDACTED:github_token]");
        let s = redact_cut_end("Authorization: Bearer abc".to_string(), &none());
        assert_eq!(s, "Authorization: Bearer [REDACTED:bearer]");
        let s = redact_cut_end("token AKIAIOSF".to_string(), &none());
        assert_eq!(s, "token [REDACTED:aws_access_key]");
    }

    #[test]
    fn the_fragment_window_respects_word_boundaries_before_it() {
        // The 512-byte window starts on an "s" inside one long word: that
        // "sk-" does not start a token.
        let inside_a_word = format!("x{}", "sk-a".repeat(200));
        assert_eq!(
            redact_cut_end(inside_a_word.clone(), &none()),
            inside_a_word
        );
    }

    #[test]
    fn ordinary_text_before_a_cut_is_kept() {
        for text in ["done\n", "risk-", "sky", "Bearer", "Bearer ", "aaaa"] {
            assert_eq!(redact_cut_end(text.to_string(), &none()), text);
        }
    }

    #[test]
    fn the_start_of_a_secret_value_before_a_cut_is_redacted() {
        let secrets = Secrets::new(vec!["Zq8-supersecret-value".to_string()]);
        let s = redact_cut_end("PASSWORD=Zq8-sup".to_string(), &secrets);
        assert_eq!(s, "PASSWORD=[REDACTED:secret]");
        let s = redact_cut_end("PASSWORD=Zq8".to_string(), &secrets);
        assert_eq!(s, "PASSWORD=Zq8", "three bytes give away little");
    }

    #[test]
    fn the_end_of_a_secret_value_after_a_cut_is_redacted() {
        let secrets = Secrets::new(vec!["Zq8-supersecret-value".to_string()]);
        let s = redact_cut_start("cret-value and more".to_string(), &secrets);
        assert_eq!(s, "[REDACTED:secret] and more");
    }

    #[test]
    fn a_private_key_whose_begin_was_cut_is_redacted_through_its_end() {
        let s = redact_cut_start(
            "Zm9vYmFy\nYmF6\n-----END RSA PRIVATE KEY-----\nnext\n".to_string(),
            &none(),
        );
        assert_eq!(s, "[REDACTED:private_key]\nnext\n");
    }

    #[test]
    fn a_jwt_whose_start_was_cut_is_redacted() {
        let s = redact_cut_start(
            "NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxIn0.sig_nature rest".to_string(),
            &none(),
        );
        assert_eq!(s, "[REDACTED:jwt] rest");
    }

    #[test]
    fn ordinary_text_after_a_cut_is_kept() {
        for text in ["lue\n", "3.14 is pi", "-----END CERTIFICATE-----", "a.b"] {
            assert_eq!(redact_cut_start(text.to_string(), &none()), text);
        }
    }
}
