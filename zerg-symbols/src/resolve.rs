//! From a file's imports to the indexed files they name, per language: Python modules and
//! packages (absolute from any enclosing directory, or relative), JavaScript and TypeScript
//! relative specifiers (with the extensions and `index` files bundlers try), Rust `mod`
//! declarations and `crate::`, `self::`, `super::` paths, and Go import paths (matched to the
//! indexed directory that ends the path). Imports of other packages resolve to nothing.

use super::{FileSymbols, Language, SymbolIndex};

/// The indexed files `symbols` (the file at `path`) imports, in import order, each once.
pub(crate) fn imported_files(
    index: &SymbolIndex,
    path: &str,
    symbols: &FileSymbols,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let add = |out: &mut Vec<String>, p: String| {
        if p != path && !out.contains(&p) {
            out.push(p);
        }
    };
    let family = symbols.language.family();
    let has = |p: &str| index.get(p).is_some_and(|s| s.language.family() == family);
    for imp in &symbols.imports {
        match symbols.language {
            Language::Python => {
                for p in python(&has, path, &imp.from, &imp.names) {
                    add(&mut out, p);
                }
            }
            Language::JavaScript | Language::TypeScript => {
                if let Some(p) = javascript(&has, path, &imp.from) {
                    add(&mut out, p);
                }
            }
            Language::Rust => {
                if let Some(p) = rust(&has, path, &imp.from) {
                    add(&mut out, p);
                }
            }
            Language::Go => {
                for p in go(index, &imp.from) {
                    add(&mut out, p);
                }
            }
        }
        if out.len() >= 64 {
            break;
        }
    }
    out
}

/// The directory of a path, with a trailing `/` (empty for the root).
pub(crate) fn dir_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(i) => &path[..=i],
        None => "",
    }
}

/// `base` (a directory ending in `/`, or empty) joined with a relative path, `.` and `..`
/// resolved; `None` when it climbs out of the repository.
fn join(base: &str, rel: &str) -> Option<String> {
    let mut parts: Vec<&str> = base.split('/').filter(|s| !s.is_empty()).collect();
    for seg in rel.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts.join("/"))
}

fn parent_dir(dir: &str) -> Option<&str> {
    if dir.is_empty() {
        return None;
    }
    Some(dir_of(&dir[..dir.len() - 1]))
}

fn python(has: &dyn Fn(&str) -> bool, path: &str, from: &str, names: &[String]) -> Vec<String> {
    // `dir` ends with `/` or is empty (the root).
    let module = |dir: &str, dotted: &str| -> Option<String> {
        if dotted.is_empty() {
            let init = format!("{dir}__init__.py");
            return has(&init).then_some(init);
        }
        let base = format!("{dir}{}", dotted.replace('.', "/"));
        [
            format!("{base}.py"),
            format!("{base}.pyi"),
            format!("{base}/__init__.py"),
        ]
        .into_iter()
        .find(|p| has(p))
    };
    let mut found = Vec::new();
    let dots = from.len() - from.trim_start_matches('.').len();
    let rest = &from[dots..];
    let bases: Vec<String> = if dots > 0 {
        // `.` is the file's own package, each further dot one package up.
        let mut dir = dir_of(path);
        for _ in 1..dots {
            match parent_dir(dir) {
                Some(d) => dir = d,
                None => return found,
            }
        }
        vec![dir.to_string()]
    } else {
        // Absolute: from the closest enclosing directory that has it (a `src/` layout, a
        // package inside a monorepo), up to the root.
        let mut dirs = Vec::new();
        let mut dir = Some(dir_of(path));
        while let Some(d) = dir {
            dirs.push(d.to_string());
            dir = parent_dir(d);
        }
        dirs
    };
    for base in bases {
        let mut hit = false;
        for n in names.iter().filter(|n| *n != "*") {
            let sub = if rest.is_empty() {
                n.clone()
            } else {
                format!("{rest}.{n}")
            };
            if let Some(p) = module(&base, &sub) {
                found.push(p);
                hit = true;
            }
        }
        if let Some(p) = module(&base, rest) {
            found.push(p);
            hit = true;
        }
        if hit {
            break;
        }
    }
    found
}

const JS_EXTENSIONS: &[&str] = &[
    ".ts", ".tsx", ".d.ts", ".js", ".jsx", ".mjs", ".cjs", ".mts", ".cts",
];

fn javascript(has: &dyn Fn(&str) -> bool, path: &str, spec: &str) -> Option<String> {
    if !(spec.starts_with("./") || spec.starts_with("../") || spec == "." || spec == "..") {
        return None;
    }
    let target = join(dir_of(path), spec)?;
    let mut candidates = vec![target.clone()];
    // TypeScript's ESM style names the compiled file: `./api.js` is `./api.ts`.
    for (js, ts) in [
        (".js", ".ts"),
        (".jsx", ".tsx"),
        (".mjs", ".mts"),
        (".cjs", ".cts"),
    ] {
        if let Some(stem) = target.strip_suffix(js) {
            candidates.push(format!("{stem}{ts}"));
            candidates.push(format!("{stem}.tsx"));
        }
    }
    for ext in JS_EXTENSIONS {
        candidates.push(format!("{target}{ext}"));
    }
    for ext in JS_EXTENSIONS {
        candidates.push(if target.is_empty() {
            format!("index{ext}")
        } else {
            format!("{target}/index{ext}")
        });
    }
    candidates.into_iter().find(|c| has(c))
}

fn rust(has: &dyn Fn(&str) -> bool, path: &str, from: &str) -> Option<String> {
    let file = path.rsplit('/').next().unwrap_or(path);
    let dir = dir_of(path);
    // The directory holding a file's child modules.
    let own = if matches!(file, "mod.rs" | "lib.rs" | "main.rs") {
        dir.to_string()
    } else {
        format!("{dir}{}/", file.trim_end_matches(".rs"))
    };
    let mut segs = from.split("::").filter(|s| !s.is_empty()).peekable();
    let mut base = match segs.peek().copied() {
        Some("crate") => {
            segs.next();
            // The crate root: the closest enclosing `src/`.
            let mut d = Some(dir);
            let mut root = None;
            while let Some(x) = d {
                if x.ends_with("src/") || x == "src/" {
                    root = Some(x.to_string());
                    break;
                }
                d = parent_dir(x);
            }
            root.unwrap_or_else(|| dir.to_string())
        }
        Some("self") => {
            segs.next();
            own.clone()
        }
        Some("super") => {
            let mut d = own.clone();
            while segs.peek() == Some(&"super") {
                segs.next();
                d = parent_dir(&d)?.to_string();
            }
            d
        }
        // A bare first segment: a module beside this one (2018 paths), or another crate.
        _ => own.clone(),
    };
    let mut last = None;
    for seg in segs {
        if seg == "*" || seg.contains(' ') {
            break;
        }
        let file = format!("{base}{seg}.rs");
        let module = format!("{base}{seg}/mod.rs");
        if has(&file) {
            last = Some(file);
        } else if has(&module) {
            last = Some(module);
        } else {
            break;
        }
        base = format!("{base}{seg}/");
    }
    last
}

fn go(index: &SymbolIndex, import: &str) -> Vec<String> {
    // The longest tail of the import path that is an indexed directory of Go files: the module
    // path is not needed to find `internal/auth` in `github.com/acme/app/internal/auth`.
    let parts: Vec<&str> = import.split('/').filter(|s| !s.is_empty()).collect();
    for i in 0..parts.len() {
        let dir = format!("{}/", parts[i..].join("/"));
        let files: Vec<String> = index
            .under(&dir)
            .filter(|(p, s)| {
                s.language == Language::Go
                    && !p[dir.len()..].contains('/')
                    && !p.ends_with("_test.go")
            })
            .map(|(p, _)| p.to_string())
            .collect();
        if !files.is_empty() {
            return files;
        }
    }
    Vec::new()
}
