//! The `## Relevant Symbols` section of one task's prompt: which files, which of their symbols,
//! and in what order, within a byte budget.
//!
//! Files, most relevant first: the ones the task modifies, the ones it reads (a read directory
//! brings every indexed file under it), then the files those import, one hop out. A task that
//! only creates files gets the files beside the ones it creates, in the same language family
//! (the closest directory that has any). Symbols are then taken in order of their file's rank,
//! top-level definitions before nested ones, and, in imported files, exported definitions
//! before private ones, until the budget is spent; what did not fit is counted at the end.

use std::collections::HashSet;

use super::resolve::{dir_of, imported_files};
use super::{Language, SymbolIndex, clip};
use zerg_proto::graph::Files;

/// The heading the section starts with.
pub const SECTION_HEADING: &str = "## Relevant Symbols";

const INTRO: &str = "Definitions in the files this task touches and in the files those import, from zerg's symbol map of the task's base commit (`L12` is line 12). Read a file before you change it.\n";

/// The most files a read directory contributes.
const MAX_DIR_FILES: usize = 500;
/// Candidate lines stop being gathered past this many bytes (files come in rank order), so a
/// task that reads a huge directory costs little to rank.
const MAX_CANDIDATE_BYTES: usize = 1 << 20;

/// Why a file is in the section; the order is the rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    Modified,
    Read,
    InReadDir,
    Imported,
    Neighbour,
}

struct Pick {
    path: String,
    role: Role,
    why: String,
}

struct Candidate {
    file: usize,
    line: u32,
    text: String,
    key: (Role, u16, bool, usize, u32),
}

/// The section for a task with these files, at most `max_bytes` bytes long; empty when the
/// index has nothing for the task (or the budget cannot hold a single symbol).
pub fn task_section(index: &SymbolIndex, files: &Files, max_bytes: usize) -> String {
    let picks = pick_files(index, files);
    if picks.is_empty() {
        return String::new();
    }
    let mut candidates: Vec<Candidate> = Vec::new();
    let mut gathered = 0usize;
    for (fi, pick) in picks.iter().enumerate() {
        if gathered > MAX_CANDIDATE_BYTES.max(max_bytes.saturating_mul(16)) {
            break;
        }
        let Some(symbols) = index.get(&pick.path) else {
            continue;
        };
        let before = candidates.len();
        if !symbols.exports.is_empty() {
            candidates.push(Candidate {
                file: fi,
                line: 0,
                text: format!("- exports: {}\n", clip(&symbols.exports.join(", "), 240)),
                key: (pick.role, 0, false, fi, 0),
            });
        }
        for d in &symbols.definitions {
            let indent = "  ".repeat(usize::from(d.depth.min(8)));
            candidates.push(Candidate {
                file: fi,
                line: d.line,
                text: format!("{indent}- L{} {}\n", d.line, d.signature),
                key: (
                    pick.role,
                    d.depth.min(3),
                    pick.role >= Role::Imported && !d.exported,
                    fi,
                    d.line,
                ),
            });
        }
        gathered += candidates[before..]
            .iter()
            .map(|c| c.text.len())
            .sum::<usize>();
    }
    candidates.sort_by_key(|c| c.key);

    let head = format!("{SECTION_HEADING}\n{INTRO}");
    let reserve = footer(usize::MAX, max_bytes).len();
    let heading = |p: &Pick| format!("\n### {} ({})\n", p.path, clip(&p.why, 160));
    let mut used = head.len();
    let mut opened = vec![false; picks.len()];
    let mut chosen = vec![false; candidates.len()];
    let mut omitted = 0usize;
    for (i, c) in candidates.iter().enumerate() {
        let cost = c.text.len()
            + if opened[c.file] {
                0
            } else {
                heading(&picks[c.file]).len()
            };
        if used + cost + reserve <= max_bytes {
            used += cost;
            opened[c.file] = true;
            chosen[i] = true;
        } else {
            omitted += 1;
        }
    }
    if !chosen.iter().any(|c| *c) {
        return String::new();
    }
    let mut out = head;
    for (fi, pick) in picks.iter().enumerate() {
        if !opened[fi] {
            continue;
        }
        out.push_str(&heading(pick));
        let mut lines: Vec<&Candidate> = candidates
            .iter()
            .zip(&chosen)
            .filter(|(c, chosen)| **chosen && c.file == fi)
            .map(|(c, _)| c)
            .collect();
        lines.sort_by_key(|c| c.line);
        for c in lines {
            out.push_str(&c.text);
        }
    }
    if omitted > 0 {
        out.push_str(&footer(omitted, max_bytes));
    }
    out
}

fn footer(omitted: usize, max_bytes: usize) -> String {
    format!("\n({omitted} more symbols left out to stay within {max_bytes} bytes.)\n")
}

/// The files of the section, in rank order, each once.
fn pick_files(index: &SymbolIndex, files: &Files) -> Vec<Pick> {
    let mut picks: Vec<Pick> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut add = |picks: &mut Vec<Pick>, path: &str, role: Role, why: String| {
        if seen.insert(path.to_string()) {
            picks.push(Pick {
                path: path.to_string(),
                role,
                why,
            });
        }
    };
    for p in &files.modify {
        if index.get(p).is_some() {
            add(&mut picks, p, Role::Modified, "modified".into());
        }
    }
    for r in &files.read {
        if !r.ends_with('/') && index.get(r).is_some() {
            add(&mut picks, r, Role::Read, "read".into());
            continue;
        }
        let dir = if r.ends_with('/') {
            r.clone()
        } else {
            format!("{r}/")
        };
        for (p, _) in index.under(&dir).take(MAX_DIR_FILES) {
            add(&mut picks, p, Role::InReadDir, format!("in {dir}"));
        }
    }
    let seeds: Vec<String> = picks.iter().map(|p| p.path.clone()).collect();
    for seed in &seeds {
        let Some(symbols) = index.get(seed) else {
            continue;
        };
        for target in imported_files(index, seed, symbols) {
            add(
                &mut picks,
                &target,
                Role::Imported,
                format!("imported by {seed}"),
            );
        }
    }
    if picks.is_empty() {
        for created in &files.create {
            let family = crate::language_of(created).map(Language::family);
            let mut dir = dir_of(created);
            loop {
                let beside: Vec<String> = index
                    .under(dir)
                    .filter(|(p, s)| {
                        !p[dir.len()..].contains('/')
                            && family.is_none_or(|f| s.language.family() == f)
                            && !files.create.iter().any(|c| c == p)
                    })
                    .map(|(p, _)| p.to_string())
                    .collect();
                if !beside.is_empty() {
                    for p in beside {
                        add(&mut picks, &p, Role::Neighbour, format!("beside {created}"));
                    }
                    break;
                }
                if dir.is_empty() {
                    break;
                }
                dir = dir_of(&dir[..dir.len() - 1]);
            }
        }
    }
    picks
}
