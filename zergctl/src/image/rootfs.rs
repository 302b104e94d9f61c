//! The offline image: a root filesystem assembled from the host's own binaries (and the
//! shared libraries `ldd` names), written as a tar stream for the engine's import.

use super::*;

/// Assembles the offline root filesystem from the host.
pub(super) fn offline_rootfs(agent: &Path, extras: &[PathBuf]) -> Result<Rootfs, ImageError> {
    let mut fs_ = Rootfs::default();
    for d in ["bin", "etc", "usr/local/bin", "zerg/run"] {
        fs_.dir(d, 0o755, 0);
    }
    // Mount points in container mode; a remote worker (swarm, kubernetes), which has no
    // mounts, keeps its own repository and logs there, as whichever uid runs it.
    for d in ["workspace", "zerg/logs"] {
        fs_.dir(d, 0o1777, WORKER_UID);
    }
    fs_.dir("tmp", 0o1777, 0);
    // Writable for whichever uid zergd picks (its own, or 10001).
    fs_.dir("home", 0o755, 0);
    fs_.dir("home/worker", 0o1777, WORKER_UID);
    fs_.dir("root", 0o700, 0);
    fs_.data(
        "etc/passwd",
        format!("root:x:0:0:root:/root:/bin/sh\nworker:x:{WORKER_UID}:{WORKER_UID}:zerg worker:/home/worker:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"),
        0o644,
    );
    fs_.data(
        "etc/group",
        format!("root:x:0:\nworker:x:{WORKER_UID}:\nnogroup:x:65534:\n"),
        0o644,
    );
    fs_.data(
        "etc/nsswitch.conf",
        "passwd: files\ngroup: files\nhosts: files dns\n".to_string(),
        0o644,
    );

    fs_.host_binary(Path::new("/bin/sh"))?;
    for tool in TOOLS {
        if let Some(p) = which(tool) {
            fs_.host_binary(&p)?;
        }
    }
    let git = which("git").ok_or_else(|| {
        input("git not found on this host: the offline image copies the host's git")
    })?;
    let git_real = fs_.host_binary(&git)?;
    let git_meta = fs::metadata(&git_real)
        .map_err(|e| input(format!("cannot stat {}: {e}", git_real.display())))?;
    let exec = std::process::Command::new(&git)
        .arg("--exec-path")
        .output()
        .map_err(|e| input(format!("cannot run {} --exec-path: {e}", git.display())))?;
    let exec_dir = PathBuf::from(String::from_utf8_lossy(&exec.stdout).trim());
    if exec_dir.is_dir() {
        let mut entries: Vec<PathBuf> = fs::read_dir(&exec_dir)
            .map_err(|e| input(format!("cannot read {}: {e}", exec_dir.display())))?
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for p in entries {
            if git_helper_wanted(&p, &git_meta) {
                fs_.host_binary(&p)?;
            }
        }
    }
    for certs in ["/etc/ssl/certs/ca-certificates.crt"] {
        if Path::new(certs).is_file() {
            fs_.host_path(Path::new(certs))?;
        }
    }
    fs_.binary_as(
        zerg_proto::contract::image::AGENT_PATH.trim_start_matches('/'),
        agent,
    )?;
    for extra in extras {
        let name = extra
            .file_name()
            .ok_or_else(|| input(format!("--with {}: not a file", extra.display())))?;
        fs_.binary_as(&format!("usr/local/bin/{}", name.to_string_lossy()), extra)?;
    }
    Ok(fs_)
}

/// Which entries of git's exec path go into the image: links to git itself, shell scripts
/// and sourced shell libraries, and the compiled helpers in [`GIT_HELPERS`]. Perl and Python
/// scripts (no interpreter in the image) and server tools are left out.
pub(super) fn git_helper_wanted(p: &Path, git: &fs::Metadata) -> bool {
    let Ok(meta) = fs::symlink_metadata(p) else {
        return false;
    };
    if meta.file_type().is_symlink() {
        return true;
    }
    if !meta.is_file() {
        return false;
    }
    if meta.dev() == git.dev() && meta.ino() == git.ino() {
        return true;
    }
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let mut head = [0u8; 64];
    let n = fs::File::open(p)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let head = &head[..n];
    if head.starts_with(b"\x7fELF") {
        return GIT_HELPERS.contains(&name.as_str());
    }
    let first = head.split(|b| *b == b'\n').next().unwrap_or_default();
    !first.starts_with(b"#!") || first.starts_with(b"#!/bin/sh")
}

pub(super) fn which(name: &str) -> Option<PathBuf> {
    SYSTEM_PATH
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Shared libraries from `ldd` output (`name => /path (0x…)` and `/path (0x…)` lines). A
/// library reported `not found` is an error; virtual objects (vDSO) are skipped.
pub(super) fn parse_ldd(output: &str) -> Result<Vec<PathBuf>, String> {
    let mut libs = Vec::new();
    for line in output.lines().map(str::trim) {
        if let Some((name, rest)) = line.split_once("=>") {
            let rest = rest.trim();
            if rest.starts_with("not found") {
                return Err(name.trim().to_string());
            }
            if let Some(p) = rest
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/'))
            {
                libs.push(PathBuf::from(p));
            }
        } else if line.starts_with('/')
            && let Some(p) = line.split_whitespace().next()
        {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

pub(super) fn ldd(file: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let out = std::process::Command::new("ldd")
        .arg(file)
        .output()
        .map_err(|e| {
            input(format!(
                "cannot run ldd (glibc's libc-bin) for {}: {e}",
                file.display()
            ))
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        if text.contains("not a dynamic executable") || text.contains("statically linked") {
            return Ok(Vec::new());
        }
        return Err(input(format!(
            "ldd {} failed: {}",
            file.display(),
            text.trim()
        )));
    }
    parse_ldd(&text).map_err(|lib| {
        input(format!(
            "{} needs {lib}, which this host does not have",
            file.display()
        ))
    })
}

pub(super) fn is_elf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"\x7fELF"
}

/// One entry of the image's filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Node {
    Dir {
        mode: u32,
        owner: u32,
    },
    /// A host file's bytes.
    File {
        src: PathBuf,
        mode: u32,
        key: (u64, u64),
    },
    /// Generated content.
    Data {
        bytes: Vec<u8>,
        mode: u32,
    },
    Symlink {
        target: PathBuf,
    },
}

/// The root filesystem being assembled: paths relative to `/`, in archive order (parents
/// before children).
#[derive(Debug, Clone, Default)]
pub(super) struct Rootfs {
    pub(super) nodes: BTreeMap<PathBuf, Node>,
    /// Files whose libraries were already added (git's exec path is mostly hardlinks).
    pub(super) linked: HashSet<(u64, u64)>,
}

pub(super) fn io_input(what: &str, p: &Path) -> impl FnOnce(std::io::Error) -> ImageError {
    let msg = format!("cannot {what} {}", p.display());
    move |e| input(format!("{msg}: {e}"))
}

impl Rootfs {
    pub(super) fn dir(&mut self, rel: &str, mode: u32, owner: u32) {
        let mut cur = PathBuf::new();
        for c in Path::new(rel).components() {
            cur.push(c);
            self.nodes.entry(cur.clone()).or_insert(Node::Dir {
                mode: 0o755,
                owner: 0,
            });
        }
        self.nodes.insert(cur, Node::Dir { mode, owner });
    }

    pub(super) fn data(&mut self, rel: &str, content: String, mode: u32) {
        self.parents(Path::new(rel));
        self.nodes.insert(
            PathBuf::from(rel),
            Node::Data {
                bytes: content.into_bytes(),
                mode,
            },
        );
    }

    pub(super) fn parents(&mut self, rel: &Path) {
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty())
            && !self.nodes.contains_key(parent)
        {
            self.dir(&parent.to_string_lossy(), 0o755, 0);
        }
    }

    /// Adds a host path at the same place, recording every symlink met on the way (so
    /// `/bin/sh` brings `bin -> usr/bin`, `usr/bin/sh -> dash` and `usr/bin/dash`), and
    /// returns the resolved path of the file.
    pub(super) fn host_path(&mut self, path: &Path) -> Result<PathBuf, ImageError> {
        let mut todo: VecDeque<OsString> = path
            .components()
            .filter(|c| !matches!(c, Component::RootDir))
            .map(|c| c.as_os_str().to_os_string())
            .collect();
        let mut cur = PathBuf::from("/");
        let mut hops = 0;
        while let Some(c) = todo.pop_front() {
            if c == ".." {
                cur.pop();
                continue;
            }
            if c == "." {
                continue;
            }
            let next = cur.join(&c);
            let rel = next.strip_prefix("/").unwrap_or(&next).to_path_buf();
            let meta = fs::symlink_metadata(&next).map_err(io_input("read", &next))?;
            if meta.file_type().is_symlink() {
                hops += 1;
                if hops > 40 {
                    return Err(input(format!(
                        "too many symlinks resolving {}",
                        path.display()
                    )));
                }
                let target = fs::read_link(&next).map_err(io_input("read link", &next))?;
                self.parents(&rel);
                self.nodes.insert(
                    rel,
                    Node::Symlink {
                        target: target.clone(),
                    },
                );
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                for t in target
                    .components()
                    .rev()
                    .filter(|c| !matches!(c, Component::RootDir))
                {
                    todo.push_front(t.as_os_str().to_os_string());
                }
            } else if meta.is_dir() {
                self.nodes.entry(rel).or_insert(Node::Dir {
                    mode: meta.mode() & 0o7777,
                    owner: 0,
                });
                cur = next;
            } else if meta.is_file() {
                if !todo.is_empty() {
                    return Err(input(format!("{} is not a directory", next.display())));
                }
                self.parents(&rel);
                self.nodes.insert(
                    rel,
                    Node::File {
                        src: next.clone(),
                        mode: meta.mode() & 0o7777,
                        key: (meta.dev(), meta.ino()),
                    },
                );
                cur = next;
            } else {
                return Err(input(format!("{} is not a regular file", next.display())));
            }
        }
        Ok(cur)
    }

    /// Adds a host file at its own path plus, for an ELF file, its shared libraries.
    pub(super) fn host_binary(&mut self, path: &Path) -> Result<PathBuf, ImageError> {
        let real = self.host_path(path)?;
        self.libraries(&real)?;
        Ok(real)
    }

    /// Adds the shared libraries of an ELF file (once per inode).
    pub(super) fn libraries(&mut self, file: &Path) -> Result<(), ImageError> {
        let meta = fs::metadata(file).map_err(io_input("read", file))?;
        if self.linked.insert((meta.dev(), meta.ino())) && is_elf(file) {
            for lib in ldd(file)? {
                self.host_path(&lib)?;
            }
        }
        Ok(())
    }

    /// Adds a host file (following symlinks) under another name, plus its libraries.
    pub(super) fn binary_as(&mut self, rel: &str, src: &Path) -> Result<(), ImageError> {
        let real = fs::canonicalize(src).map_err(io_input("find", src))?;
        let meta = fs::metadata(&real).map_err(io_input("read", &real))?;
        if !meta.is_file() {
            return Err(input(format!("{} is not a file", src.display())));
        }
        self.parents(Path::new(rel));
        self.nodes.insert(
            PathBuf::from(rel),
            Node::File {
                src: real.clone(),
                mode: (meta.mode() & 0o7777) | 0o555,
                key: (meta.dev(), meta.ino()),
            },
        );
        self.libraries(&real)
    }

    /// Files sharing an inode: every path but the first becomes a hardlink to the first.
    pub(super) fn hardlinks(&self) -> HashMap<PathBuf, PathBuf> {
        let mut first: HashMap<(u64, u64), &PathBuf> = HashMap::new();
        let mut links = HashMap::new();
        for (path, node) in &self.nodes {
            if let Node::File { key, .. } = node {
                match first.get(key) {
                    Some(f) => {
                        links.insert(path.clone(), (*f).clone());
                    }
                    None => {
                        first.insert(*key, path);
                    }
                }
            }
        }
        links
    }

    /// A hash of everything that ends up in the image (and of [`FORMAT_VERSION`]). SipHash
    /// (std's `DefaultHasher`) twice with different prefixes: 128 bits, fast even in debug
    /// builds. A Rust release changing the hasher only costs one rebuild.
    pub(super) fn content_hash(&self) -> Result<String, ImageError> {
        let mut a = std::hash::DefaultHasher::new();
        let mut b = std::hash::DefaultHasher::new();
        b.write(b"second half");
        let links = self.hardlinks();
        let mut feed = |bytes: &[u8]| {
            a.write(bytes);
            b.write(bytes);
            a.write_usize(bytes.len());
            b.write_usize(bytes.len());
        };
        feed(FORMAT_VERSION.as_bytes());
        for (path, node) in &self.nodes {
            feed(path.as_os_str().as_encoded_bytes());
            match (node, links.get(path)) {
                (_, Some(to)) => feed(format!("link {}", to.display()).as_bytes()),
                (Node::Dir { mode, owner }, _) => feed(format!("dir {mode:o} {owner}").as_bytes()),
                (Node::Symlink { target }, _) => {
                    feed(format!("symlink {}", target.display()).as_bytes())
                }
                (Node::Data { bytes, mode }, _) => {
                    feed(format!("data {mode:o}").as_bytes());
                    feed(bytes);
                }
                (Node::File { src, mode, .. }, _) => {
                    feed(format!("file {mode:o}").as_bytes());
                    feed(&fs::read(src).map_err(io_input("read", src))?);
                }
            }
        }
        Ok(format!("{:016x}{:016x}", a.finish(), b.finish()))
    }

    /// The filesystem as an (uncompressed, ustar) tar archive.
    pub(super) fn to_tar(&self) -> Result<Vec<u8>, ImageError> {
        let links = self.hardlinks();
        let mut tar = Vec::new();
        for (path, node) in &self.nodes {
            let name = path.to_string_lossy().to_string();
            if let Some(to) = links.get(path) {
                // The engine applies a link's mode to the shared inode: repeat the file's.
                let mode = match self.nodes.get(to) {
                    Some(Node::File { mode, .. }) => *mode,
                    _ => 0o755,
                };
                tar_entry(&mut tar, &name, b'1', mode, 0, &to.to_string_lossy(), &[])?;
                continue;
            }
            match node {
                Node::Dir { mode, owner } => {
                    tar_entry(&mut tar, &format!("{name}/"), b'5', *mode, *owner, "", &[])?
                }
                Node::Symlink { target } => tar_entry(
                    &mut tar,
                    &name,
                    b'2',
                    0o777,
                    0,
                    &target.to_string_lossy(),
                    &[],
                )?,
                Node::Data { bytes, mode } => {
                    tar_entry(&mut tar, &name, b'0', *mode, 0, "", bytes)?
                }
                Node::File { src, mode, .. } => {
                    let bytes = fs::read(src).map_err(io_input("read", src))?;
                    tar_entry(&mut tar, &name, b'0', *mode, 0, "", &bytes)?;
                }
            }
        }
        tar.extend_from_slice(&[0u8; 1024]);
        Ok(tar)
    }
}

/// Appends one ustar entry (header, data, padding). Owner and group are the same id.
pub(super) fn tar_entry(
    out: &mut Vec<u8>,
    name: &str,
    kind: u8,
    mode: u32,
    owner: u32,
    link: &str,
    data: &[u8],
) -> Result<(), ImageError> {
    let mut h = [0u8; 512];
    let (prefix, short) = split_name(name)
        .ok_or_else(|| input(format!("path too long for the image archive: {name}")))?;
    if link.len() > 100 {
        return Err(input(format!(
            "link target too long for the image archive: {link}"
        )));
    }
    let put =
        |h: &mut [u8; 512], at: usize, bytes: &[u8]| h[at..at + bytes.len()].copy_from_slice(bytes);
    put(&mut h, 0, short.as_bytes());
    put(&mut h, 100, format!("{mode:07o}\0").as_bytes());
    put(&mut h, 108, format!("{owner:07o}\0").as_bytes());
    put(&mut h, 116, format!("{owner:07o}\0").as_bytes());
    put(&mut h, 124, format!("{:011o}\0", data.len()).as_bytes());
    put(&mut h, 136, format!("{:011o}\0", 0).as_bytes());
    put(&mut h, 148, b"        ");
    h[156] = kind;
    put(&mut h, 157, link.as_bytes());
    put(&mut h, 257, b"ustar\0");
    put(&mut h, 263, b"00");
    put(&mut h, 345, prefix.as_bytes());
    let sum: u32 = h.iter().map(|b| *b as u32).sum();
    put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    let pad = (512 - data.len() % 512) % 512;
    out.extend(std::iter::repeat_n(0u8, pad));
    Ok(())
}

/// Splits a path into ustar's `prefix` (≤ 155 bytes) and `name` (≤ 100 bytes).
pub(super) fn split_name(name: &str) -> Option<(&str, &str)> {
    if name.len() <= 100 {
        return Some(("", name));
    }
    let trimmed = name.trim_end_matches('/');
    trimmed
        .match_indices('/')
        .map(|(i, _)| i)
        .find(|&i| i <= 155 && name.len() - i - 1 <= 100)
        .map(|i| (&name[..i], &name[i + 1..]))
}

// === Dockerfile ===
