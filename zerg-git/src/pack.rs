//! Objects kept in memory while a task commit or a level merge is built, then written to the
//! store once, as one pack and its index, instead of a loose file per object: a task's blobs,
//! trees and commit cost two files, and a level's merge folds the level's task packs into its
//! own so the store holds one pack per level, not one per task.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use flate2::Compression;
use flate2::write::ZlibEncoder;
use gix::ObjectId;
use gix::odb::memory::Storage;

use crate::Repo;

/// The most objects a pack may hold to be folded into a level's pack: a task's pack holds a
/// handful; anything larger came from elsewhere and is left alone.
const MAX_FOLDED_OBJECTS: u32 = 4096;

/// The most bytes (inflated) one level's fold reads into memory; packs beyond stay as they are.
const MAX_FOLDED_BYTES: u64 = 64 << 20;

/// The only files of a pack's name a folded pack may have: its data and its index. A `.keep`,
/// `.promisor`, `.bitmap`, `.rev` or `.mtimes` beside a pack means git (or a fetch in progress)
/// has plans for it.
const FOLDABLE: [&str; 2] = ["pack", "idx"];

/// One object to pack.
struct Entry<'a> {
    id: ObjectId,
    kind: gix::object::Kind,
    data: &'a [u8],
}

impl Repo {
    /// A handle on the same repository whose object writes stay in memory until
    /// [`Repo::store_objects`] takes them; reads see both.
    pub(crate) fn in_memory(&self) -> Repo {
        let mut repo = self.repo.clone();
        repo.objects.enable_object_memory();
        Repo {
            repo,
            dir: self.dir.clone(),
        }
    }

    /// The objects written to this handle (made by [`Repo::in_memory`]) since it was made.
    pub(crate) fn take_objects(&self) -> Storage {
        self.repo.objects.reset_object_memory().unwrap_or_default()
    }

    /// Where this handle writes objects: the repository's store, or a container worker's
    /// private object dir (`GIT_OBJECT_DIRECTORY`).
    fn objects_dir(&self) -> &Path {
        self.repo.objects.store_ref().path()
    }

    /// Writes `objects` to the store this handle writes to: one pack when that is the
    /// repository's own store; loose objects in a container worker's private object dir, which
    /// zergd imports object by object, without a git program. `durable` fsyncs the pack, its
    /// index and the pack dir (needed before the packs it replaces are removed). Returns the
    /// pack, when it wrote one.
    pub(crate) fn store_objects(
        &self,
        objects: &Storage,
        durable: bool,
    ) -> Result<Option<PathBuf>, crate::Error> {
        if objects.is_empty() {
            return Ok(None);
        }
        let own = crate::objects::normalize(&self.repo.common_dir().join("objects"));
        if crate::objects::normalize(self.objects_dir()) != own {
            for (kind, data) in objects.values() {
                gix::objs::Write::write_buf(&self.repo, *kind, data)
                    .map_err(|e| self.err("write an object", e))?;
            }
            return Ok(None);
        }
        let entries: Vec<Entry<'_>> = objects
            .iter()
            .map(|(id, (kind, data))| Entry {
                id: *id,
                kind: *kind,
                data,
            })
            .collect();
        let pack = write_pack(
            &own.join("pack"),
            self.repo.object_hash(),
            &entries,
            durable,
        )
        .map_err(|e| self.err("write a pack", e))?;
        Ok(Some(pack))
    }

    /// Adds to `objects` every object of the small packs in the store written at or after
    /// `since` (the tasks' packs of a level) and returns those packs, to be removed with
    /// [`remove_packs`] once `objects` is stored. A pack holding `keep` (the last level's merge
    /// head: its pack is the last level's own), a pack with any other companion file than its
    /// index, and the packs of a store with a multi-pack index are never chosen. A pack that
    /// cannot be read is left where it is.
    pub(crate) fn fold_packs(
        &self,
        since: SystemTime,
        keep: ObjectId,
        objects: &mut Storage,
    ) -> Result<Vec<PathBuf>, crate::Error> {
        let dir = crate::objects::normalize(&self.repo.common_dir().join("objects").join("pack"));
        if dir.join("multi-pack-index").exists() {
            return Ok(Vec::new());
        }
        let Ok(listing) = fs::read_dir(&dir) else {
            return Ok(Vec::new());
        };
        let mut names: Vec<String> = listing
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        let mut others: HashSet<&str> = HashSet::new();
        for n in &names {
            if let Some((stem, ext)) = n.rsplit_once('.')
                && !FOLDABLE.contains(&ext)
            {
                others.insert(stem);
            }
        }
        let mut chosen = Vec::new();
        let mut budget = MAX_FOLDED_BYTES;
        for n in &names {
            let Some(stem) = n.strip_suffix(".idx") else {
                continue;
            };
            if others.contains(stem) || !stem.starts_with("pack-") {
                continue;
            }
            let idx_path = dir.join(n);
            let fresh = fs::metadata(&idx_path)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t >= since);
            if !fresh {
                continue;
            }
            let index = match gix::odb::pack::index::File::at(&idx_path, self.repo.object_hash()) {
                Ok(i) if i.num_objects() <= MAX_FOLDED_OBJECTS && i.lookup(keep).is_none() => i,
                _ => continue,
            };
            let mut read = Vec::new();
            let mut whole = true;
            for e in index.iter() {
                if objects.contains_key(&e.oid) {
                    continue;
                }
                // Sized before it is read: what a worker left in the store is never trusted to
                // be small.
                match self.repo.find_header(e.oid).map(|h| h.size()) {
                    Ok(n) if n <= budget => budget -= n,
                    _ => {
                        whole = false;
                        break;
                    }
                }
                // Only an object that is what its name says is carried into the level's pack.
                let hash = self.repo.object_hash();
                match self.repo.find_object(e.oid) {
                    Ok(o)
                        if gix::objs::compute_hash(hash, o.kind, &o.data)
                            .is_ok_and(|id| id == e.oid) =>
                    {
                        read.push((e.oid, (o.kind, o.detach().data)))
                    }
                    _ => {
                        whole = false;
                        break;
                    }
                }
            }
            if whole {
                objects.extend(read);
                chosen.push(dir.join(format!("{stem}.pack")));
            }
        }
        Ok(chosen)
    }
}

/// Removes folded packs: each index first (which makes the pack invisible to a new reader),
/// then its pack. A reader that has the pack open keeps reading it; one that looks again finds
/// its objects in the pack that replaced it, `written`, which is never removed: a pack is named
/// by its content, so folding one pack alone writes the same pack again.
pub(crate) fn remove_packs(packs: &[PathBuf], written: Option<&Path>) {
    for pack in packs.iter().filter(|p| Some(p.as_path()) != written) {
        for ext in ["idx", "pack"] {
            let p = pack.with_extension(ext);
            if let Err(e) = fs::remove_file(&p)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(file = %p.display(), error = %e, "a folded pack was not removed");
            }
        }
    }
}

/// Writes `entries` as one version-2 pack and its version-2 index into `dir` (a store's `pack`
/// dir), each through a temp file renamed into place: the pack first, then the index, which is
/// what makes it visible. Returns the pack's path.
fn write_pack(
    dir: &Path,
    hash: gix::hash::Kind,
    entries: &[Entry<'_>],
    durable: bool,
) -> io::Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let mut pack: Vec<u8> =
        Vec::with_capacity(64 + entries.iter().map(|e| e.data.len() / 2 + 16).sum::<usize>());
    pack.extend_from_slice(b"PACK");
    pack.extend_from_slice(&2u32.to_be_bytes());
    let count = u32::try_from(entries.len())
        .map_err(|_| io::Error::other("too many objects for one pack"))?;
    pack.extend_from_slice(&count.to_be_bytes());
    // (id, crc32 of the entry's bytes, offset), sorted by id for the index.
    let mut index: Vec<(ObjectId, u32, u64)> = Vec::with_capacity(entries.len());
    for e in entries {
        let start = pack.len();
        let type_id: u8 = match e.kind {
            gix::object::Kind::Commit => 1,
            gix::object::Kind::Tree => 2,
            gix::object::Kind::Blob => 3,
            gix::object::Kind::Tag => 4,
        };
        let mut size = e.data.len() as u64;
        let mut byte = (type_id << 4) | (size & 0x0f) as u8;
        size >>= 4;
        while size != 0 {
            pack.push(byte | 0x80);
            byte = (size & 0x7f) as u8;
            size >>= 7;
        }
        pack.push(byte);
        let mut z = ZlibEncoder::new(pack, Compression::fast());
        z.write_all(e.data)?;
        pack = z.finish()?;
        let mut crc = flate2::Crc::new();
        crc.update(&pack[start..]);
        index.push((e.id, crc.sum(), start as u64));
    }
    let pack_hash = digest(hash, &pack)?;
    pack.extend_from_slice(pack_hash.as_bytes());
    index.sort_unstable_by_key(|a| a.0);

    let mut idx: Vec<u8> = Vec::with_capacity(
        8 + 1024 + index.len() * (hash.len_in_bytes() + 8) + 2 * hash.len_in_bytes(),
    );
    idx.extend_from_slice(&[0xff, b't', b'O', b'c']);
    idx.extend_from_slice(&2u32.to_be_bytes());
    let mut fan = [0u32; 256];
    for (id, _, _) in &index {
        fan[usize::from(id.as_bytes()[0])] += 1;
    }
    let mut total = 0u32;
    for n in fan {
        total += n;
        idx.extend_from_slice(&total.to_be_bytes());
    }
    for (id, _, _) in &index {
        idx.extend_from_slice(id.as_bytes());
    }
    for (_, crc, _) in &index {
        idx.extend_from_slice(&crc.to_be_bytes());
    }
    let mut large: Vec<u64> = Vec::new();
    for (_, _, offset) in &index {
        let small = match u32::try_from(*offset) {
            Ok(o) if o < 0x8000_0000 => o,
            _ => {
                large.push(*offset);
                0x8000_0000 | (large.len() as u32 - 1)
            }
        };
        idx.extend_from_slice(&small.to_be_bytes());
    }
    for offset in large {
        idx.extend_from_slice(&offset.to_be_bytes());
    }
    idx.extend_from_slice(pack_hash.as_bytes());
    let idx_hash = digest(hash, &idx)?;
    idx.extend_from_slice(idx_hash.as_bytes());

    let name = format!("pack-{}", pack_hash.to_hex());
    let pack_path = dir.join(format!("{name}.pack"));
    place(dir, &pack_path, &pack, durable)?;
    place(dir, &dir.join(format!("{name}.idx")), &idx, durable)?;
    if durable {
        File::open(dir)?.sync_all()?;
    }
    Ok(pack_path)
}

/// Writes `bytes` to `path` through a temp file in `dir`, read-only as git leaves pack files;
/// a file already there (the same pack, named by its content) is kept.
fn place(dir: &Path, path: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        return Ok(());
    }
    let mut tmp = tempfile::Builder::new()
        .prefix("tmp_pack_")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    if durable {
        tmp.as_file().sync_all()?;
    }
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(0o444))?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The hash of `bytes` in the repository's object format.
fn digest(kind: gix::hash::Kind, bytes: &[u8]) -> io::Result<ObjectId> {
    let mut h = gix::hash::hasher(kind);
    h.update(bytes);
    h.try_finalize()
        .map_err(|e| io::Error::other(e.to_string()))
}
