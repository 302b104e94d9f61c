//! `zergctl image build`: the `zerg-worker` image that container-mode workers run in.
//!
//! Two ways, same tag (default [`DEFAULT_TAG`]), both through the Docker Engine API (no docker
//! CLI):
//!
//! - **Dockerfile** (`offline = false`): `docker/Dockerfile` (compiled into zergctl) is built
//!   with the `zerg-worker-agent` binary (and any `--with` binaries) as its context. Needs a
//!   registry (the `node` base image) and npm (Claude Code).
//! - **Offline** (`offline = true`): no registry at all. A root filesystem is assembled from
//!   this host's own binaries — `/bin/sh`, a set of coreutils, `git` and the helpers of its
//!   exec path, exactly the shared libraries `ldd` reports for each, the dynamic loader —
//!   plus `/etc/passwd` and `/etc/group` with the unprivileged `worker` user (uid 10001), the
//!   agent and the `--with` binaries in `/usr/local/bin`. It is streamed as a tar archive to the
//!   engine's image import (`POST /images/create?fromSrc=-`, i.e. `docker import`). Files keep
//!   their host paths (symlinks such as `/bin -> usr/bin` are recorded as symlinks, hardlinks
//!   as hardlinks), so `git` finds its compiled-in exec path.
//!
//! The offline image is cached: a hash of its inputs (every file's bytes, paths, modes and a
//! format version) is stored in the `zerg.image.hash` label, and a build whose tag already
//! carries the same hash returns at once.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::fs;
use std::hash::Hasher;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::{BuildImageOptionsBuilder, CreateImageOptionsBuilder};
use tokio_stream::StreamExt;

/// The tag built when none is given; also the default `container.image` of a rush.
pub const DEFAULT_TAG: &str = zerg_proto::contract::image::DEFAULT_TAG;
/// Label holding the offline image's input hash.
const HASH_LABEL: &str = "zerg.image.hash";
/// Bump when the rootfs layout or image config changes, to invalidate cached images.
const FORMAT_VERSION: &str = "zerg-worker-rootfs/2";
/// The unprivileged user's uid and gid.
const WORKER_UID: u32 = zerg_proto::contract::image::WORKER_UID;
/// The Dockerfile for registry-backed builds.
const DOCKERFILE: &str = include_str!("../../docker/Dockerfile");
/// Where binaries are looked up on the host (never the caller's `PATH`, which may hold shims).
const SYSTEM_PATH: &str = "/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin";
/// Commands copied into the offline image when the host has them.
const TOOLS: &[&str] = &[
    "bash", "cat", "ls", "mkdir", "cp", "mv", "rm", "ln", "test", "[", "true", "false", "echo",
    "env", "sleep", "touch", "grep", "sed", "head", "tail", "wc", "chmod", "printf", "sort",
    "uniq", "cut", "tr", "tee", "find", "xargs", "diff", "id", "pwd", "dirname", "basename",
    "readlink", "realpath", "mktemp", "date", "uname", "stat",
];
/// Compiled helpers of git's exec path worth their libraries (scripts and builtins are
/// always taken).
const GIT_HELPERS: &[&str] = &[
    "git-sh-i18n--envsubst",
    "git-remote-http",
    "git-remote-https",
];
/// Engine timeout for image requests (an import answers after reading the whole archive).
const IMAGE_TIMEOUT: Duration = Duration::from_secs(600);

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Build without a registry (locally assembled rootfs, imported).
    pub offline: bool,
    /// Image tag.
    pub tag: String,
    /// The `zerg-worker-agent` binary. `None`: `$ZERG_WORKER_AGENT_BIN`, else the one next to
    /// the current executable.
    pub agent: Option<PathBuf>,
    /// Extra binaries copied to `/usr/local/bin/<file name>` (e.g. a fake agent CLI for tests).
    pub with: Vec<PathBuf>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            offline: false,
            tag: DEFAULT_TAG.into(),
            agent: None,
            with: Vec::new(),
        }
    }
}

/// Why an image build failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The Docker engine could not be reached.
    #[error(
        "docker engine unreachable: {message}; start dockerd (or set DOCKER_HOST) and make sure this user may use it"
    )]
    Unreachable {
        /// The client's error.
        message: String,
    },
    /// The engine refused or failed the build.
    #[error("image build failed: {message}")]
    Engine {
        /// The engine's message (and the last build output, if any).
        message: String,
    },
    /// A required input is missing or unreadable.
    #[error("{message}")]
    Input {
        /// What is missing, and what to do.
        message: String,
    },
}

fn input(message: impl Into<String>) -> ImageError {
    ImageError::Input {
        message: message.into(),
    }
}

/// Builds the worker image and returns its id (`sha256:…`).
///
/// Offline builds return at once when an image with the same tag and the same input hash
/// exists.
pub async fn build(opts: &BuildOptions) -> Result<String, ImageError> {
    let agent = agent_path(opts)?;
    let docker = connect().await?;
    if opts.offline {
        build_offline(&docker, opts, &agent).await
    } else {
        build_dockerfile(&docker, opts, &agent).await
    }
}

fn agent_path(opts: &BuildOptions) -> Result<PathBuf, ImageError> {
    let path = match (
        &opts.agent,
        std::env::var_os("ZERG_WORKER_AGENT_BIN").filter(|v| !v.is_empty()),
    ) {
        (Some(p), _) => p.clone(),
        (None, Some(p)) => PathBuf::from(p),
        (None, None) => std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.join("zerg-worker-agent")))
            .unwrap_or_else(|| PathBuf::from("zerg-worker-agent")),
    };
    if !path.is_file() {
        return Err(input(format!(
            "zerg-worker-agent not found at {}: build it (cargo build -p zerg-worker-agent) and set ZERG_WORKER_AGENT_BIN or install it next to zergctl",
            path.display()
        )));
    }
    Ok(path)
}

async fn connect() -> Result<Docker, ImageError> {
    let unreachable = |e: bollard::errors::Error| ImageError::Unreachable {
        message: e.to_string(),
    };
    let docker = Docker::connect_with_local_defaults()
        .map_err(unreachable)?
        .with_timeout(IMAGE_TIMEOUT);
    let docker = docker.negotiate_version().await.map_err(unreachable)?;
    docker.ping().await.map_err(unreachable)?;
    Ok(docker)
}

/// Splits `name[:tag]` (a registry host may carry a port) into repository and tag.
fn split_tag(image: &str) -> (&str, &str) {
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (image, "latest"),
    }
}

async fn image_id(docker: &Docker, tag: &str) -> Result<String, ImageError> {
    let info = docker
        .inspect_image(tag)
        .await
        .map_err(|e| ImageError::Engine {
            message: format!("cannot inspect {tag} after building it: {e}"),
        })?;
    Ok(info.id.unwrap_or_else(|| tag.to_string()))
}

// === Offline ===

async fn build_offline(
    docker: &Docker,
    opts: &BuildOptions,
    agent: &Path,
) -> Result<String, ImageError> {
    let extras = opts.with.clone();
    let agent = agent.to_path_buf();
    let rootfs = tokio::task::spawn_blocking(move || offline_rootfs(&agent, &extras))
        .await
        .map_err(|e| input(format!("rootfs assembly panicked: {e}")))??;
    let hash = {
        let r = rootfs.clone();
        tokio::task::spawn_blocking(move || r.content_hash())
            .await
            .map_err(|e| input(format!("hashing panicked: {e}")))??
    };
    let mut previous = None;
    if let Ok(existing) = docker.inspect_image(&opts.tag).await {
        let labels = existing.config.and_then(|c| c.labels).unwrap_or_default();
        if labels.get(HASH_LABEL) == Some(&hash) {
            return Ok(existing.id.unwrap_or_else(|| opts.tag.clone()));
        }
        previous = existing.id;
    }
    let tar = tokio::task::spawn_blocking(move || rootfs.to_tar())
        .await
        .map_err(|e| input(format!("archiving panicked: {e}")))??;
    let (repo, tag) = split_tag(&opts.tag);
    let options = CreateImageOptionsBuilder::new()
        .from_src("-")
        .repo(repo)
        .tag(tag)
        .message("zergctl image build --offline")
        .changes(image_changes(&hash))
        .build();
    let mut stream = std::pin::pin!(docker.create_image(
        Some(options),
        Some(bollard::body_full(tar.into())),
        None
    ));
    while let Some(item) = stream.next().await {
        item.map_err(|e| ImageError::Engine {
            message: e.to_string(),
        })?;
    }
    let id = image_id(docker, &opts.tag).await?;
    // The image this build replaced under the tag; kept if a container still uses it.
    if let Some(old) = previous.filter(|old| *old != id) {
        let _ = docker
            .remove_image(
                &old,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await;
    }
    Ok(id)
}

/// The image config, as Dockerfile instructions applied on import.
fn image_changes(hash: &str) -> Vec<String> {
    vec![
        format!("ENV PATH={SYSTEM_PATH}"),
        "ENV HOME=/home/worker".into(),
        format!("USER {WORKER_UID}:{WORKER_UID}"),
        "WORKDIR /workspace".into(),
        format!(r#"CMD ["{}"]"#, zerg_proto::contract::image::AGENT_PATH),
        format!("LABEL {HASH_LABEL}={hash} zerg.image.kind=offline"),
    ]
}

/// Assembles the offline root filesystem from the host.
fn offline_rootfs(agent: &Path, extras: &[PathBuf]) -> Result<Rootfs, ImageError> {
    let mut fs_ = Rootfs::default();
    for d in [
        "bin",
        "etc",
        "usr/local/bin",
        "workspace",
        "zerg/logs",
        "zerg/run",
    ] {
        fs_.dir(d, 0o755, 0);
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
fn git_helper_wanted(p: &Path, git: &fs::Metadata) -> bool {
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

fn which(name: &str) -> Option<PathBuf> {
    SYSTEM_PATH
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Shared libraries from `ldd` output (`name => /path (0x…)` and `/path (0x…)` lines). A
/// library reported `not found` is an error; virtual objects (vDSO) are skipped.
fn parse_ldd(output: &str) -> Result<Vec<PathBuf>, String> {
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

fn ldd(file: &Path) -> Result<Vec<PathBuf>, ImageError> {
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

fn is_elf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"\x7fELF"
}

/// One entry of the image's filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
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
struct Rootfs {
    nodes: BTreeMap<PathBuf, Node>,
    /// Files whose libraries were already added (git's exec path is mostly hardlinks).
    linked: HashSet<(u64, u64)>,
}

fn io_input(what: &str, p: &Path) -> impl FnOnce(std::io::Error) -> ImageError {
    let msg = format!("cannot {what} {}", p.display());
    move |e| input(format!("{msg}: {e}"))
}

impl Rootfs {
    fn dir(&mut self, rel: &str, mode: u32, owner: u32) {
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

    fn data(&mut self, rel: &str, content: String, mode: u32) {
        self.parents(Path::new(rel));
        self.nodes.insert(
            PathBuf::from(rel),
            Node::Data {
                bytes: content.into_bytes(),
                mode,
            },
        );
    }

    fn parents(&mut self, rel: &Path) {
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty())
            && !self.nodes.contains_key(parent)
        {
            self.dir(&parent.to_string_lossy(), 0o755, 0);
        }
    }

    /// Adds a host path at the same place, recording every symlink met on the way (so
    /// `/bin/sh` brings `bin -> usr/bin`, `usr/bin/sh -> dash` and `usr/bin/dash`), and
    /// returns the resolved path of the file.
    fn host_path(&mut self, path: &Path) -> Result<PathBuf, ImageError> {
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
    fn host_binary(&mut self, path: &Path) -> Result<PathBuf, ImageError> {
        let real = self.host_path(path)?;
        self.libraries(&real)?;
        Ok(real)
    }

    /// Adds the shared libraries of an ELF file (once per inode).
    fn libraries(&mut self, file: &Path) -> Result<(), ImageError> {
        let meta = fs::metadata(file).map_err(io_input("read", file))?;
        if self.linked.insert((meta.dev(), meta.ino())) && is_elf(file) {
            for lib in ldd(file)? {
                self.host_path(&lib)?;
            }
        }
        Ok(())
    }

    /// Adds a host file (following symlinks) under another name, plus its libraries.
    fn binary_as(&mut self, rel: &str, src: &Path) -> Result<(), ImageError> {
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
    fn hardlinks(&self) -> HashMap<PathBuf, PathBuf> {
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
    fn content_hash(&self) -> Result<String, ImageError> {
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
    fn to_tar(&self) -> Result<Vec<u8>, ImageError> {
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
fn tar_entry(
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
fn split_name(name: &str) -> Option<(&str, &str)> {
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

async fn build_dockerfile(
    docker: &Docker,
    opts: &BuildOptions,
    agent: &Path,
) -> Result<String, ImageError> {
    let agent = agent.to_path_buf();
    let extras = opts.with.clone();
    let context = tokio::task::spawn_blocking(move || dockerfile_context(&agent, &extras))
        .await
        .map_err(|e| input(format!("context assembly panicked: {e}")))??;
    let options = BuildImageOptionsBuilder::new()
        .dockerfile("Dockerfile")
        .t(&opts.tag)
        .rm(true)
        .forcerm(true)
        .build();
    let mut stream =
        std::pin::pin!(docker.build_image(options, None, Some(bollard::body_full(context.into()))));
    let mut tail: VecDeque<String> = VecDeque::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(info) => {
                if let Some(line) = info.stream.filter(|l| !l.trim().is_empty()) {
                    if tail.len() == 20 {
                        tail.pop_front();
                    }
                    tail.push_back(line.trim_end().to_string());
                }
            }
            Err(e) => {
                let out = Vec::from(tail).join("\n");
                return Err(ImageError::Engine {
                    message: format!("{e}\n{out}").trim().to_string(),
                });
            }
        }
    }
    image_id(docker, &opts.tag).await
}

/// The build context: the Dockerfile (with a `COPY` per extra binary) and the binaries.
fn dockerfile_context(agent: &Path, extras: &[PathBuf]) -> Result<Vec<u8>, ImageError> {
    let mut dockerfile = DOCKERFILE.to_string();
    let mut fs_ = Rootfs::default();
    fs_.binary_as("zerg-worker-agent", agent)?;
    for extra in extras {
        let name = extra
            .file_name()
            .ok_or_else(|| input(format!("--with {}: not a file", extra.display())))?
            .to_string_lossy()
            .to_string();
        fs_.binary_as(&format!("extra/{name}"), extra)?;
        dockerfile.push_str(&format!("COPY extra/{name} /usr/local/bin/{name}\n"));
    }
    // Only the files: the context needs no libraries (the base image has its own).
    fs_.nodes.retain(|p, n| {
        matches!(n, Node::File { .. } | Node::Dir { .. })
            && (p.starts_with("extra") || p == Path::new("zerg-worker-agent"))
    });
    fs_.data("Dockerfile", dockerfile, 0o644);
    fs_.to_tar()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_is_parsed() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibpcre2-8.so.0 => /lib/x86_64-linux-gnu/libpcre2-8.so.0 (0x00007f1d)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f1c)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f1e)\n";
        assert_eq!(
            parse_ldd(out).unwrap(),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libpcre2-8.so.0"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert_eq!(
            parse_ldd("\tlibfoo.so.1 => not found\n").unwrap_err(),
            "libfoo.so.1"
        );
        assert_eq!(
            parse_ldd("\tstatically linked\n").unwrap(),
            Vec::<PathBuf>::new()
        );
    }

    #[test]
    fn tags_split() {
        assert_eq!(split_tag("zerg-worker:latest"), ("zerg-worker", "latest"));
        assert_eq!(split_tag("zerg-worker"), ("zerg-worker", "latest"));
        assert_eq!(
            split_tag("localhost:5000/zerg-worker"),
            ("localhost:5000/zerg-worker", "latest")
        );
        assert_eq!(
            split_tag("localhost:5000/zerg-worker:x"),
            ("localhost:5000/zerg-worker", "x")
        );
    }

    #[test]
    fn long_names_use_the_ustar_prefix() {
        assert_eq!(split_name("usr/bin/git"), Some(("", "usr/bin/git")));
        let long = format!("{}/{}", "a".repeat(120), "b".repeat(90));
        assert_eq!(split_name(&long), Some((&long[..120], &long[121..])));
        assert_eq!(split_name(&"c".repeat(300)), None);
    }

    #[test]
    fn symlinks_and_hardlinks_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir_all(d.join("usr/bin")).unwrap();
        fs::write(d.join("usr/bin/dash"), "#!shell").unwrap();
        std::os::unix::fs::symlink("usr/bin", d.join("bin")).unwrap();
        std::os::unix::fs::symlink("dash", d.join("usr/bin/sh")).unwrap();
        fs::hard_link(d.join("usr/bin/dash"), d.join("usr/bin/ash")).unwrap();
        let mut r = Rootfs::default();
        let real = r.host_path(&d.join("bin/sh")).unwrap();
        assert_eq!(real, d.join("usr/bin/dash"));
        r.host_path(&d.join("usr/bin/ash")).unwrap();
        let rel = |p: &str| d.strip_prefix("/").unwrap().join(p);
        assert_eq!(
            r.nodes[&rel("bin")],
            Node::Symlink {
                target: "usr/bin".into()
            }
        );
        assert_eq!(
            r.nodes[&rel("usr/bin/sh")],
            Node::Symlink {
                target: "dash".into()
            }
        );
        assert!(matches!(r.nodes[&rel("usr/bin/dash")], Node::File { .. }));
        assert_eq!(
            r.hardlinks().get(&rel("usr/bin/dash")),
            Some(&rel("usr/bin/ash"))
        );

        // The archive lists what the host's tar expects.
        r.data("etc/passwd", "root:x:0:0::/:/bin/sh\n".into(), 0o644);
        let tar = r.to_tar().unwrap();
        assert_eq!(tar.len() % 512, 0);
        let file = d.join("out.tar");
        fs::write(&file, &tar).unwrap();
        let out = std::process::Command::new("tar")
            .arg("-tvf")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(listing.contains("bin -> usr/bin"), "{listing}");
        assert!(listing.contains("usr/bin/dash link to"), "{listing}");
        assert!(listing.contains("etc/passwd"), "{listing}");

        let h1 = r.content_hash().unwrap();
        assert_eq!(h1, r.content_hash().unwrap());
        fs::write(d.join("usr/bin/dash"), "#!changed").unwrap();
        assert_ne!(
            h1,
            r.content_hash().unwrap(),
            "file bytes are part of the hash"
        );
    }

    #[test]
    fn git_exec_path_policy() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::write(d.join("git"), b"\x7fELF-git").unwrap();
        fs::hard_link(d.join("git"), d.join("git-commit")).unwrap();
        fs::write(d.join("git-sh-setup"), "# sourced\n").unwrap();
        fs::write(d.join("git-submodule"), "#!/bin/sh\n").unwrap();
        fs::write(d.join("git-svn"), "#!/usr/bin/perl\n").unwrap();
        fs::write(d.join("git-daemon"), b"\x7fELF-daemon").unwrap();
        fs::write(d.join("git-remote-https"), b"\x7fELF-curl").unwrap();
        let git = fs::metadata(d.join("git")).unwrap();
        let wanted = |n: &str| git_helper_wanted(&d.join(n), &git);
        assert!(wanted("git-commit"));
        assert!(wanted("git-sh-setup"));
        assert!(wanted("git-submodule"));
        assert!(!wanted("git-svn"));
        assert!(!wanted("git-daemon"));
        assert!(wanted("git-remote-https"));
    }

    #[test]
    fn dockerfile_context_has_agent_and_extras() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("agent");
        let extra = dir.path().join("fake-claude");
        fs::write(&agent, "#!/bin/sh\n").unwrap();
        fs::write(&extra, "#!/bin/sh\n").unwrap();
        let tar = dockerfile_context(&agent, &[extra]).unwrap();
        let file = dir.path().join("ctx.tar");
        fs::write(&file, &tar).unwrap();
        let out = std::process::Command::new("tar")
            .arg("-tf")
            .arg(&file)
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&out.stdout);
        for want in ["Dockerfile", "zerg-worker-agent", "extra/fake-claude"] {
            assert!(
                listing.lines().any(|l| l == want),
                "{want} missing: {listing}"
            );
        }
        let df = std::process::Command::new("tar")
            .arg("-xOf")
            .arg(&file)
            .arg("Dockerfile")
            .output()
            .unwrap();
        let df = String::from_utf8_lossy(&df.stdout);
        assert!(
            df.contains("COPY extra/fake-claude /usr/local/bin/fake-claude"),
            "{df}"
        );
        assert!(df.contains("USER 10001:10001"));
    }

    /// Builds the offline image into a test tag, checks the cache and runs `git` and `sh` in it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn offline_image_builds_caches_and_runs() {
        let docker = match connect().await {
            Ok(d) => d,
            Err(e) => {
                eprintln!("skipping: no Docker engine reachable ({e})");
                return;
            }
        };
        if which("git").is_none() {
            eprintln!("skipping: no git on this host");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("zerg-worker-agent");
        fs::write(&agent, "#!/bin/sh\necho agent-ok\n").unwrap();
        let opts = BuildOptions {
            offline: true,
            tag: "zerg-worker:unit-test".into(),
            agent: Some(agent),
            with: vec![PathBuf::from("/bin/true")],
        };
        let id = build(&opts).await.unwrap();
        let started = std::time::Instant::now();
        assert_eq!(
            build(&opts).await.unwrap(),
            id,
            "an unchanged rebuild is cached"
        );
        assert!(started.elapsed() < Duration::from_secs(20));

        let script =
            "git --version && echo ok && id -u && true && ls /usr/local/bin && zerg-worker-agent";
        let out = run_in(&docker, &opts.tag, &["sh", "-c", script]).await;
        assert!(out.0 == 0, "exit {}: {}", out.0, out.1);
        for want in [
            "git version",
            "ok\n",
            "10001\n",
            "zerg-worker-agent",
            "agent-ok",
        ] {
            assert!(out.1.contains(want), "{want:?} missing from {:?}", out.1);
        }
        let _ = docker
            .remove_image(
                &opts.tag,
                Some(
                    bollard::query_parameters::RemoveImageOptionsBuilder::new()
                        .force(true)
                        .build(),
                ),
                None,
            )
            .await;
    }

    async fn run_in(docker: &Docker, image: &str, cmd: &[&str]) -> (i64, String) {
        use bollard::models::{ContainerCreateBody, HostConfig};
        let body = ContainerCreateBody {
            image: Some(image.into()),
            cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                cap_drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = docker.create_container(None, body).await.unwrap().id;
        docker.start_container(&id, None).await.unwrap();
        let mut wait = std::pin::pin!(docker.wait_container(&id, None));
        let code = match wait.next().await {
            Some(Ok(r)) => r.status_code,
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => code,
            other => panic!("wait: {other:?}"),
        };
        let opts = bollard::query_parameters::LogsOptionsBuilder::new()
            .stdout(true)
            .stderr(true)
            .build();
        let mut logs = std::pin::pin!(docker.logs(&id, Some(opts)));
        let mut text = String::new();
        while let Some(Ok(chunk)) = logs.next().await {
            text.push_str(&chunk.to_string());
        }
        let rm = bollard::query_parameters::RemoveContainerOptionsBuilder::new()
            .force(true)
            .build();
        let _ = docker.remove_container(&id, Some(rm)).await;
        (code, text)
    }
}
