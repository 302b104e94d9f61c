//! Git objects written by container workers: imported into the repository's store only after
//! each one is checked against its name, within size limits, without following anything the
//! container left in its object dir.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};
use std::sync::{Condvar, Mutex};

use crate::fsat::Dir;

/// The limits are the transfer's: a pushed pack and an imported object dir weigh the same.
pub use crate::transfer::ImportLimits;

/// Copies the objects worker `worker`'s containers wrote (into their private object dir,
/// `<git dir>/zerg/<feature>/worker-<N>/objects`) into the repository's shared object store,
/// so zergd's own git sees the worker's commits.
///
/// - Every directory and file is opened by descriptor, relative to the one above it, never
///   following a symlink; a FIFO or device is refused without blocking.
/// - A loose object is inflated as a stream, within its declared size and
///   [`ImportLimits::max_object`], and hashed on the way: one whose content does not match its
///   name is skipped, logged and deleted from the worker's dir (so it costs nothing again).
/// - A pack goes through `git index-pack --strict --max-input-size` into a quarantine
///   directory; only when no object in it is larger than the limit is it moved into the store.
/// - A bad entry is skipped, never the whole import; objects that exist are never overwritten.
/// - What was imported (or was in the store already) is removed from the worker's dir: the
///   container still reads it through its alternate, the real store, and each import reads
///   only what is new since the last, however long the rush.
/// - One import per worker at a time: a second caller waits for the first.
///
/// zergd calls this before it checks a commit a container worker reports, and the container
/// launcher when a worker container exits. `common` is the repository's common git dir
/// (absolute, [`common_dir_in`]). Returns how many objects and packs it imported.
pub fn import_objects(
    common: &Path,
    feature: &str,
    worker: u32,
    limits: ImportLimits,
) -> io::Result<usize> {
    let from_path = worker_object_dir(common, feature, worker);
    let _slot = ImportSlot::take(from_path.clone());
    // Every step from the common dir down is opened without following a symlink: a symlink
    // anywhere on the way would make zergd import (and so expose) objects of a repository the
    // container cannot read.
    let rel = from_path.strip_prefix(common).unwrap_or(&from_path);
    let from = match Dir::open_below(common, rel) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => {
            tracing::warn!(dir = %from_path.display(), error = %e, "a worker's object dir is not a plain directory; nothing imported");
            return Ok(0);
        }
    };
    let to = common.join("objects");
    let mut n = 0;
    for (name, _) in from.entries()? {
        let Some(name_s) = name.to_str() else {
            continue;
        };
        let is_fanout = name_s.len() == 2 && name_s.bytes().all(|c| c.is_ascii_hexdigit());
        if is_fanout {
            let sub = match from.dir(&name) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(dir = %from_path.join(&name).display(), error = %e, "skipping a worker's object dir entry that is not a directory");
                    continue;
                }
            };
            n += import_fanout(&sub, name_s, &to, &from_path, limits)?;
        } else if name_s == "pack" {
            match from.dir(&name) {
                Ok(d) => n += import_packs(&d, common, &from_path, limits),
                Err(e) => {
                    tracing::warn!(dir = %from_path.join("pack").display(), error = %e, "skipping a worker's pack dir that is not a directory")
                }
            }
        }
    }
    Ok(n)
}
/// The repository's common git dir (absolute).
pub fn common_dir_of(repo: &Path) -> io::Result<PathBuf> {
    let git = crate::Repo::open(repo).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(common_dir_in(&git))
}

/// The common git dir of an open repository (absolute).
pub fn common_dir_in(git: &crate::Repo) -> PathBuf {
    let dir = git.common_dir();
    if dir.is_absolute() {
        normalize(dir)
    } else {
        normalize(&git.dir().join(dir))
    }
}

/// Per-worker git areas (`<common>/zerg/<feature>/worker-<N>`) live here, inside the common git
/// dir.
pub const WORKER_GIT_SUBDIR: &str = "zerg";

/// Resolves `.` and `..` without touching the filesystem.
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The private git directory of worker `worker_id` of a rush of `feature`
/// (`<common>/zerg/<feature>/worker-<N>`), mounted in its container in place of the real common
/// git dir. zergd builds it from scratch at every spawn: copies of `config`, `HEAD` and
/// `info/exclude`, a snapshot of every ref as `packed-refs`, the worktree's own admin dir
/// (`worktrees/<name>`: `HEAD`, `commondir`, `gitdir`, the sparse checkout that keeps the spec
/// out of git's hands), and `objects/` where the container's new objects land (the real store,
/// read-only, is its alternate). Everything git writes inside the container — commits, the
/// worker branch, other refs, the index — stays here; zergd moves the real worker branch itself
/// once it has checked and accepted a reported commit. It is removed when the rush ends.
pub fn worker_git_dir(common_dir: &Path, feature: &str, worker_id: u32) -> PathBuf {
    common_dir
        .join(WORKER_GIT_SUBDIR)
        .join(feature)
        .join(format!("worker-{worker_id}"))
}

/// The private object directory of a worker (see [`worker_git_dir`]).
pub fn worker_object_dir(common_dir: &Path, feature: &str, worker_id: u32) -> PathBuf {
    worker_git_dir(common_dir, feature, worker_id).join("objects")
}

/// The workers whose import is running, by private object dir.
static IMPORTING: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
static IMPORT_DONE: Condvar = Condvar::new();

/// Holds a worker's import slot until dropped.
struct ImportSlot(PathBuf);

impl ImportSlot {
    fn take(key: PathBuf) -> Self {
        let mut set = IMPORTING.lock().unwrap_or_else(|e| e.into_inner());
        while set.get_or_insert_with(HashSet::new).contains(&key) {
            set = IMPORT_DONE.wait(set).unwrap_or_else(|e| e.into_inner());
        }
        set.get_or_insert_with(HashSet::new).insert(key.clone());
        Self(key)
    }
}

impl Drop for ImportSlot {
    fn drop(&mut self) {
        let mut set = IMPORTING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = set.as_mut() {
            s.remove(&self.0);
        }
        IMPORT_DONE.notify_all();
    }
}

/// Imports the loose objects of one fan-out directory (`<xx>/`).
fn import_fanout(
    sub: &Dir,
    prefix: &str,
    to: &Path,
    from_path: &Path,
    limits: ImportLimits,
) -> io::Result<usize> {
    let mut n = 0;
    for (file, _) in sub.entries()? {
        let Some(file_s) = file.to_str() else {
            continue;
        };
        if !file_s.bytes().all(|c| c.is_ascii_hexdigit()) {
            continue;
        }
        let dest_dir = to.join(prefix);
        if dest_dir.join(file_s).exists() {
            // Imported before (or the store had it): the container reads it through its
            // alternate, so the copy in its own dir only makes every later import look again.
            let _ = sub.remove(&file);
            continue;
        }
        let id = format!("{prefix}{file_s}");
        match verify_loose(sub, &file, &id, limits.max_object) {
            Ok(bytes) => {
                if write_object(&dest_dir, file_s, &bytes)? {
                    n += 1;
                }
                // Imported: the next import does not read it again.
                let _ = sub.remove(&file);
            }
            Err(why) => {
                tracing::warn!(object = %from_path.join(prefix).join(file_s).display(), reason = %why, "not importing a worker's object; removed from its object dir");
                let _ = sub.remove(&file);
            }
        }
    }
    Ok(n)
}

/// Imports the packs of a worker's `pack/` directory; returns how many it imported.
fn import_packs(dir: &Dir, common: &Path, from_path: &Path, limits: ImportLimits) -> usize {
    let mut n = 0;
    let entries = match dir.entries() {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(dir = %from_path.join("pack").display(), error = %e, "cannot list a worker's packs");
            return 0;
        }
    };
    for (file, _) in entries {
        let Some(stem) = file.to_str().and_then(|f| f.strip_suffix(".pack")) else {
            continue;
        };
        if common
            .join("objects/pack")
            .join(format!("{stem}.idx"))
            .exists()
        {
            continue;
        }
        match import_pack(dir, &file, common, limits) {
            Ok(()) => n += 1,
            Err(why) => {
                tracing::warn!(pack = %from_path.join("pack").join(&file).display(), reason = %why, "not importing a worker's pack; removed from its object dir");
                let _ = dir.remove(&file);
            }
        }
    }
    n
}

/// Indexes one pack a worker wrote into a quarantine object dir (its bases come from the real
/// store), checks the size of every object in it, then moves it into the real store.
fn import_pack(dir: &Dir, file: &OsStr, common: &Path, limits: ImportLimits) -> Result<(), String> {
    let (pack, _) = dir.open_file(file).map_err(|e| e.to_string())?;
    crate::transfer::Incoming::index(common, pack, limits)?.accept(common)
}

/// Largest loose object file (compressed) zergd reads from a container.
const MAX_LOOSE_FILE: u64 = 1 << 30;

/// Reads a loose object a container wrote and checks that it is what its name says: a plain
/// file (not a link), zlib data that inflates to `<type> <size>\0<content>` of exactly that
/// size, no larger than `max_object`, whose SHA-1 (40-digit names) or SHA-256 (64-digit names)
/// is the name. The content is hashed as it inflates, never held: memory stays at the file's
/// own size whatever it inflates to. Returns the file's bytes.
fn verify_loose(dir: &Dir, name: &OsStr, id: &str, max_object: u64) -> Result<Vec<u8>, String> {
    let (mut f, st) = dir.open_file(name).map_err(|e| e.to_string())?;
    let len = st.st_size as u64;
    if len > MAX_LOOSE_FILE.min(max_object.saturating_add(1 << 20)) {
        return Err(format!("{len} bytes is too large"));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    (&mut f)
        .take(len.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    enum Hasher {
        Sha1(sha1::Sha1),
        Sha256(sha2::Sha256),
    }
    let mut hasher = match id.len() {
        40 => Hasher::Sha1(sha1::Digest::new()),
        64 => Hasher::Sha256(sha2::Digest::new()),
        _ => return Err("not an object id".into()),
    };
    let mut update = |chunk: &[u8]| match &mut hasher {
        Hasher::Sha1(h) => sha1::Digest::update(h, chunk),
        Hasher::Sha256(h) => sha2::Digest::update(h, chunk),
    };
    let mut z = flate2::read::ZlibDecoder::new(&bytes[..]);
    // The header: `<type> <size>\0`, at most a few dozen bytes.
    let mut header = Vec::with_capacity(32);
    let mut byte = [0u8; 1];
    loop {
        match z.read(&mut byte) {
            Ok(1) if byte[0] == 0 => break,
            Ok(1) if header.len() < 32 => header.push(byte[0]),
            Ok(1) => return Err("bad object header".into()),
            Ok(_) => return Err("no object header".into()),
            Err(e) => return Err(format!("not zlib data: {e}")),
        }
    }
    let header_s = std::str::from_utf8(&header).map_err(|_| "bad object header")?;
    let (kind, size) = header_s.split_once(' ').ok_or("bad object header")?;
    if !matches!(kind, "blob" | "tree" | "commit" | "tag") {
        return Err(format!("unknown object type {kind:?}"));
    }
    let size: u64 = size.parse().map_err(|_| "bad object size")?;
    if size > max_object {
        return Err(format!(
            "{size} bytes inflated is larger than container.max_object_size ({max_object} bytes)"
        ));
    }
    update(&header);
    update(&[0]);
    let mut left = size;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let want = buf
            .len()
            .min(usize::try_from(left + 1).unwrap_or(usize::MAX));
        let got = z
            .read(&mut buf[..want])
            .map_err(|e| format!("not zlib data: {e}"))?;
        if got == 0 {
            break;
        }
        if got as u64 > left {
            return Err("object size does not match its header".into());
        }
        update(&buf[..got]);
        left -= got as u64;
    }
    if left != 0 {
        return Err("object size does not match its header".into());
    }
    let digest = match hasher {
        Hasher::Sha1(h) => format!("{:x}", sha1::Digest::finalize(h)),
        Hasher::Sha256(h) => format!("{:x}", sha2::Digest::finalize(h)),
    };
    if digest != id.to_ascii_lowercase() {
        return Err("content does not match the object id".into());
    }
    Ok(bytes)
}

/// Writes one verified object unless the destination has it; returns whether it wrote. The
/// file is written under a temporary name and renamed, so readers never see half an object.
/// The destination is the repository's own store, which no container can write.
fn write_object(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
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

/// Removes the lock files a killed process left on a rush's refs: `refs/heads/zerg/<feature>/`
/// (staging and the worker branches), `packed-refs.lock`, and the `index.lock` and `HEAD.lock`
/// of the staging worktree's git dir (`staging_git_dir`). git and gix take such a lock for the
/// moment of an update and remove it after; one left behind by a zergd killed in the middle of
/// a level merge makes every later move of those refs fail ("Could not prepare reference
/// edit"). Only locks last changed before `before` (when the restarted zergd began) are
/// removed, so a lock a live worker takes meanwhile is left alone. Returns the paths removed.
pub fn clear_stale_locks(
    common_dir: &Path,
    feature: &str,
    staging_git_dir: Option<&Path>,
    before: std::time::SystemTime,
) -> Vec<PathBuf> {
    let stale = |p: &Path| {
        std::fs::symlink_metadata(p)
            .ok()
            .filter(|m| m.file_type().is_file())
            .and_then(|m| m.modified().ok())
            .is_some_and(|t| t < before)
    };
    let mut candidates = Vec::new();
    let mut dirs = vec![common_dir.join("refs/heads/zerg").join(feature)];
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => dirs.push(p),
                Ok(t) if t.is_file() && p.extension().is_some_and(|x| x == "lock") => {
                    candidates.push(p)
                }
                _ => {}
            }
        }
    }
    candidates.push(common_dir.join("packed-refs.lock"));
    if let Some(g) = staging_git_dir {
        candidates.push(g.join("index.lock"));
        candidates.push(g.join("HEAD.lock"));
    }
    candidates
        .into_iter()
        .filter(|p| stale(p) && std::fs::remove_file(p).is_ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use zerg_proto::testkit::git;

    /// Writes a blob into `repo` and returns its id and loose-object path.
    fn blob(repo: &Path, content: &str) -> (String, PathBuf) {
        let f = repo.join("blob.tmp");
        fs::write(&f, content).unwrap();
        let id = git(repo, &["hash-object", "-w", &f.to_string_lossy()]);
        let path = repo.join(".git/objects").join(&id[..2]).join(&id[2..]);
        (id, path)
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        root: PathBuf,
        repo: PathBuf,
        other: PathBuf,
        common: PathBuf,
        from: PathBuf,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let repo = root.join("repo");
        let other = root.join("other");
        for r in [&repo, &other] {
            fs::create_dir_all(r).unwrap();
            git(r, &["init", "-q", "-b", "main"]);
        }
        let common = fs::canonicalize(repo.join(".git")).unwrap();
        let from = worker_object_dir(&common, "f", 1);
        fs::create_dir_all(&from).unwrap();
        Fixture {
            _dir: dir,
            root,
            repo,
            other,
            common,
            from,
        }
    }

    impl Fixture {
        fn put(&self, id: &str, src: &Path) {
            let d = self.from.join(&id[..2]);
            fs::create_dir_all(&d).unwrap();
            fs::copy(src, d.join(&id[2..])).unwrap();
        }
        fn has(&self, id: &str) -> bool {
            self.common
                .join("objects")
                .join(&id[..2])
                .join(&id[2..])
                .exists()
        }
        fn import(&self, limits: ImportLimits) -> usize {
            import_objects(&self.common, "f", 1, limits).unwrap()
        }
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn only_objects_that_match_their_names_are_imported_once() {
        let fx = fixture();
        // A genuine new object.
        let (good, good_path) = blob(&fx.other, "new content\n");
        fx.put(&good, &good_path);
        // A genuine object stored under another object's name.
        let (victim, _) = blob(&fx.other, "the real one\n");
        let (_, liar_path) = blob(&fx.other, "something else\n");
        fx.put(&victim, &liar_path);
        // Garbage, and a symlink to a file the worker could not read itself.
        let bogus = "ab".to_string() + &"0".repeat(38);
        fs::create_dir_all(fx.from.join("ab")).unwrap();
        fs::write(fx.from.join("ab").join(&bogus[2..]), "not zlib").unwrap();
        let secret = fx.root.join("secret");
        fs::write(&secret, "secret").unwrap();
        let linked = "cd".to_string() + &"1".repeat(38);
        fs::create_dir_all(fx.from.join("cd")).unwrap();
        std::os::unix::fs::symlink(&secret, fx.from.join("cd").join(&linked[2..])).unwrap();

        assert_eq!(fx.import(ImportLimits::default()), 1);
        assert_eq!(git(&fx.repo, &["cat-file", "-p", &good]), "new content");
        for id in [&victim, &bogus, &linked] {
            assert!(!fx.has(id), "{id} must not be imported");
        }
        // A refused object is removed from the worker's dir, so it is not read again; so is an
        // imported one (the container reads it through its alternate), so that each import
        // reads only what is new.
        assert!(!fx.from.join("ab").join(&bogus[2..]).exists());
        assert!(!fx.from.join(&good[..2]).join(&good[2..]).exists());
        // One the store had already goes too.
        let (known, known_path) = blob(&fx.repo, "already in the store\n");
        fx.put(&known, &known_path);
        assert_eq!(fx.import(ImportLimits::default()), 0, "imported once");
        assert!(!fx.from.join(&known[..2]).join(&known[2..]).exists());
        assert_eq!(
            import_objects(&fx.common, "f", 9, ImportLimits::default()).unwrap(),
            0
        );
    }

    #[test]
    fn a_symlinked_fanout_dir_fifo_or_pack_dir_is_skipped_and_the_rest_imported() {
        let fx = fixture();
        // Another repository's objects, which the worker cannot read, behind symlinks.
        let (secret, secret_path) = blob(&fx.other, "another repository's secret\n");
        let fan = &secret[..2];
        std::os::unix::fs::symlink(secret_path.parent().unwrap(), fx.from.join(fan)).unwrap();
        std::os::unix::fs::symlink(fx.other.join(".git/objects/pack"), fx.from.join("pack"))
            .unwrap();
        // A FIFO where an object should be: opening it must not block.
        let fifo_id = if fan == "ee" { "ef" } else { "ee" }.to_string() + &"2".repeat(38);
        fs::create_dir_all(fx.from.join(&fifo_id[..2])).unwrap();
        nix::unistd::mkfifo(
            &fx.from.join(&fifo_id[..2]).join(&fifo_id[2..]),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        // A fan-out entry that is a file, not a directory.
        let odd = if fan == "aa" { "ab" } else { "aa" };
        fs::write(fx.from.join(odd), "x").unwrap();
        // And one genuine object, which must still arrive.
        let (good, good_path) = blob(&fx.other, "the worker's own work\n");
        if &good[..2] != fan {
            fx.put(&good, &good_path);
        }
        let n = fx.import(ImportLimits::default());
        assert!(!fx.has(&secret), "an object behind a symlink was imported");
        if &good[..2] != fan {
            assert_eq!(n, 1);
            assert!(fx.has(&good));
        }
    }

    #[test]
    fn a_zlib_bomb_is_refused_without_inflating_past_its_limit() {
        let fx = fixture();
        // 64 MiB of zeros declared as a blob: a few dozen KiB compressed.
        let size = 64usize << 20;
        let mut raw = format!("blob {size}\0").into_bytes();
        raw.resize(raw.len() + size, 0);
        let id = {
            use sha1::Digest;
            format!("{:x}", sha1::Sha1::digest(&raw))
        };
        let z = zlib(&raw);
        assert!(z.len() < 1 << 20);
        let d = fx.from.join(&id[..2]);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(&id[2..]), &z).unwrap();
        let small = ImportLimits {
            max_object: 1 << 20,
            ..ImportLimits::default()
        };
        assert_eq!(fx.import(small), 0);
        assert!(!fx.has(&id));
        // The same object within the limit is genuine and imported.
        fs::write(d.join(&id[2..]), &z).unwrap();
        assert_eq!(fx.import(ImportLimits::default()), 1);
        assert!(fx.has(&id));
        // A header that understates the size is caught before the content is all read.
        let lie = [b"blob 5\0".to_vec(), vec![0u8; 1 << 20]].concat();
        let lie_id = "0f".to_string() + &"3".repeat(38);
        fs::create_dir_all(fx.from.join("0f")).unwrap();
        fs::write(fx.from.join("0f").join(&lie_id[2..]), zlib(&lie)).unwrap();
        let dir = Dir::open(&fx.from.join("0f")).unwrap();
        let why = verify_loose(&dir, OsStr::new(&lie_id[2..]), &lie_id, 1 << 30).unwrap_err();
        assert!(why.contains("size does not match"), "{why}");
    }

    #[test]
    fn a_pack_with_an_object_over_the_limit_is_refused_and_a_good_one_imported() {
        let fx = fixture();
        let big = fx.other.join("big");
        fs::write(&big, vec![b'z'; 4 << 20]).unwrap();
        let big_id = git(&fx.other, &["hash-object", "-w", &big.to_string_lossy()]);
        let pack_of = |ids: &str, name: &str| {
            let out = std::process::Command::new("git")
                .arg("-C")
                .arg(&fx.other)
                .args(["pack-objects", "--stdout"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .and_then(|mut c| {
                    c.stdin.take().unwrap().write_all(ids.as_bytes())?;
                    c.wait_with_output()
                })
                .unwrap();
            fs::create_dir_all(fx.from.join("pack")).unwrap();
            fs::write(fx.from.join("pack").join(name), out.stdout).unwrap();
        };
        pack_of(&format!("{big_id}\n"), "pack-big.pack");
        let small = ImportLimits {
            max_object: 1 << 20,
            ..ImportLimits::default()
        };
        assert_eq!(fx.import(small), 0);
        assert!(crate::cli::git(&fx.repo, &["cat-file", "-e", &big_id]).is_err());
        assert!(
            !fx.from.join("pack/pack-big.pack").exists(),
            "a refused pack is removed"
        );
        let leftovers: Vec<_> = fs::read_dir(fx.common.join("objects"))
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("zerg-incoming-")
            })
            .collect();
        assert!(leftovers.is_empty(), "quarantine left behind");
        // A pack larger than max_pack is refused before git reads it.
        pack_of(&format!("{big_id}\n"), "pack-big2.pack");
        let tiny = ImportLimits {
            max_pack: 1024,
            ..ImportLimits::default()
        };
        assert_eq!(fx.import(tiny), 0);
        // Within the limits it is imported.
        pack_of(&format!("{big_id}\n"), "pack-big3.pack");
        assert_eq!(fx.import(ImportLimits::default()), 1);
        assert_eq!(git(&fx.repo, &["cat-file", "-t", &big_id]), "blob");
    }
}
