//! `zergctl image build --devcontainer`: the base image a project's
//! `.devcontainer/devcontainer.json` names, as the Dev Containers format has it: `image`, or
//! `build.dockerfile` with `build.context`, `build.args` and `build.target` (paths relative to
//! the file's directory; the older top-level `dockerFile` and `context` too). The file is JSON
//! with comments and trailing commas.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::rootfs::{Node, Rootfs, io_input};
use super::{ImageError, input};

/// Where a devcontainer's image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// An image by name (`"image"`).
    Image(String),
    /// A Dockerfile to build first (`"build"`).
    Build {
        /// The Dockerfile.
        dockerfile: PathBuf,
        /// The build context directory.
        context: PathBuf,
        /// `build.args`.
        args: HashMap<String, String>,
        /// `build.target`, when set.
        target: Option<String>,
    },
}

/// Reads `<repo>/.devcontainer/devcontainer.json`.
pub fn read(repo: &Path) -> Result<Base, ImageError> {
    let path = repo.join(".devcontainer").join("devcontainer.json");
    let text = fs::read_to_string(&path).map_err(io_input("read", &path))?;
    parse(&text, path.parent().unwrap_or(repo))
        .map_err(|e| input(format!("{}: {e}", path.display())))
}

/// The base a devcontainer.json names; `dir` is the file's directory.
pub fn parse(text: &str, dir: &Path) -> Result<Base, String> {
    let v: serde_json::Value =
        serde_json::from_str(&strip_jsonc(text)).map_err(|e| format!("not JSON: {e}"))?;
    let s = |v: &serde_json::Value, key: &str| -> Result<Option<String>, String> {
        match v.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(x)) if !x.trim().is_empty() => Ok(Some(x.clone())),
            Some(other) => Err(format!(
                "field `{key}` must be a non-empty string, got {other}"
            )),
        }
    };
    let build = v.get("build").cloned().unwrap_or(serde_json::Value::Null);
    let dockerfile = match s(&build, "dockerfile")? {
        Some(d) => Some(d),
        None => s(&v, "dockerFile")?,
    };
    if let Some(dockerfile) = dockerfile {
        let context = match s(&build, "context")? {
            Some(c) => Some(c),
            None => s(&v, "context")?,
        }
        .unwrap_or_else(|| ".".into());
        let mut args = HashMap::new();
        if let Some(map) = build.get("args").and_then(|a| a.as_object()) {
            for (k, val) in map {
                let val = val
                    .as_str()
                    .ok_or_else(|| format!("field `build.args.{k}` must be a string"))?;
                args.insert(k.clone(), val.to_string());
            }
        }
        return Ok(Base::Build {
            dockerfile: dir.join(dockerfile),
            context: dir.join(context),
            args,
            target: s(&build, "target")?,
        });
    }
    match s(&v, "image")? {
        Some(image) => Ok(Base::Image(image)),
        None => Err(
            "names neither `image` nor `build.dockerfile`; zergctl image build --devcontainer needs one (a Docker Compose devcontainer is not supported)"
                .into(),
        ),
    }
}

/// JSON with comments (`//`, `/* */`) and trailing commas, as plain JSON. Strings are kept
/// as they are.
fn strip_jsonc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if c == '\\' {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                out.push(c);
            }
            ('/', Some('/')) => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut prev = ' ';
                for n in chars.by_ref() {
                    if prev == '*' && n == '/' {
                        break;
                    }
                    prev = n;
                }
                out.push(' ');
            }
            _ => out.push(c),
        }
    }
    // Trailing commas: a comma followed only by whitespace before `}` or `]`.
    let mut clean = String::with_capacity(out.len());
    let mut in_string = false;
    let bytes: Vec<char> = out.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if in_string {
            clean.push(c);
            if c == '\\' && i + 1 < bytes.len() {
                clean.push(bytes[i + 1]);
                i += 1;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            clean.push(c);
        } else if c == ',' {
            let next = bytes[i + 1..].iter().find(|n| !n.is_whitespace());
            if !matches!(next, Some('}') | Some(']')) {
                clean.push(c);
            }
        } else {
            clean.push(c);
        }
        i += 1;
    }
    clean
}

/// The build context of a devcontainer's Dockerfile: every file below `context` except `.git`
/// and `.zerg` (`.dockerignore` is not read), with the Dockerfile added as
/// `.zerg-devcontainer.Dockerfile` when it lies outside the context. Returns the archive and
/// the Dockerfile's path inside it.
pub fn context_tar(context: &Path, dockerfile: &Path) -> Result<(Vec<u8>, String), ImageError> {
    let mut fs_ = Rootfs::default();
    walk(&mut fs_, context, Path::new(""))?;
    let name = match dockerfile.strip_prefix(context) {
        Ok(rel) if fs_.nodes.contains_key(rel) => rel.to_string_lossy().to_string(),
        _ => {
            let text = fs::read_to_string(dockerfile).map_err(io_input("read", dockerfile))?;
            let name = ".zerg-devcontainer.Dockerfile".to_string();
            fs_.data(&name, text, 0o644);
            name
        }
    };
    Ok((fs_.to_tar()?, name))
}

fn walk(fs_: &mut Rootfs, dir: &Path, rel: &Path) -> Result<(), ImageError> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .map_err(io_input("read", dir))?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name();
        if rel.as_os_str().is_empty() && (name == ".git" || name == ".zerg") {
            continue;
        }
        let path = e.path();
        let r = rel.join(&name);
        let meta = fs::symlink_metadata(&path).map_err(io_input("read", &path))?;
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&path).map_err(io_input("read", &path))?;
            fs_.parents(&r);
            fs_.nodes.insert(r, Node::Symlink { target });
        } else if meta.is_dir() {
            fs_.dir(&r.to_string_lossy(), meta.mode() & 0o7777, 0);
            walk(fs_, &path, &r)?;
        } else if meta.is_file() {
            fs_.parents(&r);
            fs_.nodes.insert(
                r,
                Node::File {
                    src: path,
                    mode: meta.mode() & 0o7777,
                    key: (meta.dev(), meta.ino()),
                },
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_and_build_are_read_with_comments_and_trailing_commas() {
        let dir = Path::new("/p/.devcontainer");
        let image = r#"{
  // the project's image
  "name": "py", /* block */ "image": "myproject-dev:1",
  "features": {"x": {},},
}"#;
        assert_eq!(
            parse(image, dir).unwrap(),
            Base::Image("myproject-dev:1".into())
        );
        let build = r#"{"build": {"dockerfile": "Dockerfile", "context": "..", "args": {"V": "3.12"}, "target": "dev"}, "image": "ignored", "url": "http://x//y"}"#;
        match parse(build, dir).unwrap() {
            Base::Build {
                dockerfile,
                context,
                args,
                target,
            } => {
                assert_eq!(dockerfile, dir.join("Dockerfile"));
                assert_eq!(context, dir.join(".."));
                assert_eq!(args.get("V").map(String::as_str), Some("3.12"));
                assert_eq!(target.as_deref(), Some("dev"));
            }
            other => panic!("{other:?}"),
        }
        let legacy = r#"{"dockerFile": "D"}"#;
        assert!(
            matches!(parse(legacy, dir).unwrap(), Base::Build { context, .. } if context == dir.join("."))
        );
        let err = parse(r#"{"dockerComposeFile": "c.yml"}"#, dir).unwrap_err();
        assert!(
            err.contains("neither `image` nor `build.dockerfile`"),
            "{err}"
        );
        let err = parse(r#"{"image": 3}"#, dir).unwrap_err();
        assert!(err.contains("field `image`"), "{err}");
        assert!(parse("{", dir).unwrap_err().contains("not JSON"));
    }
}
