//! Code between repositories that share no filesystem: a remote worker and zergd.
//!
//! - **Down** (`FetchBase`): zergd sends a lease's base at depth one: the commit itself, and
//!   every tree and blob of its tree that the worker does not already hold in the tree of a
//!   commit it named as a *have*. A first fetch is a whole snapshot; a base that moved by a level
//!   costs the files that level changed. The worker marks each fetched commit shallow.
//! - **Up** (`PushObjects`): the worker sends a thin pack of `base..commit` (its commits, and the
//!   trees and blobs they add, deltas against objects of the base allowed). zergd indexes it with
//!   `git index-pack --strict --fix-thin` into a quarantine directory of its own, within a size
//!   cap, refuses any object over the object limit, checks the reported commit there (it
//!   descends from the base, it leaves the spec alone), and only then moves the pack into the
//!   repository ([`Incoming::accept`]). Whatever is refused never reaches the object store.
//!
//! Packs are written and indexed by the `git` program: it deltifies and verifies them exactly
//! as a `git push` would be.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use gix::ObjectId;
use gix::bstr::ByteSlice;

use crate::{Error, Repo};

/// How much a container's objects may weigh (`container.max_object_size` and
/// `container.max_pack_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportLimits {
    /// Largest object, inflated, in bytes: a loose object or any object of a pack.
    pub max_object: u64,
    /// Largest pack file, in bytes.
    pub max_pack: u64,
}

impl Default for ImportLimits {
    fn default() -> Self {
        Self {
            max_object: zerg_proto::contract::limits::MAX_OBJECT_BYTES,
            max_pack: zerg_proto::contract::limits::MAX_PACK_BYTES,
        }
    }
}

/// One object to send, with the path it was found at (git's delta heuristics use it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackEntry {
    /// Object id.
    pub id: ObjectId,
    /// Repository-relative path of a tree or blob; empty for commits and root trees.
    pub path: String,
}

impl Repo {
    /// What a peer lacks to hold every commit of `wants` at depth one when it already holds the
    /// whole trees of `haves`: the want commits, and the trees and blobs of their trees that no
    /// have's tree holds. Haves this repository does not know are ignored (the peer then gets
    /// more than it needs, never less).
    pub fn snapshot_objects(
        &self,
        wants: &[String],
        haves: &[String],
    ) -> Result<Vec<PackEntry>, Error> {
        let mut known: HashSet<ObjectId> = HashSet::new();
        for have in haves {
            if !self.is_commit(have) {
                continue;
            }
            known.insert(self.oid(have)?);
            let tree = self.tree_of(have)?;
            known.insert(tree.id);
            for (id, _) in self.tree_entries(&tree, have)? {
                known.insert(id);
            }
        }
        let mut out = Vec::new();
        for want in wants {
            let commit = self.oid(want)?;
            if !self.is_commit(want) {
                return Err(self.err(format!("send {want}"), "it is not a commit here"));
            }
            if known.insert(commit) {
                out.push(PackEntry {
                    id: commit,
                    path: String::new(),
                });
            }
            let tree = self.tree_of(want)?;
            if known.insert(tree.id) {
                out.push(PackEntry {
                    id: tree.id,
                    path: String::new(),
                });
            }
            for (id, path) in self.tree_entries(&tree, want)? {
                if known.insert(id) {
                    out.push(PackEntry { id, path });
                }
            }
        }
        Ok(out)
    }

    /// The parents of `commit`, in order.
    pub fn parents(&self, commit: &str) -> Result<Vec<String>, Error> {
        let c = self
            .repo
            .find_commit(self.oid(commit)?)
            .map_err(|e| self.err(format!("read {commit}"), e))?;
        Ok(c.parent_ids().map(|p| p.to_string()).collect())
    }

    /// Every tree and blob under `tree` with its path; submodule entries (commits of another
    /// repository) are left out.
    fn tree_entries(
        &self,
        tree: &gix::Tree<'_>,
        rev: &str,
    ) -> Result<Vec<(ObjectId, String)>, Error> {
        let mut recorder = gix::traverse::tree::Recorder::default();
        tree.traverse()
            .breadthfirst(&mut recorder)
            .map_err(|e| self.err(format!("list the tree of {rev}"), e))?;
        Ok(recorder
            .records
            .into_iter()
            .filter(|e| !e.mode.is_commit())
            .map(|e| (e.oid, e.filepath.to_str_lossy().into_owned()))
            .collect())
    }

    /// Writes a pack of `objects` to `out` with `git pack-objects` (deltas between them
    /// allowed); returns its size in bytes.
    pub fn write_pack(&self, objects: &[PackEntry], out: File) -> Result<u64, Error> {
        let mut list = String::with_capacity(objects.len() * 60);
        for o in objects {
            list.push_str(&o.id.to_string());
            if !o.path.is_empty() && !o.path.contains('\n') {
                list.push(' ');
                list.push_str(&o.path);
            }
            list.push('\n');
        }
        self.pack_objects(&["pack-objects", "--stdout", "-q"], &list, out)
    }

    /// Writes a thin pack of `base..commit` to `out` (what a worker pushes): the commits after
    /// `base`, and the objects they add, with deltas against objects of `base`. Returns its size.
    pub fn write_thin_pack(&self, base: &str, commit: &str, out: File) -> Result<u64, Error> {
        let (b, c) = (self.oid(base)?, self.oid(commit)?);
        let revs = format!("{c}\n^{b}\n");
        self.pack_objects(
            &["pack-objects", "--stdout", "-q", "--revs", "--thin"],
            &revs,
            out,
        )
    }

    fn pack_objects(&self, args: &[&str], input: &str, out: File) -> Result<u64, Error> {
        let what = "write a pack";
        let mut child = crate::cli::scrubbed("git")
            .arg("--git-dir")
            .arg(self.git_dir())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(out.try_clone().map_err(|e| self.err(what, e))?)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| self.err(what, format!("cannot run git: {e}")))?;
        let mut stdin = child.stdin.take().expect("piped");
        // A failed write shows as git's own failure below.
        let _ = stdin.write_all(input.as_bytes());
        drop(stdin);
        let done = child
            .wait_with_output()
            .map_err(|e| self.err(what, format!("git: {e}")))?;
        if !done.status.success() {
            return Err(self.err(
                what,
                String::from_utf8_lossy(&done.stderr).trim().to_string(),
            ));
        }
        out.metadata()
            .map(|m| m.len())
            .map_err(|e| self.err(what, e))
    }
}

/// A pack indexed into a quarantine directory: its objects are readable through
/// [`Incoming::repo`] (the quarantine first, the repository's objects as an alternate) and are in
/// the repository only after [`Incoming::accept`]. Dropped unaccepted, it is removed with all it
/// held.
#[derive(Debug)]
pub struct Incoming {
    dir: tempfile::TempDir,
    objects: PathBuf,
    /// How many objects the pack held (thin bases it was completed with included).
    pub objects_count: usize,
}

impl Incoming {
    /// Indexes the pack in `pack` strictly into a new quarantine under `common`'s object dir:
    /// `git index-pack --strict --fix-thin` with the repository's objects as the only source of
    /// thin bases, refusing a pack larger than `limits.max_pack` and any object larger than
    /// `limits.max_object`. The error says why, in git's words where git refused it.
    pub fn index(common: &Path, pack: File, limits: ImportLimits) -> Result<Incoming, String> {
        let size = pack.metadata().map_err(|e| e.to_string())?.len();
        if size > limits.max_pack {
            return Err(format!(
                "the pack's {size} bytes are more than the {} bytes allowed",
                limits.max_pack
            ));
        }
        let real = common.join("objects");
        let dir = tempfile::Builder::new()
            .prefix("zerg-incoming-")
            .tempdir_in(&real)
            .map_err(|e| format!("cannot make a quarantine dir: {e}"))?;
        let objects = dir.path().join("objects");
        fs::create_dir_all(objects.join("pack")).map_err(|e| e.to_string())?;
        fs::create_dir_all(objects.join("info")).map_err(|e| e.to_string())?;
        fs::write(
            objects.join("info").join("alternates"),
            format!("{}\n", real.display()),
        )
        .map_err(|e| e.to_string())?;
        // A bare repository around the quarantine, so the commit can be checked in it.
        let config = fs::read_to_string(common.join("config")).unwrap_or_default();
        let sha256 = config
            .to_ascii_lowercase()
            .contains("objectformat = sha256");
        fs::write(
            dir.path().join("config"),
            if sha256 {
                "[core]\n\trepositoryformatversion = 1\n\tbare = true\n[extensions]\n\tobjectformat = sha256\n"
            } else {
                "[core]\n\trepositoryformatversion = 0\n\tbare = true\n"
            },
        )
        .map_err(|e| e.to_string())?;
        fs::write(dir.path().join("HEAD"), "ref: refs/heads/main\n").map_err(|e| e.to_string())?;
        fs::create_dir_all(dir.path().join("refs").join("heads")).map_err(|e| e.to_string())?;
        let max = format!("--max-input-size={}", limits.max_pack);
        let out = crate::cli::scrubbed("git")
            .arg("--git-dir")
            .arg(dir.path())
            .args(["index-pack", "--stdin", "--fix-thin", "--strict", &max])
            .env("GIT_OBJECT_DIRECTORY", &objects)
            .env("GIT_ALTERNATE_OBJECT_DIRECTORIES", &real)
            .stdin(pack)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("cannot run git index-pack: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "git index-pack refused it: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let mut incoming = Incoming {
            dir,
            objects,
            objects_count: 0,
        };
        incoming.objects_count = incoming.check_sizes(common, limits.max_object)?;
        Ok(incoming)
    }

    /// Refuses the pack when one of its own objects is larger than `max_object`; returns how
    /// many objects it holds.
    fn check_sizes(&self, common: &Path, max_object: u64) -> Result<usize, String> {
        // Only the quarantine's own objects: no alternates for this look.
        let out = crate::cli::scrubbed("git")
            .arg("--git-dir")
            .arg(common)
            .args([
                "cat-file",
                "--batch-all-objects",
                "--batch-check=%(objectsize) %(objectname)",
            ])
            .env("GIT_OBJECT_DIRECTORY", &self.objects)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run git cat-file: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut n = 0;
        for line in text.lines() {
            let (size, id) = line.split_once(' ').unwrap_or((line, ""));
            if size.parse::<u64>().map_or(true, |s| s > max_object) {
                return Err(format!(
                    "object {id} of {size} bytes is larger than the {max_object} bytes allowed"
                ));
            }
            n += 1;
        }
        Ok(n)
    }

    /// The quarantine as a repository: its own objects, and the real ones behind them.
    pub fn repo(&self) -> Result<Repo, Error> {
        Repo::open(self.dir.path())
    }

    /// Moves the pack into the repository whose common dir is `common`: the pack first, its index
    /// last (git sees a pack once its index is there).
    pub fn accept(self, common: &Path) -> Result<(), String> {
        let dest = common.join("objects").join("pack");
        let mut names: Vec<PathBuf> = fs::read_dir(self.objects.join("pack"))
            .map_err(|e| e.to_string())?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "pack" || e == "idx"))
            .collect();
        names.sort_by_key(|p| p.extension().is_some_and(|e| e == "idx"));
        for p in names {
            let to = dest.join(p.file_name().unwrap_or_default());
            fs::rename(&p, &to).map_err(|e| format!("cannot move {}: {e}", p.display()))?;
        }
        if let Ok(d) = File::open(&dest) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

/// Stores a pack zergd sent into the worker's own repository (`git_dir`) and marks `shallow`
/// as commits whose parents it does not hold. The shallow list is written first: the strict
/// index checks every commit's parents are there, or shallow.
pub fn store_fetched(git_dir: &Path, pack: File, shallow: &[String]) -> Result<(), String> {
    let path = git_dir.join("shallow");
    let before = fs::read_to_string(&path).ok();
    let mut lines: Vec<String> = before
        .as_deref()
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    for s in shallow {
        if crate::is_object_id(s) && !lines.contains(s) {
            lines.push(s.clone());
        }
    }
    let mut text = lines.join("\n");
    text.push('\n');
    fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let out = crate::cli::scrubbed("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(["index-pack", "--stdin", "--fix-thin", "--strict"])
        .stdin(pack)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run git index-pack: {e}"))?;
    if !out.status.success() {
        let _ = match before {
            Some(b) => fs::write(&path, b),
            None => fs::remove_file(&path),
        };
        return Err(format!(
            "git index-pack: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerg_proto::testkit::git;

    const FORMATS: [&str; 2] = ["sha1", "sha256"];

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    /// zergd's repository, with history, a spec and a few files; returns its head.
    fn origin(dir: &Path, format: &str) -> (PathBuf, String) {
        let r = dir.join("origin");
        fs::create_dir(&r).unwrap();
        git(
            &r,
            &[
                "init",
                "-q",
                "-b",
                "main",
                &format!("--object-format={format}"),
            ],
        );
        write(&r, ".gsd/specs/f/task-graph.json", "{}\n");
        for i in 0..3 {
            write(
                &r,
                &format!("src/m{i}.rs"),
                &format!("pub fn f{i}() {{}}\n").repeat(50),
            );
            git(&r, &["add", "-A"]);
            git(&r, &["commit", "-q", "-m", &format!("c{i}")]);
        }
        let head = git(&r, &["rev-parse", "HEAD"]);
        (r, head)
    }

    fn spool(repo: &Repo, objects: &[PackEntry]) -> File {
        let f = tempfile::tempfile().unwrap();
        repo.write_pack(objects, f.try_clone().unwrap()).unwrap();
        rewound(f)
    }

    fn rewound(mut f: File) -> File {
        use std::io::Seek;
        f.rewind().unwrap();
        f
    }

    /// A worker's repository holding `base` at depth one, fetched from `origin`.
    fn worker(dir: &Path, format: &str, origin: &Repo, base: &str) -> PathBuf {
        let w = dir.join("worker");
        fs::create_dir(&w).unwrap();
        git(&w, &["init", "-q", &format!("--object-format={format}")]);
        let objects = origin.snapshot_objects(&[base.to_string()], &[]).unwrap();
        store_fetched(
            &w.join(".git"),
            spool(origin, &objects),
            &[base.to_string()],
        )
        .unwrap();
        git(&w, &["reset", "-q", "--hard", base]);
        w
    }

    fn quarantines(common: &Path) -> usize {
        fs::read_dir(common.join("objects"))
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("zerg-incoming-")
            })
            .count()
    }

    #[test]
    fn a_base_goes_down_at_depth_one_and_a_task_commit_comes_back_checked() {
        for format in FORMATS {
            let dir = tempfile::tempdir().unwrap();
            let (o, base) = origin(dir.path(), format);
            let origin = Repo::open(&o).unwrap();
            let w = worker(dir.path(), format, &origin, &base);
            // Depth one: the base's parent is not there.
            assert_eq!(git(&w, &["rev-list", "--count", "HEAD"]), "1", "{format}");
            write(&w, "src/m1.rs", "pub fn changed() {}\n");
            git(&w, &["add", "-A"]);
            git(
                &w,
                &[
                    "-c",
                    "user.name=w",
                    "-c",
                    "user.email=w@x",
                    "commit",
                    "-q",
                    "-m",
                    "task",
                ],
            );
            let commit = git(&w, &["rev-parse", "HEAD"]);
            let wrepo = Repo::open(&w).unwrap();
            let f = tempfile::tempfile().unwrap();
            let size = wrepo
                .write_thin_pack(&base, &commit, f.try_clone().unwrap())
                .unwrap();
            assert!(size > 0 && size < 4096, "a task's pack is small: {size}");
            assert!(!origin.is_commit(&commit));
            let common = o.join(".git");
            let inc = Incoming::index(&common, rewound(f), ImportLimits::default()).unwrap();
            inc.repo()
                .unwrap()
                .check_task_commit(&base, &commit, ".gsd/specs/f")
                .unwrap();
            assert!(!origin.is_commit(&commit), "nothing lands before accept");
            inc.accept(&common).unwrap();
            assert!(Repo::open(&o).unwrap().is_commit(&commit), "{format}");
            assert_eq!(quarantines(&common), 0);
            // The next base: the worker's commit is a have, so only what it lacks comes down.
            let more = origin
                .snapshot_objects(std::slice::from_ref(&commit), std::slice::from_ref(&base))
                .unwrap();
            let none = Repo::open(&o)
                .unwrap()
                .snapshot_objects(std::slice::from_ref(&commit), std::slice::from_ref(&commit))
                .unwrap();
            assert!(none.is_empty(), "a have that is the want sends nothing");
            assert!(!more.is_empty());
        }
    }

    /// Pushes `commit` (made in the worker by `make`) and returns why zergd refused it, or
    /// `None` if it was accepted.
    fn hostile(
        format: &str,
        limits: ImportLimits,
        make: impl FnOnce(&Path, &str) -> (String, Option<Vec<u8>>),
    ) -> Option<String> {
        let dir = tempfile::tempdir().unwrap();
        let (o, base) = origin(dir.path(), format);
        let origin = Repo::open(&o).unwrap();
        let w = worker(dir.path(), format, &origin, &base);
        let (commit, raw) = make(&w, &base);
        let f = tempfile::tempfile().unwrap();
        match raw {
            Some(bytes) => {
                let mut f2 = f.try_clone().unwrap();
                f2.write_all(&bytes).unwrap();
            }
            None => {
                Repo::open(&w)
                    .unwrap()
                    .write_thin_pack(&base, &commit, f.try_clone().unwrap())
                    .unwrap();
            }
        }
        let common = o.join(".git");
        let r = Incoming::index(&common, rewound(f), limits).and_then(|inc| {
            inc.repo().map_err(|e| e.to_string())?.check_task_commit(
                &base,
                &commit,
                ".gsd/specs/f",
            )?;
            inc.accept(&common)
        });
        assert_eq!(quarantines(&common), 0, "the quarantine is gone");
        if r.is_err() {
            assert!(
                !Repo::open(&o).unwrap().is_commit(&commit) || commit.is_empty(),
                "a refused commit never reaches the repository"
            );
        }
        r.err()
    }

    fn commit_all(w: &Path, msg: &str) -> String {
        git(w, &["add", "-A"]);
        git(
            w,
            &[
                "-c",
                "user.name=w",
                "-c",
                "user.email=w@x",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                msg,
            ],
        );
        git(w, &["rev-parse", "HEAD"])
    }

    #[test]
    fn hostile_packs_are_refused_and_leave_nothing() {
        for format in FORMATS {
            // Corrupt: a byte of the pack flipped.
            let why = hostile(format, ImportLimits::default(), |w, base| {
                write(w, "src/x.rs", "x\n");
                let c = commit_all(w, "t");
                let f = tempfile::tempfile().unwrap();
                let size = Repo::open(w)
                    .unwrap()
                    .write_thin_pack(base, &c, f.try_clone().unwrap())
                    .unwrap();
                let mut bytes = Vec::new();
                use std::io::Read;
                rewound(f).read_to_end(&mut bytes).unwrap();
                let mid = size as usize / 2;
                bytes[mid] ^= 0xff;
                (c, Some(bytes))
            })
            .expect("a corrupt pack is refused");
            assert!(why.contains("index-pack"), "{why}");
            // Oversized pack.
            let tiny = ImportLimits {
                max_pack: 64,
                ..ImportLimits::default()
            };
            let why = hostile(format, tiny, |w, _| {
                write(w, "src/big.rs", &"big text\n".repeat(1000));
                (commit_all(w, "t"), None)
            })
            .expect("an oversized pack is refused");
            assert!(why.contains("bytes allowed"), "{why}");
            // An object over the object limit.
            let small_objects = ImportLimits {
                max_object: 1000,
                ..ImportLimits::default()
            };
            let why = hostile(format, small_objects, |w, _| {
                write(w, "src/big.rs", &"0123456789abcdef\n".repeat(4096));
                (commit_all(w, "t"), None)
            })
            .expect("an object over the limit is refused");
            assert!(why.contains("larger than"), "{why}");
            // A commit that does not descend from the base (an orphan history).
            let why = hostile(format, ImportLimits::default(), |w, _| {
                git(w, &["checkout", "-q", "--orphan", "other"]);
                write(w, "evil.rs", "evil\n");
                (commit_all(w, "orphan"), None)
            })
            .expect("a commit off the base is refused");
            assert!(why.contains("does not descend"), "{why}");
            // A change to the spec.
            let why = hostile(format, ImportLimits::default(), |w, _| {
                write(w, ".gsd/specs/f/task-graph.json", "{\"evil\": true}\n");
                (commit_all(w, "spec"), None)
            })
            .expect("a spec change is refused");
            assert!(why.contains("spec"), "{why}");
            // And a good one still goes in.
            assert_eq!(
                hostile(format, ImportLimits::default(), |w, _| {
                    write(w, "src/ok.rs", "ok\n");
                    (commit_all(w, "ok"), None)
                }),
                None
            );
        }
    }
}
