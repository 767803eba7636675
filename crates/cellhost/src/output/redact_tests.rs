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
    let openssh = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----";
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
        // Prose: hyphenated words glued to `sk-`, `bearer` inside words.
        "the task-management-system-overview-document and a risk-assessment-of-the-whole-thing",
        "a desk-for-every-engineer-on-the-floor policy; disk-usage-report-for-yesterday",
        "the standardbearer tokens of the old order; cupbearer gifted",
        "flagbearer 0123456789abcdefghij was the team's number",
        "Use the Bearer scheme: Authorization: Bearer <token>",
        // Code: identifiers that contain token prefixes.
        "def mask_test_implementation(): return risk_live_coverage",
        "task_test_configuration_values = load('disk_live_backup_settings')",
        "risk_test_configurationvalues = 1",
        "for ask in asks: print(f'{task}-{risk}-{desk}')",
        "x = {'github_pat': None, 'ghp_count': 3, 'AKIA_PREFIX': 'AKIA'}",
        "import re\nPATTERN = re.compile(r'sk-[A-Za-z0-9]{20,}')\n",
        "'line one\\nline two\\tand a tab'",
        "{\"message\": \"ok\\nnext\", \"items\": [\"eyJ\", \"xoxb\"]}",
        "AKIAIOSFODNN7EXAMPLEX2 is an id, not a key",
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

#[test]
fn tokens_after_escapes_underscores_quotes_and_letters_are_redacted() {
    let gh = format!("ghp_{}", "Zyxw9876".repeat(5));
    let sk = "sk-proj-Ab3dEf6hIj9lMn2pQr5tUv8xYz1-_cd4";
    let aws = "AKIAIOSFODNN7EXAMPLE";
    let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl";
    for token in [gh.as_str(), sk, aws, jwt, "xoxb-123456789012-abcdefABCDEF"] {
        for before in [
            "\\n", "\\t", "\\r", "\\x41", "\\u00e9", "_", "'", "\"", "user", "KEY",
        ] {
            let text = format!("{before}{token} end");
            let out = redacted(&text);
            assert!(!out.contains(&token[4..14]), "{text:?} -> {out:?}");
            assert!(
                out.starts_with(before) && out.contains("[REDACTED:"),
                "{text:?} -> {out:?}"
            );
        }
    }
}

#[test]
fn a_bearer_credential_after_an_escape_is_redacted_but_not_inside_a_word() {
    assert_eq!(
        redacted("'auth:\\nBearer abc123.def-456'"),
        "'auth:\\nBearer [REDACTED:bearer]'"
    );
    assert_eq!(
        redacted("_Bearer abc123.def-456"),
        "_Bearer [REDACTED:bearer]"
    );
    assert_eq!(redacted("cupbearer 12345678"), "cupbearer 12345678");
}

#[test]
fn an_aws_key_glued_to_a_longer_id_is_left_but_one_after_letters_is_redacted() {
    assert_eq!(
        redacted("idAKIAIOSFODNN7EXAMPLE"),
        "id[REDACTED:aws_access_key]"
    );
    assert_eq!(redacted("AKIAIOSFODNN7EXAMPLE9"), "AKIAIOSFODNN7EXAMPLE9");
}

#[test]
fn a_token_inside_rejected_prose_is_still_found() {
    let gh = format!("ghp_{}", "Zyxw9876".repeat(5));
    let text = format!("xbearer {gh}");
    assert_eq!(redacted(&text), "xbearer [REDACTED:github_token]");
    let text = "task-management-system-bearer abc123def";
    assert_eq!(
        redacted(text),
        "task-management-system-bearer [REDACTED:bearer]"
    );
}

#[test]
fn a_glued_fragment_before_a_cut_is_redacted_unless_it_is_prose() {
    let s = redact_cut_end("s = '\\nghp_abc12".to_string(), &none());
    assert_eq!(s, "s = '\\n[REDACTED:github_token]");
    let s = redact_cut_end("KEY_sk-abc".to_string(), &none());
    assert_eq!(s, "KEY_[REDACTED:api_key]");
    for text in ["task-", "risk-assess", "cupbearer x"] {
        assert_eq!(redact_cut_end(text.to_string(), &none()), text);
    }
}

#[test]
fn long_runs_of_prose_candidates_are_left_untouched() {
    // Each `sk-` is a rejected candidate; the scan resumes past it (a
    // restart at every byte would take minutes here).
    let text = "task-".repeat(40_000);
    assert_eq!(redacted(&text), text);
    let text = "xbearer abcdefgh ".repeat(10_000);
    assert_eq!(redacted(&text), text);
}

#[test]
fn a_secret_value_that_could_cross_a_cut_is_found() {
    let secrets = Secrets::new(vec!["first-line\nsecond-line".to_string()]);
    assert_eq!(secrets.straddle(b"x\nfirst-line\n", b""), Some(11));
    assert_eq!(secrets.straddle(b"x\nfirst-line\n", b"seco"), Some(11));
    assert_eq!(secrets.straddle(b"x\nfirst-line\n", b"other\n"), None);
    assert_eq!(secrets.straddle(b"x\nfirst-", b""), Some(6));
    assert_eq!(secrets.straddle(b"nothing\n", b""), None);
    assert_eq!(secrets.straddle(b"", b"first"), None);
}
