//! The task-graph file format (`.gsd/specs/<feature>/task-graph.json`) and its validation.
//!
//! A graph is read with [`load`] (or [`parse`] for bytes already in memory). Each task is
//! parsed into a [`serde_json::Value`] and walked by hand as the parser reaches it (then
//! dropped, so a large graph is never held twice), so that every problem in the file is
//! collected instead of stopping at the first one. Problems that would make the graph
//! unsafe or impossible to run are errors and refuse the graph ([`GraphError::Invalid`]);
//! problems that only affect informational fields or graph hygiene are warnings, returned
//! beside the graph in [`Validated`]. Unknown keys are ignored everywhere, so graphs written
//! by newer or older planners (with `phase`, `conflict_matrix`, `files.delete`, `steps`, ...)
//! still load.
//!
//! Text that reaches the agent's command line (a task's title, description, context,
//! acceptance criteria and verification command) must not contain NUL characters, which no
//! command-line argument can hold. Validation never recurses over the tasks and its work grows
//! linearly with the graph: dependency cycles are found iteratively and only the first few are
//! listed, so a hostile graph cannot exhaust the stack or the memory.
//!
//! The rules follow the original ZERG tool with these differences: file ownership is exclusive
//! only within a level (tasks of different levels may touch the same file), file paths must
//! be relative and normalised, levels must be contiguous from 1, and graph-hygiene findings
//! (unreachable and orphan tasks, `consumers` without an `integration_test`, unknown
//! consumers) are warnings rather than errors.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// Maximum length of a task id, in characters.
pub const MAX_TASK_ID_LEN: usize = 64;

/// Maximum length of a feature name, in characters.
pub const MAX_FEATURE_NAME_LEN: usize = 100;

/// Verification timeout used when a task's `verification` has no `timeout_seconds`.
pub const DEFAULT_VERIFICATION_TIMEOUT_SECONDS: u64 = 30;

/// A parsed and validated task graph.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TaskGraph {
    /// Feature name; used in paths, branch names and the state file name.
    pub feature: String,
    /// Free-form format version (`"1.0"`, `"2.0"` in practice); not interpreted.
    pub version: Option<String>,
    /// The tasks, in file order.
    pub tasks: Vec<Task>,
}

/// One task of a [`TaskGraph`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Task {
    /// Unique task id, e.g. `AUTH-L1-001`.
    pub id: String,
    /// Short human-readable title.
    pub title: String,
    /// Longer description; `""` when absent.
    pub description: String,
    /// Level (1-based). All tasks of a level run in parallel once lower levels are done.
    pub level: u32,
    /// Ids of tasks (all at lower levels) that must complete before this one.
    pub dependencies: Vec<String>,
    /// Files the task creates, modifies and reads.
    pub files: Files,
    /// Command run after the agent finishes, if any.
    pub verification: Option<Verification>,
    /// Planner's estimate, in minutes.
    pub estimate_minutes: Option<u32>,
    /// Ids of tasks that consume this task's output (informational).
    pub consumers: Vec<String>,
    /// Integration test path covering this task's consumers (informational).
    pub integration_test: Option<String>,
    /// Scoped context; when present it replaces the spec context in the prompt.
    pub context: Option<String>,
    /// Acceptance criteria (a single string in the file becomes one entry).
    pub acceptance_criteria: Vec<String>,
}

/// The files a task touches. Paths are relative to the repository root and normalised.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Files {
    /// Files the task creates (owned by the task within its level).
    pub create: Vec<String>,
    /// Files the task modifies (owned by the task within its level).
    pub modify: Vec<String>,
    /// Files the task only reads (unrestricted).
    pub read: Vec<String>,
}

/// A task's verification command.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Verification {
    /// Shell command to run.
    pub command: String,
    /// Timeout in seconds ([`DEFAULT_VERIFICATION_TIMEOUT_SECONDS`] when absent).
    pub timeout_seconds: u64,
}

/// One finding. `task` is the task id (or `tasks[i]` when the id itself is missing/invalid),
/// `field` the JSON field path, e.g. "dependencies", "files.create[2]", "level", "feature".
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    /// Task the finding is about, or `None` for graph-level findings.
    pub task: Option<String>,
    /// JSON field path within the task (or the graph when `task` is `None`); may be empty
    /// when the finding is about the whole document.
    pub field: String,
    /// Human-readable description of the problem.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.task, self.field.is_empty()) {
            (Some(task), false) => {
                write!(f, "task {task}, field `{}`: {}", self.field, self.message)
            }
            (Some(task), true) => write!(f, "task {task}: {}", self.message),
            (None, false) => write!(f, "field `{}`: {}", self.field, self.message),
            (None, true) => f.write_str(&self.message),
        }
    }
}

/// A graph that passed validation, with the non-fatal findings.
#[derive(Debug, Clone)]
pub struct Validated {
    /// The graph.
    pub graph: TaskGraph,
    /// Warnings found while validating; they do not refuse the graph.
    pub warnings: Vec<Diagnostic>,
}

/// Why a task graph could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Io {
        /// File that was being read.
        path: PathBuf,
        /// Underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid JSON.
    #[error("{path}:{line}:{column}: invalid JSON: {message}")]
    Syntax {
        /// File that was parsed.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// Parser message, without the position.
        message: String,
    },
    /// The JSON is well formed but the graph breaks one or more rules.
    #[error("{path}: task graph is invalid ({} errors)", errors.len())]
    Invalid {
        /// File that was parsed.
        path: PathBuf,
        /// Every error found (never empty).
        errors: Vec<Diagnostic>,
        /// Warnings found alongside the errors.
        warnings: Vec<Diagnostic>,
    },
}

/// Reads and validates the task graph at `path`.
pub fn load(path: &Path) -> Result<Validated, GraphError> {
    let bytes = std::fs::read(path).map_err(|source| GraphError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&bytes, path)
}

/// Parses and validates a task graph from `bytes`. `path` is used only in error messages.
pub fn parse(bytes: &[u8], path: &Path) -> Result<Validated, GraphError> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let doc = read_document(bytes).map_err(|e| GraphError::Syntax {
        path: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: strip_position(&e),
    })?;
    let mut cx = Collector::default();
    let graph = check_document(doc, &mut cx);
    match graph {
        Some(graph) if cx.errors.is_empty() => Ok(Validated {
            graph,
            warnings: cx.warnings,
        }),
        _ => Err(GraphError::Invalid {
            path: path.to_path_buf(),
            errors: cx.errors,
            warnings: cx.warnings,
        }),
    }
}

/// Checks a feature name: `[A-Za-z0-9][A-Za-z0-9_-]*`, at most [`MAX_FEATURE_NAME_LEN`]
/// characters. The error message names the rule that was broken.
pub fn validate_feature_name(name: &str) -> Result<(), String> {
    let Some(first) = name.chars().next() else {
        return Err("feature name must not be empty".to_owned());
    };
    let len = name.chars().count();
    if len > MAX_FEATURE_NAME_LEN {
        return Err(format!(
            "feature name is {len} characters long; at most {MAX_FEATURE_NAME_LEN} are allowed"
        ));
    }
    if !first.is_ascii_alphanumeric() {
        return Err(format!(
            "feature name must start with a letter or digit, not {first:?}"
        ));
    }
    if let Some(bad) = name.chars().find(|c| !is_word_char(*c)) {
        return Err(format!(
            "feature name may contain only ASCII letters, digits, '_' and '-' (found {bad:?}); \
             it must match [A-Za-z0-9][A-Za-z0-9_-]*"
        ));
    }
    Ok(())
}

/// Checks a task id: `^[A-Za-z][A-Za-z0-9_-]{0,63}$` (so `TASK-001`, `T1` and `RES-L2-001`
/// pass, while `T1.1`, `1abc` and `a;b` fail). The error message names the rule.
pub fn validate_task_id(id: &str) -> Result<(), String> {
    let Some(first) = id.chars().next() else {
        return Err("task id must not be empty".to_owned());
    };
    let len = id.chars().count();
    if len > MAX_TASK_ID_LEN {
        return Err(format!(
            "task id is {len} characters long; at most {MAX_TASK_ID_LEN} are allowed"
        ));
    }
    if !first.is_ascii_alphabetic() {
        return Err(format!(
            "task id must start with an ASCII letter, not {first:?}"
        ));
    }
    if let Some(bad) = id.chars().find(|c| !is_word_char(*c)) {
        return Err(format!(
            "task id may contain only ASCII letters, digits, '_' and '-' (found {bad:?}); \
             it must match [A-Za-z][A-Za-z0-9_-]{{0,63}}"
        ));
    }
    Ok(())
}

/// The level encoded in a task id: the first `-L<digits>-` in it. `"RES-L2-001"` gives 2,
/// `"A-L10-x"` gives 10, `"T1"` gives `None`.
pub fn level_from_id(id: &str) -> Option<u32> {
    let bytes = id.as_bytes();
    let mut start = 0;
    while let Some(pos) = id[start..].find("-L") {
        let digits_start = start + pos + 2;
        let digits_end = digits_start
            + bytes[digits_start..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
        if digits_end > digits_start
            && bytes.get(digits_end) == Some(&b'-')
            && let Ok(level) = id[digits_start..digits_end].parse::<u32>()
        {
            return Some(level);
        }
        start = start + pos + 1;
    }
    None
}

/// Checks one path from `files.create` or `files.modify`: it must be relative, normalised (no
/// empty, `.` or `..` components, no trailing `/`, no backslashes) and must not be inside a
/// `.git` directory (any component equal to `.git`, compared case-insensitively).
pub fn validate_file_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("path must not be empty".to_owned());
    }
    if path.starts_with('/') {
        return Err(format!(
            "path '{path}' must be relative to the repository root, not absolute"
        ));
    }
    if path.contains('\\') {
        return Err(format!(
            "path '{path}' must use '/' separators, not backslashes"
        ));
    }
    if path.chars().any(char::is_control) {
        return Err(format!("path {path:?} must not contain control characters"));
    }
    if path.ends_with('/') {
        return Err(format!("path '{path}' must not end with '/'"));
    }
    for component in path.split('/') {
        match component {
            "" => {
                return Err(format!(
                    "path '{path}' must not contain empty components ('//')"
                ));
            }
            "." | ".." => {
                return Err(format!(
                    "path '{path}' must be normalised (no '.' or '..' components)"
                ));
            }
            c if c.eq_ignore_ascii_case(".git") => {
                return Err(format!(
                    "path '{path}' must not be inside the .git directory"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks one path from `files.read`: as [`validate_file_path`], except that it may name a
/// whole directory with a trailing `/` (`"src/"`), as the original's design step writes.
pub fn validate_read_path(path: &str) -> Result<(), String> {
    match path.strip_suffix('/') {
        Some(dir) if !dir.is_empty() && !dir.ends_with('/') => validate_file_path(dir)
            .map_err(|e| e.replace(&format!("'{dir}'"), &format!("'{path}'"))),
        _ => validate_file_path(path),
    }
}

impl TaskGraph {
    /// Tasks grouped by level, each group in graph order.
    pub fn levels(&self) -> BTreeMap<u32, Vec<&Task>> {
        let mut levels: BTreeMap<u32, Vec<&Task>> = BTreeMap::new();
        for task in &self.tasks {
            levels.entry(task.level).or_default().push(task);
        }
        levels
    }

    /// The highest level (0 for a graph without tasks).
    pub fn max_level(&self) -> u32 {
        self.tasks.iter().map(|t| t.level).max().unwrap_or(0)
    }

    /// The task with id `id`.
    pub fn task(&self, id: &str) -> Option<&Task> {
        self.tasks.iter().find(|t| t.id == id)
    }

    /// Ids of every task that transitively depends on `id` (not including `id` itself),
    /// sorted by level and then graph order.
    pub fn dependents_closure(&self, id: &str) -> Vec<String> {
        let mut dependents: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, task) in self.tasks.iter().enumerate() {
            for dep in &task.dependencies {
                dependents.entry(dep.as_str()).or_default().push(i);
            }
        }
        let mut seen: BTreeSet<usize> = BTreeSet::new();
        let mut queue: Vec<&str> = vec![id];
        while let Some(current) = queue.pop() {
            for &i in dependents
                .get(current)
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                if self.tasks[i].id != id && seen.insert(i) {
                    queue.push(&self.tasks[i].id);
                }
            }
        }
        let mut found: Vec<usize> = seen.into_iter().collect();
        found.sort_by_key(|&i| (self.tasks[i].level, i));
        found
            .into_iter()
            .map(|i| self.tasks[i].id.clone())
            .collect()
    }
}

mod checks;
mod read;
mod relevel;
#[cfg(test)]
mod tests;

use checks::*;
use read::*;
pub use relevel::{Moved, relevel};
