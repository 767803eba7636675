//! Percent-format scripts (`# %%` cells: the Jupytext / VS Code convention).
//!
//! `cellhost run FILE` runs a script cell by cell in one kernel. A line
//! that starts with `# %%` (or `#%%`), with no indentation, starts a new
//! cell; the rest of that line is the cell's title, e.g.
//!
//! ```text
//! # %% Load the data
//! import json
//! data = json.load(open("data.json"))
//!
//! # %% [markdown]
//! # Markdown cells are comments and are skipped.
//!
//! # %% Summary [tag]
//! len(data)
//! ```
//!
//! Rules:
//! - Text before the first marker is a cell (without a title) unless it is
//!   only whitespace; a script without any marker is one cell.
//! - `[markdown]`, `[md]` and `[raw]` tags mark cells that are not code;
//!   they are skipped. Other `[...]` tags are dropped from the title.
//! - A cell keeps its code lines exactly, minus leading and trailing blank
//!   lines; cells left with no code are dropped. Lines are joined with
//!   `\n` (CRLF input gives LF code).
//! - Cells are numbered from 1 among the code cells returned; `line` is the
//!   1-based line of a cell's first code line in the file, for messages.

/// One code cell of a percent-format script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptCell {
    /// 1-based position among the code cells returned.
    pub index: usize,
    /// The marker line's title, without `[...]` tags; `None` when empty.
    pub title: Option<String>,
    /// 1-based line of the first code line in the file.
    pub line: usize,
    /// The cell's code: its lines as written, without leading or trailing
    /// blank lines, joined with `\n` (no final newline).
    pub code: String,
}

/// Splits a percent-format script into its code cells.
pub fn parse(source: &str) -> Vec<ScriptCell> {
    let source = source.strip_prefix('\u{feff}').unwrap_or(source);
    let mut cells = Vec::new();
    let mut current = Pending {
        header: Header::Code { title: None },
        first_line: 1,
        lines: Vec::new(),
    };
    for (i, line) in source.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let line_no = i + 1;
        match marker_header(line) {
            Some(header) => {
                let done = std::mem::replace(
                    &mut current,
                    Pending {
                        header,
                        first_line: line_no + 1,
                        lines: Vec::new(),
                    },
                );
                done.finish(&mut cells);
            }
            None => current.lines.push(line),
        }
    }
    current.finish(&mut cells);
    cells
}

/// What a marker line says about the cell it starts.
enum Header {
    Code {
        title: Option<String>,
    },
    /// Markdown or raw: not run.
    Skipped,
}

/// A cell whose lines are still being collected.
struct Pending<'a> {
    header: Header,
    /// File line number of `lines[0]`.
    first_line: usize,
    lines: Vec<&'a str>,
}

impl Pending<'_> {
    fn finish(self, cells: &mut Vec<ScriptCell>) {
        let Header::Code { title } = self.header else {
            return;
        };
        let is_blank = |line: &&str| line.trim().is_empty();
        let Some(first) = self.lines.iter().position(|l| !is_blank(l)) else {
            return;
        };
        let last = self
            .lines
            .iter()
            .rposition(|l| !is_blank(l))
            .expect("a non-blank line exists");
        cells.push(ScriptCell {
            index: cells.len() + 1,
            title,
            line: self.first_line + first,
            code: self.lines[first..=last].join("\n"),
        });
    }
}

/// `Some` when `line` is a cell marker: `# %%` or `#%%` at column 0,
/// followed by the end of the line, whitespace, more `%` (Spyder's nested
/// cells) or a `[tag]`. `# %%time` is an ordinary comment.
fn marker_header(line: &str) -> Option<Header> {
    let rest = line
        .strip_prefix("# %%")
        .or_else(|| line.strip_prefix("#%%"))?;
    let rest = rest.trim_start_matches('%');
    if !(rest.is_empty() || rest.starts_with(char::is_whitespace) || rest.starts_with('[')) {
        return None;
    }

    let mut title = String::new();
    let mut skipped = false;
    let mut rest = rest;
    while let Some(open) = rest.find('[') {
        let tag = rest[open + 1..]
            .find(']')
            .map(|close| &rest[open + 1..open + 1 + close])
            .filter(|tag| is_tag(tag));
        let Some(tag) = tag else {
            title.push_str(&rest[..=open]);
            rest = &rest[open + 1..];
            continue;
        };
        if ["markdown", "md", "raw"]
            .iter()
            .any(|kind| tag.eq_ignore_ascii_case(kind))
        {
            skipped = true;
        }
        title.push_str(&rest[..open]);
        title.push(' ');
        rest = &rest[open + tag.len() + 2..];
    }
    title.push_str(rest);

    if skipped {
        return Some(Header::Skipped);
    }
    let title = title.split_whitespace().collect::<Vec<_>>().join(" ");
    Some(Header::Code {
        title: (!title.is_empty()).then_some(title),
    })
}

/// A `[tag]` is one word (`markdown`, `md`, `raw`, `parameters`, ...);
/// brackets around anything else (`[1, 2]`, `["x"]`) are title text.
fn is_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cell(index: usize, title: Option<&str>, line: usize, code: &str) -> ScriptCell {
        ScriptCell {
            index,
            title: title.map(str::to_string),
            line,
            code: code.to_string(),
        }
    }

    #[test]
    fn a_script_without_markers_is_one_cell() {
        assert_eq!(
            parse("import os\nprint(os.getcwd())\n"),
            vec![cell(1, None, 1, "import os\nprint(os.getcwd())")]
        );
    }

    #[test]
    fn an_empty_script_has_no_cells() {
        assert_eq!(parse(""), vec![]);
        assert_eq!(parse("\n  \n\t\n"), vec![]);
    }

    #[test]
    fn each_marker_starts_a_cell() {
        let source = "# %%\nx = 1\n# %%\ny = 2\n";
        assert_eq!(
            parse(source),
            vec![cell(1, None, 2, "x = 1"), cell(2, None, 4, "y = 2")]
        );
    }

    #[test]
    fn the_rest_of_the_marker_line_is_the_title() {
        let source = "# %%   Load the data  \nx = 1\n";
        assert_eq!(
            parse(source),
            vec![cell(1, Some("Load the data"), 2, "x = 1")]
        );
    }

    #[test]
    fn markers_without_a_space_after_the_hash_count_too() {
        assert_eq!(
            parse("#%% one\nx = 1\n"),
            vec![cell(1, Some("one"), 2, "x = 1")]
        );
    }

    #[test]
    fn extra_percent_signs_still_make_a_marker() {
        assert_eq!(
            parse("# %%% nested\nx\n"),
            vec![cell(1, Some("nested"), 2, "x")]
        );
    }

    #[test]
    fn a_comment_that_only_starts_like_a_marker_is_code() {
        let source = "# %%time is an ipython magic\nx = 1\n";
        assert_eq!(parse(source), vec![cell(1, None, 1, source.trim_end())]);
    }

    #[test]
    fn an_indented_marker_is_code() {
        let source = "if True:\n    # %% not a marker\n    x = 1\n";
        assert_eq!(parse(source), vec![cell(1, None, 1, source.trim_end())]);
    }

    #[test]
    fn text_before_the_first_marker_is_a_cell() {
        let source = "import os\n\n# %% second\nx = 1\n";
        assert_eq!(
            parse(source),
            vec![
                cell(1, None, 1, "import os"),
                cell(2, Some("second"), 4, "x = 1")
            ]
        );
    }

    #[test]
    fn whitespace_before_the_first_marker_is_not_a_cell() {
        let source = "\n   \n# %%\nx = 1\n";
        assert_eq!(parse(source), vec![cell(1, None, 4, "x = 1")]);
    }

    #[test]
    fn markdown_cells_are_skipped() {
        let source = "# %% [markdown]\n# # Heading\n# text\n# %% [md] notes\n# more\n# %%\nx = 1\n";
        assert_eq!(parse(source), vec![cell(1, None, 7, "x = 1")]);
    }

    #[test]
    fn markdown_tags_are_case_insensitive_and_may_follow_a_title() {
        let source = "# %% Intro [Markdown]\n# hi\n# %% code\nx\n";
        assert_eq!(parse(source), vec![cell(1, Some("code"), 4, "x")]);
    }

    #[test]
    fn raw_cells_are_skipped() {
        assert_eq!(
            parse("# %% [raw]\nnot python\n# %%\nx\n"),
            vec![cell(1, None, 4, "x")]
        );
    }

    #[test]
    fn other_tags_are_kept_out_of_the_title() {
        let source = "# %% Setup [parameters] step [x]\nx = 1\n# %% [tag]\ny\n";
        assert_eq!(
            parse(source),
            vec![
                cell(1, Some("Setup step"), 2, "x = 1"),
                cell(2, None, 4, "y")
            ]
        );
    }

    #[test]
    fn brackets_that_are_not_tags_stay_in_the_title() {
        let source = "# %% Sum [1, 2] and a[0\nx\n";
        assert_eq!(
            parse(source),
            vec![cell(1, Some("Sum [1, 2] and a[0"), 2, "x")]
        );
    }

    #[test]
    fn cells_with_only_whitespace_are_dropped_and_indices_stay_dense() {
        let source = "# %% a\n\n   \n# %% b\nx = 1\n# %% c\n\t\n# %% d\ny = 2";
        assert_eq!(
            parse(source),
            vec![
                cell(1, Some("b"), 5, "x = 1"),
                cell(2, Some("d"), 9, "y = 2")
            ]
        );
    }

    #[test]
    fn code_lines_are_kept_exactly_except_outer_blank_lines() {
        let source = "# %%\n\n  \ndef f():\n    return 1\n\n\n  print( f() )  \n\n \n# %%\n";
        assert_eq!(
            parse(source),
            vec![cell(
                1,
                None,
                4,
                "def f():\n    return 1\n\n\n  print( f() )  "
            )]
        );
    }

    #[test]
    fn the_line_number_points_at_the_first_code_line() {
        let source = "a = 1\n# %%\n\n\nb = 2\n";
        assert_eq!(
            parse(source),
            vec![cell(1, None, 1, "a = 1"), cell(2, None, 5, "b = 2")]
        );
    }

    #[test]
    fn crlf_line_endings_are_handled() {
        let source = "x = 1\r\n# %% Title\r\ny = 2\r\nz = 3\r\n";
        assert_eq!(
            parse(source),
            vec![
                cell(1, None, 1, "x = 1"),
                cell(2, Some("Title"), 3, "y = 2\nz = 3")
            ]
        );
    }

    #[test]
    fn a_byte_order_mark_does_not_hide_the_first_marker() {
        assert_eq!(
            parse("\u{feff}# %% one\nx\n"),
            vec![cell(1, Some("one"), 2, "x")]
        );
    }

    #[test]
    fn a_marker_on_the_last_line_adds_no_cell() {
        assert_eq!(parse("x = 1\n# %% end"), vec![cell(1, None, 1, "x = 1")]);
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_every_cell_has_code(
            lines in proptest::collection::vec(
                prop_oneof![
                    Just("# %%".to_string()),
                    Just("# %% [markdown]".to_string()),
                    Just("#%% t [x]".to_string()),
                    Just("".to_string()),
                    Just(" \t\r".to_string()),
                    Just("x = 1\r".to_string()),
                    any::<String>(),
                ],
                0..30,
            ),
        ) {
            let source = lines.join("\n");
            let cells = parse(&source);
            let source = source.strip_prefix('\u{feff}').unwrap_or(&source);
            let line_count = source.split('\n').count();
            for (i, cell) in cells.iter().enumerate() {
                prop_assert_eq!(cell.index, i + 1);
                prop_assert!(!cell.code.trim().is_empty());
                prop_assert!(cell.line >= 1 && cell.line <= line_count);
                let first = cell.code.split('\n').next().unwrap_or("");
                let file_line = source.split('\n').nth(cell.line - 1).unwrap_or("");
                prop_assert_eq!(file_line.strip_suffix('\r').unwrap_or(file_line), first);
            }
        }

        #[test]
        fn parse_never_panics_on_arbitrary_text(source in any::<String>()) {
            for cell in parse(&source) {
                prop_assert!(!cell.code.trim().is_empty());
            }
        }
    }
}
