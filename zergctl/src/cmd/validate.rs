//! `zergctl validate`: check a task graph offline, listing every problem.

use std::path::Path;

use crate::{CliError, code};

/// Runs `zergctl validate`.
pub fn validate(target: &str) -> Result<u8, CliError> {
    let p = Path::new(target);
    let path = if p.extension().is_some_and(|e| e == "json") || p.is_file() {
        p.to_path_buf()
    } else {
        Path::new(".gsd")
            .join("specs")
            .join(target)
            .join("task-graph.json")
    };
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
