//! Objects kept in memory while a level merge is built, then written to the store once, as
//! one pack and its index, instead of a loose file per merge commit and tree.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use flate2::Compression;
use flate2::write::ZlibEncoder;
use gix::ObjectId;
use gix::odb::memory::Storage;

use crate::Repo;

/// One object to pack.
struct Entry<'a> {
    id: ObjectId,
    kind: gix::object::Kind,
    data: &'a [u8],
}

impl Repo {
    /// A handle on the same repository whose object writes stay in memory until
    /// [`Repo::take_objects`] hands them over for [`Repo::store_objects`]; its reads see both
    /// what is in memory and what is on disk.
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

    /// Writes `objects` to the repository's store as one pack and index, fsynced with the pack
    /// dir (git's own default for packs).
    pub(crate) fn store_objects(&self, objects: &Storage) -> Result<(), crate::Error> {
        if objects.is_empty() {
            return Ok(());
        }
        let entries: Vec<Entry<'_>> = objects
            .iter()
            .map(|(id, (kind, data))| Entry {
                id: *id,
                kind: *kind,
                data,
            })
            .collect();
        let dir = self.repo.objects.store_ref().path().join("pack");
        write_pack(&dir, self.repo.object_hash(), &entries).map_err(|e| self.err("write a pack", e))
    }
}

/// Writes `entries` as one version-2 pack and its version-2 index into `dir` (a store's `pack`
/// dir), each through a temp file renamed into place: the pack first, then the index, which is
/// what makes it visible; each file and then the dir fsynced.
fn write_pack(dir: &Path, hash: gix::hash::Kind, entries: &[Entry<'_>]) -> io::Result<()> {
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
    place(dir, &dir.join(format!("{name}.pack")), &pack)?;
    place(dir, &dir.join(format!("{name}.idx")), &idx)?;
    File::open(dir)?.sync_all()
}

/// Writes `bytes` to `path` through a temp file in `dir`, read-only as git leaves pack files;
/// a file already there (the same pack, named by its content) is kept.
fn place(dir: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        return Ok(());
    }
    let mut tmp = tempfile::Builder::new()
        .prefix("tmp_pack_")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
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
