//! Per-language extraction: a file's bytes in, its definitions, imports and exports out.
//!
//! Each language has one function that looks at one syntax node and says what it is (a
//! definition, an import, an export) and which of its children to look at next. The walk is a
//! loop over an explicit stack, never recursion, and it does not descend into function bodies:
//! what a map needs is what a module offers, not a function's locals. Nesting deeper than
//! [`MAX_DEPTH`] is not followed, and a parse that takes longer than [`PARSE_TIME_LIMIT`] is
//! abandoned (the file counts as unparsable), so no file can hold the indexer for long.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tree_sitter::{Node, ParseOptions, ParseState, Parser};

use super::{
    Definition, FileSymbols, Import, Kind, Language, MAX_DEFINITIONS, MAX_IMPORTS, MAX_NAME,
    MAX_SIGNATURE, SkipReason, clip,
};

/// How long one file may take to parse.
pub const PARSE_TIME_LIMIT: Duration = Duration::from_secs(5);
/// Definitions nested deeper than this are not looked for.
pub const MAX_DEPTH: u16 = 32;
/// A file with a NUL byte among its first this many bytes is binary (git's own rule).
const BINARY_PROBE: usize = 8000;
/// The most syntax nodes one file's walk visits.
const MAX_VISITS: usize = 2_000_000;

/// The grammar a file is parsed with: its language, and for TypeScript whether it is TSX.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Grammar {
    /// Python.
    Python,
    /// JavaScript (with JSX).
    JavaScript,
    /// TypeScript.
    TypeScript,
    /// TypeScript with JSX.
    Tsx,
    /// Rust.
    Rust,
    /// Go.
    Go,
}

impl Grammar {
    /// The grammar of a path, from its extension; `None` for other languages.
    pub fn of_path(path: &str) -> Option<Grammar> {
        let name = path.rsplit('/').next().unwrap_or(path);
        let ext = name.rsplit_once('.').map(|(_, e)| e)?;
        Some(match ext {
            "py" | "pyi" => Grammar::Python,
            "js" | "jsx" | "mjs" | "cjs" => Grammar::JavaScript,
            "ts" | "mts" | "cts" => Grammar::TypeScript,
            "tsx" => Grammar::Tsx,
            "rs" => Grammar::Rust,
            "go" => Grammar::Go,
            _ => return None,
        })
    }

    /// Its language.
    pub fn language(self) -> Language {
        match self {
            Grammar::Python => Language::Python,
            Grammar::JavaScript => Language::JavaScript,
            Grammar::TypeScript | Grammar::Tsx => Language::TypeScript,
            Grammar::Rust => Language::Rust,
            Grammar::Go => Language::Go,
        }
    }

    /// A short name, used in cache file names.
    pub fn name(self) -> &'static str {
        match self {
            Grammar::Python => "python",
            Grammar::JavaScript => "javascript",
            Grammar::TypeScript => "typescript",
            Grammar::Tsx => "tsx",
            Grammar::Rust => "rust",
            Grammar::Go => "go",
        }
    }

    fn tree_sitter(self) -> tree_sitter::Language {
        match self {
            Grammar::Python => tree_sitter_python::LANGUAGE.into(),
            Grammar::JavaScript => tree_sitter_javascript::LANGUAGE.into(),
            Grammar::TypeScript => tree_sitter_typescript::LANGUAGE_TYPESCRIPT.into(),
            Grammar::Tsx => tree_sitter_typescript::LANGUAGE_TSX.into(),
            Grammar::Rust => tree_sitter_rust::LANGUAGE.into(),
            Grammar::Go => tree_sitter_go::LANGUAGE.into(),
        }
    }
}

/// Extracts what a file defines, imports and exports. `Err` says why the file is skipped.
pub fn extract(grammar: Grammar, src: &[u8]) -> Result<FileSymbols, SkipReason> {
    if src[..src.len().min(BINARY_PROBE)].contains(&0) {
        return Err(SkipReason::Binary);
    }
    let mut parser = Parser::new();
    parser
        .set_language(&grammar.tree_sitter())
        .map_err(|_| SkipReason::Unparsable)?;
    let started = Instant::now();
    let mut too_long = |_: &ParseState| started.elapsed() > PARSE_TIME_LIMIT;
    let options = ParseOptions::new().progress_callback(&mut too_long);
    let len = src.len();
    let tree = parser
        .parse_with_options(&mut |i, _| &src[i.min(len)..], None, Some(options))
        .ok_or(SkipReason::Unparsable)?;
    let mut out = Out {
        src,
        symbols: FileSymbols {
            language: grammar.language(),
            definitions: Vec::new(),
            imports: Vec::new(),
            exports: Vec::new(),
            truncated: false,
        },
        exported_names: BTreeSet::new(),
    };
    let grammar_step = |out: &mut Out<'_>, node, scope: &Scope, stack: &mut Vec<_>| match grammar {
        Grammar::Python => python(out, node, scope, stack),
        Grammar::JavaScript | Grammar::TypeScript | Grammar::Tsx => {
            javascript(out, node, scope, stack)
        }
        Grammar::Rust => rust(out, node, scope, stack),
        Grammar::Go => go(out, node, scope, stack),
    };
    let mut stack = vec![(tree.root_node(), Scope::default())];
    let mut visits = 0usize;
    while let Some((node, scope)) = stack.pop() {
        visits += 1;
        if visits > MAX_VISITS {
            out.symbols.truncated = true;
            break;
        }
        let before = stack.len();
        grammar_step(&mut out, node, &scope, &mut stack);
        // Children were pushed in source order; reversing them makes the pop order follow the
        // source too.
        stack[before..].reverse();
    }
    Ok(out.finish(grammar))
}

/// Where a node is: how deep, inside what, and what that implies.
#[derive(Debug, Clone, Default)]
struct Scope {
    depth: u16,
    parent: String,
    /// Inside a class, an `impl` block, a trait or an interface: functions are methods.
    in_type: bool,
    /// The enclosing definition is exported (JavaScript `export`, Rust trait impls and `pub`
    /// traits).
    exported: bool,
    /// Source offset where the signature of the next definition starts (an `export`
    /// keyword); `None` means the definition's own start.
    sig_start: Option<usize>,
    /// Decorator text to put before the next Python definition.
    decorators: String,
}

impl Scope {
    fn inside(&self, name: &str, exported: bool) -> Scope {
        Scope {
            depth: self.depth.saturating_add(1),
            parent: name.to_string(),
            in_type: true,
            exported,
            sig_start: None,
            decorators: String::new(),
        }
    }

    /// The same place, for a child that is not itself a definition (`export`, `declare`).
    fn same(&self) -> Scope {
        Scope {
            sig_start: None,
            decorators: String::new(),
            ..self.clone()
        }
    }
}

struct Out<'a> {
    src: &'a [u8],
    symbols: FileSymbols,
    /// Names exported by a list (`export { a }`, `__all__`), applied to definitions at the end.
    exported_names: BTreeSet<String>,
}

impl Out<'_> {
    fn text(&self, node: Node<'_>) -> String {
        let (s, e) = (node.start_byte(), node.end_byte().min(self.src.len()));
        let bytes = &self.src[s.min(e)..e];
        clip(
            &String::from_utf8_lossy(&bytes[..bytes.len().min(4 * MAX_NAME)]),
            MAX_NAME,
        )
    }

    fn field_text(&self, node: Node<'_>, field: &str) -> Option<String> {
        node.child_by_field_name(field).map(|n| self.text(n))
    }

    /// The source between two offsets of `node` on one line: comments left out, whitespace
    /// collapsed, at most a few times [`MAX_SIGNATURE`] bytes looked at.
    fn collapsed(&self, node: Node<'_>, start: usize, end: usize) -> String {
        let end = end.min(self.src.len()).min(start + 8 * MAX_SIGNATURE);
        let start = start.min(end);
        let mut comments: Vec<(usize, usize)> = Vec::new();
        let mut stack = vec![node];
        let mut seen = 0;
        while let Some(n) = stack.pop() {
            seen += 1;
            if seen > 4096 || n.start_byte() >= end {
                continue;
            }
            if n.end_byte() <= start {
                continue;
            }
            if n.kind().contains("comment") {
                comments.push((n.start_byte(), n.end_byte()));
                continue;
            }
            let mut c = n.walk();
            stack.extend(n.children(&mut c));
        }
        comments.sort_unstable();
        let mut text = Vec::with_capacity(end - start);
        let mut at = start;
        for (s, e) in comments {
            if s > at {
                text.extend_from_slice(&self.src[at..s.min(end)]);
            }
            at = at.max(e.min(end));
        }
        if at < end {
            text.extend_from_slice(&self.src[at..end]);
        }
        let s = String::from_utf8_lossy(&text);
        s.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// A signature from `start` up to `body` (or the whole node without a body).
    fn head(&self, node: Node<'_>, scope: &Scope, body: Option<Node<'_>>) -> String {
        let start = scope.sig_start.unwrap_or(node.start_byte());
        let end = body.map_or(node.end_byte(), |b| b.start_byte());
        let mut s = self.collapsed(node, start, end);
        while s.ends_with([':', '{', ';', '=', ' ']) {
            s.pop();
        }
        if !scope.decorators.is_empty() {
            s = format!("{} {s}", scope.decorators);
        }
        clip(&s, MAX_SIGNATURE)
    }

    /// A type's whole text when it fits in a signature (a short struct, enum or interface says
    /// everything), else its head followed by `{ … }`.
    fn whole(&self, node: Node<'_>, scope: &Scope) -> String {
        let start = scope.sig_start.unwrap_or(node.start_byte());
        let mut s = self.collapsed(node, start, node.end_byte());
        while s.ends_with([';', ' ']) {
            s.pop();
        }
        if s.len() <= MAX_SIGNATURE && node.end_byte() - start <= 8 * MAX_SIGNATURE {
            return s;
        }
        match s.find('{') {
            Some(i) => format!(
                "{} {{ … }}",
                clip(s[..i].trim_end(), MAX_SIGNATURE.saturating_sub(8))
            ),
            None => clip(&s, MAX_SIGNATURE),
        }
    }

    fn define(
        &mut self,
        kind: Kind,
        name: String,
        signature: String,
        node: Node<'_>,
        scope: &Scope,
        exported: bool,
    ) {
        if self.symbols.definitions.len() >= MAX_DEFINITIONS {
            self.symbols.truncated = true;
            return;
        }
        self.symbols.definitions.push(Definition {
            kind,
            name,
            signature,
            line: u32::try_from(node.start_position().row)
                .unwrap_or(u32::MAX - 1)
                .saturating_add(1),
            depth: scope.depth,
            parent: scope.parent.clone(),
            exported,
        });
    }

    fn import(&mut self, from: String, names: Vec<String>) {
        if from.is_empty() {
            return;
        }
        if self.symbols.imports.len() >= MAX_IMPORTS {
            self.symbols.truncated = true;
            return;
        }
        let mut names = names;
        names.truncate(64);
        self.symbols.imports.push(Import { from, names });
    }

    fn export(&mut self, name: String) {
        if self.symbols.exports.len() >= MAX_IMPORTS {
            self.symbols.truncated = true;
            return;
        }
        self.symbols.exports.push(name);
    }

    fn finish(mut self, grammar: Grammar) -> FileSymbols {
        let listed = &self.exported_names;
        let js = matches!(
            grammar,
            Grammar::JavaScript | Grammar::TypeScript | Grammar::Tsx
        );
        for d in &mut self.symbols.definitions {
            if d.depth == 0 && listed.contains(&d.name) {
                d.exported = true;
            }
            // A class exported by a list exports its public methods too.
            if js && d.depth == 1 && listed.contains(&d.parent) && !d.name.starts_with('#') {
                d.exported = true;
            }
            // Python: `__all__`, when there is one, decides what a module exports.
            if grammar == Grammar::Python && d.depth == 0 && !listed.is_empty() {
                d.exported = listed.contains(&d.name);
            }
        }
        self.symbols.definitions.sort_by_key(|d| (d.line, d.depth));
        self.symbols
    }
}

fn named_children<'t>(node: Node<'t>) -> Vec<Node<'t>> {
    let mut c = node.walk();
    node.named_children(&mut c).collect()
}

fn push_children<'t>(node: Node<'t>, scope: &Scope, stack: &mut Vec<(Node<'t>, Scope)>) {
    if scope.depth > MAX_DEPTH {
        return;
    }
    for child in named_children(node) {
        stack.push((child, scope.same()));
    }
}

/// A string literal's contents, without quotes or a Python prefix (`r"…"`, `b'…'`).
fn unquote(s: &str) -> String {
    let s = s.trim();
    match s.find(['"', '\'', '`']) {
        Some(i) if i <= 3 && s[..i].chars().all(|c| c.is_ascii_alphabetic()) => s[i..]
            .trim_matches(|c| c == '"' || c == '\'' || c == '`')
            .to_string(),
        _ => s.to_string(),
    }
}

/// Whether a Rust item is behind `#[cfg(test)]` (a test module is not part of the map).
fn rust_test_only(out: &Out<'_>, node: Node<'_>) -> bool {
    let mut prev = node.prev_named_sibling();
    let mut n = 0;
    while let Some(p) = prev {
        n += 1;
        if p.kind() != "attribute_item" || n > 16 {
            return false;
        }
        if out.text(p).replace(' ', "").contains("cfg(test)") {
            return true;
        }
        prev = p.prev_named_sibling();
    }
    false
}

// === Python ===

fn python<'t>(
    out: &mut Out<'_>,
    node: Node<'t>,
    scope: &Scope,
    stack: &mut Vec<(Node<'t>, Scope)>,
) {
    match node.kind() {
        "module" | "block" | "if_statement" | "elif_clause" | "else_clause" | "try_statement"
        | "except_clause" | "finally_clause" | "ERROR" => push_children(node, scope, stack),
        "decorated_definition" => {
            let decorators: Vec<String> = named_children(node)
                .into_iter()
                .filter(|n| n.kind() == "decorator")
                .map(|n| out.collapsed(n, n.start_byte(), n.end_byte()))
                .collect();
            if let Some(def) = node.child_by_field_name("definition") {
                let mut s = scope.same();
                s.decorators = clip(&decorators.join(" "), MAX_SIGNATURE / 2);
                stack.push((def, s));
            }
        }
        "function_definition" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let kind = if scope.in_type {
                Kind::Method
            } else {
                Kind::Function
            };
            let sig = out.head(node, scope, node.child_by_field_name("body"));
            let exported = python_public(&name);
            out.define(kind, name, sig, node, scope, exported);
        }
        "class_definition" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let body = node.child_by_field_name("body");
            let sig = out.head(node, scope, body);
            let exported = python_public(&name);
            out.define(Kind::Class, name.clone(), sig, node, scope, exported);
            if let Some(body) = body
                && scope.depth < MAX_DEPTH
            {
                stack.push((body, scope.inside(&name, exported)));
            }
        }
        "import_statement" => {
            for n in named_children(node) {
                let module = match n.kind() {
                    "dotted_name" => Some(n),
                    "aliased_import" => n.child_by_field_name("name"),
                    _ => None,
                };
                if let Some(m) = module {
                    let from = out.text(m);
                    out.import(from, vec![]);
                }
            }
        }
        "import_from_statement" => {
            let Some(module) = node.child_by_field_name("module_name") else {
                return;
            };
            let from = out.text(module);
            let mut names = Vec::new();
            let mut c = node.walk();
            for n in node.children_by_field_name("name", &mut c) {
                let n = match n.kind() {
                    "aliased_import" => n.child_by_field_name("name").unwrap_or(n),
                    _ => n,
                };
                names.push(out.text(n));
            }
            if named_children(node)
                .iter()
                .any(|n| n.kind() == "wildcard_import")
            {
                names.push("*".into());
            }
            out.import(from, names);
        }
        "expression_statement" if scope.depth == 0 => {
            // `__all__ = ["a", "b"]`
            for a in named_children(node) {
                if a.kind() != "assignment" {
                    continue;
                }
                let (Some(left), Some(right)) = (
                    a.child_by_field_name("left"),
                    a.child_by_field_name("right"),
                ) else {
                    continue;
                };
                if out.text(left) != "__all__" || !matches!(right.kind(), "list" | "tuple") {
                    continue;
                }
                for s in named_children(right) {
                    if s.kind() == "string" {
                        let name = unquote(&out.text(s));
                        if !name.is_empty() {
                            out.exported_names.insert(name.clone());
                            out.export(name);
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

fn python_public(name: &str) -> bool {
    !name.starts_with('_') || (name.starts_with("__") && name.ends_with("__"))
}

// === JavaScript and TypeScript ===

fn javascript<'t>(
    out: &mut Out<'_>,
    node: Node<'t>,
    scope: &Scope,
    stack: &mut Vec<(Node<'t>, Scope)>,
) {
    let kind = if scope.in_type {
        Kind::Method
    } else {
        Kind::Function
    };
    match node.kind() {
        "program" | "ERROR" | "ambient_declaration" | "statement_block" => {
            push_children(node, scope, stack)
        }
        "export_statement" => {
            let is_default = {
                let mut c = node.walk();
                node.children(&mut c).any(|n| n.kind() == "default")
            };
            let source = node
                .child_by_field_name("source")
                .map(|s| unquote(&out.text(s)));
            if let Some(decl) = node.child_by_field_name("declaration") {
                let mut s = scope.same();
                s.exported = true;
                s.sig_start = Some(node.start_byte());
                if is_default {
                    out.export("default".into());
                }
                stack.push((decl, s));
                return;
            }
            if let Some(value) = node.child_by_field_name("value") {
                match value.kind() {
                    "identifier" => {
                        let name = out.text(value);
                        out.exported_names.insert(name.clone());
                        out.export(format!("default ({name})"));
                    }
                    "function_expression" | "arrow_function" | "generator_function" => {
                        out.export("default".into());
                        let mut s = scope.same();
                        s.sig_start = Some(node.start_byte());
                        let name = out
                            .field_text(value, "name")
                            .unwrap_or_else(|| "default".into());
                        let sig = out.head(value, &s, value.child_by_field_name("body"));
                        out.define(Kind::Function, name, sig, value, scope, true);
                    }
                    "class" => {
                        out.export("default".into());
                        let mut s = scope.same();
                        s.sig_start = Some(node.start_byte());
                        s.exported = true;
                        stack.push((value, s));
                    }
                    _ => out.export("default".into()),
                }
                return;
            }
            let mut names = Vec::new();
            let mut star = false;
            for n in named_children(node) {
                match n.kind() {
                    "export_clause" => {
                        for spec in named_children(n) {
                            if spec.kind() != "export_specifier" {
                                continue;
                            }
                            let name = out.field_text(spec, "name").unwrap_or_default();
                            let alias = out.field_text(spec, "alias");
                            if source.is_none() {
                                out.exported_names.insert(name.clone());
                            }
                            names.push((name, alias));
                        }
                    }
                    "namespace_export" => {
                        star = true;
                        names.push((out.text(n), None));
                    }
                    _ => {}
                }
            }
            if names.is_empty() && source.is_some() {
                star = true;
                names.push(("*".into(), None));
            }
            let from = source.as_ref().map(|s| format!(" from {s}"));
            for (name, alias) in &names {
                let shown = match alias {
                    Some(a) if a != name => format!("{name} as {a}"),
                    _ => name.clone(),
                };
                out.export(format!("{shown}{}", from.as_deref().unwrap_or("")));
            }
            if let Some(src) = source {
                let imported = if star {
                    vec!["*".to_string()]
                } else {
                    names.into_iter().map(|(n, _)| n).collect()
                };
                out.import(src, imported);
            }
        }
        "import_statement" => {
            let Some(source) = node.child_by_field_name("source") else {
                return;
            };
            let from = unquote(&out.text(source));
            let mut names = Vec::new();
            for clause in named_children(node) {
                if clause.kind() != "import_clause" {
                    continue;
                }
                for n in named_children(clause) {
                    match n.kind() {
                        "identifier" => names.push(out.text(n)),
                        "namespace_import" => names.push(out.text(n)),
                        "named_imports" => {
                            for spec in named_children(n) {
                                if let Some(name) = out.field_text(spec, "name") {
                                    names.push(name);
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            out.import(from, names);
        }
        "function_declaration" | "generator_function_declaration" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let sig = out.head(node, scope, node.child_by_field_name("body"));
            out.define(Kind::Function, name, sig, node, scope, scope.exported);
        }
        "function_signature" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let sig = out.head(node, scope, None);
            out.define(Kind::Function, name, sig, node, scope, scope.exported);
        }
        "class_declaration" | "abstract_class_declaration" | "class" => {
            let name = out
                .field_text(node, "name")
                .unwrap_or_else(|| "default".into());
            let body = node.child_by_field_name("body");
            let sig = out.head(node, scope, body);
            out.define(Kind::Class, name.clone(), sig, node, scope, scope.exported);
            if let Some(body) = body
                && scope.depth < MAX_DEPTH
            {
                stack.push((body, scope.inside(&name, scope.exported)));
            }
        }
        "class_body" | "interface_body" | "object_type" if scope.in_type => {
            push_children(node, scope, stack)
        }
        "method_definition" | "method_signature" | "abstract_method_signature" if scope.in_type => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let sig = out.head(node, scope, node.child_by_field_name("body"));
            let private = name.starts_with('#')
                || named_children(node)
                    .iter()
                    .any(|n| n.kind() == "accessibility_modifier" && out.text(*n) == "private");
            out.define(
                Kind::Method,
                name,
                sig,
                node,
                scope,
                scope.exported && !private,
            );
        }
        "interface_declaration" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let sig = out.whole(node, scope);
            out.define(
                Kind::Interface,
                name.clone(),
                sig,
                node,
                scope,
                scope.exported,
            );
            if let Some(body) = node.child_by_field_name("body")
                && scope.depth < MAX_DEPTH
            {
                stack.push((body, scope.inside(&name, scope.exported)));
            }
        }
        "type_alias_declaration" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let sig = out.whole(node, scope);
            out.define(Kind::Type, name, sig, node, scope, scope.exported);
        }
        "enum_declaration" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let sig = out.whole(node, scope);
            out.define(Kind::Enum, name, sig, node, scope, scope.exported);
        }
        "internal_module" | "module" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let body = node.child_by_field_name("body");
            let sig = out.head(node, scope, body);
            out.define(
                Kind::Module,
                unquote(&name),
                sig,
                node,
                scope,
                scope.exported,
            );
            if let Some(body) = body
                && scope.depth < MAX_DEPTH
            {
                let mut inner = scope.inside(&unquote(&name), scope.exported);
                inner.in_type = false;
                stack.push((body, inner));
            }
        }
        "lexical_declaration" | "variable_declaration" if !scope.in_type => {
            for d in named_children(node) {
                if d.kind() != "variable_declarator" {
                    continue;
                }
                let (Some(name), Some(value)) = (
                    d.child_by_field_name("name"),
                    d.child_by_field_name("value"),
                ) else {
                    continue;
                };
                let name_text = out.text(name);
                match value.kind() {
                    "arrow_function" | "function_expression" | "generator_function" => {
                        let mut s = scope.clone();
                        s.decorators.clear();
                        if s.sig_start.is_none() {
                            s.sig_start = Some(node.start_byte());
                        }
                        let sig = out.head(node, &s, value.child_by_field_name("body"));
                        out.define(kind, name_text, sig, node, scope, scope.exported);
                    }
                    "class" => {
                        let mut s = scope.clone();
                        if s.sig_start.is_none() {
                            s.sig_start = Some(node.start_byte());
                        }
                        let body = value.child_by_field_name("body");
                        let sig = out.head(node, &s, body);
                        out.define(
                            Kind::Class,
                            name_text.clone(),
                            sig,
                            node,
                            scope,
                            scope.exported,
                        );
                        if let Some(body) = body
                            && scope.depth < MAX_DEPTH
                        {
                            stack.push((body, scope.inside(&name_text, scope.exported)));
                        }
                    }
                    "call_expression" => {
                        if let Some(from) = require(out, value) {
                            let names = match name.kind() {
                                "identifier" => vec![name_text],
                                _ => named_children(name)
                                    .into_iter()
                                    .map(|n| out.text(n))
                                    .collect(),
                            };
                            out.import(from, names);
                        }
                    }
                    _ => {}
                }
            }
        }
        "expression_statement" if scope.depth == 0 => {
            for e in named_children(node) {
                match e.kind() {
                    "call_expression" => {
                        if let Some(from) = require(out, e) {
                            out.import(from, vec![]);
                        }
                    }
                    "assignment_expression" => {
                        if let Some(left) = e.child_by_field_name("left") {
                            let l = out.text(left);
                            if l == "module.exports" || l.starts_with("exports.") {
                                out.export(l);
                            }
                        }
                        if let Some(right) = e.child_by_field_name("right")
                            && right.kind() == "call_expression"
                            && let Some(from) = require(out, right)
                        {
                            out.import(from, vec![]);
                        }
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// The module of `require("…")`, if `call` is one.
fn require(out: &Out<'_>, call: Node<'_>) -> Option<String> {
    let f = call.child_by_field_name("function")?;
    if out.text(f) != "require" {
        return None;
    }
    let args = call.child_by_field_name("arguments")?;
    let first = named_children(args).into_iter().next()?;
    (first.kind() == "string").then(|| unquote(&out.text(first)))
}

// === Rust ===

fn rust<'t>(out: &mut Out<'_>, node: Node<'t>, scope: &Scope, stack: &mut Vec<(Node<'t>, Scope)>) {
    let public = || {
        named_children(node)
            .iter()
            .any(|n| n.kind() == "visibility_modifier")
    };
    if node.kind().ends_with("_item") && rust_test_only(out, node) {
        return;
    }
    match node.kind() {
        "source_file" | "declaration_list" | "ERROR" => push_children(node, scope, stack),
        "function_item" | "function_signature_item" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let kind = if scope.in_type {
                Kind::Method
            } else {
                Kind::Function
            };
            let sig = out.head(node, scope, node.child_by_field_name("body"));
            let exported = public() || scope.exported;
            out.define(kind, name, sig, node, scope, exported);
        }
        "struct_item" | "union_item" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let sig = out.whole(node, scope);
            out.define(Kind::Struct, name, sig, node, scope, public());
        }
        "enum_item" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let sig = out.whole(node, scope);
            out.define(Kind::Enum, name, sig, node, scope, public());
        }
        "type_item" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let sig = out.whole(node, scope);
            out.define(Kind::Type, name, sig, node, scope, public());
        }
        "trait_item" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let body = node.child_by_field_name("body");
            let sig = out.head(node, scope, body);
            let exported = public();
            out.define(Kind::Trait, name.clone(), sig, node, scope, exported);
            if let Some(body) = body
                && scope.depth < MAX_DEPTH
            {
                stack.push((body, scope.inside(&name, exported)));
            }
        }
        "impl_item" => {
            let Some(ty) = out.field_text(node, "type") else {
                return;
            };
            let body = node.child_by_field_name("body");
            let sig = out.head(node, scope, body);
            // Methods of a trait impl are as visible as the trait.
            let trait_impl = node.child_by_field_name("trait").is_some();
            out.define(Kind::Impl, ty.clone(), sig, node, scope, trait_impl);
            if let Some(body) = body
                && scope.depth < MAX_DEPTH
            {
                stack.push((body, scope.inside(&ty, trait_impl)));
            }
        }
        "mod_item" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            match node.child_by_field_name("body") {
                None => out.import(format!("self::{name}"), vec![]),
                Some(body) => {
                    let sig = out.head(node, scope, Some(body));
                    let exported = public();
                    out.define(Kind::Module, name.clone(), sig, node, scope, exported);
                    if scope.depth < MAX_DEPTH {
                        let mut inner = scope.inside(&name, exported);
                        inner.in_type = false;
                        inner.exported = false;
                        stack.push((body, inner));
                    }
                }
            }
        }
        "use_declaration" => {
            let Some(arg) = node.child_by_field_name("argument") else {
                return;
            };
            let exported = public();
            for path in use_paths(out, arg) {
                if exported {
                    out.export(path.clone());
                }
                let from = path.split(" as ").next().unwrap_or(&path).to_string();
                out.import(from, vec![]);
            }
        }
        _ => {}
    }
}

/// The paths a `use` tree names, `{}` groups expanded: `a::{b, c::D as E}` is `a::b` and
/// `a::c::D as E`. At most 256 paths; no recursion.
fn use_paths(out: &Out<'_>, arg: Node<'_>) -> Vec<String> {
    let mut paths = Vec::new();
    let mut stack = vec![(String::new(), arg)];
    while let Some((prefix, n)) = stack.pop() {
        if paths.len() >= 256 || stack.len() > 1024 {
            break;
        }
        let join = |s: String| {
            if prefix.is_empty() {
                s
            } else {
                format!("{prefix}::{s}")
            }
        };
        match n.kind() {
            "scoped_use_list" => {
                let p = n
                    .child_by_field_name("path")
                    .map(|p| join(out.text(p)))
                    .unwrap_or_else(|| prefix.clone());
                if let Some(list) = n.child_by_field_name("list") {
                    for c in named_children(list).into_iter().rev() {
                        stack.push((p.clone(), c));
                    }
                }
            }
            "use_list" => {
                for c in named_children(n).into_iter().rev() {
                    stack.push((prefix.clone(), c));
                }
            }
            "use_as_clause" => {
                let path = n.child_by_field_name("path").map(|p| out.text(p));
                let alias = n.child_by_field_name("alias").map(|a| out.text(a));
                if let (Some(p), Some(a)) = (path, alias) {
                    paths.push(format!("{} as {a}", join(p)));
                }
            }
            "use_wildcard" => paths.push(join(out.text(n))),
            // `a::{self, b}`: `self` is `a` itself.
            "self" if !prefix.is_empty() => paths.push(prefix.clone()),
            k if k.contains("comment") => {}
            _ => paths.push(join(out.text(n))),
        }
    }
    paths
}

// === Go ===

fn go<'t>(out: &mut Out<'_>, node: Node<'t>, scope: &Scope, stack: &mut Vec<(Node<'t>, Scope)>) {
    let exported = |name: &str| name.chars().next().is_some_and(char::is_uppercase);
    match node.kind() {
        "source_file" | "ERROR" | "import_spec_list" => push_children(node, scope, stack),
        "import_declaration" => push_children(node, scope, stack),
        "import_spec" => {
            if let Some(path) = node.child_by_field_name("path") {
                let from = unquote(&out.text(path));
                out.import(from, vec![]);
            }
        }
        "function_declaration" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let sig = out.head(node, scope, node.child_by_field_name("body"));
            let e = exported(&name);
            out.define(Kind::Function, name, sig, node, scope, e);
        }
        "method_declaration" => {
            let Some(name) = out.field_text(node, "name") else {
                return;
            };
            let receiver = node
                .child_by_field_name("receiver")
                .and_then(|r| {
                    named_children(r)
                        .into_iter()
                        .find(|p| p.kind() == "parameter_declaration")
                })
                .and_then(|p| p.child_by_field_name("type"))
                .map(|t| out.text(t))
                .unwrap_or_default();
            let receiver = receiver
                .trim_start_matches('*')
                .split('[')
                .next()
                .unwrap_or("")
                .to_string();
            let sig = out.head(node, scope, node.child_by_field_name("body"));
            let inner = scope.inside(&receiver, exported(&receiver));
            let e = exported(&name);
            out.define(Kind::Method, name, sig, node, &inner, e);
        }
        "type_declaration" => {
            for spec in named_children(node) {
                if !matches!(spec.kind(), "type_spec" | "type_alias") {
                    continue;
                }
                let Some(name) = out.field_text(spec, "name") else {
                    continue;
                };
                let ty = spec.child_by_field_name("type");
                let kind = match ty.map(|t| t.kind()) {
                    Some("struct_type") => Kind::Struct,
                    Some("interface_type") => Kind::Interface,
                    _ => Kind::Type,
                };
                let whole = out.whole(spec, &scope.same());
                let sig = clip(&format!("type {whole}"), MAX_SIGNATURE);
                let e = exported(&name);
                out.define(kind, name.clone(), sig, spec, scope, e);
                if kind == Kind::Interface
                    && let Some(ty) = ty
                {
                    let inner = scope.inside(&name, e);
                    for m in named_children(ty) {
                        if m.kind() != "method_elem" {
                            continue;
                        }
                        let Some(mname) = out.field_text(m, "name") else {
                            continue;
                        };
                        let msig = out.head(m, &inner, None);
                        let me = exported(&mname);
                        out.define(Kind::Method, mname, msig, m, &inner, me);
                    }
                }
            }
        }
        _ => {}
    }
}
