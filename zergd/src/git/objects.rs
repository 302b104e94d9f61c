//! Git objects written by container workers: imported into the repository's store only after
//! each one is checked against its name.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::launcher::container::{normalize, worker_object_dir};

/// Copies the objects worker `worker_id`'s containers wrote (into their private object dir,
/// `<git dir>/zerg/worker-<N>/objects`) into the repository's shared object store, so zergd's
/// own git sees the worker's commits. Every loose object is inflated and hashed first: one whose
/// content does not match its name, a symlink, or anything but a plain file is skipped (and
/// logged), so a hostile container can neither plant a corrupt object nor make zergd copy a file
/// it could not read itself. Packs go through `git index-pack`, which checks them the same way.
/// Objects that already exist are never overwritten. Returns how many were imported.
///
/// The launcher calls this whenever a worker container exits; zergd also calls it before it
/// checks a commit a container worker reports.
pub fn import_worker_objects(repo: &Path, worker_id: u32) -> io::Result<usize> {
    let common = common_dir_of(repo)?;
    import_objects(&common, &worker_object_dir(&common, worker_id))
}

/// The repository's common git dir (absolute), asked of git itself.
pub(crate) fn common_dir_of(repo: &Path) -> io::Result<PathBuf> {
    let out = crate::git::git(
        repo,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )
    .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(normalize(Path::new(&out)))
}

pub(crate) fn import_objects(common: &Path, from: &Path) -> io::Result<usize> {
    let to = common.join("objects");
    // The object dir itself must be the container's own directory: a symlink there would make
    // zergd import (and so expose) objects of a repository the container cannot read.
    if !fs::symlink_metadata(from).is_ok_and(|m| m.is_dir()) {
        if fs::symlink_metadata(from).is_ok() {
            tracing::warn!(dir = %from.display(), "a worker's object dir is not a plain directory; nothing imported");
        }
        return Ok(0);
    }
    let Ok(entries) = fs::read_dir(from) else {
        return Ok(0);
    };
    let mut n = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let is_fanout = name.len() == 2 && name.bytes().all(|c| c.is_ascii_hexdigit());
        if is_fanout && is_dir {
            for obj in fs::read_dir(entry.path())?.flatten() {
                let file = obj.file_name().to_string_lossy().to_string();
                if !file.bytes().all(|c| c.is_ascii_hexdigit()) {
                    continue;
                }
                let dest_dir = to.join(&name);
                if dest_dir.join(&file).exists() {
                    continue;
                }
                match verify_loose(&obj.path(), &format!("{name}{file}")) {
                    Ok(bytes) => {
                        if write_object(&dest_dir, &file, &bytes)? {
                            n += 1;
                        }
                    }
                    Err(why) => {
                        tracing::warn!(object = %obj.path().display(), reason = %why, "not importing a worker's object")
                    }
                }
            }
        } else if name == "pack" && is_dir {
            for p in fs::read_dir(entry.path())?.flatten() {
                let file = p.file_name().to_string_lossy().to_string();
                let Some(stem) = file.strip_suffix(".pack") else {
                    continue;
                };
                if !p.file_type().is_ok_and(|t| t.is_file())
                    || to.join("pack").join(format!("{stem}.idx")).exists()
                {
                    continue;
                }
                let pack = fs::File::open(p.path())?;
                let out = crate::git::scrubbed("git")
                    .arg("--git-dir")
                    .arg(common)
                    .args(["index-pack", "--stdin", "--fix-thin", "--strict"])
                    .stdin(pack)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .output()?;
                if out.status.success() {
                    n += 1;
                } else {
                    tracing::warn!(pack = %p.path().display(), error = %String::from_utf8_lossy(&out.stderr).trim(), "not importing a worker's pack");
                }
            }
        }
    }
    Ok(n)
}

/// Largest loose object zergd imports from a container (compressed and inflated).
pub(crate) const MAX_OBJECT_BYTES: u64 = 512 << 20;

/// Reads a loose object a container wrote and checks that it is what its name says: a plain
/// file (not a link), zlib data that inflates to `<type> <size>\0<content>` of that size, whose
/// SHA-1 (40-digit names) or SHA-256 (64-digit names) is the name. Returns the file's bytes.
pub(crate) fn verify_loose(path: &Path, id: &str) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let meta = fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if !meta.file_type().is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > MAX_OBJECT_BYTES {
        return Err(format!("{} bytes is too large", meta.len()));
    }
    let bytes = fs::read(path).map_err(|e| e.to_string())?;
    let mut inflated = Vec::new();
    flate2::read::ZlibDecoder::new(&bytes[..])
        .take(MAX_OBJECT_BYTES)
        .read_to_end(&mut inflated)
        .map_err(|e| format!("not zlib data: {e}"))?;
    let nul = inflated
        .iter()
        .position(|b| *b == 0)
        .ok_or("no object header")?;
    let header = std::str::from_utf8(&inflated[..nul]).map_err(|_| "bad object header")?;
    let (kind, size) = header.split_once(' ').ok_or("bad object header")?;
    if !matches!(kind, "blob" | "tree" | "commit" | "tag") {
        return Err(format!("unknown object type {kind:?}"));
    }
    if size.parse::<usize>().ok() != Some(inflated.len() - nul - 1) {
        return Err("object size does not match its header".into());
    }
    let digest = match id.len() {
        40 => {
            use sha1::Digest;
            format!("{:x}", sha1::Sha1::digest(&inflated))
        }
        64 => {
            use sha2::Digest;
            format!("{:x}", sha2::Sha256::digest(&inflated))
        }
        _ => return Err("not an object id".into()),
    };
    if digest != id.to_ascii_lowercase() {
        return Err("content does not match the object id".into());
    }
    Ok(bytes)
}

/// Writes one verified object unless the destination has it; returns whether it wrote. The
/// file is written under a temporary name and renamed, so readers never see half an object.
pub(crate) fn write_object(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<bool> {
    let dest = dir.join(name);
    if dest.exists() {
        return Ok(false);
    }
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".zerg-import-{}-{name}", std::process::id()));
    fs::write(&tmp, bytes)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o444))?;
    if dest.exists() {
        fs::remove_file(&tmp)?;
        return Ok(false);
    }
    fs::rename(&tmp, &dest)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git_ok(dir: &Path, args: &[&str]) -> String {
        super::super::git(dir, args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Writes a blob into `repo` and returns its id and loose-object path.
    fn blob(repo: &Path, content: &str) -> (String, PathBuf) {
        let f = repo.join("blob.tmp");
        fs::write(&f, content).unwrap();
        let id = git_ok(repo, &["hash-object", "-w", &f.to_string_lossy()]);
        let path = repo.join(".git/objects").join(&id[..2]).join(&id[2..]);
        (id, path)
    }

    #[test]
    fn only_objects_that_match_their_names_are_imported_once() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        let other = dir.path().join("other");
        for r in [&repo, &other] {
            fs::create_dir_all(r).unwrap();
            git_ok(r, &["init", "-q", "-b", "main"]);
        }
        let common = repo.join(".git");
        let from = worker_object_dir(&common, 1);
        let put = |id: &str, src: &Path| {
            let d = from.join(&id[..2]);
            fs::create_dir_all(&d).unwrap();
            fs::copy(src, d.join(&id[2..])).unwrap();
        };
        // A genuine new object.
        let (good, good_path) = blob(&other, "new content\n");
        put(&good, &good_path);
        // A genuine object stored under another object's name.
        let (victim, _) = blob(&other, "the real one\n");
        let (_, liar_path) = blob(&other, "something else\n");
        put(&victim, &liar_path);
        // Garbage, and a symlink to a file the worker could not read itself.
        let bogus = "ab".to_string() + &"0".repeat(38);
        fs::create_dir_all(from.join("ab")).unwrap();
        fs::write(from.join("ab").join(&bogus[2..]), "not zlib").unwrap();
        let secret = dir.path().join("secret");
        fs::write(&secret, "secret").unwrap();
        let linked = "cd".to_string() + &"1".repeat(38);
        fs::create_dir_all(from.join("cd")).unwrap();
        std::os::unix::fs::symlink(&secret, from.join("cd").join(&linked[2..])).unwrap();

        assert_eq!(import_worker_objects(&repo, 1).unwrap(), 1);
        assert_eq!(git_ok(&repo, &["cat-file", "-p", &good]), "new content");
        for id in [&victim, &bogus, &linked] {
            assert!(
                !common
                    .join("objects")
                    .join(&id[..2])
                    .join(&id[2..])
                    .exists(),
                "{id} must not be imported"
            );
        }
        assert_eq!(import_worker_objects(&repo, 1).unwrap(), 0, "imported once");
        assert_eq!(import_worker_objects(&repo, 9).unwrap(), 0);
    }
}
