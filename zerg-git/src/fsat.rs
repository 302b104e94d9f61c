//! File work on trees a worker can write, by directory descriptor: every step opens the next
//! component relative to the directory already open (`openat` with `O_NOFOLLOW`), and modes
//! and owners change through the open descriptor (`fchmod`, `fchown`). A symlink a worker left
//! or swapped in is never followed, and no path is resolved twice, so there is no window between
//! a check and the operation it guards.
//!
//! Used by container mode (the grant walk, the private git dir, the per-worker home) and by the
//! import of a container's git objects.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{Gid, UnlinkatFlags, fchown, unlinkat};

/// What a directory entry is, read without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A socket.
    Socket,
    /// Anything else (FIFO, device).
    Other,
}

impl Kind {
    fn of(st: &FileStat) -> Kind {
        match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFREG => Kind::File,
            SFlag::S_IFDIR => Kind::Dir,
            SFlag::S_IFLNK => Kind::Symlink,
            SFlag::S_IFSOCK => Kind::Socket,
            _ => Kind::Other,
        }
    }
}

fn err(e: Errno) -> io::Error {
    io::Error::from(e)
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Opening a FIFO for reading with `O_NONBLOCK` returns at once instead of waiting for a
/// writer; the caller checks the type on the descriptor before it reads.
const FILE_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC)
    .union(OFlag::O_NONBLOCK)
    .union(OFlag::O_NOCTTY);

/// An open directory. Everything below it is reached through it.
#[derive(Debug)]
pub struct Dir(OwnedFd);

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// One name, checked to be a single plain component (no `/`, not `.` or `..`).
fn name(n: &OsStr) -> io::Result<&OsStr> {
    let b = n.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{:?} is not a plain file name", n),
        ));
    }
    Ok(n)
}

impl Dir {
    /// Opens a directory zergd made (or trusts): the last component must be a directory, not a
    /// symlink; the components above it are zergd's own and resolved normally.
    pub fn open(path: &Path) -> io::Result<Dir> {
        nix::fcntl::open(path, DIR_FLAGS, Mode::empty())
            .map(Dir)
            .map_err(|e| {
                io::Error::new(
                    io::Error::from(e).kind(),
                    format!("{}: {e}", path.display()),
                )
            })
    }

    /// Opens `rel` below `root`, one component at a time, never following a symlink on the way.
    pub fn open_below(root: &Path, rel: &Path) -> io::Result<Dir> {
        let mut d = Dir::open(root)?;
        for c in plain_components(rel)? {
            d = d.dir(c)?;
        }
        Ok(d)
    }

    /// Opens the subdirectory `n`; a symlink there is an error (`ELOOP` / `ENOTDIR`).
    pub fn dir(&self, n: impl AsRef<OsStr>) -> io::Result<Dir> {
        openat(self, name(n.as_ref())?, DIR_FLAGS, Mode::empty())
            .map(Dir)
            .map_err(err)
    }

    /// Makes `n` a directory here, replacing whatever a worker left that is not one (a
    /// symlink, a file), and opens it.
    pub fn make_dir(&self, n: impl AsRef<OsStr>, mode: u32) -> io::Result<Dir> {
        let n = name(n.as_ref())?;
        match self.kind(n)? {
            Some(Kind::Dir) => {}
            Some(_) => {
                self.remove(n)?;
                mkdirat(self, n, Mode::from_bits_truncate(mode)).map_err(err)?;
            }
            None => match mkdirat(self, n, Mode::from_bits_truncate(mode)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(err(e)),
            },
        }
        self.dir(n)
    }

    /// Makes `rel` (plain relative components) a chain of directories below this one, replacing
    /// anything on the way that is not a directory, and opens the last.
    pub fn make_dirs(&self, rel: &Path, mode: u32) -> io::Result<Dir> {
        let mut d = self.reopen()?;
        for c in plain_components(rel)? {
            d = d.make_dir(c, mode)?;
        }
        Ok(d)
    }

    fn reopen(&self) -> io::Result<Dir> {
        openat(self, ".", DIR_FLAGS, Mode::empty())
            .map(Dir)
            .map_err(err)
    }

    /// The entry's metadata, not following a symlink; `None` when there is no such entry.
    pub fn stat(&self, n: impl AsRef<OsStr>) -> io::Result<Option<FileStat>> {
        match fstatat(self, name(n.as_ref())?, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(err(e)),
        }
    }

    /// What the entry is, not following a symlink; `None` when there is no such entry.
    pub fn kind(&self, n: impl AsRef<OsStr>) -> io::Result<Option<Kind>> {
        Ok(self.stat(n)?.as_ref().map(Kind::of))
    }

    /// This directory's own metadata.
    pub fn fstat(&self) -> io::Result<FileStat> {
        fstat(self).map_err(err)
    }

    /// The names in this directory (without `.` and `..`), with their kinds as the directory
    /// reports them (`None` when it does not say).
    pub fn entries(&self) -> io::Result<Vec<(OsString, Option<Kind>)>> {
        let mut d = nix::dir::Dir::from_fd(self.reopen()?.0).map_err(err)?;
        let mut out = Vec::new();
        for e in d.iter() {
            let e = e.map_err(err)?;
            let n = OsStr::from_bytes(e.file_name().to_bytes());
            if n == "." || n == ".." {
                continue;
            }
            use nix::dir::Type;
            let k = e.file_type().map(|t| match t {
                Type::File => Kind::File,
                Type::Directory => Kind::Dir,
                Type::Symlink => Kind::Symlink,
                Type::Socket => Kind::Socket,
                _ => Kind::Other,
            });
            out.push((n.to_os_string(), k));
        }
        Ok(out)
    }

    /// Removes the entry, whatever it is (a directory with everything below it, walked by
    /// descriptor); nothing there is fine.
    pub fn remove(&self, n: impl AsRef<OsStr>) -> io::Result<()> {
        let n = name(n.as_ref())?;
        match unlinkat(self, n, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => return Ok(()),
            Err(Errno::EISDIR | Errno::EPERM) => {}
            Err(e) => return Err(err(e)),
        }
        if self.kind(n)? != Some(Kind::Dir) {
            return unlinkat(self, n, UnlinkatFlags::NoRemoveDir).map_err(err);
        }
        let sub = self.dir(n)?;
        for (child, _) in sub.entries()? {
            sub.remove(&child)?;
        }
        match unlinkat(self, n, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(err(e)),
        }
    }

    /// Writes a new file `n` with `mode`, removing whatever was there first: what a worker left
    /// there is replaced, never followed or truncated in place.
    pub fn write_new(&self, n: impl AsRef<OsStr>, bytes: &[u8], mode: u32) -> io::Result<()> {
        let n = name(n.as_ref())?;
        self.remove(n)?;
        let fd = openat(
            self,
            n,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(err)?;
        let mut f = File::from(fd);
        f.write_all(bytes)?;
        // The umask may have narrowed the mode.
        fchmod(&f, Mode::from_bits_truncate(mode)).map_err(err)
    }

    /// Opens the regular file `n` for reading; a symlink, FIFO, device or directory there is an
    /// error, and opening never blocks.
    pub fn open_file(&self, n: impl AsRef<OsStr>) -> io::Result<(File, FileStat)> {
        let fd = openat(self, name(n.as_ref())?, FILE_FLAGS, Mode::empty()).map_err(err)?;
        let st = fstat(&fd).map_err(err)?;
        if Kind::of(&st) != Kind::File {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        Ok((File::from(fd), st))
    }

    /// Gives `gid` group access to this directory (and, with `recursive`, to every directory
    /// and regular file below it; `skip` names entries of this directory to leave alone):
    /// group read/write, search plus setgid on directories, execute where the owner may
    /// execute. Owners never change; symlinks and special files are left alone. Every change
    /// goes through a descriptor of the entry itself.
    pub fn grant(&self, gid: u32, recursive: bool, skip: &[&OsStr]) -> io::Result<()> {
        set_group_bits(self, &self.fstat()?, gid, 0o2070)?;
        if !recursive {
            return Ok(());
        }
        for (n, _) in self.entries()? {
            if skip.contains(&n.as_os_str()) {
                continue;
            }
            self.grant_entry(&n, gid, |d| d.grant(gid, true, &[]))?;
        }
        Ok(())
    }

    /// Group read (and search on directories) for `gid` on this tree, which the container only
    /// reads.
    pub fn grant_readable(&self, gid: u32) -> io::Result<()> {
        set_group_bits(self, &self.fstat()?, gid, 0o050)?;
        for (n, _) in self.entries()? {
            match self.kind(&n)? {
                Some(Kind::Dir) => self.dir(&n)?.grant_readable(gid)?,
                Some(Kind::File) => self.grant_file(&n, gid, 0o040)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Grants one entry: a directory is opened and handed to `dir`; a regular file gets group
    /// read/write (and execute where the owner may). An entry that changed kind between the
    /// listing and the open is left alone.
    fn grant_entry(
        &self,
        n: &OsStr,
        gid: u32,
        dir: impl FnOnce(&Dir) -> io::Result<()>,
    ) -> io::Result<()> {
        match self.kind(n)? {
            Some(Kind::Dir) => match self.dir(n) {
                Ok(d) => dir(&d),
                Err(e) if raced(&e) => Ok(()),
                Err(e) => Err(e),
            },
            Some(Kind::File) => self.grant_file(n, gid, 0o060),
            _ => Ok(()),
        }
    }

    /// Gives `gid` the `want` bits on the regular file `n` (plus group execute where the owner
    /// may execute and `want` allows writing), through its descriptor. A symlink, FIFO or
    /// anything else there, or an entry that vanished, is left alone.
    pub fn grant_file(&self, n: impl AsRef<OsStr>, gid: u32, want: u32) -> io::Result<()> {
        match self.open_file(n) {
            Ok((f, st)) => {
                let x = if st.st_mode & 0o100 != 0 && want & 0o020 != 0 {
                    0o010
                } else {
                    0
                };
                set_group_bits(&f, &st, gid, want | x)
            }
            Err(e) if raced(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// An entry that turned into something else (a symlink, a FIFO) or vanished between the
/// listing and the open: a worker is changing the tree, and the entry is skipped.
fn raced(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error().map(Errno::from_raw),
        Some(Errno::ELOOP | Errno::ENOTDIR | Errno::ENOENT | Errno::ENXIO)
    ) || e.kind() == io::ErrorKind::InvalidInput
}

/// Sets the group of the open entry to `gid` and adds `want` to its mode, through the
/// descriptor. Special bits outside `want` that the entry had are dropped: an entry a worker
/// made never becomes setuid or setgid by zergd's hand.
fn set_group_bits(fd: impl AsFd, st: &FileStat, gid: u32, want: u32) -> io::Result<()> {
    let fd = fd.as_fd();
    if st.st_gid != gid {
        fchown(fd, None, Some(Gid::from_raw(gid))).map_err(err)?;
    }
    let mode = st.st_mode & 0o7777;
    let target = (mode & 0o0777) | want;
    if mode != target || st.st_gid != gid {
        // chown may clear setgid; always re-apply the full mode after a group change.
        fchmod(fd, Mode::from_bits_truncate(target)).map_err(err)?;
    }
    Ok(())
}

/// The components of a plain relative path (no root, no `..`, no `.`).
fn plain_components(rel: &Path) -> io::Result<Vec<&OsStr>> {
    rel.components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a plain relative path", rel.display()),
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn nothing_a_worker_left_is_followed() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::write(outside.path().join("victim"), "secret").unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("victim"), r.join("flink")).unwrap();
        let d = Dir::open(r).unwrap();
        assert!(
            d.dir("link").is_err(),
            "a symlinked directory is not opened"
        );
        assert!(
            d.open_file("flink").is_err(),
            "a symlinked file is not opened"
        );
        assert!(Dir::open_below(r, Path::new("link")).is_err());
        // Writing over a symlink replaces it.
        d.write_new("flink", b"mine", 0o644).unwrap();
        assert_eq!(
            std::fs::read_to_string(outside.path().join("victim")).unwrap(),
            "secret"
        );
        assert_eq!(std::fs::read_to_string(r.join("flink")).unwrap(), "mine");
        // make_dirs replaces a symlink on the way and makes nothing outside.
        d.make_dirs(Path::new("link/a/b"), 0o755).unwrap();
        assert!(std::fs::symlink_metadata(r.join("link")).unwrap().is_dir());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
        // remove walks a directory by descriptor and leaves what a symlink inside points to.
        std::os::unix::fs::symlink(outside.path(), r.join("link/a/out")).unwrap();
        d.remove("link").unwrap();
        assert!(!r.join("link").exists());
        assert!(outside.path().join("victim").exists());
        // A FIFO is refused without blocking.
        nix::unistd::mkfifo(&r.join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        assert!(d.open_file("fifo").is_err());
        assert!(name(OsStr::new("../x")).is_err() && name(OsStr::new("..")).is_err());
    }

    /// The attack of the security review, in one process: while the grant walk runs again and
    /// again, another thread swaps a file and a symlink to a root-only file back and forth with
    /// atomic renames. The victim's mode and group never change.
    #[test]
    fn a_symlink_swapped_in_during_the_grant_walk_is_never_followed() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, "root only").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let before = std::fs::metadata(&victim).unwrap();
        let tree = root.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let tree = tree.clone();
            let victim = victim.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (a, b) = (tree.join("a"), tree.join("b"));
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::fs::write(tree.join("f.tmp"), "x");
                    let _ = std::fs::set_permissions(
                        tree.join("f.tmp"),
                        std::fs::Permissions::from_mode(0o6777),
                    );
                    let _ = std::fs::rename(
                        tree.join("f.tmp"),
                        if i.is_multiple_of(2) { &a } else { &b },
                    );
                    let _ = std::fs::remove_file(tree.join("l.tmp"));
                    let _ = std::os::unix::fs::symlink(&victim, tree.join("l.tmp"));
                    let _ = std::fs::rename(
                        tree.join("l.tmp"),
                        if i.is_multiple_of(2) { &b } else { &a },
                    );
                    i += 1;
                }
            })
        };
        // Root may give any group; anyone else only their own.
        let gid = if nix::unistd::geteuid().is_root() {
            4242
        } else {
            nix::unistd::getegid().as_raw()
        };
        for _ in 0..3000 {
            let d = Dir::open(&tree).unwrap();
            d.grant(gid, true, &[]).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().unwrap();
        let after = std::fs::metadata(&victim).unwrap();
        assert_eq!(after.mode(), before.mode(), "the victim's mode changed");
        assert_eq!(after.gid(), before.gid(), "the victim's group changed");
        // And what the walk grants carries no setuid bit of the worker's choosing.
        Dir::open(&tree).unwrap().grant(gid, true, &[]).unwrap();
        for e in std::fs::read_dir(&tree).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_file() {
                assert_eq!(m.mode() & 0o4000, 0, "setuid kept on {:?}", e.path());
            }
        }
    }
}
