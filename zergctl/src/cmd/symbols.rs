//! `zergctl symbols`: the repository symbol map, offline.
//!
//! Without `--task` it indexes the repository's HEAD (committed files only) with the
//! `symbols:` settings of `.zerg/config.yaml` and prints the map, or the part of it under the
//! given paths. With `--task FEATURE TASK_ID` it prints exactly the `## Relevant Symbols`
//! section zergd puts in that task's prompt, computed the same way: from the rush's staging
//! branch (`zerg/<feature>/staging`) when it exists, as zergd has it after the last merged
//! level, else from HEAD, as a new rush would start; with the rush's snapshots of the graph and
//! config when there is a rush, else with `.gsd/specs/<feature>/task-graph.json` and
//! `.zerg/config.yaml`. Both share zergd's cache (`.zerg/cache/symbols`).

use std::path::{Path, PathBuf};

use serde_json::json;
use zerg_symbols::{self as symbols, Cache, Settings, SymbolIndex};

use crate::{CliError, code, git};

/// Runs `zergctl symbols`.
pub fn run(
    paths: Vec<String>,
    task: Option<Vec<String>>,
    json: bool,
    repo: Option<PathBuf>,
) -> Result<u8, CliError> {
    let start = match &repo {
        Some(p) => p.clone(),
        None => std::env::current_dir().map_err(|e| {
            CliError::new(
                code::USAGE,
                format!("cannot read the current directory: {e}"),
            )
        })?,
    };
    let root = PathBuf::from(git(&start, &["rev-parse", "--show-toplevel"]).map_err(|_| {
        CliError::new(
            code::USAGE,
            format!("{} is not inside a git repository", start.display()),
        )
    })?);
    match task.as_deref() {
        Some([feature, task_id]) => task_section(&root, feature, task_id, json),
        Some(_) => Err(CliError::new(code::USAGE, "--task takes FEATURE TASK_ID")),
        None => {
            // Paths are relative to the current directory, like git's.
            let prefix = if repo.is_none() {
                git(&start, &["rev-parse", "--show-prefix"]).unwrap_or_default()
            } else {
                String::new()
            };
            map(&root, &prefix, &paths, json)
        }
    }
}

/// The `symbols:` section of a config file; the defaults when the file does not exist.
fn settings(path: &Path) -> Result<Settings, CliError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Settings::default()),
        Err(e) => {
            return Err(CliError::new(
                code::DATA,
                format!("cannot read {}: {e}", path.display()),
            ));
        }
    };
    let bad = |e: String| CliError::new(code::DATA, format!("{}: {e}", path.display()));
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let s = match doc.get("symbols") {
        None | Some(serde_yaml::Value::Null) => Settings::default(),
        Some(v) => serde_yaml::from_value(v.clone()).map_err(|e| bad(format!("symbols: {e}")))?,
    };
    s.check().map_err(bad)?;
    Ok(s)
}

fn index(root: &Path, rev: &str, settings: &Settings) -> Result<SymbolIndex, CliError> {
    let cache = Cache::in_repo(root);
    let git = zerg_git::Repo::open(root)
        .map_err(|e| CliError::new(code::FAILED, format!("cannot index {rev}: {e}")))?;
    symbols::build(&git, rev, settings, Some(&cache))
        .map(|(ix, _)| ix)
        .map_err(|e| CliError::new(code::FAILED, format!("cannot index {rev}: {e}")))
}

fn task_section(root: &Path, feature: &str, task_id: &str, json: bool) -> Result<u8, CliError> {
    zerg_proto::graph::validate_feature_name(feature)
        .map_err(|e| CliError::new(code::USAGE, format!("feature: {e}")))?;
    let rush_dir = root.join(".zerg").join("rush").join(feature);
    let staging = format!("refs/heads/zerg/{feature}/staging");
    let rev = match git(root, &["rev-parse", "--verify", "--quiet", &staging]) {
        Ok(commit) if !commit.is_empty() => commit,
        _ => "HEAD".to_string(),
    };
    let (graph_path, config_path) = if rush_dir.join("spec").is_dir() {
        (
            rush_dir.join("spec").join("task-graph.json"),
            rush_dir.join("config.yaml"),
        )
    } else {
        (
            root.join(".gsd")
                .join("specs")
                .join(feature)
                .join("task-graph.json"),
            root.join(".zerg").join("config.yaml"),
        )
    };
    let graph = zerg_proto::graph::load(&graph_path)
        .map_err(|e| CliError::new(code::DATA, format!("{}: {e}", graph_path.display())))?
        .graph;
    let Some(task) = graph.task(task_id) else {
        return Err(CliError::new(
            code::NOT_FOUND,
            format!("{} has no task {task_id}", graph_path.display()),
        ));
    };
    let settings = settings(&config_path)?;
    let section = if settings.enabled {
        let ix = index(root, &rev, &settings)?;
        symbols::task_section(&ix, &task.files, settings.max_bytes_per_task)
    } else {
        eprintln!(
            "symbols.enabled is false in {}: prompts have no Relevant Symbols section",
            config_path.display()
        );
        String::new()
    };
    if json {
        println!(
            "{}",
            json!({"feature": feature, "task": task_id, "rev": rev, "section": section})
        );
    } else {
        print!("{section}");
    }
    Ok(code::OK)
}

fn map(root: &Path, prefix: &str, paths: &[String], json: bool) -> Result<u8, CliError> {
    let settings = settings(&root.join(".zerg").join("config.yaml"))?;
    let ix = index(root, "HEAD", &settings)?;
    let mut chosen: Vec<(String, &symbols::FileSymbols)> = Vec::new();
    let mut unmatched = Vec::new();
    if paths.is_empty() {
        chosen.extend(ix.files().map(|(p, s)| (p.to_string(), s)));
    }
    for p in paths {
        let rel = normalize(&format!("{prefix}{p}"));
        let before = chosen.len();
        if let Some(s) = ix.get(&rel) {
            chosen.push((rel.clone(), s));
        } else {
            let dir = if rel.is_empty() {
                String::new()
            } else {
                format!("{}/", rel.trim_end_matches('/'))
            };
            chosen.extend(ix.under(&dir).map(|(p, s)| (p.to_string(), s)));
        }
        if chosen.len() == before {
            unmatched.push(p.clone());
        }
    }
    chosen.sort_by(|a, b| a.0.cmp(&b.0));
    chosen.dedup_by(|a, b| a.0 == b.0);
    for p in &unmatched {
        let why = match ix.skipped(&normalize(&format!("{prefix}{p}"))) {
            Some(r) => format!("skipped ({})", serde_json::to_value(r).unwrap_or_default()),
            None => "no indexed file there".to_string(),
        };
        eprintln!("warning: {p}: {}", why.replace('"', ""));
    }
    let c = ix.counts();
    if json {
        let files: serde_json::Map<String, serde_json::Value> = chosen
            .iter()
            .map(|(p, s)| (p.clone(), serde_json::to_value(s).unwrap_or_default()))
            .collect();
        println!(
            "{}",
            json!({"commit": ix.commit(), "counts": c, "files": files})
        );
    } else {
        for (p, s) in &chosen {
            print!("{}", render(p, s));
        }
        eprintln!(
            "{}: {} files, {} definitions; skipped {} in other languages, {} binary, {} over {} bytes, {} unparsable",
            &ix.commit()[..ix.commit().len().min(12)],
            c.indexed,
            c.definitions,
            c.other_language,
            c.binary,
            c.too_large,
            settings.max_file_bytes,
            c.unparsable
        );
    }
    Ok(if !unmatched.is_empty() && chosen.is_empty() {
        code::NOT_FOUND
    } else {
        code::OK
    })
}

/// One file of the map, for people.
fn render(path: &str, s: &symbols::FileSymbols) -> String {
    let mut out = format!("{path} ({})\n", s.language.name());
    if !s.imports.is_empty() {
        let list: Vec<String> = s
            .imports
            .iter()
            .map(|i| {
                if i.names.is_empty() {
                    i.from.clone()
                } else {
                    format!("{} ({})", i.from, i.names.join(", "))
                }
            })
            .collect();
        out.push_str(&format!("  imports: {}\n", list.join("; ")));
    }
    if !s.exports.is_empty() {
        out.push_str(&format!("  exports: {}\n", s.exports.join(", ")));
    }
    for d in &s.definitions {
        out.push_str(&format!(
            "{}  L{} {}\n",
            "  ".repeat(usize::from(d.depth.min(8))),
            d.line,
            d.signature
        ));
    }
    out
}

/// A repository-relative path with `.` and `..` resolved (never above the root).
fn normalize(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    let mut out = parts.join("/");
    if p.ends_with('/') && !out.is_empty() {
        out.push('/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_within_the_repository() {
        assert_eq!(normalize("src/./a/../b.rs"), "src/b.rs");
        assert_eq!(normalize("web/"), "web/");
        assert_eq!(normalize("../../etc/passwd"), "etc/passwd");
        assert_eq!(normalize("."), "");
    }

    #[test]
    fn settings_come_from_the_symbols_section_with_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.yaml");
        assert_eq!(settings(&p).unwrap(), Settings::default());
        std::fs::write(&p, "workers: {retry_attempts: 2}\nsymbols:\n  languages: [rust]\n  max_bytes_per_task: 900\n").unwrap();
        let s = settings(&p).unwrap();
        assert_eq!(s.languages, [symbols::Language::Rust]);
        assert_eq!(s.max_bytes_per_task, 900);
        assert!(s.enabled);
        std::fs::write(&p, "symbols: {languages: [cobol]}\n").unwrap();
        let e = settings(&p).unwrap_err();
        assert!(
            e.message.contains("symbols") && e.message.contains("cobol"),
            "{}",
            e.message
        );
        assert_eq!(e.code, code::DATA);
        std::fs::write(&p, "symbols: {max_file_bytes: 0}\n").unwrap();
        assert!(
            settings(&p)
                .unwrap_err()
                .message
                .contains("symbols.max_file_bytes")
        );
    }
}
