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
const FORMAT_VERSION: &str = "zerg-worker-rootfs/4";
/// The unprivileged user's uid and gid.
const WORKER_UID: u32 = zerg_proto::contract::image::WORKER_UID;
/// The Dockerfile for registry-backed builds.
const DOCKERFILE: &str = include_str!("../../../docker/Dockerfile");
/// Where binaries are looked up on the host (never the caller's `PATH`, which may hold shims).
const SYSTEM_PATH: &str = "/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin";
/// Commands copied into the offline image when the host has them.
const TOOLS: &[&str] = &[
    "bash", "cat", "ls", "mkdir", "cp", "mv", "rm", "ln", "test", "[", "true", "false", "echo",
    "env", "sleep", "touch", "grep", "sed", "head", "tail", "wc", "chmod", "printf", "sort",
    "uniq", "cut", "tr", "tee", "find", "xargs", "diff", "id", "pwd", "dirname", "basename",
    "readlink", "realpath", "mktemp", "date", "uname", "stat", "seq",
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
    /// A local image to layer the worker onto (`--from`): the project's own environment.
    pub from: Option<String>,
    /// A repository whose `.devcontainer/devcontainer.json` names the base (`--devcontainer`).
    pub devcontainer: Option<PathBuf>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            offline: false,
            tag: DEFAULT_TAG.into(),
            agent: None,
            with: Vec::new(),
            from: None,
            devcontainer: None,
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
    if let Some(repo) = &opts.devcontainer {
        let base = match devcontainer::read(repo)? {
            devcontainer::Base::Image(image) => image,
            devcontainer::Base::Build {
                dockerfile,
                context,
                args,
                target,
            } => {
                let tag = format!("{}-devcontainer-base", opts.tag);
                build_devcontainer(
                    &docker,
                    &tag,
                    &dockerfile,
                    &context,
                    &args,
                    target.as_deref(),
                )
                .await?;
                tag
            }
        };
        return build_from(&docker, opts, &agent, &base).await;
    }
    if let Some(base) = &opts.from {
        return build_from(&docker, opts, &agent, base).await;
    }
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

async fn build_dockerfile(
    docker: &Docker,
    opts: &BuildOptions,
    agent: &Path,
) -> Result<String, ImageError> {
    build_context(docker, opts, agent, DOCKERFILE.to_string()).await
}

/// Builds `dockerfile` with the agent and the `--with` binaries as its context.
async fn build_context(
    docker: &Docker,
    opts: &BuildOptions,
    agent: &Path,
    dockerfile: String,
) -> Result<String, ImageError> {
    let agent = agent.to_path_buf();
    let extras = opts.with.clone();
    let context =
        tokio::task::spawn_blocking(move || dockerfile_context(&dockerfile, &agent, &extras))
            .await
            .map_err(|e| input(format!("context assembly panicked: {e}")))??;
    let options = BuildImageOptionsBuilder::new()
        .dockerfile("Dockerfile")
        .t(&opts.tag)
        .rm(true)
        .forcerm(true)
        .build();
    run_build(docker, options, context).await?;
    image_id(docker, &opts.tag).await
}

/// Runs one build on the engine, its last lines of output in the error when it fails.
async fn run_build(
    docker: &Docker,
    options: bollard::query_parameters::BuildImageOptions,
    context: Vec<u8>,
) -> Result<(), ImageError> {
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
    Ok(())
}

/// Builds a devcontainer's Dockerfile into `tag`, as the Dev Containers tools would.
async fn build_devcontainer(
    docker: &Docker,
    tag: &str,
    dockerfile: &Path,
    context: &Path,
    args: &HashMap<String, String>,
    target: Option<&str>,
) -> Result<(), ImageError> {
    let (ctx, dfile) = {
        let (c, d) = (context.to_path_buf(), dockerfile.to_path_buf());
        tokio::task::spawn_blocking(move || devcontainer::context_tar(&c, &d))
            .await
            .map_err(|e| input(format!("context assembly panicked: {e}")))??
    };
    let mut options = BuildImageOptionsBuilder::new()
        .dockerfile(&dfile)
        .t(tag)
        .rm(true)
        .forcerm(true)
        .buildargs(args);
    if let Some(t) = target {
        options = options.target(t);
    }
    run_build(docker, options.build(), ctx)
        .await
        .map_err(|e| match e {
            ImageError::Engine { message } => ImageError::Engine {
                message: format!(
                    "the devcontainer's Dockerfile {}: {message}",
                    dockerfile.display()
                ),
            },
            other => other,
        })
}

/// The build context: the Dockerfile (with a `COPY` per extra binary) and the binaries.
fn dockerfile_context(
    dockerfile: &str,
    agent: &Path,
    extras: &[PathBuf],
) -> Result<Vec<u8>, ImageError> {
    let mut dockerfile = dockerfile.to_string();
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

// === From the project's own image ===

/// Layers the worker onto `base`, an image on this machine: the agent, the `worker` user
/// (uid/gid 10001) and the directories a worker uses, after checking the base has what a
/// worker needs (`sh`, `git`, a C library the agent runs with). No registry is contacted.
async fn build_from(
    docker: &Docker,
    opts: &BuildOptions,
    agent: &Path,
    base: &str,
) -> Result<String, ImageError> {
    if docker.inspect_image(base).await.is_err() {
        return Err(input(format!(
            "--from {base}: no such image on this machine; build or pull it first (`docker images` lists what is here)"
        )));
    }
    let dockerfile = from_dockerfile(base);
    build_context(docker, opts, agent, dockerfile)
        .await
        .map_err(|e| match e {
            ImageError::Engine { message } => ImageError::Engine {
                message: explain_from_failure(base, &message),
            },
            other => other,
        })
}

/// The Dockerfile of `image build --from BASE`. The extra binaries' `COPY` lines are appended
/// by [`dockerfile_context`], after the checks: they come last, as root, then `USER` is set
/// again.
fn from_dockerfile(base: &str) -> String {
    let uid = WORKER_UID;
    let agent = zerg_proto::contract::image::AGENT_PATH;
    format!(
        r#"# Generated by `zergctl image build --from {base}`.
FROM {base}
USER 0
COPY zerg-worker-agent {agent}
RUN missing="";     for tool in git; do command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"; done;     if [ -n "$missing" ]; then echo "zerg: the base image {base} has no:$missing (a worker commits with git): install it in the base image"; exit 3; fi;     out="$({agent} 2>&1)";     case "$out" in "zerg-worker-agent: "*) ;; *) echo "zerg: zerg-worker-agent cannot run in {base}: $out (its C library differs from the one the agent was built for: use a glibc base, or an agent built for this one with --agent)"; exit 4;; esac;     grep -q "^[^:]*:[^:]*:{uid}:" /etc/group || echo "worker:x:{uid}:" >> /etc/group;     grep -q "^[^:]*:[^:]*:{uid}:" /etc/passwd || echo "worker:x:{uid}:{uid}:zerg worker:/home/worker:/bin/sh" >> /etc/passwd;     mkdir -p /home/worker /workspace /zerg/logs /zerg/run;     chmod 1777 /home/worker /workspace /zerg/logs
LABEL zerg.image.kind="from" zerg.image.base="{base}"
ENV HOME=/home/worker
WORKDIR /workspace
CMD ["{agent}"]
USER {uid}:{uid}
"#
    )
}

/// An engine error of a `--from` build, with the cause named when it is the base's.
fn explain_from_failure(base: &str, message: &str) -> String {
    let lower = message.to_ascii_lowercase();
    if lower.contains("/bin/sh") && (lower.contains("no such file") || lower.contains("not found"))
    {
        format!(
            "the base image {base} has no shell (/bin/sh): a worker runs its verification and setup commands with sh; use a base that has one\n{message}"
        )
    } else {
        message.to_string()
    }
}

pub mod devcontainer;
mod rootfs;
#[cfg(test)]
mod tests;

use rootfs::*;
