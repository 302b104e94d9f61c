//! `zerg-attack`: what hostile code inside a worker container tries against zergd, for the
//! hostile-worker end-to-end tests. Each subcommand is one attack from the security review;
//! the tests run it inside a live worker container (`docker exec`, or from the fake agent
//! CLI's `shell` op) and then check that zergd refused it or that it did no harm.
//!
//! - `swap-file --dir D --target T --seconds S`: in `D`, a file (mode 6777) and a symlink to
//!   `T` swap places by atomic rename-exchange, as fast as possible, for `S` seconds: a walk
//!   that checks an entry and then changes it by path follows the symlink now and then.
//! - `swap-dir --dir D --names a,b --target T --seconds S`: each `D/<name>` swaps between a
//!   real directory and a symlink to `T/<name>` (fan-out dirs of another repository's objects).
//! - `link --path P --target T`: replaces `P` with a symlink to `T`.
//! - `flood --socket S --count N --seconds H`: opens `N` connections to `S` and holds them.
//! - `bomb --dir D --size N`: writes a genuine loose blob of `N` zero bytes (a few hundred KiB
//!   compressed) under its real SHA-1 name into the object dir `D`.
//! - `spam --path P --bytes N`: writes `N` bare newlines, two bytes that are not UTF-8 and a
//!   marker line to `P` (the container's own output: `/proc/1/fd/1`).
//! - `push --task T --lease L --other-task T2 --other-lease L2`: from inside a remote worker
//!   (swarm or kubernetes mode), with the worker's own plane URL, CA and token, pushes hostile
//!   packs for lease `L` of task `T`: corrupt bytes, a size over any cap, a commit off the base,
//!   a commit that changes the spec, a good commit under another worker's lease `L2`, and one
//!   without the token; prints whether each was refused and why.
//! - `streams --task T --lease L --count N --conns C --seconds S`: from inside a remote
//!   worker, opens `N` `FetchBase` streams for its own lease over `C` connections, reads none
//!   of them, prints how many opened, and holds them for `S` seconds.
//! - `artifacts --task T --lease L --count N --bytes B`: pushes `N` artifacts of `B` bytes
//!   each for its own lease; prints how many were kept and the first refusal.
//! - `checkpoint --task T --lease L`: pushes, then reports as its checkpoint, a merge commit
//!   whose first parent is the base's parent (read from the base commit's header, though the
//!   worker's snapshot does not hold it) and whose tree is the base's.
//!
//! Each prints one JSON line saying what it did.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

fn arg(args: &[String], name: &str) -> Result<String, String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .ok_or(format!("{name} is required"))
}

fn num(args: &[String], name: &str) -> Result<u64, String> {
    arg(args, name)?
        .parse()
        .map_err(|_| format!("{name}: not a number"))
}

fn exchange(a: &Path, b: &Path) -> bool {
    nix::fcntl::renameat2(
        nix::fcntl::AT_FDCWD,
        a,
        nix::fcntl::AT_FDCWD,
        b,
        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
    )
    .is_ok()
}

fn swap_file(args: &[String]) -> Result<serde_json::Value, String> {
    let dir = PathBuf::from(arg(args, "--dir")?);
    let target = PathBuf::from(arg(args, "--target")?);
    let secs = num(args, "--seconds")?;
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut swaps = 0u64;
    // Several pairs, so a walk meets one wherever it is.
    let pairs: Vec<(PathBuf, PathBuf)> = (0..8)
        .map(|i| (dir.join(format!("f{i}")), dir.join(format!("l{i}"))))
        .collect();
    for (f, l) in &pairs {
        let _ = std::fs::remove_file(f);
        let _ = std::fs::remove_file(l);
        std::fs::write(f, "x").map_err(|e| e.to_string())?;
        let _ = std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o6777));
        std::os::unix::fs::symlink(&target, l).map_err(|e| e.to_string())?;
    }
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        for (f, l) in &pairs {
            if exchange(f, l) {
                swaps += 1;
            }
        }
    }
    Ok(json!({"attack": "swap-file", "swaps": swaps}))
}

fn swap_dir(args: &[String]) -> Result<serde_json::Value, String> {
    let dir = PathBuf::from(arg(args, "--dir")?);
    let target = PathBuf::from(arg(args, "--target")?);
    let names = arg(args, "--names")?;
    let secs = num(args, "--seconds")?;
    let mut pairs = Vec::new();
    for n in names.split(',').filter(|n| !n.is_empty()) {
        let real = dir.join(n);
        let link = dir.join(format!(".{n}-link"));
        let _ = std::fs::create_dir_all(&real);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(target.join(n), &link).map_err(|e| e.to_string())?;
        pairs.push((real, link));
    }
    let mut swaps = 0u64;
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        for (real, link) in &pairs {
            if exchange(real, link) {
                swaps += 1;
            }
        }
    }
    Ok(json!({"attack": "swap-dir", "swaps": swaps}))
}

fn link(args: &[String]) -> Result<serde_json::Value, String> {
    let path = PathBuf::from(arg(args, "--path")?);
    let target = PathBuf::from(arg(args, "--target")?);
    let _ = std::fs::remove_dir_all(&path);
    let _ = std::fs::remove_file(&path);
    std::os::unix::fs::symlink(&target, &path).map_err(|e| e.to_string())?;
    Ok(json!({"attack": "link", "path": path, "target": target}))
}

fn flood(args: &[String]) -> Result<serde_json::Value, String> {
    let socket = PathBuf::from(arg(args, "--socket")?);
    let count = num(args, "--count")?;
    let secs = num(args, "--seconds")?;
    let mut held = Vec::new();
    let mut failed = 0u64;
    for _ in 0..count {
        match std::os::unix::net::UnixStream::connect(&socket) {
            Ok(s) => held.push(s),
            Err(_) => failed += 1,
        }
    }
    println!(
        "{}",
        json!({"attack": "flood", "connected": held.len(), "failed": failed, "holding": true})
    );
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_secs(secs));
    Ok(json!({"attack": "flood", "connected": held.len(), "failed": failed}))
}

fn bomb(args: &[String]) -> Result<serde_json::Value, String> {
    use sha1::Digest;
    let dir = PathBuf::from(arg(args, "--dir")?);
    let size = num(args, "--size")? as usize;
    let header = format!("blob {size}\0");
    let zeros = vec![0u8; 1 << 20];
    let mut h = sha1::Sha1::new();
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    h.update(header.as_bytes());
    z.write_all(header.as_bytes()).map_err(|e| e.to_string())?;
    let mut left = size;
    while left > 0 {
        let n = left.min(zeros.len());
        h.update(&zeros[..n]);
        z.write_all(&zeros[..n]).map_err(|e| e.to_string())?;
        left -= n;
    }
    let id = format!("{:x}", h.finalize());
    let bytes = z.finish().map_err(|e| e.to_string())?;
    let fan = dir.join(&id[..2]);
    std::fs::create_dir_all(&fan).map_err(|e| e.to_string())?;
    std::fs::write(fan.join(&id[2..]), &bytes).map_err(|e| e.to_string())?;
    Ok(json!({"attack": "bomb", "id": id, "compressed": bytes.len(), "inflated": size}))
}

fn spam(args: &[String]) -> Result<serde_json::Value, String> {
    let path = PathBuf::from(arg(args, "--path")?);
    let bytes = num(args, "--bytes")? as usize;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let block = vec![b'\n'; 1 << 16];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len());
        f.write_all(&block[..n]).map_err(|e| e.to_string())?;
        left -= n;
    }
    f.write_all(b"\xff\xfe\nzerg-attack: after the bad bytes\n")
        .map_err(|e| e.to_string())?;
    Ok(json!({"attack": "spam", "bytes": bytes}))
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("swap-file") => swap_file(&args),
        Some("swap-dir") => swap_dir(&args),
        Some("link") => link(&args),
        Some("flood") => flood(&args),
        Some("bomb") => bomb(&args),
        Some("spam") => spam(&args),
        Some("push") => push(&args),
        Some("streams") => streams(&args),
        Some("artifacts") => artifacts(&args),
        Some("checkpoint") => checkpoint(&args),
        _ => Err(
            "usage: zerg-attack swap-file|swap-dir|link|flood|bomb|spam|push|streams|artifacts|checkpoint ..."
                .into(),
        ),
    };
    match r {
        Ok(v) => {
            println!("{v}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("zerg-attack: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs git in the worker's repository (`/workspace`, or `ZERG_WORKTREE`) with `env`, feeding
/// `input`; returns its trimmed stdout.
fn wgit(args: &[&str], env: &[(&str, &str)], input: &[u8]) -> Result<Vec<u8>, String> {
    let wt = std::env::var("ZERG_WORKTREE").unwrap_or_else(|_| "/workspace".into());
    let mut c = std::process::Command::new("git")
        .arg("-C")
        .arg(&wt)
        .args(["-c", "user.name=attack", "-c", "user.email=attack@x"])
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    c.stdin
        .take()
        .unwrap()
        .write_all(input)
        .map_err(|e| e.to_string())?;
    let out = c.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out.stdout)
}

fn wgit_str(args: &[&str], env: &[(&str, &str)], input: &[u8]) -> Result<String, String> {
    Ok(String::from_utf8_lossy(&wgit(args, env, input)?)
        .trim()
        .to_string())
}

/// A commit on the worker's `HEAD` whose tree has `path` set to `content`.
fn commit_changing(path: &str, content: &str) -> Result<String, String> {
    let idx = std::env::temp_dir().join(format!("zerg-attack-index-{}", std::process::id()));
    let idx = idx.to_string_lossy().to_string();
    let env = [("GIT_INDEX_FILE", idx.as_str())];
    wgit(&["read-tree", "HEAD"], &env, b"")?;
    let blob = wgit_str(&["hash-object", "-w", "--stdin"], &env, content.as_bytes())?;
    let info = format!("100644,{blob},{path}");
    wgit(&["update-index", "--add", "--cacheinfo", &info], &env, b"")?;
    let tree = wgit_str(&["write-tree"], &env, b"")?;
    let _ = std::fs::remove_file(&idx);
    wgit_str(
        &["commit-tree", &tree, "-p", "HEAD", "-m", "attack"],
        &[],
        b"",
    )
}

/// A thin pack of `HEAD..commit` (or, with `orphan`, all of `commit`).
fn pack_of(commit: &str, orphan: bool) -> Result<Vec<u8>, String> {
    let revs = if orphan {
        format!("{commit}\n")
    } else {
        format!("{commit}\n^HEAD\n")
    };
    wgit(
        &["pack-objects", "--stdout", "-q", "--revs", "--thin"],
        &[],
        revs.as_bytes(),
    )
}

/// One hostile push: its name, the task and lease it names, the commit, the pack, the size it
/// announces (the pack's own when `None`), and whether it carries the token.
struct Case<'a> {
    name: &'static str,
    task: &'a str,
    lease: &'a str,
    commit: String,
    pack: Vec<u8>,
    announced: Option<u64>,
    with_token: bool,
}

/// What a remote worker knows of its plane: the URL, the CA to trust, its token and who it is.
struct Plane {
    url: String,
    ca: String,
    token: String,
    me: zerg_proto::v1::WorkerRef,
}

impl Plane {
    /// Read from the worker's environment, as the worker agent reads it.
    fn from_env() -> Result<Plane, String> {
        let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
        let ca = std::fs::read_to_string(var("ZERG_PLANE_CA")?).map_err(|e| e.to_string())?;
        let token = std::fs::read_to_string(var("ZERG_WORKER_TOKEN_FILE")?)
            .map_err(|e| e.to_string())?
            .trim()
            .to_string();
        Ok(Plane {
            url: var("ZERG_PLANE_URL")?,
            ca,
            token,
            me: zerg_proto::v1::WorkerRef {
                rush_id: var("ZERG_RUSH_ID")?,
                worker_id: var("ZERG_WORKER_ID")?
                    .parse()
                    .map_err(|_| "ZERG_WORKER_ID")?,
                generation: var("ZERG_GENERATION")?
                    .parse()
                    .map_err(|_| "ZERG_GENERATION")?,
            },
        })
    }

    /// One new connection (HTTP/2 over TLS) to the plane.
    async fn connect(&self) -> Result<tonic::transport::Channel, String> {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
        Endpoint::from_shared(self.url.clone())
            .map_err(|e| e.to_string())?
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca)))
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("{}: {e}", self.url))
    }

    /// `msg` with the worker's token.
    fn req<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        if let Ok(v) = format!("Bearer {}", self.token).parse() {
            req.metadata_mut().insert("authorization", v);
        }
        req
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

fn push(args: &[String]) -> Result<serde_json::Value, String> {
    use zerg_proto::v1;
    let plane = Plane::from_env()?;
    let (token, me) = (plane.token.clone(), plane.me.clone());
    let (task, lease) = (arg(args, "--task")?, arg(args, "--lease")?);
    let (other_task, other_lease) = (arg(args, "--other-task")?, arg(args, "--other-lease")?);
    let feature = std::env::var("ZERG_FEATURE").map_err(|_| "ZERG_FEATURE is not set")?;
    // The packs, made with the worker's own git from the base it checked out.
    let spec_commit = commit_changing(&format!(".gsd/specs/{feature}/task-graph.json"), "{}\n")?;
    let good_commit = commit_changing("attack.txt", "a file of its own\n")?;
    let empty_tree = wgit_str(&["mktree"], &[], b"")?;
    let orphan = wgit_str(&["commit-tree", &empty_tree, "-m", "orphan"], &[], b"")?;
    let mut corrupt = b"PACK\0\0\0\x02\0\0\0\x01".to_vec();
    corrupt.extend(std::iter::repeat_n(0xa5u8, 4096));
    let case = |name, task, lease, commit: &String, pack, announced, with_token| Case {
        name,
        task,
        lease,
        commit: commit.clone(),
        pack,
        announced,
        with_token,
    };
    let cases = vec![
        case("corrupt", &task, &lease, &good_commit, corrupt, None, true),
        case(
            "oversize",
            &task,
            &lease,
            &good_commit,
            vec![0u8; 16],
            Some(1 << 40),
            true,
        ),
        case(
            "off_base",
            &task,
            &lease,
            &orphan,
            pack_of(&orphan, true)?,
            None,
            true,
        ),
        case(
            "spec_change",
            &task,
            &lease,
            &spec_commit,
            pack_of(&spec_commit, false)?,
            None,
            true,
        ),
        case(
            "other_lease",
            &other_task,
            &other_lease,
            &good_commit,
            pack_of(&good_commit, false)?,
            None,
            true,
        ),
        case(
            "no_token",
            &task,
            &lease,
            &good_commit,
            pack_of(&good_commit, false)?,
            None,
            false,
        ),
    ];
    runtime()?.block_on(async move {
        let ch = plane.connect().await?;
        let mut out = serde_json::Map::new();
        for c in cases {
            let first = v1::PushChunk {
                worker: Some(me.clone()),
                lease_id: c.lease.to_string(),
                task_id: c.task.to_string(),
                commit: c.commit,
                pack_bytes: c.announced.unwrap_or(c.pack.len() as u64),
                data: c.pack,
            };
            let name = c.name;
            let mut req = tonic::Request::new(tokio_stream::iter(vec![first]));
            if c.with_token {
                let v = format!("Bearer {token}").parse().map_err(|_| "token")?;
                req.metadata_mut().insert("authorization", v);
            }
            let mut client = v1::worker_client::WorkerClient::new(ch.clone());
            let r = client.push_objects(req).await;
            out.insert(
                name.to_string(),
                match r {
                    Ok(_) => json!({"refused": false}),
                    Err(s) => json!({"refused": true, "code": format!("{:?}", s.code()), "message": s.message()}),
                },
            );
        }
        Ok::<_, String>(json!({"attack": "push", "results": out}))
    })
}

fn refusal(s: &tonic::Status) -> serde_json::Value {
    json!({"code": format!("{:?}", s.code()), "message": s.message()})
}

fn streams(args: &[String]) -> Result<serde_json::Value, String> {
    use zerg_proto::v1;
    let plane = Plane::from_env()?;
    let (task, lease) = (arg(args, "--task")?, arg(args, "--lease")?);
    let (count, conns) = (num(args, "--count")?, num(args, "--conns")?.max(1));
    let secs = num(args, "--seconds")?;
    runtime()?.block_on(async move {
        let mut chans = Vec::new();
        for _ in 0..conns {
            chans.push(plane.connect().await?);
        }
        let plane = std::sync::Arc::new(plane);
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..count {
            let ch = chans[i as usize % chans.len()].clone();
            let req = v1::FetchBaseRequest {
                worker: Some(plane.me.clone()),
                lease_id: lease.clone(),
                task_id: task.clone(),
                haves: vec![],
            };
            let plane = plane.clone();
            calls.spawn(async move {
                let mut c = v1::worker_client::WorkerClient::new(ch);
                tokio::time::timeout(Duration::from_secs(30), c.fetch_base(plane.req(req))).await
            });
        }
        let (mut opened, mut refused, mut timed_out, mut first_refusal) = (0u64, 0u64, 0u64, None);
        // The streams are kept, and never read.
        let mut held = Vec::new();
        while let Some(r) = calls.join_next().await {
            match r {
                Ok(Ok(Ok(s))) => {
                    opened += 1;
                    held.push(s);
                }
                Ok(Ok(Err(s))) => {
                    refused += 1;
                    first_refusal.get_or_insert_with(|| refusal(&s));
                }
                _ => timed_out += 1,
            }
        }
        let report = json!({"attack": "streams", "opened": opened, "refused": refused,
            "timed_out": timed_out, "first_refusal": first_refusal, "holding": true});
        println!("{report}");
        let _ = std::io::stdout().flush();
        tokio::time::sleep(Duration::from_secs(secs)).await;
        drop(held);
        Ok(json!({"attack": "streams", "opened": opened}))
    })
}

fn artifacts(args: &[String]) -> Result<serde_json::Value, String> {
    use zerg_proto::v1;
    let plane = Plane::from_env()?;
    let (task, lease) = (arg(args, "--task")?, arg(args, "--lease")?);
    let (count, bytes) = (num(args, "--count")?, num(args, "--bytes")? as usize);
    runtime()?.block_on(async move {
        let ch = plane.connect().await?;
        let (mut kept, mut refused, mut first_refusal) = (0u64, 0u64, None);
        let chunk = vec![b'a'; 256 << 10];
        for i in 0..count {
            let mut msgs = Vec::new();
            let mut left = bytes;
            while left > 0 || msgs.is_empty() {
                let n = left.min(chunk.len());
                msgs.push(v1::ArtifactChunk {
                    data: chunk[..n].to_vec(),
                    ..Default::default()
                });
                left -= n;
            }
            msgs[0].worker = Some(plane.me.clone());
            msgs[0].lease_id = lease.clone();
            msgs[0].task_id = task.clone();
            msgs[0].name = format!("attack-{i}.bin");
            let mut c = v1::worker_client::WorkerClient::new(ch.clone());
            match c.push_artifact(plane.req(tokio_stream::iter(msgs))).await {
                Ok(_) => kept += 1,
                Err(s) => {
                    refused += 1;
                    first_refusal.get_or_insert_with(|| refusal(&s));
                }
            }
        }
        Ok(
            json!({"attack": "artifacts", "accepted": kept, "refused": refused,
            "first_refusal": first_refusal}),
        )
    })
}

fn checkpoint(args: &[String]) -> Result<serde_json::Value, String> {
    use zerg_proto::v1;
    let plane = Plane::from_env()?;
    let (task, lease) = (arg(args, "--task")?, arg(args, "--lease")?);
    let base = wgit_str(&["rev-parse", "HEAD"], &[], b"")?;
    let header = wgit_str(&["cat-file", "commit", &base], &[], b"")?;
    let older = header
        .lines()
        .find_map(|l| l.strip_prefix("parent "))
        .ok_or("the base has no parent to reach for")?
        .to_string();
    let tree = wgit_str(&["rev-parse", &format!("{base}^{{tree}}")], &[], b"")?;
    // The worker's snapshot lacks `older`, so the commit is written as raw bytes.
    let body = format!(
        "tree {tree}\nparent {older}\nparent {base}\nauthor a <a@x> 0 +0000\ncommitter a <a@x> 0 +0000\n\nWIP: ZERG checkpoint\n"
    );
    let merge = wgit_str(
        &[
            "hash-object",
            "-t",
            "commit",
            "-w",
            "--literally",
            "--stdin",
        ],
        &[],
        body.as_bytes(),
    )?;
    let pack = wgit(
        &["pack-objects", "--stdout", "-q"],
        &[],
        format!("{merge}\n").as_bytes(),
    )?;
    runtime()?.block_on(async move {
        let ch = plane.connect().await?;
        let mut c = v1::worker_client::WorkerClient::new(ch);
        let push = v1::PushChunk {
            worker: Some(plane.me.clone()),
            lease_id: lease.clone(),
            task_id: task.clone(),
            commit: merge.clone(),
            pack_bytes: pack.len() as u64,
            data: pack,
        };
        let pushed = c
            .push_objects(plane.req(tokio_stream::iter(vec![push])))
            .await
            .map(|_| json!({"refused": false}))
            .unwrap_or_else(|s| refusal(&s));
        let fail = v1::FailRequest {
            worker: Some(plane.me.clone()),
            lease_id: lease,
            task_id: task,
            kind: v1::FailKind::Checkpoint as i32,
            message: "checkpoint at 50%".into(),
            checkpoint_commit: merge.clone(),
            ..Default::default()
        };
        let reported = c
            .fail(plane.req(fail))
            .await
            .map(|_| json!({"refused": false}))
            .unwrap_or_else(|s| refusal(&s));
        Ok(
            json!({"attack": "checkpoint", "commit": merge, "older": older,
            "pushed": pushed, "reported": reported}),
        )
    })
}
