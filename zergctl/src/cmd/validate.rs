//! `zergctl validate`: check a task graph offline, listing every problem; with `--fix`,
//! first set each task's level from its dependencies and write the graph back.

use std::io::Write;
use std::path::Path;

use crate::{CliError, code};

/// Runs `zergctl validate` (`fix`: `--fix`).
pub fn validate(target: &str, fix: bool) -> Result<u8, CliError> {
    let p = Path::new(target);
    let path = if p.extension().is_some_and(|e| e == "json") || p.is_file() {
        p.to_path_buf()
    } else {
        Path::new(".gsd")
            .join("specs")
            .join(target)
            .join("task-graph.json")
    };
    if fix && let Some(refused) = relevel_file(&path)? {
        return Ok(refused);
    }
    match zerg_proto::graph::load(&path) {
        Ok(v) => {
            for w in &v.warnings {
                println!("warning: {w}");
            }
            println!(
                "{}: valid ({} tasks, {} levels, {} warnings)",
                path.display(),
                v.graph.tasks.len(),
                v.graph.max_level(),
                v.warnings.len()
            );
            Ok(code::OK)
        }
        Err(zerg_proto::graph::GraphError::Invalid {
            path,
            errors,
            warnings,
        }) => {
            for e in &errors {
                println!("error: {e}");
            }
            for w in &warnings {
                println!("warning: {w}");
            }
            println!("{}: invalid ({} errors)", path.display(), errors.len());
            Ok(code::FAILED)
        }
        Err(e @ zerg_proto::graph::GraphError::Syntax { .. }) => {
            println!("error: {e}");
            Ok(code::FAILED)
        }
        Err(e) => Err(CliError::new(
            code::DATA,
            format!(
                "{e}: {}",
                std::error::Error::source(&e)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            ),
        )),
    }
}

/// `--fix`: relevels the graph at `path` and writes it back when a level changed, printing
/// each move. `Some(code)` when the graph cannot be relevelled (unreadable, not JSON, a cycle
/// or a missing dependency, each printed as an error): the file is left as it was.
fn relevel_file(path: &Path) -> Result<Option<u8>, CliError> {
    let bytes = std::fs::read(path).map_err(|e| {
        CliError::new(
            code::DATA,
            format!("cannot read task graph {}: {e}", path.display()),
        )
    })?;
    let mut root: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            println!(
                "error: {}: line {}, column {}: {e}",
                path.display(),
                e.line(),
                e.column()
            );
            return Ok(Some(code::FAILED));
        }
    };
    let moved = match zerg_proto::graph::relevel(&mut root) {
        Ok(m) => m,
        Err(errors) => {
            for e in &errors {
                println!("error: {e}");
            }
            println!(
                "{}: not relevelled ({} errors); nothing was written",
                path.display(),
                errors.len()
            );
            return Ok(Some(code::FAILED));
        }
    };
    if moved.is_empty() {
        println!(
            "{}: every level already matches the dependencies; nothing was written",
            path.display()
        );
        return Ok(None);
    }
    for m in &moved {
        match m.from {
            Some(from) => println!("moved {}: level {from} -> {}", m.id, m.to),
            None => println!("moved {}: no level -> {}", m.id, m.to),
        }
    }
    let mut text = serde_json::to_vec_pretty(&root)
        .map_err(|e| CliError::new(code::INTERNAL, e.to_string()))?;
    text.push(b'\n');
    write_atomically(path, &text).map_err(|e| {
        CliError::new(
            code::DATA,
            format!("cannot write task graph {}: {e}", path.display()),
        )
    })?;
    println!("{}: {} task(s) moved; written", path.display(), moved.len());
    Ok(None)
}

/// Writes `bytes` to `path` through a temporary file in the same directory, synced and then
/// renamed over it, keeping the permission bits of the file it replaces (0644 for a new one);
/// the directory is synced after.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let perms = std::fs::metadata(path)
        .map(|m| m.permissions())
        .unwrap_or_else(|_| std::fs::Permissions::from_mode(0o644));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().set_permissions(perms)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
}
