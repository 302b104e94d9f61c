//! Guards the source layout of the daemon and of its launchers.
//!
//! The rules, one test each: the launchers live in their own crate, zerg-launch, which depends
//! on zerg-proto and zerg-config only (never on zergd, on zerg-symbols or on git, whether the
//! zerg-git and gix crates or the git program); the settings are plain data in zerg-config,
//! which imports neither zergd nor a launcher; zergd's files form no import circle, so they
//! stack in layers that can be read and changed one at a time; the supervisor holds no wire
//! type (`zerg_proto::v1`), which stays at the edges that speak gRPC; and every source file of
//! the three crates begins with a `//!` line that says what it is.
//!
//! The checks read the sources with `syn`: they see `use` items and the paths in code and in
//! macro bodies, never doc comments, other attributes or the contents of strings.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use syn::buffer::Cursor;
use syn::parse::ParseStream;
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};

/// A module path from a crate root; empty for the root itself.
type ModPath = Vec<String>;

/// The names a module scope defines, each with the path from the crate root it stands for;
/// `None` for a name brought in from another crate.
type Names = BTreeMap<String, Option<ModPath>>;

/// The names each module scope defines, for a `use …::*` of it and for paths through it: its
/// child modules and what its `use` items bring in.
type Exports = BTreeMap<ModPath, Names>;

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace root")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, as sorted paths relative to `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    assert!(
        dir.is_dir(),
        "{} does not exist: the layout needs it",
        dir.display()
    );
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(next) = todo.pop() {
        let entries = std::fs::read_dir(&next)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", next.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", next.display()))
                .path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path.strip_prefix(dir).expect("under dir").to_path_buf());
            }
        }
    }
    files.sort();
    files
}

/// The text of a file.
fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// A Rust source file, parsed.
fn parse(path: &Path) -> syn::File {
    syn::parse_file(&read(path)).unwrap_or_else(|e| panic!("cannot parse {}: {e}", path.display()))
}

/// The module a file under a crate's `src` is: `lib.rs` and `main.rs` are the root, `a/mod.rs`
/// is `a` and `a/b.rs` is `a::b`.
fn module_of(rel: &Path) -> ModPath {
    let mut parts: ModPath = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().expect("a file name");
    let stem = file.strip_suffix(".rs").unwrap_or(&file);
    let root = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !root {
        parts.push(stem.to_owned());
    }
    parts
}

/// A module path as a reader writes it.
fn show(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_owned()
    } else {
        module.join("::")
    }
}

/// A path one file names.
struct Named {
    /// The path as written, e.g. `super::recovery::append_escalations` or `use zerg_proto::v1`.
    text: String,
    /// Its segments as written, without a leading `::`.
    segments: Vec<String>,
    /// The path from the crate root it stands for, when it names something in this crate.
    absolute: Option<ModPath>,
    /// Named inside an inline `#[cfg(test)]` module.
    in_test: bool,
}

/// A module scope: a file's own module, or an inline `mod x { … }` inside it.
#[derive(Default)]
struct Scope {
    /// Its path from the crate root.
    path: ModPath,
    /// The modules declared in it, with `mod x;` or `mod x { … }`.
    children: BTreeSet<String>,
    /// The names its `use` items bring in.
    names: Names,
    /// The names its `use …::*` items bring in from this crate's modules.
    globbed: Names,
}

/// What one file names and declares.
#[derive(Default)]
struct FileInfo {
    /// Every path it names, in source order.
    named: Vec<Named>,
    /// The modules it declares with `mod x;` under `#[cfg(test)]`.
    test_modules: BTreeSet<ModPath>,
    /// The names each of its module scopes defines.
    scopes: Exports,
}

/// One name a `use` item brings in, or one glob.
struct UseLeaf {
    /// The path it imports (the module itself for a glob), without a leading `::`.
    segments: Vec<String>,
    /// The name it binds; `None` for a glob.
    name: Option<String>,
    /// The path as written.
    text: String,
}

/// Walks one file and gathers the paths it names.
struct Collector<'e> {
    /// The names other modules export, for `use …::*`.
    exports: &'e Exports,
    /// The module scopes we are in, innermost last.
    scopes: Vec<Scope>,
    /// How many `#[cfg(test)]` inline modules we are in.
    in_test: usize,
    /// What was found.
    info: FileInfo,
}

impl Collector<'_> {
    /// Opens a module scope and learns the modules it declares and the names its `use` items
    /// bring in, so paths can be resolved wherever they appear in it.
    fn enter(&mut self, path: ModPath, items: &[syn::Item]) {
        let children = items
            .iter()
            .filter_map(|item| match item {
                syn::Item::Mod(m) => Some(m.ident.to_string()),
                _ => None,
            })
            .collect();
        self.scopes.push(Scope {
            path,
            children,
            ..Scope::default()
        });
        for item in items {
            if let syn::Item::Use(u) = item {
                for leaf in use_leaves(u) {
                    self.learn(&leaf, u.leading_colon.is_some());
                }
            }
        }
    }

    /// Closes the innermost scope and records the names it defines.
    fn leave(&mut self) {
        let scope = self.scopes.pop().expect("a scope to leave");
        let mut names = scope.names;
        for child in scope.children {
            let mut path = scope.path.clone();
            path.push(child.clone());
            names.insert(child, Some(path));
        }
        self.info.scopes.insert(scope.path, names);
    }

    /// Resolves a `use` leaf, binds the name it brings in and returns what it stands for.
    fn learn(&mut self, leaf: &UseLeaf, external: bool) -> Option<ModPath> {
        let absolute = if external {
            None
        } else {
            self.resolve(&leaf.segments)
        };
        let scope = self.scopes.last_mut().expect("a scope");
        match (&leaf.name, &absolute) {
            (Some(name), _) if name != "_" => {
                scope.names.insert(name.clone(), absolute.clone());
            }
            (None, Some(target)) => {
                for (name, path) in self.exports.get(target).into_iter().flatten() {
                    scope
                        .globbed
                        .entry(name.clone())
                        .or_insert_with(|| path.clone());
                }
            }
            _ => {}
        }
        absolute
    }

    /// The path from the crate root a path stands for, if it starts with `crate`, `self`,
    /// `super`, a module declared in this scope or a name a `use` brought in from this crate,
    /// and does not pass through a name brought in from another crate (`crate::fsat::Dir`, where
    /// the root has `pub use zerg_git::fsat`, is zerg-git's).
    fn resolve(&self, segments: &[String]) -> Option<ModPath> {
        let scope = self.scopes.last()?;
        let (first, after_first) = segments.split_first()?;
        let (mut base, mut rest) = match first.as_str() {
            "crate" => (ModPath::new(), after_first),
            "self" => (scope.path.clone(), after_first),
            "super" => (scope.path.clone(), segments),
            name if !after_first.is_empty() => {
                let base = if scope.children.contains(name) {
                    let mut path = scope.path.clone();
                    path.push(name.to_owned());
                    path
                } else {
                    scope
                        .names
                        .get(name)
                        .or_else(|| scope.globbed.get(name))?
                        .clone()?
                };
                (base, after_first)
            }
            _ => return None,
        };
        while let Some((first, after)) = rest.split_first()
            && first == "super"
        {
            base.pop()?;
            rest = after;
        }
        base.extend(rest.iter().cloned());
        let leaves_the_crate = (0..base.len()).any(|n| {
            let names = self.exports.get(&base[..n]);
            matches!(names.and_then(|names| names.get(&base[n])), Some(None))
        });
        (!leaves_the_crate).then_some(base)
    }

    /// Records a path the file names.
    fn name(&mut self, segments: Vec<String>, leading_colon: bool, text: String) {
        let absolute = if leading_colon {
            None
        } else {
            self.resolve(&segments)
        };
        self.info.named.push(Named {
            text,
            segments,
            absolute,
            in_test: self.in_test > 0,
        });
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    // Doc comments are attributes, and no attribute imports anything.
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}

    // `pub(super)` and `pub(crate)` say who may see an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        let test = is_cfg_test(&item.attrs);
        let mut path = self.scopes.last().expect("a scope").path.clone();
        path.push(item.ident.to_string());
        match &item.content {
            // Declaring a child module is not importing it.
            None => {
                if test || self.in_test > 0 {
                    self.info.test_modules.insert(path);
                }
            }
            Some((_, items)) => {
                self.in_test += usize::from(test);
                self.enter(path, items);
                for item in items {
                    self.visit_item(item);
                }
                self.leave();
                self.in_test -= usize::from(test);
            }
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let external = item.leading_colon.is_some();
        for leaf in use_leaves(item) {
            let absolute = self.learn(&leaf, external);
            let colon = if external { "::" } else { "" };
            self.info.named.push(Named {
                text: format!("use {colon}{}", leaf.text),
                segments: leaf.segments,
                absolute,
                in_test: self.in_test > 0,
            });
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        // A one-segment path is a local name (or the `self` receiver), not a module's item.
        if path.segments.len() >= 2 {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            let colon = if path.leading_colon.is_some() {
                "::"
            } else {
                ""
            };
            let text = format!("{colon}{}", segments.join("::"));
            self.name(segments, path.leading_colon.is_some(), text);
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        for segments in macro_paths(mac) {
            let text = format!("{} (in a macro)", segments.join("::"));
            self.name(segments, false, text);
        }
    }
}

/// What one file (of the module `module`) names and declares; `exports` lets a `use …::*`
/// bring in the names of the module it globs.
fn collect(file: &syn::File, module: ModPath, exports: &Exports) -> FileInfo {
    let mut collector = Collector {
        exports,
        scopes: Vec::new(),
        in_test: 0,
        info: FileInfo::default(),
    };
    collector.enter(module, &file.items);
    for item in &file.items {
        collector.visit_item(item);
    }
    collector.leave();
    collector.info
}

/// Whether the attributes hold `#[cfg(test)]` (or `#[cfg(all(test, …))]`).
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg") && attr.parse_args::<syn::Meta>().is_ok_and(|m| needs_test(&m))
    })
}

/// Whether a `cfg` predicate holds only under `test`.
fn needs_test(meta: &syn::Meta) -> bool {
    match meta {
        syn::Meta::Path(path) => path.is_ident("test"),
        syn::Meta::List(list) if list.path.is_ident("all") => list
            .parse_args_with(Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated)
            .is_ok_and(|all| all.iter().any(needs_test)),
        _ => false,
    }
}

/// The names a `use` item brings in, its groups, renames and globs spelled out.
fn use_leaves(item: &syn::ItemUse) -> Vec<UseLeaf> {
    fn walk(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<UseLeaf>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                walk(&p.tree, prefix, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) => out.push(leaf(prefix, &n.ident, None)),
            syn::UseTree::Rename(r) => out.push(leaf(prefix, &r.ident, Some(&r.rename))),
            syn::UseTree::Glob(_) => out.push(UseLeaf {
                segments: prefix.clone(),
                name: None,
                text: format!("{}::*", prefix.join("::")),
            }),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    walk(tree, prefix, out);
                }
            }
        }
    }
    fn leaf(prefix: &[String], ident: &syn::Ident, rename: Option<&syn::Ident>) -> UseLeaf {
        let mut segments = prefix.to_vec();
        if ident != "self" {
            segments.push(ident.to_string());
        }
        let mut text = segments.join("::");
        if let Some(rename) = rename {
            write!(text, " as {rename}").expect("writing to a String");
        }
        let name = rename.map_or_else(|| segments.last().cloned(), |r| Some(r.to_string()));
        UseLeaf {
            segments,
            name,
            text,
        }
    }
    let mut out = Vec::new();
    walk(&item.tree, &mut Vec::new(), &mut out);
    out
}

/// The paths of two or more segments (`a::b…`) in a macro's tokens.
fn macro_paths(mac: &syn::Macro) -> Vec<Vec<String>> {
    mac.parse_body_with(|input: ParseStream<'_>| {
        input.step(|cursor| {
            let mut found = Vec::new();
            let end = scan_tokens(*cursor, &mut found);
            Ok((found, end))
        })
    })
    .unwrap_or_default()
}

/// Gathers the paths in a token stream, groups included, and returns the cursor at its end.
fn scan_tokens<'a>(mut cursor: Cursor<'a>, found: &mut Vec<Vec<String>>) -> Cursor<'a> {
    while !cursor.eof() {
        if let Some((inner, _, _, next)) = cursor.any_group() {
            scan_tokens(inner, found);
            cursor = next;
        } else if let Some((ident, next)) = cursor.ident() {
            let mut segments = vec![ident.to_string()];
            cursor = next;
            while let Some((ident, next)) = path_sep(cursor).and_then(|c| c.ident()) {
                segments.push(ident.to_string());
                cursor = next;
            }
            if segments.len() >= 2 {
                found.push(segments);
            }
        } else if let Some((_, next)) = cursor.token_tree() {
            cursor = next;
        } else {
            break;
        }
    }
    cursor
}

/// The cursor after a `::` at `cursor`, if there is one.
fn path_sep(cursor: Cursor<'_>) -> Option<Cursor<'_>> {
    let (first, next) = cursor.punct()?;
    let (second, next) = next.punct()?;
    (first.as_char() == ':' && second.as_char() == ':').then_some(next)
}

/// Tarjan's strongly connected components of a graph given as adjacency lists.
struct Tarjan<'g> {
    /// The edges out of each node.
    edges: &'g [Vec<usize>],
    /// The order each node was first reached in.
    index: Vec<Option<usize>>,
    /// The lowest index reachable from each node's subtree.
    low: Vec<usize>,
    /// Whether each node is on the stack.
    on_stack: Vec<bool>,
    /// The nodes of the components not yet closed.
    stack: Vec<usize>,
    /// The next index to hand out.
    next: usize,
    /// The components found, each sorted.
    components: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    /// Reaches `node` and everything reachable from it.
    fn visit(&mut self, node: usize) {
        self.index[node] = Some(self.next);
        self.low[node] = self.next;
        self.next += 1;
        self.stack.push(node);
        self.on_stack[node] = true;
        let edges = self.edges;
        for &to in &edges[node] {
            match self.index[to] {
                None => {
                    self.visit(to);
                    self.low[node] = self.low[node].min(self.low[to]);
                }
                Some(index) if self.on_stack[to] => self.low[node] = self.low[node].min(index),
                Some(_) => {}
            }
        }
        if self.index[node] == Some(self.low[node]) {
            let mut component = Vec::new();
            while let Some(member) = self.stack.pop() {
                self.on_stack[member] = false;
                component.push(member);
                if member == node {
                    break;
                }
            }
            component.sort_unstable();
            self.components.push(component);
        }
    }
}

/// The strongly connected components of a graph of `edges.len()` nodes.
fn strongly_connected(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = edges.len();
    let mut tarjan = Tarjan {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        components: Vec::new(),
    };
    for node in 0..n {
        if tarjan.index[node].is_none() {
            tarjan.visit(node);
        }
    }
    tarjan.components
}

#[test]
fn zergd_files_form_no_circle() {
    let report = circles(&root().join("zergd/src"));
    assert!(
        report.is_empty(),
        "zergd's files import each other in a circle, so none of them can be read or changed \
         without the rest. Break each circle below: move what both sides need into a module \
         beneath them, or pass it in.\n{report}"
    );
}

#[test]
fn zerg_git_files_form_no_circle() {
    // Its root (`lib.rs`) holds `Repo` and `Error`, which every module builds on, and
    // re-exports their types: its own imports of them are the crate's face, not a circle.
    let report = circles_below_root(&root().join("zerg-git/src"));
    assert!(
        report.is_empty(),
        "zerg-git's files import each other in a circle. Break each circle below: move what \
         both sides need into the module beneath them.\n{report}"
    );
}

/// The imports among the files under `src` (a crate's source root): each file (relative
/// path and module), and each edge between two files with one path that makes it. Test-only
/// files (declared under `#[cfg(test)]`, named `tests.rs`, or below one) have no edge.
struct Imports {
    files: Vec<(PathBuf, ModPath)>,
    edges: BTreeMap<(usize, usize), String>,
    /// Every path each file names, in the order of `files`.
    named: Vec<Vec<Named>>,
}

fn imports(src: &Path) -> Imports {
    // `main.rs` is the root of the binary, a crate of its own that reaches the library only
    // through `zergd::…`: no edge of the library's graph touches it.
    let files: Vec<(PathBuf, ModPath, syn::File)> = rust_files(src)
        .into_iter()
        .filter(|rel| rel != Path::new("main.rs"))
        .map(|rel| {
            let ast = parse(&src.join(&rel));
            let module = module_of(&rel);
            (rel, module, ast)
        })
        .collect();
    // Each pass learns what the modules define, so that in the next a `use super::*` brings in
    // the names of the module it globs; a few passes settle it.
    let mut exports = Exports::new();
    let mut infos: Vec<FileInfo> = Vec::new();
    for _ in 0..4 {
        infos = files
            .iter()
            .map(|(_, module, ast)| collect(ast, module.clone(), &exports))
            .collect();
        let learned: Exports = infos.iter().flat_map(|info| info.scopes.clone()).collect();
        if learned == exports {
            break;
        }
        exports = learned;
    }
    let index: BTreeMap<ModPath, usize> = files
        .iter()
        .enumerate()
        .map(|(i, (_, module, _))| (module.clone(), i))
        .collect();
    // Test-only files may reach anywhere: those declared under `#[cfg(test)]`, those named
    // `tests.rs` and everything below them are left out.
    let declared_in_tests: BTreeSet<ModPath> = infos
        .iter()
        .flat_map(|info| info.test_modules.iter().cloned())
        .collect();
    let test_only = |module: &ModPath| {
        (1..=module.len())
            .any(|n| module[n - 1] == "tests" || declared_in_tests.contains(&module[..n]))
    };
    let mut edges: BTreeMap<(usize, usize), String> = BTreeMap::new();
    for (from, info) in infos.iter().enumerate() {
        if test_only(&files[from].1) {
            continue;
        }
        for named in &info.named {
            let Some(absolute) = &named.absolute else {
                continue;
            };
            // The longest prefix that is a file's module: `crate::a::b::Item` is `a::b`.
            let to = (0..=absolute.len())
                .rev()
                .find_map(|n| index.get(&absolute[..n]));
            if let Some(&to) = to
                && to != from
                && !test_only(&files[to].1)
            {
                edges
                    .entry((from, to))
                    .or_insert_with(|| named.text.clone());
            }
        }
    }
    Imports {
        files: files
            .into_iter()
            .map(|(rel, module, _)| (rel, module))
            .collect(),
        edges,
        named: infos.into_iter().map(|info| info.named).collect(),
    }
}

/// The circles of imports among the files under `src` (a crate's source root), each with the
/// imports that make it; empty when there is none.
fn circles(src: &Path) -> String {
    report_circles(imports(src))
}

/// [`circles`], not counting what the crate root imports.
fn circles_below_root(src: &Path) -> String {
    let mut all = imports(src);
    let root = all.files.iter().position(|(_, module)| module.is_empty());
    all.edges.retain(|&(from, _), _| Some(from) != root);
    report_circles(all)
}

fn report_circles(Imports { files, edges, .. }: Imports) -> String {
    let shown = |i: usize| format!("{} ({})", show(&files[i].1), files[i].0.display());
    let mut adjacency = vec![Vec::new(); files.len()];
    for &(from, to) in edges.keys() {
        adjacency[from].push(to);
    }

    let mut report = String::new();
    for component in strongly_connected(&adjacency) {
        if component.len() < 2 {
            continue;
        }
        writeln!(report, "\na circle of {} files:", component.len()).expect("a String");
        for &member in &component {
            writeln!(report, "  {}", shown(member)).expect("a String");
        }
        writeln!(
            report,
            "the imports inside it, each with one path that makes it:"
        )
        .expect("a String");
        for (&(from, to), text) in &edges {
            if component.contains(&from) && component.contains(&to) {
                writeln!(
                    report,
                    "  {} -> {} ({text})",
                    show(&files[from].1),
                    show(&files[to].1)
                )
                .expect("a String");
            }
        }
    }
    report
}

/// Whether a path names the gRPC wire types: `zerg_proto::v1…`, or `v1::…`.
fn names_wire(segments: &[String]) -> bool {
    (segments.len() >= 2 && segments[0] == "v1")
        || segments
            .windows(2)
            .any(|pair| pair[0] == "zerg_proto" && pair[1] == "v1")
}

#[test]
fn no_wire_type_inside_the_supervisor() {
    let dir = root().join("zergd/src/supervisor");
    let mut found = String::new();
    // Its tests too: they drive the state machine with the same domain values.
    for rel in rust_files(&dir) {
        let module = module_of(&Path::new("supervisor").join(&rel));
        let info = collect(&parse(&dir.join(&rel)), module, &Exports::new());
        let wire: BTreeSet<&str> = info
            .named
            .iter()
            .filter(|named| names_wire(&named.segments))
            .map(|named| named.text.as_str())
            .collect();
        if !wire.is_empty() {
            let paths = wire.into_iter().collect::<Vec<_>>().join(", ");
            writeln!(found, "  zergd/src/supervisor/{}: {paths}", rel.display()).expect("a String");
        }
    }
    assert!(
        found.is_empty(),
        "the supervisor names gRPC wire types (`zerg_proto::v1`); it should work on zergd's own \
         types and leave the conversion to the edges that speak gRPC (wire/, server.rs):\n{found}"
    );
}

#[test]
fn no_wire_type_in_what_the_supervisor_imports() {
    let found = wire_reached_from_supervisor(&root().join("zergd/src"));
    assert!(
        found.is_empty(),
        "files the supervisor imports (directly or through others) name gRPC wire types, so \
         the supervisor still builds them through those files; return zergd's own types there \
         and convert in wire/ or server.rs:\n{found}"
    );
}

/// The files outside `supervisor/` that its files reach through imports and that name gRPC
/// wire types, each with the wire paths it names; empty when there is none.
fn wire_reached_from_supervisor(src: &Path) -> String {
    let Imports {
        files,
        edges,
        named,
    } = imports(src);
    let in_supervisor = |i: usize| files[i].1.first().is_some_and(|m| m == "supervisor");
    let mut reached: BTreeSet<usize> = (0..files.len()).filter(|&i| in_supervisor(i)).collect();
    let mut todo: Vec<usize> = reached.iter().copied().collect();
    while let Some(from) = todo.pop() {
        for &(f, to) in edges.keys() {
            if f == from && reached.insert(to) {
                todo.push(to);
            }
        }
    }
    let mut found = String::new();
    for i in reached.into_iter().filter(|&i| !in_supervisor(i)) {
        // What its own tests name is theirs.
        let wire: BTreeSet<&str> = named[i]
            .iter()
            .filter(|named| !named.in_test && names_wire(&named.segments))
            .map(|named| named.text.as_str())
            .collect();
        if !wire.is_empty() {
            let paths = wire.into_iter().collect::<Vec<_>>().join(", ");
            writeln!(found, "  {}: {paths}", files[i].0.display()).expect("a String");
        }
    }
    found
}

#[test]
fn every_source_file_says_what_it_is() {
    let root = root();
    let mut problems = String::new();
    for dir in ["zergd/src", "zerg-launch/src", "zerg-config/src"] {
        let path = root.join(dir);
        if !path.is_dir() {
            writeln!(problems, "  {dir}: no such directory").expect("a String");
            continue;
        }
        for rel in rust_files(&path) {
            let text = read(&path.join(&rel));
            let first = text.lines().map(str::trim).find(|line| !line.is_empty());
            let says = first
                .and_then(|line| line.strip_prefix("//!"))
                .is_some_and(|rest| !rest.trim().is_empty());
            if !says {
                writeln!(problems, "  {dir}/{}", rel.display()).expect("a String");
            }
        }
    }
    assert!(
        problems.is_empty(),
        "every source file must begin with a `//!` line that says what the file is; these do \
         not:\n{problems}"
    );
}

/// The value of `key = "…"` in a line of TOML, if the line holds one.
fn quoted_value<'t>(line: &'t str, key: &str) -> Option<&'t str> {
    let (_, after) = line.split_once(key)?;
    let after = after.trim_start().strip_prefix('=')?.trim_start();
    let after = after.strip_prefix('"')?;
    after.split_once('"').map(|(value, _)| value)
}

/// The crates a Cargo.toml's `[dependencies]` tables name (also `[target.….dependencies]` and
/// `[dependencies.x]`), with `_` spelled `-`; a dependency renamed with `package = "…"` is
/// listed under both names.
fn dependencies(manifest: &Path) -> Vec<String> {
    /// Where in the manifest a line is.
    enum Table {
        /// Outside every dependency table.
        Other,
        /// In a table of dependencies, one a line.
        Deps,
        /// In the table of one dependency.
        One,
    }
    let mut names = Vec::new();
    let mut table = Table::Other;
    for line in read(manifest).lines() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if let Some(header) = line.strip_prefix('[') {
            let header = header.trim_end_matches(']').trim();
            table = if header == "dependencies" || header.ends_with(".dependencies") {
                Table::Deps
            } else if let Some(name) = header
                .strip_prefix("dependencies.")
                .or_else(|| header.rsplit_once(".dependencies.").map(|(_, name)| name))
            {
                names.push(name.trim_matches(['"', '\'']).to_owned());
                Table::One
            } else {
                Table::Other
            };
            continue;
        }
        match table {
            Table::Deps => {
                if let Some((key, _)) = line.split_once('=') {
                    let key = key.trim().trim_matches('"');
                    names.push(key.split('.').next().unwrap_or(key).trim().to_owned());
                    names.extend(quoted_value(line, "package").map(str::to_owned));
                }
            }
            Table::One => names.extend(quoted_value(line, "package").map(str::to_owned)),
            Table::Other => {}
        }
    }
    names
        .into_iter()
        .map(|name| name.replace('_', "-"))
        .collect()
}

/// Whether a path ends in `Command::new`.
fn is_command_new(path: &syn::Path) -> bool {
    let mut last = path.segments.iter().rev().map(|s| &s.ident);
    last.next().is_some_and(|i| i == "new") && last.next().is_some_and(|i| i == "Command")
}

/// Finds the calls `Command::new("git")`, in code and in macro bodies that are expressions.
#[derive(Default)]
struct GitRuns(Vec<String>);

impl<'ast> Visit<'ast> for GitRuns {
    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let syn::Expr::Path(func) = &*call.func
            && is_command_new(&func.path)
            && let Some(syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(program),
                ..
            })) = call.args.first()
            && program.value() == "git"
        {
            self.0.push("Command::new(\"git\")".to_owned());
        }
        visit::visit_expr_call(self, call);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if let Ok(args) =
            mac.parse_body_with(Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated)
        {
            for arg in &args {
                self.visit_expr(arg);
            }
        }
    }
}

/// The problems of the sources under `<root>/<krate>/src`: paths that start with one of
/// `crates` and, if `no_git`, runs of the git program.
fn source_problems(krate: &str, crates: &[&str], no_git: bool) -> Vec<String> {
    source_problems_in(&root(), krate, crates, no_git)
}

/// [`source_problems`] in the workspace at `root`.
fn source_problems_in(root: &Path, krate: &str, crates: &[&str], no_git: bool) -> Vec<String> {
    let src = root.join(krate).join("src");
    let mut problems = Vec::new();
    for rel in rust_files(&src) {
        let ast = parse(&src.join(&rel));
        let shown = format!("{krate}/src/{}", rel.display());
        let named: BTreeSet<String> = collect(&ast, module_of(&rel), &Exports::new())
            .named
            .into_iter()
            .filter(|named| {
                named
                    .segments
                    .first()
                    .is_some_and(|first| crates.contains(&first.as_str()))
            })
            .map(|named| named.text)
            .collect();
        for text in named {
            problems.push(format!("{shown} names {text}"));
        }
        if no_git {
            let mut runs = GitRuns::default();
            runs.visit_file(&ast);
            for run in runs.0 {
                problems.push(format!("{shown} runs the git program: {run}"));
            }
        }
    }
    problems
}

/// The problems of a crate's `[dependencies]`: the ones among `banned` it names.
fn dependency_problems(krate: &str, banned: &[&str]) -> Vec<String> {
    dependency_problems_in(&root(), krate, banned)
}

/// [`dependency_problems`] in the workspace at `root`.
fn dependency_problems_in(root: &Path, krate: &str, banned: &[&str]) -> Vec<String> {
    dependencies(&root.join(krate).join("Cargo.toml"))
        .into_iter()
        .filter(|name| banned.contains(&name.as_str()))
        .map(|name| format!("{krate}/Cargo.toml: [dependencies] names {name}"))
        .collect()
}

#[test]
fn launchers_depend_on_neither_zergd_nor_git() {
    let mut problems =
        dependency_problems("zerg-launch", &["zergd", "zerg-git", "gix", "zerg-symbols"]);
    problems.extend(source_problems(
        "zerg-launch",
        &["zergd", "zerg_git", "gix"],
        true,
    ));
    assert!(
        problems.is_empty(),
        "zerg-launch starts workers and depends on zerg-proto and zerg-config only: not on \
         zergd, zerg-symbols or git (zerg-git, gix or the git program). Move these out:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn config_imports_no_launcher() {
    let mut problems = dependency_problems("zerg-config", &["zerg-launch", "zergd"]);
    problems.extend(source_problems(
        "zerg-config",
        &["zerg_launch", "zergd"],
        false,
    ));
    assert!(
        problems.is_empty(),
        "zerg-config holds the settings as plain data and imports neither a launcher nor \
         zergd. Move these out:\n  {}",
        problems.join("\n  ")
    );
}

/// The checks above, on a scratch workspace that breaks each rule once: each must see it (a
/// check that finds nothing in a planted case would pass whatever the code does).
#[test]
fn each_layout_check_finds_a_rule_broken_on_purpose() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path();
    let write = |rel: &str, text: &str| {
        let p = w.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    // Two files that import each other, and a third beside them that imports one only.
    write(
        "zergd/src/lib.rs",
        "//! root\nmod a;\nmod b;\nmod c;\n#[cfg(test)]\nmod t;\n",
    );
    write("zergd/src/a.rs", "//! a\nuse crate::b::B;\npub struct A;\n");
    write("zergd/src/b.rs", "//! b\npub struct B(crate::a::A);\n");
    write("zergd/src/c.rs", "//! c\nuse crate::a::A;\n");
    write(
        "zergd/src/t.rs",
        "//! tests reach anywhere\nuse crate::c;\n",
    );
    let report = circles(&w.join("zergd/src"));
    assert!(report.contains("a circle of 2 files"), "{report}");
    assert!(
        circles_below_root(&w.join("zergd/src")).contains("a circle of 2 files"),
        "a circle below the root counts without it"
    );
    assert!(report.contains("a -> b (use crate::b::B)"), "{report}");
    assert!(
        !report.contains("c.rs"),
        "c is outside the circle: {report}"
    );
    // Without the import back, no circle.
    write("zergd/src/b.rs", "//! b\npub struct B;\n");
    assert_eq!(circles(&w.join("zergd/src")), "");

    // The supervisor builds a wire type through a file it imports (two steps away); the same
    // type named only by that file's tests is not counted.
    write(
        "zergd/src/lib.rs",
        "//! root\nmod a;\nmod b;\nmod supervisor;\n",
    );
    write("zergd/src/supervisor.rs", "//! s\nuse crate::a::A;\n");
    write("zergd/src/a.rs", "//! a\npub struct A(crate::b::B);\n");
    write(
        "zergd/src/b.rs",
        "//! b\npub struct B;\npub fn f() -> zerg_proto::v1::DiskUsage { todo!() }\n",
    );
    let found = wire_reached_from_supervisor(&w.join("zergd/src"));
    assert!(found.contains("b.rs: zerg_proto::v1::DiskUsage"), "{found}");
    write(
        "zergd/src/b.rs",
        "//! b\npub struct B;\n#[cfg(test)]\nmod tests {\n    fn f(_: zerg_proto::v1::DiskUsage) {}\n}\n",
    );
    assert_eq!(wire_reached_from_supervisor(&w.join("zergd/src")), "");

    // A launcher that names zergd, runs git and depends on zerg-git.
    write(
        "zerg-launch/src/lib.rs",
        "//! l\nuse zergd::calls::RushKey;\nfn f() { let _ = std::process::Command::new(\"git\"); }\n",
    );
    write(
        "zerg-launch/Cargo.toml",
        "[package]\nname = \"zerg-launch\"\n\n[dependencies]\nzerg_git = { path = \"../zerg-git\" }\n",
    );
    let problems = source_problems_in(w, "zerg-launch", &["zergd", "zerg_git", "gix"], true);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("names use zergd::calls::RushKey"))
            && problems.iter().any(|p| p.contains("runs the git program")),
        "{problems:?}"
    );
    let deps = dependency_problems_in(w, "zerg-launch", &["zerg-git"]);
    assert_eq!(
        deps,
        vec!["zerg-launch/Cargo.toml: [dependencies] names zerg-git".to_string()]
    );
}
