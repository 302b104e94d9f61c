//! docs/testing.md stays true: every behaviour row names tests that exist, and every row of the
//! README's Resilience table, command reference and exit-code table has a row there.

use std::path::Path;

/// The cells of a Markdown table row (`| a | b |`), split at every `|` not escaped as `\|`.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut out = vec![String::new()];
    let mut prev = '\0';
    for c in inner.chars() {
        if c == '|' && prev != '\\' {
            out.push(String::new());
        } else {
            out.last_mut().expect("a cell").push(c);
        }
        prev = c;
    }
    out.into_iter().map(|c| c.trim().to_string()).collect()
}

/// The tables of a Markdown text: each one's header cells and its data rows' cells.
fn tables(text: &str) -> Vec<(Vec<String>, Vec<Vec<String>>)> {
    let mut out: Vec<(Vec<String>, Vec<Vec<String>>)> = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let is_row = |l: &str| l.trim_start().starts_with('|');
        let is_rule = |l: &str| is_row(l) && l.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '));
        if !is_row(line) || !lines.peek().is_some_and(|l| is_rule(l)) {
            continue;
        }
        lines.next();
        let mut rows = Vec::new();
        while let Some(l) = lines.next_if(|l| is_row(l)) {
            rows.push(cells(l));
        }
        out.push((cells(line), rows));
    }
    out
}

/// The `` `…` `` spans of a cell.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The first cells of the README table whose header starts with `first`.
fn readme_keys(readme: &str, first: &str) -> Vec<String> {
    tables(readme)
        .into_iter()
        .filter(|(h, _)| h.first().is_some_and(|c| c == first))
        .flat_map(|(_, rows)| rows.into_iter().filter_map(|r| r.into_iter().next()))
        .collect()
}

/// What a source file holds under a test's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// No test of that name.
    Missing,
    /// A test that runs wherever the suite runs.
    Runs,
    /// A test that can pass without running its check: marked `#[ignore]`, or printing
    /// `SKIPPED` and returning on its own (rather than through `testkit::skip`, which fails
    /// under `CI=true`).
    CanSkip,
}

/// What `src` holds under `fn name(`: a test is a function with `#[test]` or `#[tokio::test…]`
/// among the four lines before it.
fn find_test(src: &str, name: &str) -> Found {
    let Some(at) = src.find(&format!("fn {name}(")) else {
        return Found::Missing;
    };
    let attrs: Vec<&str> = src[..at].lines().rev().take(4).collect();
    if !attrs
        .iter()
        .any(|l| l.contains("#[test]") || l.contains("#[tokio::test"))
    {
        return Found::Missing;
    }
    let rest = &src[at..];
    let body = &rest[..rest.find("\n}\n").map_or(rest.len(), |e| e + 3)];
    if attrs.iter().any(|l| l.contains("#[ignore")) || body.contains("\"SKIPPED") {
        Found::CanSkip
    } else {
        Found::Runs
    }
}

/// What is wrong with the coverage map `map` against `readme`; `find(path, name)` says what
/// `path` (relative to the repository root) holds under `fn name(`. A row is wrong when it
/// names no test, names one that does not exist, or names only tests that can skip on CI.
fn problems(map: &str, readme: &str, find: impl Fn(&str, &str) -> Found) -> Vec<String> {
    let mut out = Vec::new();
    let mut claims = Vec::new();
    for (header, rows) in tables(map) {
        if header.last().is_none_or(|c| c != "Tests") {
            continue;
        }
        for row in rows {
            let claim = row.first().cloned().unwrap_or_default();
            let tests = row.last().map(String::as_str).unwrap_or_default();
            let named = code_spans(tests);
            if row.len() != header.len() || named.is_empty() {
                out.push(format!("row {claim:?} names no test"));
            }
            let mut runs = false;
            for t in &named {
                match t.rsplit_once("::") {
                    Some((path, name)) => match find(path, name) {
                        Found::Runs => runs = true,
                        Found::CanSkip => {}
                        Found::Missing => {
                            out.push(format!("row {claim:?}: no test `fn {name}(` in {path}"))
                        }
                    },
                    None => out.push(format!("row {claim:?}: {t:?} is not `path::function`")),
                }
            }
            if !named.is_empty() && !runs {
                out.push(format!("row {claim:?} names no test that runs on CI"));
            }
            claims.push(claim);
        }
    }
    let covered = |key: &str| {
        claims
            .iter()
            .any(|c| c == key || c.starts_with(&format!("{key}:")))
    };
    let mut keys = readme_keys(readme, "Failure");
    keys.extend(readme_keys(readme, "Command"));
    keys.extend(
        readme_keys(readme, "Code")
            .into_iter()
            .map(|c| format!("Exit code {c}")),
    );
    for key in keys {
        if !covered(&key) {
            out.push(format!(
                "the README's {key:?} has no row in docs/testing.md"
            ));
        }
    }
    out
}

#[test]
fn every_documented_behaviour_names_a_test_that_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |p: &str| {
        std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("cannot read {p}: {e}"))
    };
    let map = read("docs/testing.md");
    let readme = read("README.md");
    let find = |path: &str, name: &str| {
        std::fs::read_to_string(root.join(path)).map_or(Found::Missing, |src| find_test(&src, name))
    };
    // The README tables this check reads are where it expects them.
    for first in ["Failure", "Command", "Code"] {
        assert!(
            !readme_keys(&readme, first).is_empty(),
            "no README table starting with {first:?}"
        );
    }
    let problems = problems(&map, &readme, find);
    assert!(
        problems.is_empty(),
        "docs/testing.md is out of date:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_coverage_check_reports_empty_rows_missing_tests_skip_only_rows_and_uncovered_readme_rows() {
    let readme = "\
| Failure | What zerg does |
|---|---|
| A worker fails to spawn | retries |
| zergd is killed | readopts |

| Command | What it does |
|---|---|
| `zergctl service [install\\|print]` | writes a unit |

| Code | When |
|---|---|
| 6 | never |
| 64 | bad usage |
";
    let map = "\
| Behaviour | Where | Tests |
|---|---|---|
| A worker fails to spawn | README | `a.rs::spawn_retry` |
| `zergctl service [install\\|print]` | README | |
| Exit code 64: bad usage | README | `a.rs::gone`, `b.rs::usage` |
| zergd is killed | README | `c.rs::on_a_cluster`, `c.rs::ignored` |
";
    let find = |path: &str, name: &str| match (path, name) {
        ("a.rs", "spawn_retry") | ("b.rs", "usage") => Found::Runs,
        ("c.rs", _) => Found::CanSkip,
        _ => Found::Missing,
    };
    let p = problems(map, readme, find);
    assert_eq!(
        p,
        vec![
            "row \"`zergctl service [install\\\\|print]`\" names no test".to_string(),
            "row \"Exit code 64: bad usage\": no test `fn gone(` in a.rs".to_string(),
            "row \"zergd is killed\" names no test that runs on CI".to_string(),
            "the README's \"Exit code 6\" has no row in docs/testing.md".to_string(),
        ]
    );
}

#[test]
fn only_a_function_marked_as_a_test_counts_and_a_skip_of_its_own_is_seen() {
    let src = "fn helper() {}\n\n#[test]\nfn plain() {\n    if !docker_or_skip() {\n        return;\n    }\n}\n\n#[tokio::test(flavor = \"multi_thread\")]\n#[ignore = \"needs a cluster\"]\nasync fn asynchronous() {}\n\n#[test]\nfn quiet() {\n    if std::env::var_os(\"X\").is_none() {\n        eprintln!(\"SKIPPED: no X\");\n        return;\n    }\n}\n\n#[test]\nfn after() {}\n";
    assert_eq!(find_test(src, "plain"), Found::Runs);
    assert_eq!(find_test(src, "asynchronous"), Found::CanSkip);
    assert_eq!(find_test(src, "quiet"), Found::CanSkip);
    assert_eq!(find_test(src, "after"), Found::Runs);
    assert_eq!(find_test(src, "helper"), Found::Missing);
    assert_eq!(find_test(src, "missing"), Found::Missing);
}
