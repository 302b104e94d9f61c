//! The task-graph file format (`.gsd/specs/<feature>/task-graph.json`) and its validation.
//!
//! A graph is read with [`load`] (or [`parse`] for bytes already in memory). The JSON is first
//! parsed into a [`serde_json::Value`] and then walked by hand, so that every problem in the
//! file is collected instead of stopping at the first one. Problems that would make the graph
//! unsafe or impossible to run are errors and refuse the graph ([`GraphError::Invalid`]);
//! problems that only affect informational fields or graph hygiene are warnings, returned
//! beside the graph in [`Validated`]. Unknown keys are ignored everywhere, so graphs written
//! by newer or older planners (with `phase`, `conflict_matrix`, `files.delete`, `steps`, ...)
//! still load.
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
    let value: Value = serde_json::from_slice(bytes).map_err(|e| GraphError::Syntax {
        path: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: strip_position(&e),
    })?;
    let mut cx = Collector::default();
    let graph = check_document(&value, &mut cx);
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

/// Checks one path from `files.create`, `files.modify` or `files.read`: it must be relative,
/// normalised (no empty, `.` or `..` components, no trailing `/`, no backslashes) and must not
/// be inside a `.git` directory (any component equal to `.git`, compared case-insensitively).
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

// ---------------------------------------------------------------------------------------------
// Validation internals
// ---------------------------------------------------------------------------------------------

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// serde_json's message without its trailing " at line L column C".
fn strip_position(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    full.strip_suffix(&suffix)
        .map(str::to_owned)
        .unwrap_or(full)
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[derive(Default)]
struct Collector {
    errors: Vec<Diagnostic>,
    warnings: Vec<Diagnostic>,
}

impl Collector {
    fn error(&mut self, task: Option<&str>, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(Diagnostic {
            task: task.map(str::to_owned),
            field: field.into(),
            message: message.into(),
        });
    }

    fn warn(&mut self, task: Option<&str>, field: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Diagnostic {
            task: task.map(str::to_owned),
            field: field.into(),
            message: message.into(),
        });
    }
}

/// A task as far as it could be read; fields that were missing or wrong are `None`/empty.
struct Draft {
    /// `tasks[i]` index.
    index: usize,
    /// Label used in diagnostics: the id when valid, otherwise `tasks[i]`.
    label: String,
    /// The id, when it is a valid id.
    id: Option<String>,
    title: Option<String>,
    description: String,
    level: Option<u32>,
    /// Dependencies as (position in the JSON list, id), duplicates removed.
    dependencies: Vec<(usize, String)>,
    /// Files per kind as (position in the JSON list, path).
    create: Vec<(usize, String)>,
    modify: Vec<(usize, String)>,
    read: Vec<(usize, String)>,
    verification: Option<Verification>,
    estimate_minutes: Option<u32>,
    consumers: Vec<(usize, String)>,
    integration_test: Option<String>,
    context: Option<String>,
    acceptance_criteria: Vec<String>,
}

impl Draft {
    fn label(&self) -> Option<&str> {
        Some(&self.label)
    }

    fn into_task(self) -> Option<Task> {
        let strip = |v: Vec<(usize, String)>| v.into_iter().map(|(_, s)| s).collect::<Vec<_>>();
        Some(Task {
            id: self.id?,
            title: self.title?,
            description: self.description,
            level: self.level?,
            dependencies: strip(self.dependencies),
            files: Files {
                create: strip(self.create),
                modify: strip(self.modify),
                read: strip(self.read),
            },
            verification: self.verification,
            estimate_minutes: self.estimate_minutes,
            consumers: strip(self.consumers),
            integration_test: self.integration_test,
            context: self.context,
            acceptance_criteria: self.acceptance_criteria,
        })
    }
}

/// Validates the whole document. Returns the graph when it could be assembled; the caller
/// refuses it anyway if any error was collected.
fn check_document(value: &Value, cx: &mut Collector) -> Option<TaskGraph> {
    let Some(root) = value.as_object() else {
        cx.error(
            None,
            "",
            format!("task graph must be a JSON object, not {}", json_type(value)),
        );
        return None;
    };

    let feature = match root.get("feature") {
        None => {
            cx.error(None, "feature", "missing required field");
            None
        }
        Some(Value::String(s)) => match validate_feature_name(s) {
            Ok(()) => Some(s.clone()),
            Err(message) => {
                cx.error(None, "feature", message);
                None
            }
        },
        Some(other) => {
            cx.error(
                None,
                "feature",
                format!("must be a string, not {}", json_type(other)),
            );
            None
        }
    };

    let version = match root.get("version") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            cx.warn(
                None,
                "version",
                format!("should be a string, not {}; ignored", json_type(other)),
            );
            None
        }
    };

    let drafts: Vec<Draft> = match root.get("tasks") {
        None => {
            cx.error(None, "tasks", "missing required field");
            Vec::new()
        }
        Some(Value::Array(items)) if items.is_empty() => {
            cx.error(None, "tasks", "must be a non-empty list");
            Vec::new()
        }
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| read_task(i, item, cx))
            .collect(),
        Some(other) => {
            cx.error(
                None,
                "tasks",
                format!("must be a non-empty list, not {}", json_type(other)),
            );
            Vec::new()
        }
    };

    check_cross_task(&drafts, cx);

    if let Some(levels) = root.get("levels") {
        check_levels_object(levels, &drafts, cx);
    }

    let feature = feature?;
    let tasks = drafts
        .into_iter()
        .map(Draft::into_task)
        .collect::<Option<Vec<_>>>()?;
    Some(TaskGraph {
        feature,
        version,
        tasks,
    })
}

/// Reads a list of strings; reports a wrong container type or wrong element types as errors
/// (when `fatal`) or warnings. Returns `None` when the list is unusable.
fn read_string_list(
    value: &Value,
    task: Option<&str>,
    field: &str,
    fatal: bool,
    cx: &mut Collector,
) -> Option<Vec<(usize, String)>> {
    let report = |cx: &mut Collector, field: String, message: String| {
        if fatal {
            cx.error(task, field, message);
        } else {
            cx.warn(task, field, format!("{message}; ignored"));
        }
    };
    let Value::Array(items) = value else {
        report(
            cx,
            field.to_owned(),
            format!("must be a list of strings, not {}", json_type(value)),
        );
        return None;
    };
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::String(s) => out.push((i, s.clone())),
            other => {
                report(
                    cx,
                    format!("{field}[{i}]"),
                    format!("must be a string, not {}", json_type(other)),
                );
                ok = false;
            }
        }
    }
    // An informational list with a bad element is ignored as a whole; a fatal one has already
    // refused the graph, so keeping the good elements only helps the cross-task checks.
    (ok || fatal).then_some(out)
}

fn read_task(index: usize, value: &Value, cx: &mut Collector) -> Option<Draft> {
    let Some(obj) = value.as_object() else {
        cx.error(
            None,
            format!("tasks[{index}]"),
            format!("task must be an object, not {}", json_type(value)),
        );
        return None;
    };
    let position = format!("tasks[{index}]");

    // id first, because it names the task in every other diagnostic.
    let id = match obj.get("id") {
        None => {
            cx.error(Some(&position), "id", "missing required field");
            None
        }
        Some(Value::String(s)) => match validate_task_id(s) {
            Ok(()) => Some(s.clone()),
            Err(message) => {
                cx.error(Some(&position), "id", format!("{message} (got {s:?})"));
                None
            }
        },
        Some(other) => {
            cx.error(
                Some(&position),
                "id",
                format!("must be a string, not {}", json_type(other)),
            );
            None
        }
    };
    let label = id.clone().unwrap_or(position);
    let task = Some(label.as_str());

    let title = match obj.get("title") {
        None => {
            cx.error(task, "title", "missing required field");
            None
        }
        Some(Value::String(s)) if s.trim().is_empty() => {
            cx.error(task, "title", "must be a non-empty string");
            None
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            cx.error(
                task,
                "title",
                format!("must be a non-empty string, not {}", json_type(other)),
            );
            None
        }
    };

    let description = match obj.get("description") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            cx.error(
                task,
                "description",
                format!("must be a string, not {}", json_type(other)),
            );
            String::new()
        }
    };

    let level = match obj.get("level") {
        None => {
            cx.error(task, "level", "missing required field");
            None
        }
        Some(Value::Number(n)) => match n.as_u64() {
            Some(l) if l >= 1 && l <= u64::from(u32::MAX) => u32::try_from(l).ok(),
            _ => {
                cx.error(task, "level", format!("must be an integer >= 1, not {n}"));
                None
            }
        },
        Some(other) => {
            cx.error(
                task,
                "level",
                format!("must be an integer >= 1, not {}", json_type(other)),
            );
            None
        }
    };

    let mut dependencies = Vec::new();
    match obj.get("dependencies") {
        None | Some(Value::Null) => {}
        Some(v) => {
            let mut seen = HashSet::new();
            for (i, dep) in read_string_list(v, task, "dependencies", true, cx).unwrap_or_default()
            {
                if seen.insert(dep.clone()) {
                    dependencies.push((i, dep));
                } else {
                    cx.warn(
                        task,
                        format!("dependencies[{i}]"),
                        format!("dependency '{dep}' is listed more than once"),
                    );
                }
            }
        }
    }

    let (mut create, mut modify, mut read) = (Vec::new(), Vec::new(), Vec::new());
    match obj.get("files") {
        None | Some(Value::Null) => {}
        Some(Value::Object(files)) => {
            for (kind, out) in [
                ("create", &mut create),
                ("modify", &mut modify),
                ("read", &mut read),
            ] {
                let field = format!("files.{kind}");
                let Some(v) = files.get(kind).filter(|v| !v.is_null()) else {
                    continue;
                };
                for (i, path) in read_string_list(v, task, &field, true, cx).unwrap_or_default() {
                    if let Err(message) = validate_file_path(&path) {
                        cx.error(task, format!("{field}[{i}]"), message);
                    }
                    out.push((i, path));
                }
            }
        }
        Some(other) => {
            cx.error(
                task,
                "files",
                format!(
                    "must be an object with create/modify/read lists, not {}",
                    json_type(other)
                ),
            );
        }
    }

    let verification = match obj.get("verification") {
        None | Some(Value::Null) => None,
        Some(Value::Object(v)) => read_verification(v, task, cx),
        Some(other) => {
            cx.error(
                task,
                "verification",
                format!(
                    "must be an object with a `command`, not {}",
                    json_type(other)
                ),
            );
            None
        }
    };

    let estimate_minutes = match obj.get("estimate_minutes") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n))
            if n.as_u64()
                .is_some_and(|m| m >= 1 && m <= u64::from(u32::MAX)) =>
        {
            n.as_u64().and_then(|m| u32::try_from(m).ok())
        }
        Some(other) => {
            cx.warn(
                task,
                "estimate_minutes",
                format!("should be a positive integer, not {other}; ignored"),
            );
            None
        }
    };

    let consumers = match obj.get("consumers") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => read_string_list(v, task, "consumers", false, cx).unwrap_or_default(),
    };

    let integration_test =
        read_optional_string(obj, "integration_test", task, cx).filter(|s| !s.trim().is_empty());
    let context = read_optional_string(obj, "context", task, cx);

    let acceptance_criteria = match obj.get("acceptance_criteria") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(v) => read_string_list(v, task, "acceptance_criteria", false, cx)
            .map(|list| list.into_iter().map(|(_, s)| s).collect())
            .unwrap_or_default(),
    };

    Some(Draft {
        index,
        label,
        id,
        title,
        description,
        level,
        dependencies,
        create,
        modify,
        read,
        verification,
        estimate_minutes,
        consumers,
        integration_test,
        context,
        acceptance_criteria,
    })
}

/// An informational string field: a wrong type is a warning and the value is ignored.
fn read_optional_string(
    obj: &Map<String, Value>,
    key: &str,
    task: Option<&str>,
    cx: &mut Collector,
) -> Option<String> {
    match obj.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            cx.warn(
                task,
                key,
                format!("should be a string, not {}; ignored", json_type(other)),
            );
            None
        }
    }
}

fn read_verification(
    v: &Map<String, Value>,
    task: Option<&str>,
    cx: &mut Collector,
) -> Option<Verification> {
    let command = match v.get("command") {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
        Some(Value::String(_)) => {
            cx.error(task, "verification.command", "must be a non-empty string");
            None
        }
        None => {
            cx.error(task, "verification.command", "missing required field");
            None
        }
        Some(other) => {
            cx.error(
                task,
                "verification.command",
                format!("must be a string, not {}", json_type(other)),
            );
            None
        }
    };
    let timeout_seconds = match v.get("timeout_seconds") {
        None | Some(Value::Null) => Some(DEFAULT_VERIFICATION_TIMEOUT_SECONDS),
        Some(Value::Number(n)) if n.as_u64().is_some_and(|t| t >= 1) => n.as_u64(),
        Some(other) => {
            cx.error(
                task,
                "verification.timeout_seconds",
                format!("must be a positive integer, not {other}"),
            );
            None
        }
    };
    Some(Verification {
        command: command?,
        timeout_seconds: timeout_seconds?,
    })
}

/// Rules that need every task: duplicate ids, dependency existence and levels, cycles, level
/// contiguity, per-level file ownership, and the hygiene warnings.
fn check_cross_task(drafts: &[Draft], cx: &mut Collector) {
    // Id -> position in `drafts` of its first definition.
    let mut by_id: HashMap<&str, usize> = HashMap::new();
    for (pos, draft) in drafts.iter().enumerate() {
        let Some(id) = draft.id.as_deref() else {
            continue;
        };
        if let Some(&first) = by_id.get(id) {
            cx.error(
                draft.label(),
                "id",
                format!(
                    "duplicate task id '{id}': tasks[{}] reuses the id of tasks[{}]",
                    draft.index, drafts[first].index
                ),
            );
        } else {
            by_id.insert(id, pos);
        }
    }

    // Dependencies: existence, self-reference, strictly lower level. Build the edge lists.
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); drafts.len()];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); drafts.len()];
    for (pos, draft) in drafts.iter().enumerate() {
        for (_, dep) in &draft.dependencies {
            if draft.id.as_deref() == Some(dep.as_str()) {
                cx.error(
                    draft.label(),
                    "dependencies",
                    format!("task depends on itself ('{dep}')"),
                );
                continue;
            }
            let Some(&target) = by_id.get(dep.as_str()) else {
                cx.error(
                    draft.label(),
                    "dependencies",
                    format!("dependency '{dep}' does not exist"),
                );
                continue;
            };
            if target == pos {
                // A later duplicate naming its own id: already reported as a duplicate.
                continue;
            }
            if let (Some(own), Some(theirs)) = (draft.level, drafts[target].level)
                && theirs >= own
            {
                cx.error(
                    draft.label(),
                    "dependencies",
                    format!(
                        "dependency '{dep}' is at level {theirs}, \
                         which is not lower than this task's level {own}"
                    ),
                );
            }
            edges[pos].push(target);
            dependents[target].push(pos);
        }
    }

    check_cycles(drafts, &edges, cx);

    // Levels must be contiguous from 1.
    let levels: BTreeSet<u32> = drafts.iter().filter_map(|d| d.level).collect();
    let max_level = levels.last().copied().unwrap_or(0);
    let mut expected = 1u32;
    for &level in &levels {
        if level > expected {
            let message = if level - expected == 1 {
                format!("level {expected} has no tasks; levels must be contiguous from 1")
            } else {
                format!(
                    "levels {expected} to {} have no tasks; levels must be contiguous from 1",
                    level - 1
                )
            };
            cx.error(None, "level", message);
        }
        expected = level.saturating_add(1);
    }

    // File ownership: exclusive within a level over create ∪ modify.
    let mut owners: HashMap<(u32, &str), &str> = HashMap::new();
    for draft in drafts {
        let Some(level) = draft.level else { continue };
        let mut own: HashSet<&str> = HashSet::new();
        for (kind, list) in [("create", &draft.create), ("modify", &draft.modify)] {
            for (i, path) in list {
                if validate_file_path(path).is_err() || !own.insert(path.as_str()) {
                    continue;
                }
                if let Some(owner) = owners.get(&(level, path.as_str())) {
                    cx.error(
                        draft.label(),
                        format!("files.{kind}[{i}]"),
                        format!(
                            "file '{path}' is claimed (create/modify) by both {owner} and {} \
                             at level {level}; within a level a file may be owned by only one task",
                            draft.label
                        ),
                    );
                } else {
                    owners.insert((level, path.as_str()), &draft.label);
                }
            }
        }
    }

    // Warnings: consumers.
    for draft in drafts {
        if !draft.consumers.is_empty() && draft.integration_test.is_none() {
            cx.warn(
                draft.label(),
                "integration_test",
                "task has consumers but no integration_test",
            );
        }
        for (_, consumer) in &draft.consumers {
            if !by_id.contains_key(consumer.as_str()) {
                cx.warn(
                    draft.label(),
                    "consumers",
                    format!("consumer '{consumer}' does not exist"),
                );
            }
        }
    }

    // Warnings: unreachable tasks (no dependency chain down to level 1).
    let mut reachable = vec![false; drafts.len()];
    let mut queue: Vec<usize> = (0..drafts.len())
        .filter(|&p| drafts[p].level == Some(1))
        .collect();
    for &p in &queue {
        reachable[p] = true;
    }
    while let Some(p) = queue.pop() {
        for &d in &dependents[p] {
            if !reachable[d] {
                reachable[d] = true;
                queue.push(d);
            }
        }
    }
    for (pos, draft) in drafts.iter().enumerate() {
        let Some(level) = draft.level.filter(|&l| l >= 2) else {
            continue;
        };
        if !reachable[pos] {
            cx.warn(
                draft.label(),
                "dependencies",
                format!(
                    "task at level {level} is unreachable: \
                     it has no dependency chain down to a level-1 task"
                ),
            );
        }
        // Orphans: nothing depends on it, not at the final level, no consumers.
        if dependents[pos].is_empty() && level < max_level && draft.consumers.is_empty() {
            cx.warn(
                draft.label(),
                "consumers",
                format!(
                    "orphan task: no task depends on it and it lists no consumers, \
                     although it is at level {level} below the final level {max_level}"
                ),
            );
        }
    }
}

/// Reports each dependency cycle once (found by iterative DFS; one cycle per back edge).
fn check_cycles(drafts: &[Draft], edges: &[Vec<usize>], cx: &mut Collector) {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnStack,
        Done,
    }
    let mut mark = vec![Mark::New; drafts.len()];
    let mut reported: HashSet<Vec<usize>> = HashSet::new();
    for root in 0..drafts.len() {
        if mark[root] != Mark::New {
            continue;
        }
        // Stack of (node, index of the next edge to follow).
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        mark[root] = Mark::OnStack;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            let Some(&target) = edges[node].get(*next) else {
                mark[node] = Mark::Done;
                stack.pop();
                continue;
            };
            *next += 1;
            match mark[target] {
                Mark::New => {
                    mark[target] = Mark::OnStack;
                    stack.push((target, 0));
                }
                Mark::OnStack => {
                    let start = stack.iter().position(|&(n, _)| n == target).unwrap_or(0);
                    let mut cycle: Vec<usize> = stack[start..].iter().map(|&(n, _)| n).collect();
                    let min_at = cycle
                        .iter()
                        .enumerate()
                        .min_by_key(|&(_, &n)| n)
                        .map_or(0, |(i, _)| i);
                    cycle.rotate_left(min_at);
                    if reported.insert(cycle.clone()) {
                        let mut names: Vec<&str> =
                            cycle.iter().map(|&n| drafts[n].label.as_str()).collect();
                        names.push(&drafts[cycle[0]].label);
                        cx.error(
                            drafts[cycle[0]].label(),
                            "dependencies",
                            format!("dependency cycle: {}", names.join(" -> ")),
                        );
                    }
                }
                Mark::Done => {}
            }
        }
    }
}

/// The optional top-level `levels` object: `{"1": {"name": "...", "tasks": ["ID", ...]}, ...}`.
fn check_levels_object(value: &Value, drafts: &[Draft], cx: &mut Collector) {
    let Value::Object(levels) = value else {
        cx.error(
            None,
            "levels",
            format!(
                "must be an object keyed by level number, not {}",
                json_type(value)
            ),
        );
        return;
    };
    let task_levels: HashMap<&str, Option<u32>> = drafts
        .iter()
        .filter_map(|d| d.id.as_deref().map(|id| (id, d.level)))
        .collect();
    for (key, entry) in levels {
        let base = format!("levels.{key}");
        let level = key
            .parse::<u32>()
            .ok()
            .filter(|&l| l >= 1 && !key.starts_with('+'));
        if level.is_none() {
            cx.error(
                None,
                &base,
                format!("key '{key}' must be a level number (an integer >= 1)"),
            );
        }
        let Value::Object(entry) = entry else {
            cx.error(
                None,
                &base,
                format!(
                    "must be an object with `name` and `tasks`, not {}",
                    json_type(entry)
                ),
            );
            continue;
        };
        match entry.get("name") {
            Some(Value::String(_)) => {}
            None => cx.error(None, format!("{base}.name"), "missing required field"),
            Some(other) => cx.error(
                None,
                format!("{base}.name"),
                format!("must be a string, not {}", json_type(other)),
            ),
        }
        let field = format!("{base}.tasks");
        let Some(ids) = (match entry.get("tasks") {
            None => {
                cx.error(None, &field, "missing required field");
                None
            }
            Some(v) => read_string_list(v, None, &field, true, cx),
        }) else {
            continue;
        };
        for (i, id) in ids {
            match task_levels.get(id.as_str()) {
                None => cx.error(
                    None,
                    format!("{field}[{i}]"),
                    format!("task '{id}' does not exist"),
                ),
                Some(&Some(actual)) if level.is_some_and(|l| l != actual) => cx.warn(
                    None,
                    format!("{field}[{i}]"),
                    format!("task '{id}' is listed under level {key} but has level {actual}"),
                ),
                Some(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(v: &Value) -> Result<Validated, GraphError> {
        parse(v.to_string().as_bytes(), Path::new("task-graph.json"))
    }

    fn errors(v: &Value) -> (Vec<Diagnostic>, Vec<Diagnostic>) {
        match run(v) {
            Err(GraphError::Invalid {
                errors, warnings, ..
            }) => {
                assert!(!errors.is_empty());
                (errors, warnings)
            }
            Ok(ok) => panic!("graph unexpectedly valid; warnings: {:?}", ok.warnings),
            Err(other) => panic!("unexpected error: {other}"),
        }
    }

    fn ok(v: &Value) -> Validated {
        match run(v) {
            Ok(ok) => ok,
            Err(GraphError::Invalid { errors, .. }) => {
                panic!(
                    "graph unexpectedly invalid: {:#?}",
                    errors.iter().map(ToString::to_string).collect::<Vec<_>>()
                )
            }
            Err(other) => panic!("unexpected error: {other}"),
        }
    }

    fn task(id: &str, level: u32, deps: &[&str], create: &[&str]) -> Value {
        json!({
            "id": id,
            "title": format!("Task {id}"),
            "description": "does things",
            "level": level,
            "dependencies": deps,
            "files": {"create": create, "modify": [], "read": []},
            "verification": {"command": "cargo test", "timeout_seconds": 60},
        })
    }

    fn graph(tasks: Vec<Value>) -> Value {
        json!({"feature": "auth", "version": "2.0", "tasks": tasks})
    }

    /// True when some diagnostic has this task and field and its message contains `text`.
    fn has(diags: &[Diagnostic], task: Option<&str>, field: &str, text: &str) -> bool {
        diags
            .iter()
            .any(|d| d.task.as_deref() == task && d.field == field && d.message.contains(text))
    }

    #[track_caller]
    fn assert_has(diags: &[Diagnostic], task: Option<&str>, field: &str, text: &str) {
        assert!(
            has(diags, task, field, text),
            "no diagnostic ({task:?}, {field:?}, {text:?}) in {diags:#?}"
        );
    }

    /// Two level-1 tasks and one level-2 task depending on both: valid, no warnings.
    fn small() -> Vec<Value> {
        vec![
            task("A-L1-001", 1, &[], &["src/a.rs"]),
            task("A-L1-002", 1, &[], &["src/b.rs"]),
            task("A-L2-001", 2, &["A-L1-001", "A-L1-002"], &["src/c.rs"]),
        ]
    }

    #[test]
    fn small_graph_is_valid_and_fully_read() {
        let v = ok(&graph(small()));
        assert!(v.warnings.is_empty(), "{:?}", v.warnings);
        assert_eq!(v.graph.feature, "auth");
        assert_eq!(v.graph.version.as_deref(), Some("2.0"));
        let t = v.graph.task("A-L2-001").unwrap();
        assert_eq!(t.dependencies, vec!["A-L1-001", "A-L1-002"]);
        assert_eq!(t.files.create, vec!["src/c.rs"]);
        assert_eq!(
            t.verification,
            Some(Verification {
                command: "cargo test".into(),
                timeout_seconds: 60
            })
        );
    }

    #[test]
    fn defaults_for_absent_optional_fields() {
        let v = ok(&graph(vec![
            json!({"id": "T1", "title": "t", "level": 1, "verification": {"command": "true"}}),
        ]));
        let t = &v.graph.tasks[0];
        assert_eq!(t.description, "");
        assert!(t.dependencies.is_empty());
        assert_eq!(t.files, Files::default());
        assert_eq!(
            t.verification.as_ref().unwrap().timeout_seconds,
            DEFAULT_VERIFICATION_TIMEOUT_SECONDS
        );
        assert_eq!(t.estimate_minutes, None);
        assert!(t.acceptance_criteria.is_empty());
    }

    #[test]
    fn unknown_keys_are_ignored() {
        let mut tasks = small();
        tasks[0]["phase"] = json!("foundation");
        tasks[0]["skills_required"] = json!(["rust"]);
        tasks[0]["steps"] = json!([{"step": 1, "action": "implement"}]);
        tasks[0]["status"] = json!("pending");
        tasks[0]["files"]["delete"] = json!(["old.rs"]);
        tasks[0]["files"]["move"] = json!([{"from": "a", "to": "b"}]);
        let mut g = graph(tasks);
        g["$schema"] = json!("./schema.json");
        g["conflict_matrix"] = json!({"description": "x", "conflicts": []});
        g["generated"] = json!("2025-01-01T00:00:00Z");
        let v = ok(&g);
        assert!(v.warnings.is_empty(), "{:?}", v.warnings);
    }

    #[test]
    fn json_syntax_error_reports_line_and_column() {
        let text = b"{\n  \"feature\": \"x\",\n  \"tasks\": [,]\n}\n";
        match parse(text, Path::new("g.json")) {
            Err(GraphError::Syntax {
                line,
                column,
                message,
                path,
            }) => {
                assert_eq!((line, column), (3, 13));
                assert!(!message.contains("at line"), "{message}");
                assert_eq!(path, Path::new("g.json"));
            }
            other => panic!("expected syntax error, got {other:?}"),
        }
        let err = parse(b"{\"a\": ", Path::new("g.json")).unwrap_err();
        assert!(
            err.to_string().starts_with("g.json:1:6: invalid JSON: "),
            "{err}"
        );
    }

    #[test]
    fn load_reports_io_error_and_reads_files() {
        let missing = Path::new("/nonexistent/zerg/task-graph.json");
        assert!(matches!(load(missing), Err(GraphError::Io { .. })));
        let dir = std::env::temp_dir().join(format!("zerg-graph-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("task-graph.json");
        std::fs::write(&file, graph(small()).to_string()).unwrap();
        let loaded = load(&file);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(loaded.unwrap().graph.tasks.len(), 3);
    }

    #[test]
    fn top_level_must_be_object() {
        let (e, _) = errors(&json!([1, 2]));
        assert_has(&e, None, "", "must be a JSON object");
    }

    #[test]
    fn feature_and_tasks_required() {
        let (e, _) = errors(&json!({}));
        assert_has(&e, None, "feature", "missing required field");
        assert_has(&e, None, "tasks", "missing required field");
        let (e, _) = errors(&json!({"feature": 3, "tasks": []}));
        assert_has(&e, None, "feature", "must be a string");
        assert_has(&e, None, "tasks", "non-empty list");
        let (e, _) = errors(&json!({"feature": "f", "tasks": {}}));
        assert_has(&e, None, "tasks", "non-empty list");
    }

    #[test]
    fn feature_name_rule() {
        let mut g = graph(small());
        g["feature"] = json!("bad name");
        let (e, _) = errors(&g);
        assert_has(&e, None, "feature", "[A-Za-z0-9][A-Za-z0-9_-]*");
        assert!(validate_feature_name("user-auth_2").is_ok());
        assert!(validate_feature_name("2fa").is_ok());
        assert!(validate_feature_name("").is_err());
        assert!(validate_feature_name("-x").unwrap_err().contains("start"));
        assert!(validate_feature_name("a/b").is_err());
        assert!(validate_feature_name(&"a".repeat(100)).is_ok());
        assert!(
            validate_feature_name(&"a".repeat(101))
                .unwrap_err()
                .contains("100")
        );
    }

    #[test]
    fn task_must_be_object_with_required_fields() {
        let (e, _) = errors(&graph(vec![
            json!("nope"),
            json!({"dependencies": []}),
            json!({"id": "T2", "title": ""}),
        ]));
        assert_has(&e, None, "tasks[0]", "must be an object");
        assert_has(&e, Some("tasks[1]"), "id", "missing required field");
        assert_has(&e, Some("tasks[1]"), "title", "missing required field");
        assert_has(&e, Some("tasks[1]"), "level", "missing required field");
        assert_has(&e, Some("T2"), "title", "non-empty");
        assert_has(&e, Some("T2"), "level", "missing required field");
    }

    #[test]
    fn level_must_be_positive_integer() {
        for (bad, text) in [
            (json!(0), "integer >= 1"),
            (json!(-1), "integer >= 1"),
            (json!(1.5), "integer >= 1"),
            (json!("1"), "a string"),
        ] {
            let mut t = task("T1", 1, &[], &[]);
            t["level"] = bad.clone();
            let (e, _) = errors(&graph(vec![t]));
            assert_has(&e, Some("T1"), "level", text);
        }
    }

    #[test]
    fn task_id_rule() {
        for good in [
            "TASK-001",
            "T1",
            "RES-L2-001",
            "a_b-c",
            &format!("A{}", "x".repeat(63)),
        ] {
            assert!(validate_task_id(good).is_ok(), "{good}");
        }
        for bad in [
            "T1.1",
            "1abc",
            "a;b",
            "",
            "-a",
            "a b",
            &format!("A{}", "x".repeat(64)),
        ] {
            assert!(validate_task_id(bad).is_err(), "{bad:?}");
        }
        let (e, _) = errors(&graph(vec![
            task("T1.1", 1, &[], &[]),
            json!({"id": 7, "title": "t", "level": 1}),
        ]));
        assert_has(&e, Some("tasks[0]"), "id", "T1.1");
        assert_has(&e, Some("tasks[1]"), "id", "must be a string");
    }

    #[test]
    fn duplicate_ids_refused() {
        let (e, _) = errors(&graph(vec![
            task("T1", 1, &[], &["a"]),
            task("T1", 1, &[], &["b"]),
        ]));
        assert_has(&e, Some("T1"), "id", "tasks[1] reuses the id of tasks[0]");
        assert_eq!(e.len(), 1, "{e:#?}");
    }

    #[test]
    fn dependency_must_exist() {
        let (e, _) = errors(&graph(vec![
            task("A", 1, &[], &[]),
            task("B", 2, &["A", "X"], &[]),
        ]));
        assert_has(
            &e,
            Some("B"),
            "dependencies",
            "dependency 'X' does not exist",
        );
        assert_eq!(e.len(), 1, "{e:#?}");
        assert_eq!(
            e[0].to_string(),
            "task B, field `dependencies`: dependency 'X' does not exist"
        );
    }

    #[test]
    fn dependency_on_self_refused() {
        let (e, _) = errors(&graph(vec![task("A", 1, &["A"], &[])]));
        assert_has(&e, Some("A"), "dependencies", "depends on itself");
    }

    #[test]
    fn dependency_must_be_at_lower_level() {
        let (e, _) = errors(&graph(vec![
            task("A", 1, &[], &[]),
            task("C", 2, &["A"], &[]),
            task("B", 2, &["A", "C"], &[]),
        ]));
        assert_has(
            &e,
            Some("B"),
            "dependencies",
            "dependency 'C' is at level 2, which is not lower than this task's level 2",
        );
        assert_eq!(e.len(), 1, "{e:#?}");
    }

    #[test]
    fn dependency_cycle_reported_once() {
        let (e, _) = errors(&graph(vec![
            task("A", 1, &["B"], &[]),
            task("B", 1, &["A"], &[]),
            task("C", 1, &["A"], &[]),
        ]));
        let cycles: Vec<_> = e
            .iter()
            .filter(|d| d.message.starts_with("dependency cycle"))
            .collect();
        assert_eq!(cycles.len(), 1, "{e:#?}");
        assert_eq!(cycles[0].task.as_deref(), Some("A"));
        assert_eq!(cycles[0].field, "dependencies");
        assert_eq!(cycles[0].message, "dependency cycle: A -> B -> A");
        // A three-task cycle where levels go round.
        let (e, _) = errors(&graph(vec![
            task("P", 1, &["R"], &[]),
            task("Q", 1, &["P"], &[]),
            task("R", 1, &["Q"], &[]),
        ]));
        assert_has(
            &e,
            Some("P"),
            "dependencies",
            "dependency cycle: P -> R -> Q -> P",
        );
        assert_eq!(
            e.iter()
                .filter(|d| d.message.starts_with("dependency cycle"))
                .count(),
            1
        );
    }

    #[test]
    fn levels_must_be_contiguous() {
        let (e, _) = errors(&graph(vec![
            task("A", 1, &[], &[]),
            task("B", 3, &["A"], &[]),
        ]));
        assert_has(
            &e,
            None,
            "level",
            "level 2 has no tasks; levels must be contiguous from 1",
        );
        assert_eq!(e.len(), 1, "{e:#?}");
        let (e, _) = errors(&graph(vec![task("A", 2, &[], &[])]));
        assert_has(&e, None, "level", "level 1 has no tasks");
        let (e, _) = errors(&graph(vec![
            task("A", 1, &[], &[]),
            task("B", 4_000_000_000, &["A"], &[]),
        ]));
        assert_has(&e, None, "level", "levels 2 to 3999999999 have no tasks");
    }

    #[test]
    fn path_rules() {
        for good in [
            "src/a.rs",
            "a",
            ".github/workflows/ci.yml",
            ".gitignore",
            "a/.gitkeep",
            "x..y/z",
        ] {
            assert!(validate_file_path(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "a//b",
            "./a",
            "a/./b",
            "../a",
            "a/..",
            "a/",
            "a\\b",
            ".git",
            ".git/config",
            "sub/.git/x",
            ".GIT/x",
        ] {
            assert!(validate_file_path(bad).is_err(), "{bad:?}");
        }
        let mut t = task("T1", 1, &[], &["ok.rs", "/abs", "a//b"]);
        t["files"]["modify"] = json!(["../up"]);
        t["files"]["read"] = json!([".git/HEAD", "fine.md"]);
        let (e, _) = errors(&graph(vec![t]));
        assert_has(&e, Some("T1"), "files.create[1]", "relative");
        assert_has(&e, Some("T1"), "files.create[2]", "empty components");
        assert_has(&e, Some("T1"), "files.modify[0]", "normalised");
        assert_has(&e, Some("T1"), "files.read[0]", ".git");
        assert_eq!(e.len(), 4, "{e:#?}");
    }

    #[test]
    fn same_level_shared_file_refused() {
        let mut b = task("B", 1, &[], &[]);
        b["files"]["modify"] = json!(["src/shared.rs"]);
        let (e, _) = errors(&graph(vec![task("A", 1, &[], &["src/shared.rs"]), b]));
        assert_has(
            &e,
            Some("B"),
            "files.modify[0]",
            "'src/shared.rs' is claimed (create/modify) by both A and B at level 1",
        );
        assert_eq!(e.len(), 1, "{e:#?}");
    }

    #[test]
    fn cross_level_shared_file_and_shared_reads_accepted() {
        let mut b = task("B", 2, &["A"], &[]);
        b["files"]["modify"] = json!(["src/shared.rs"]);
        b["files"]["read"] = json!(["README.md"]);
        let mut c = task("C", 2, &["A"], &[]);
        c["files"]["read"] = json!(["README.md", "src/shared.rs"]);
        let v = ok(&graph(vec![task("A", 1, &[], &["src/shared.rs"]), b, c]));
        assert!(v.warnings.is_empty(), "{:?}", v.warnings);
    }

    #[test]
    fn same_task_listing_path_twice_is_not_a_conflict() {
        let mut a = task("A", 1, &[], &["x.rs"]);
        a["files"]["modify"] = json!(["x.rs"]);
        ok(&graph(vec![a]));
    }

    #[test]
    fn wrong_types_for_engine_fields_are_errors() {
        let t = json!({
            "id": "T1",
            "title": "t",
            "level": 1,
            "description": 5,
            "dependencies": "A",
            "files": {"create": "a.rs", "modify": [1], "read": []},
            "verification": {"timeout_seconds": 0},
        });
        let u = json!({
            "id": "T2", "title": "t", "level": 1, "files": [], "verification": "cargo test"
        });
        let w = json!({
            "id": "T3", "title": "t", "level": 1, "dependencies": ["T1", 2],
            "verification": {"command": 1, "timeout_seconds": "5"},
        });
        let (e, _) = errors(&graph(vec![t, u, w]));
        assert_has(&e, Some("T1"), "description", "must be a string");
        assert_has(&e, Some("T1"), "dependencies", "list of strings");
        assert_has(&e, Some("T1"), "files.create", "list of strings");
        assert_has(&e, Some("T1"), "files.modify[0]", "must be a string");
        assert_has(
            &e,
            Some("T1"),
            "verification.command",
            "missing required field",
        );
        assert_has(
            &e,
            Some("T1"),
            "verification.timeout_seconds",
            "positive integer",
        );
        assert_has(&e, Some("T2"), "files", "must be an object");
        assert_has(&e, Some("T2"), "verification", "must be an object");
        assert_has(&e, Some("T3"), "dependencies[1]", "must be a string");
        assert_has(&e, Some("T3"), "verification.command", "must be a string");
        assert_has(
            &e,
            Some("T3"),
            "verification.timeout_seconds",
            "positive integer",
        );
    }

    #[test]
    fn informational_wrong_types_are_warnings() {
        let mut t = task("T1", 1, &[], &[]);
        t["estimate_minutes"] = json!("ten");
        t["consumers"] = json!("T2");
        t["integration_test"] = json!(3);
        t["context"] = json!(["x"]);
        t["acceptance_criteria"] = json!([1]);
        let mut g = graph(vec![t]);
        g["version"] = json!(2.0);
        let v = ok(&g);
        let w = &v.warnings;
        assert_has(w, Some("T1"), "estimate_minutes", "ignored");
        assert_has(w, Some("T1"), "consumers", "list of strings");
        assert_has(w, Some("T1"), "integration_test", "should be a string");
        assert_has(w, Some("T1"), "context", "should be a string");
        assert_has(w, Some("T1"), "acceptance_criteria[0]", "must be a string");
        assert_has(w, None, "version", "should be a string");
        let t = &v.graph.tasks[0];
        assert_eq!(
            (
                t.estimate_minutes,
                t.context.clone(),
                v.graph.version.clone()
            ),
            (None, None, None)
        );
        assert!(t.consumers.is_empty() && t.acceptance_criteria.is_empty());
    }

    #[test]
    fn informational_fields_read_when_well_typed() {
        let mut t = task("T1", 1, &[], &[]);
        t["estimate_minutes"] = json!(20);
        t["context"] = json!("ctx");
        t["acceptance_criteria"] = json!("works");
        let v = ok(&graph(vec![t]));
        let t = &v.graph.tasks[0];
        assert_eq!(t.estimate_minutes, Some(20));
        assert_eq!(t.context.as_deref(), Some("ctx"));
        assert_eq!(t.acceptance_criteria, vec!["works"]);
    }

    #[test]
    fn consumers_without_integration_test_warns() {
        let mut tasks = small();
        tasks[0]["consumers"] = json!(["A-L2-001"]);
        tasks[1]["consumers"] = json!(["A-L2-001"]);
        tasks[1]["integration_test"] = json!("tests/it.rs");
        let v = ok(&graph(tasks));
        assert_eq!(v.warnings.len(), 1, "{:?}", v.warnings);
        assert_has(
            &v.warnings,
            Some("A-L1-001"),
            "integration_test",
            "consumers but no integration_test",
        );
        let mut tasks = small();
        tasks[0]["consumers"] = json!(["A-L2-001"]);
        tasks[0]["integration_test"] = json!("");
        assert_has(
            &ok(&graph(tasks)).warnings,
            Some("A-L1-001"),
            "integration_test",
            "no integration_test",
        );
    }

    #[test]
    fn unknown_consumer_warns() {
        let mut tasks = small();
        tasks[0]["consumers"] = json!(["GHOST"]);
        tasks[0]["integration_test"] = json!("tests/it.rs");
        let v = ok(&graph(tasks));
        assert_has(
            &v.warnings,
            Some("A-L1-001"),
            "consumers",
            "consumer 'GHOST' does not exist",
        );
        assert_eq!(v.warnings.len(), 1, "{:?}", v.warnings);
    }

    #[test]
    fn unreachable_task_warns() {
        let v = ok(&graph(vec![
            task("A", 1, &[], &[]),
            task("B", 2, &["A"], &[]),
            task("C", 2, &[], &[]),
        ]));
        assert_has(&v.warnings, Some("C"), "dependencies", "unreachable");
        assert!(!has(&v.warnings, Some("B"), "dependencies", "unreachable"));
        assert_eq!(v.warnings.len(), 1, "{:?}", v.warnings);
    }

    #[test]
    fn orphan_task_warns() {
        let tasks = vec![
            task("A", 1, &[], &[]),
            task("B", 2, &["A"], &[]),
            task("C", 2, &["A"], &[]),
            task("D", 3, &["B"], &[]),
        ];
        let v = ok(&graph(tasks));
        assert_has(&v.warnings, Some("C"), "consumers", "orphan");
        assert_eq!(v.warnings.len(), 1, "{:?}", v.warnings);
        // With consumers, C is not an orphan (and has an integration test, so no other warning).
        let mut tasks = vec![
            task("A", 1, &[], &[]),
            task("B", 2, &["A"], &[]),
            task("C", 2, &["A"], &[]),
            task("D", 3, &["B"], &[]),
        ];
        tasks[2]["consumers"] = json!(["D"]);
        tasks[2]["integration_test"] = json!("tests/c.rs");
        assert!(ok(&graph(tasks)).warnings.is_empty());
    }

    #[test]
    fn levels_object_checked() {
        let mut g = graph(small());
        g["levels"] = json!({
            "1": {"name": "foundation", "tasks": ["A-L1-001", "A-L1-002"]},
            "2": {"tasks": ["A-L2-001", "NOPE"]},
            "3": {"name": 4, "tasks": "x"},
            "x": {"name": "n", "tasks": []},
        });
        let (e, _) = errors(&g);
        assert_has(&e, None, "levels.2.name", "missing required field");
        assert_has(&e, None, "levels.2.tasks[1]", "task 'NOPE' does not exist");
        assert_has(&e, None, "levels.3.name", "must be a string");
        assert_has(&e, None, "levels.3.tasks", "list of strings");
        assert_has(&e, None, "levels.x", "level number");
        assert_eq!(e.len(), 5, "{e:#?}");
        let mut g = graph(small());
        g["levels"] = json!([]);
        assert_has(&errors(&g).0, None, "levels", "must be an object");
        let mut g = graph(small());
        g["levels"] = json!({
            "1": {"name": "foundation", "tasks": ["A-L1-001", "A-L1-002"]},
            "2": {"name": "core", "tasks": ["A-L2-001"]},
        });
        assert!(ok(&g).warnings.is_empty());
    }

    #[test]
    fn multiple_errors_reported_at_once() {
        let mut bad = task("B", 2, &["A", "GHOST"], &["/abs"]);
        bad["title"] = json!(null);
        let mut g = graph(vec![
            task("A", 1, &[], &["x"]),
            bad,
            task("C", 1, &[], &["x"]),
            task("T1.1", 4, &[], &[]),
        ]);
        g["feature"] = json!("");
        let (e, _) = errors(&g);
        assert_has(&e, None, "feature", "must not be empty");
        assert_has(&e, Some("B"), "title", "non-empty string");
        assert_has(&e, Some("B"), "dependencies", "'GHOST' does not exist");
        assert_has(&e, Some("B"), "files.create[0]", "relative");
        assert_has(&e, Some("C"), "files.create[0]", "both A and C");
        assert_has(&e, Some("tasks[3]"), "id", "T1.1");
        assert_has(&e, None, "level", "level 3 has no tasks");
        assert_eq!(e.len(), 7, "{e:#?}");
        let err = run(&g).unwrap_err();
        assert_eq!(
            err.to_string(),
            "task-graph.json: task graph is invalid (7 errors)"
        );
    }

    #[test]
    fn diagnostic_display() {
        let d = Diagnostic {
            task: Some("A-L1-001".into()),
            field: "dependencies".into(),
            message: "dependency 'X' does not exist".into(),
        };
        assert_eq!(
            d.to_string(),
            "task A-L1-001, field `dependencies`: dependency 'X' does not exist"
        );
        let d = Diagnostic {
            task: None,
            field: "feature".into(),
            message: "missing required field".into(),
        };
        assert_eq!(d.to_string(), "field `feature`: missing required field");
    }

    #[test]
    fn level_from_id_parses_first_marker() {
        assert_eq!(level_from_id("RES-L2-001"), Some(2));
        assert_eq!(level_from_id("A-L10-x"), Some(10));
        assert_eq!(level_from_id("T1"), None);
        assert_eq!(level_from_id("A-L-1-L3-x"), Some(3));
        assert_eq!(level_from_id("A-L2"), None);
        assert_eq!(level_from_id("AL2-x"), None);
        assert_eq!(level_from_id("X-L99999999999-L4-y"), Some(4));
    }

    /// The 12-task, 3-level graph used by several tests.
    fn realistic() -> Value {
        let mut tasks = Vec::new();
        for i in 1..=4 {
            let mut t = task(
                &format!("AUTH-L1-00{i}"),
                1,
                &[],
                &[&format!("src/auth/m{i}.rs")],
            );
            t["files"]["modify"] = json!(
                ["Cargo.toml"]
                    .iter()
                    .take(usize::from(i == 1))
                    .collect::<Vec<_>>()
            );
            t["estimate_minutes"] = json!(10 + i);
            t["phase"] = json!("foundation");
            tasks.push(t);
        }
        for i in 1..=4 {
            let deps = [format!("AUTH-L1-00{i}"), "AUTH-L1-001".to_owned()];
            let deps: Vec<&str> = deps
                .iter()
                .map(String::as_str)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let mut t = task(
                &format!("AUTH-L2-00{i}"),
                2,
                &deps,
                &[&format!("src/core/c{i}.rs")],
            );
            // Modify a file that a level-1 task created: allowed across levels.
            t["files"]["modify"] = json!([format!("src/auth/m{i}.rs")]);
            t["files"]["read"] = json!(["Cargo.toml", "src/auth/m1.rs"]);
            t["consumers"] = json!([format!("AUTH-L3-00{i}")]);
            t["integration_test"] = json!(format!("tests/c{i}.rs"));
            t["acceptance_criteria"] = json!(["compiles", "tests pass"]);
            tasks.push(t);
        }
        for i in 1..=4 {
            let mut t = task(
                &format!("AUTH-L3-00{i}"),
                3,
                &[&format!("AUTH-L2-00{i}")],
                &[&format!("tests/c{i}.rs")],
            );
            t["files"]["modify"] = json!(
                ["Cargo.toml"]
                    .iter()
                    .take(usize::from(i == 4))
                    .collect::<Vec<_>>()
            );
            t["context"] = json!("scoped context");
            tasks.push(t);
        }
        let mut g = graph(tasks);
        g["levels"] = json!({
            "1": {"name": "foundation",
                  "tasks": ["AUTH-L1-001", "AUTH-L1-002", "AUTH-L1-003", "AUTH-L1-004"]},
            "2": {"name": "core",
                  "tasks": ["AUTH-L2-001", "AUTH-L2-002", "AUTH-L2-003", "AUTH-L2-004"]},
            "3": {"name": "integration",
                  "tasks": ["AUTH-L3-001", "AUTH-L3-002", "AUTH-L3-003", "AUTH-L3-004"]},
        });
        g
    }

    #[test]
    fn realistic_twelve_task_graph_is_valid() {
        let v = ok(&realistic());
        assert!(v.warnings.is_empty(), "{:?}", v.warnings);
        let g = &v.graph;
        assert_eq!(g.tasks.len(), 12);
        assert_eq!(g.max_level(), 3);
        let levels = g.levels();
        assert_eq!(levels.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3]);
        assert!(levels.values().all(|ts| ts.len() == 4));
        assert_eq!(levels[&2][0].id, "AUTH-L2-001");
        for t in &g.tasks {
            assert_eq!(level_from_id(&t.id), Some(t.level));
        }
        assert_eq!(
            g.task("AUTH-L2-003").unwrap().dependencies,
            vec!["AUTH-L1-001", "AUTH-L1-003"]
        );
        assert!(g.task("NOPE").is_none());
    }

    #[test]
    fn dependents_closure_is_transitive_and_ordered() {
        let v = ok(&realistic());
        let g = &v.graph;
        assert_eq!(
            g.dependents_closure("AUTH-L1-001"),
            vec![
                "AUTH-L2-001",
                "AUTH-L2-002",
                "AUTH-L2-003",
                "AUTH-L2-004",
                "AUTH-L3-001",
                "AUTH-L3-002",
                "AUTH-L3-003",
                "AUTH-L3-004"
            ]
        );
        assert_eq!(
            g.dependents_closure("AUTH-L1-002"),
            vec!["AUTH-L2-002", "AUTH-L3-002"]
        );
        assert!(g.dependents_closure("AUTH-L3-001").is_empty());
        assert!(g.dependents_closure("NOPE").is_empty());
    }

    #[test]
    fn byte_order_mark_is_accepted() {
        let mut bytes = b"\xEF\xBB\xBF".to_vec();
        bytes.extend(graph(small()).to_string().into_bytes());
        assert!(parse(&bytes, Path::new("g.json")).is_ok());
    }
}
