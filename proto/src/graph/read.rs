//! Reading a task graph: the document and each task, field by field, collecting every problem
//! instead of stopping at the first.

use super::*;

// ---------------------------------------------------------------------------------------------
// Validation internals
// ---------------------------------------------------------------------------------------------

pub(super) fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// serde_json's message without its trailing " at line L column C".
pub(super) fn strip_position(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    full.strip_suffix(&suffix)
        .map(str::to_owned)
        .unwrap_or(full)
}

/// Why `text` cannot be used in a field that reaches the agent's command line (the prompt is
/// one argument, the verification command another): a NUL character cannot be passed there,
/// so a task holding one could never run.
pub(super) fn argv_problem(text: &str) -> Option<String> {
    text.contains('\0').then(|| {
        "must not contain NUL characters: it is passed to the agent as a command-line argument, \
         which cannot hold one"
            .to_owned()
    })
}

pub(super) fn json_type(v: &Value) -> &'static str {
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
pub(super) struct Collector {
    pub(super) errors: Vec<Diagnostic>,
    pub(super) warnings: Vec<Diagnostic>,
}

impl Collector {
    pub(super) fn error(
        &mut self,
        task: Option<&str>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.errors.push(Diagnostic {
            task: task.map(str::to_owned),
            field: field.into(),
            message: message.into(),
        });
    }

    pub(super) fn warn(
        &mut self,
        task: Option<&str>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.warnings.push(Diagnostic {
            task: task.map(str::to_owned),
            field: field.into(),
            message: message.into(),
        });
    }
}

/// A task as far as it could be read; fields that were missing or wrong are `None`/empty.
pub(super) struct Draft {
    /// `tasks[i]` index.
    pub(super) index: usize,
    /// Label used in diagnostics: the id when valid, otherwise `tasks[i]`.
    pub(super) label: String,
    /// The id, when it is a valid id.
    pub(super) id: Option<String>,
    pub(super) title: Option<String>,
    pub(super) description: String,
    pub(super) level: Option<u32>,
    /// Dependencies as (position in the JSON list, id), duplicates removed.
    pub(super) dependencies: Vec<(usize, String)>,
    /// Files per kind as (position in the JSON list, path).
    pub(super) create: Vec<(usize, String)>,
    pub(super) modify: Vec<(usize, String)>,
    pub(super) read: Vec<(usize, String)>,
    pub(super) verification: Option<Verification>,
    pub(super) estimate_minutes: Option<u32>,
    pub(super) consumers: Vec<(usize, String)>,
    pub(super) integration_test: Option<String>,
    pub(super) context: Option<String>,
    pub(super) acceptance_criteria: Vec<String>,
}

impl Draft {
    pub(super) fn label(&self) -> Option<&str> {
        Some(&self.label)
    }

    pub(super) fn into_task(self) -> Option<Task> {
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

/// The top level of a task graph as the parser met it. `tasks` is read while the file is
/// parsed, one task at a time, and each task's JSON is dropped once its draft is made: a graph
/// of 10,000 tasks is never held as a JSON tree beside its drafts. The other fields are small
/// and kept as JSON for [`check_document`].
#[derive(Default)]
pub(super) struct Document {
    /// `Some(type)` when the document is not a JSON object.
    not_an_object: Option<&'static str>,
    feature: Option<Value>,
    version: Option<Value>,
    levels: Option<Value>,
    tasks: Option<TaskList>,
}

/// The `tasks` field as read: the drafts with what reading them found, or what the field was
/// instead of a list.
#[derive(Default)]
struct TaskList {
    /// `Some(type)` when `tasks` is not a list.
    not_a_list: Option<&'static str>,
    /// Elements the list held.
    len: usize,
    drafts: Vec<Draft>,
    /// What reading the tasks found, kept apart so that a later `tasks` key (the last one
    /// counts, as in any JSON reader) replaces it, and so that it is reported after the
    /// document's own fields, in the order the checks have always run.
    cx: Collector,
}

/// What [`Walk`] fills in as it meets a JSON value.
enum Walking<'a> {
    /// The whole document (an object is wanted).
    Document(&'a mut Document),
    /// The `tasks` field (a list is wanted).
    Tasks(&'a mut TaskList),
}

/// Reads the document, or its `tasks`, straight from the parser. A value of another JSON type
/// than the one wanted is skipped and its type returned, for the diagnostic.
struct Walk<'a>(Walking<'a>);

impl<'de> serde::de::DeserializeSeed<'de> for Walk<'_> {
    type Value = Option<&'static str>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Walk<'_> {
    type Value = Option<&'static str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a task graph")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::IgnoredAny;
        let Walking::Document(doc) = self.0 else {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(Some("an object"));
        };
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match &*key {
                "feature" => doc.feature = Some(map.next_value()?),
                "version" => doc.version = Some(map.next_value()?),
                "levels" => doc.levels = Some(map.next_value()?),
                "tasks" => {
                    let mut list = TaskList::default();
                    list.not_a_list = map.next_value_seed(Walk(Walking::Tasks(&mut list)))?;
                    doc.tasks = Some(list);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(None)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let Walking::Tasks(list) = self.0 else {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            return Ok(Some("a list"));
        };
        while let Some(item) = seq.next_element::<Value>()? {
            if let Some(draft) = read_task(list.len, &item, &mut list.cx) {
                list.drafts.push(draft);
            }
            list.len += 1;
        }
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Some("null"))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Some("a boolean"))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Some("an integer"))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Some("an integer"))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Some("a number"))
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Some("a string"))
    }
}

/// Parses a task graph's JSON into a [`Document`], reading the tasks as it goes. Fails only on
/// a syntax error (with its position); every other problem is left to [`check_document`].
pub(super) fn read_document(bytes: &[u8]) -> Result<Document, serde_json::Error> {
    use serde::de::DeserializeSeed;
    let mut doc = Document::default();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    doc.not_an_object = Walk(Walking::Document(&mut doc)).deserialize(&mut de)?;
    de.end()?;
    Ok(doc)
}

/// Validates the whole document. Returns the graph when it could be assembled; the caller
/// refuses it anyway if any error was collected.
pub(super) fn check_document(doc: Document, cx: &mut Collector) -> Option<TaskGraph> {
    if let Some(kind) = doc.not_an_object {
        cx.error(
            None,
            "",
            format!("task graph must be a JSON object, not {kind}"),
        );
        return None;
    }

    let feature = match &doc.feature {
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

    let version = match doc.version {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(other) => {
            cx.warn(
                None,
                "version",
                format!("should be a string, not {}; ignored", json_type(&other)),
            );
            None
        }
    };

    let drafts: Vec<Draft> = match doc.tasks {
        None => {
            cx.error(None, "tasks", "missing required field");
            Vec::new()
        }
        Some(TaskList {
            not_a_list: Some(kind),
            ..
        }) => {
            cx.error(
                None,
                "tasks",
                format!("must be a non-empty list, not {kind}"),
            );
            Vec::new()
        }
        Some(TaskList { len: 0, .. }) => {
            cx.error(None, "tasks", "must be a non-empty list");
            Vec::new()
        }
        Some(list) => {
            cx.errors.extend(list.cx.errors);
            cx.warnings.extend(list.cx.warnings);
            list.drafts
        }
    };

    check_cross_task(&drafts, cx);

    if let Some(levels) = &doc.levels {
        check_levels_object(levels, &drafts, cx);
    }

    let feature = feature?;
    let mut tasks = drafts
        .into_iter()
        .map(Draft::into_task)
        .collect::<Option<Vec<_>>>()?;
    // The tasks are collected into the drafts' own buffer, which is larger by the drafts'
    // extra fields (5.6 MB against 3.3 MB at 10,000 tasks) and would be held as long as the
    // graph is.
    tasks.shrink_to_fit();
    Some(TaskGraph {
        feature,
        version,
        tasks,
    })
}

/// Reads a list of strings; reports a wrong container type or wrong element types as errors
/// (when `fatal`) or warnings. Returns `None` when the list is unusable.
pub(super) fn read_string_list(
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

pub(super) fn read_task(index: usize, value: &Value, cx: &mut Collector) -> Option<Draft> {
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
        Some(Value::String(s)) => match argv_problem(s) {
            Some(message) => {
                cx.error(task, "title", message);
                None
            }
            None => Some(s.clone()),
        },
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
        Some(Value::String(s)) => {
            if let Some(message) = argv_problem(s) {
                cx.error(task, "description", message);
            }
            s.clone()
        }
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
                    // Reading a whole directory (`src/`) is legitimate; creating or modifying
                    // one is not.
                    let checked = if kind == "read" {
                        validate_read_path(&path)
                    } else {
                        validate_file_path(&path)
                    };
                    if let Err(message) = checked {
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
    if let Some(message) = context.as_deref().and_then(argv_problem) {
        cx.error(task, "context", message);
    }

    let acceptance_criteria = match obj.get("acceptance_criteria") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => {
            if let Some(message) = argv_problem(s) {
                cx.error(task, "acceptance_criteria", message);
            }
            vec![s.clone()]
        }
        Some(v) => {
            let list =
                read_string_list(v, task, "acceptance_criteria", false, cx).unwrap_or_default();
            for (i, s) in &list {
                if let Some(message) = argv_problem(s) {
                    cx.error(task, format!("acceptance_criteria[{i}]"), message);
                }
            }
            list.into_iter().map(|(_, s)| s).collect()
        }
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
pub(super) fn read_optional_string(
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

pub(super) fn read_verification(
    v: &Map<String, Value>,
    task: Option<&str>,
    cx: &mut Collector,
) -> Option<Verification> {
    let command = match v.get("command") {
        Some(Value::String(s)) if !s.trim().is_empty() => match argv_problem(s) {
            Some(message) => {
                cx.error(task, "verification.command", message);
                None
            }
            None => Some(s.clone()),
        },
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
