//! The repository symbol map: what each source file of a commit defines, imports and exports,
//! so that a task's prompt can show the code around the task without the agent reading whole
//! files.
//!
//! An index ([`SymbolIndex`]) is built from a commit's git objects, never from a working tree:
//! [`build`] lists the commit's tree, reads the blobs of the files in a supported language
//! ([`Language`]) and parses them with tree-sitter ([`extract`]); [`update`] moves an index to a
//! later commit, parsing only the files whose blob changed. Every parsed file is kept in a
//! [`Cache`] keyed by its blob id, so a second index of the same code parses nothing. Files in
//! other languages, binary files, files over [`Settings::max_file_bytes`] and files the parser
//! gives up on are skipped and counted ([`Counts`]).
//!
//! [`task_section`] turns an index and a task's files into the prompt's `## Relevant Symbols`
//! section: the symbols of the files the task modifies and reads, then of the files those import
//! (one hop, resolved per language), ranked and cut to a byte budget. zergd computes it when it
//! leases a task; `zergctl symbols --task` computes the same section offline.
//!
//! Repository files are treated as hostile input: nothing here panics or recurses on their
//! content, and every name, signature and list kept from a file is bounded.

mod cache;
mod extract;
mod rank;
mod resolve;
mod source;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use cache::Cache;
pub use extract::{Grammar, extract};
pub use rank::{SECTION_HEADING, task_section};
/// The `symbols:` section of `.zerg/config.yaml` and the languages it names are plain settings,
/// defined with the rest of the config.
pub use zerg_config::{Language, SymbolsConfig as Settings};

/// What kind of thing a definition is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A free function (or a function-valued constant in JavaScript and TypeScript).
    Function,
    /// A function inside a class, an `impl` block, a trait, an interface, or a Go method.
    Method,
    /// A class.
    Class,
    /// A struct.
    Struct,
    /// An enum.
    Enum,
    /// A trait.
    Trait,
    /// An interface.
    Interface,
    /// A Rust `impl` block (its methods are nested under it).
    Impl,
    /// A type alias or a Go named type that is neither a struct nor an interface.
    Type,
    /// A module or namespace declared inline.
    Module,
}

/// One definition of a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Definition {
    /// What it is.
    pub kind: Kind,
    /// Its name (for an `impl` block, the type it is for).
    pub name: String,
    /// Its signature on one line: the source from its start to its body, whitespace collapsed,
    /// at most [`MAX_SIGNATURE`] bytes.
    pub signature: String,
    /// 1-based line of its start (of the `def`, not of a decorator).
    pub line: u32,
    /// 0 at the top level, 1 inside a class or `impl` block, and so on.
    pub depth: u16,
    /// The enclosing definition's name; empty at the top level.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent: String,
    /// Whether it is visible outside its module (`pub`, `export`, a capitalised Go name, a
    /// Python name without a leading underscore or listed in `__all__`).
    pub exported: bool,
}

/// One import of a file, as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Import {
    /// The module: `.models`, `./api`, `crate::config`, `github.com/acme/app/auth`. A Rust
    /// `mod name;` declaration is recorded as `self::name`.
    pub from: String,
    /// The names imported from it (`from m import a, b`, `import { a, b } from './m'`);
    /// empty for a whole-module import.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

/// What one file defines, imports and exports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSymbols {
    /// Its language.
    pub language: Language,
    /// Its definitions, in source order.
    pub definitions: Vec<Definition>,
    /// Its imports (module level), in source order.
    pub imports: Vec<Import>,
    /// Names it exports beyond its exported definitions: export lists and re-exports
    /// (`* from './api'`, `formatPrice from './format'`, `default`), Python's `__all__`,
    /// Rust's `pub use` paths.
    pub exports: Vec<String>,
    /// Whether a per-file limit ([`MAX_DEFINITIONS`], [`MAX_IMPORTS`]) cut the lists short.
    #[serde(default)]
    pub truncated: bool,
}

/// The longest signature kept, in bytes; longer ones end in `…`.
pub const MAX_SIGNATURE: usize = 200;
/// The longest name kept, in bytes.
pub const MAX_NAME: usize = 120;
/// The most definitions kept per file.
pub const MAX_DEFINITIONS: usize = 2000;
/// The most imports (and, separately, exports) kept per file.
pub const MAX_IMPORTS: usize = 500;

/// The settings that decide which files an index holds: two indexes built with equal keys
/// from the same commit are equal.
fn index_key(settings: &Settings) -> String {
    let mut langs: Vec<&str> = settings.languages.iter().map(|l| l.name()).collect();
    langs.sort_unstable();
    langs.dedup();
    format!("{}:{}", langs.join(","), settings.max_file_bytes)
}

/// The language of a path, from its extension.
pub fn language_of(path: &str) -> Option<Language> {
    Grammar::of_path(path).map(Grammar::language)
}

/// Why a file of the tree is not in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// Not in an indexed language (or not a regular file: a symlink, a submodule).
    OtherLanguage,
    /// Holds a NUL byte in its first 8000 bytes.
    Binary,
    /// Larger than `symbols.max_file_bytes`.
    TooLarge,
    /// The parser gave up on it (it took too long).
    Unparsable,
}

/// How many files an index holds and skipped, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Files in the index.
    pub indexed: usize,
    /// Definitions in the index.
    pub definitions: usize,
    /// Skipped: other languages.
    pub other_language: usize,
    /// Skipped: binary.
    pub binary: usize,
    /// Skipped: over the size limit.
    pub too_large: usize,
    /// Skipped: the parser gave up.
    pub unparsable: usize,
}

/// What building or updating an index did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildStats {
    /// Files parsed.
    pub parsed: usize,
    /// Files taken from the cache.
    pub cached: usize,
    /// Files kept from the previous index because their blob did not change.
    pub reused: usize,
    /// Tree entries whose blob changed or appeared (an update), or every entry (a build).
    pub changed: usize,
}

/// One file of an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The git blob id of its content.
    pub blob: String,
    /// Its symbols.
    pub symbols: Arc<FileSymbols>,
}

/// The symbol map of one commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SymbolIndex {
    commit: String,
    key: String,
    files: BTreeMap<String, Entry>,
    skipped: BTreeMap<String, (String, SkipReason)>,
}

/// An index could not be built.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SymbolError(pub String);

impl SymbolIndex {
    /// An empty index of `commit` (tests and tools fill it with [`SymbolIndex::insert`]).
    pub fn new(commit: &str) -> SymbolIndex {
        SymbolIndex {
            commit: commit.to_string(),
            ..Default::default()
        }
    }

    /// The commit it describes; empty for an index not built from git.
    pub fn commit(&self) -> &str {
        &self.commit
    }

    /// Adds (or replaces) one file.
    pub fn insert(&mut self, path: &str, blob: &str, symbols: FileSymbols) {
        self.skipped.remove(path);
        self.files.insert(
            path.to_string(),
            Entry {
                blob: blob.to_string(),
                symbols: Arc::new(symbols),
            },
        );
    }

    /// The symbols of one file, if it is indexed.
    pub fn get(&self, path: &str) -> Option<&FileSymbols> {
        self.files.get(path).map(|e| e.symbols.as_ref())
    }

    /// Every indexed file, by path.
    pub fn files(&self) -> impl Iterator<Item = (&str, &FileSymbols)> {
        self.files
            .iter()
            .map(|(p, e)| (p.as_str(), e.symbols.as_ref()))
    }

    /// Indexed files under a directory (`dir` ends with `/`; empty means the root), by path.
    pub fn under<'a>(&'a self, dir: &str) -> impl Iterator<Item = (&'a str, &'a FileSymbols)> + 'a {
        let dir = dir.to_string();
        self.files
            .range::<str, _>((
                std::ops::Bound::Included(dir.as_str()),
                std::ops::Bound::Unbounded,
            ))
            .take_while(move |(p, _)| p.starts_with(&dir))
            .map(|(p, e)| (p.as_str(), e.symbols.as_ref()))
    }

    /// Why a path of the tree is not indexed, if it was skipped.
    pub fn skipped(&self, path: &str) -> Option<SkipReason> {
        self.skipped.get(path).map(|(_, r)| *r)
    }

    /// Totals.
    pub fn counts(&self) -> Counts {
        let mut c = Counts {
            indexed: self.files.len(),
            definitions: self
                .files
                .values()
                .map(|e| e.symbols.definitions.len())
                .sum(),
            ..Default::default()
        };
        for (_, r) in self.skipped.values() {
            match r {
                SkipReason::OtherLanguage => c.other_language += 1,
                SkipReason::Binary => c.binary += 1,
                SkipReason::TooLarge => c.too_large += 1,
                SkipReason::Unparsable => c.unparsable += 1,
            }
        }
        c
    }
}

/// Builds the index of `commit` in `repo` (opened at any worktree of it), taking what
/// it can from `cache` and adding what it parses.
pub fn build(
    repo: &zerg_git::Repo,
    commit: &str,
    settings: &Settings,
    cache: Option<&Cache>,
) -> Result<(SymbolIndex, BuildStats), SymbolError> {
    let commit = source::resolve_commit(repo, commit)?;
    let entries = source::list_tree(repo, &commit)?;
    let mut index = SymbolIndex {
        commit,
        key: index_key(settings),
        ..Default::default()
    };
    let mut stats = BuildStats {
        changed: entries.len(),
        ..Default::default()
    };
    fill(repo, &mut index, entries, settings, cache, &mut stats)?;
    Ok((index, stats))
}

/// Moves `previous` to `commit`: only the files whose blob changed between the two commits are
/// read again (from the cache, or parsed). Falls back to [`build`] when `previous` was not built
/// from git or with other settings.
pub fn update(
    previous: &SymbolIndex,
    repo: &zerg_git::Repo,
    commit: &str,
    settings: &Settings,
    cache: Option<&Cache>,
) -> Result<(SymbolIndex, BuildStats), SymbolError> {
    if previous.commit.is_empty() || previous.key != index_key(settings) {
        return build(repo, commit, settings, cache);
    }
    let commit = source::resolve_commit(repo, commit)?;
    let changes = source::diff_trees(repo, &previous.commit, &commit)?;
    let mut index = previous.clone();
    index.commit = commit;
    let mut changed = Vec::new();
    for (path, entry) in changes {
        index.files.remove(&path);
        index.skipped.remove(&path);
        if let Some(e) = entry {
            changed.push(e);
        }
    }
    let mut stats = BuildStats {
        changed: changed.len(),
        ..Default::default()
    };
    fill(repo, &mut index, changed, settings, cache, &mut stats)?;
    stats.reused = index
        .files
        .len()
        .saturating_sub(stats.parsed + stats.cached);
    Ok((index, stats))
}

/// Classifies tree entries, then fills the index from the cache and the parser.
fn fill(
    repo: &zerg_git::Repo,
    index: &mut SymbolIndex,
    entries: Vec<zerg_git::TreeBlob>,
    settings: &Settings,
    cache: Option<&Cache>,
    stats: &mut BuildStats,
) -> Result<(), SymbolError> {
    let mut wanted: Vec<(zerg_git::TreeBlob, Grammar)> = Vec::new();
    for e in entries {
        let grammar = Grammar::of_path(&e.path)
            .filter(|g| e.regular && settings.languages.contains(&g.language()));
        let Some(grammar) = grammar else {
            index
                .skipped
                .insert(e.path, (e.id, SkipReason::OtherLanguage));
            continue;
        };
        if e.size > settings.max_file_bytes {
            index.skipped.insert(e.path, (e.id, SkipReason::TooLarge));
            continue;
        }
        if let Some(symbols) = cache.and_then(|c| c.get(&e.id, grammar)) {
            stats.cached += 1;
            index.files.insert(
                e.path,
                Entry {
                    blob: e.id,
                    symbols: Arc::new(symbols),
                },
            );
            continue;
        }
        wanted.push((e, grammar));
    }
    let blobs: Vec<String> = wanted.iter().map(|(e, _)| e.id.clone()).collect();
    let parsed = source::parse_blobs(repo, &blobs, wanted.iter().map(|(_, g)| *g).collect())?;
    for ((e, grammar), outcome) in wanted.into_iter().zip(parsed) {
        match outcome {
            Ok(symbols) => {
                stats.parsed += 1;
                if let Some(c) = cache {
                    // A cache that cannot be written only costs a parse next time.
                    let _ = c.put(&e.id, grammar, &symbols);
                }
                index.files.insert(
                    e.path,
                    Entry {
                        blob: e.id,
                        symbols: Arc::new(symbols),
                    },
                );
            }
            Err(reason) => {
                index.skipped.insert(e.path, (e.id, reason));
            }
        }
    }
    Ok(())
}

/// Cuts `s` to at most `max` bytes on a character boundary, ending in `…` when cut.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max.saturating_sub('…'.len_utf8());
    while cut > 0 && !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &s[..cut])
}

#[cfg(test)]
mod tests;
