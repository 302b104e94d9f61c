//! `zergctl init`: prepares a repository for zerg, without ever overwriting anything.

use std::path::{Path, PathBuf};

use crate::{CliError, code};

/// The config `init` writes: every key at its default, with a comment on each.
pub const CONFIG_TEMPLATE: &str = include_str!("../init/config.yaml");

/// What zerg writes in a repository that is not meant to be committed.
pub const IGNORED: &[&str] = &[
    ".zerg/state/",
    ".zerg/logs/",
    ".zerg/rush/",
    ".zerg-worktrees/",
];

/// Runs `zergctl init` in `repo` (default: the current directory's repository).
pub fn run(repo: Option<PathBuf>) -> Result<u8, CliError> {
    let start = match repo {
        Some(p) => p,
        None => std::env::current_dir().map_err(|e| {
            CliError::new(
                code::USAGE,
                format!("cannot read the current directory: {e}"),
            )
        })?,
    };
    let root = toplevel(&start)?;
    for line in init(&root)? {
        println!("{line}");
    }
    println!(
        "\nNext: write .gsd/specs/<feature>/task-graph.json (check it with `zergctl validate <feature>`), commit it, then `zergctl rush <feature>`."
    );
    Ok(code::OK)
}

fn toplevel(dir: &Path) -> Result<PathBuf, CliError> {
    crate::git(dir, &["rev-parse", "--show-toplevel"])
        .map(PathBuf::from)
        .map_err(|_| {
            CliError::new(
                code::USAGE,
                format!(
                    "{} is not inside a git repository; run `git init` there first",
                    dir.display()
                ),
            )
        })
}

/// Does the work in the repository at `root`; returns one line per thing done or kept.
pub fn init(root: &Path) -> Result<Vec<String>, CliError> {
    let io = |what: &str, p: &Path, e: std::io::Error| {
        CliError::new(code::FAILED, format!("cannot {what} {}: {e}", p.display()))
    };
    let mut said = Vec::new();
    let config = root.join(".zerg/config.yaml");
    if config.exists() {
        said.push(format!("kept     {} (already there)", rel(root, &config)));
    } else {
        std::fs::create_dir_all(root.join(".zerg"))
            .map_err(|e| io("create", &root.join(".zerg"), e))?;
        // create_new: a file that appeared meanwhile is never overwritten.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&config)
            .and_then(|mut f| std::io::Write::write_all(&mut f, CONFIG_TEMPLATE.as_bytes()))
            .map_err(|e| io("write", &config, e))?;
        said.push(format!("created  {}", rel(root, &config)));
    }
    let specs = root.join(".gsd/specs");
    if specs.is_dir() {
        said.push(format!("kept     {}/", rel(root, &specs)));
    } else {
        std::fs::create_dir_all(&specs).map_err(|e| io("create", &specs, e))?;
        said.push(format!("created  {}/", rel(root, &specs)));
    }
    let gi = root.join(".gitignore");
    let text = match std::fs::read_to_string(&gi) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io("read", &gi, e)),
    };
    let have: Vec<&str> = text.lines().map(str::trim).collect();
    let missing: Vec<&str> = IGNORED
        .iter()
        .copied()
        .filter(|p| !have.contains(p) && !have.contains(&p.trim_end_matches('/')))
        .collect();
    if missing.is_empty() {
        said.push(".gitignore already ignores zerg's working files".to_string());
    } else {
        let mut add = String::new();
        if !text.is_empty() && !text.ends_with('\n') {
            add.push('\n');
        }
        add.push_str("# zerg's working files\n");
        for p in &missing {
            add.push_str(p);
            add.push('\n');
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&gi)
            .and_then(|mut f| std::io::Write::write_all(&mut f, add.as_bytes()))
            .map_err(|e| io("update", &gi, e))?;
        said.push(format!(".gitignore: added {}", missing.join(" ")));
    }
    Ok(said)
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_is_idempotent_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join(".gitignore"), "target/\n.zerg/logs/").unwrap();
        let first = init(root).unwrap();
        assert!(first[0].starts_with("created"), "{first:?}");
        assert_eq!(
            std::fs::read_to_string(root.join(".zerg/config.yaml")).unwrap(),
            CONFIG_TEMPLATE
        );
        assert!(root.join(".gsd/specs").is_dir());
        let gi = std::fs::read_to_string(root.join(".gitignore")).unwrap();
        for p in IGNORED {
            assert_eq!(
                gi.lines().filter(|l| l == p).count(),
                1,
                "{p} once in:\n{gi}"
            );
        }
        assert!(
            gi.starts_with("target/\n.zerg/logs/\n"),
            "the user's lines are kept: {gi}"
        );
        // A second run changes nothing, and a config the user edited is kept as it is.
        std::fs::write(
            root.join(".zerg/config.yaml"),
            "workers: {retry_attempts: 9}\n",
        )
        .unwrap();
        let second = init(root).unwrap();
        assert!(
            second.iter().all(|l| !l.starts_with("created")),
            "{second:?}"
        );
        assert_eq!(
            std::fs::read_to_string(root.join(".gitignore")).unwrap(),
            gi
        );
        assert_eq!(
            std::fs::read_to_string(root.join(".zerg/config.yaml")).unwrap(),
            "workers: {retry_attempts: 9}\n"
        );
    }
}
