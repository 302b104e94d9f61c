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
        _ => Err("usage: zerg-attack swap-file|swap-dir|link|flood|bomb|spam|push ...".into()),
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

fn push(args: &[String]) -> Result<serde_json::Value, String> {
    use zerg_proto::v1;
    let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
    let (url, ca) = (var("ZERG_PLANE_URL")?, var("ZERG_PLANE_CA")?);
    let ca = std::fs::read_to_string(ca).map_err(|e| e.to_string())?;
    let token = std::fs::read_to_string(var("ZERG_WORKER_TOKEN_FILE")?)
        .map_err(|e| e.to_string())?
        .trim()
        .to_string();
    let me = v1::WorkerRef {
        rush_id: var("ZERG_RUSH_ID")?,
        worker_id: var("ZERG_WORKER_ID")?
            .parse()
            .map_err(|_| "ZERG_WORKER_ID")?,
        generation: var("ZERG_GENERATION")?
            .parse()
            .map_err(|_| "ZERG_GENERATION")?,
    };
    let (task, lease) = (arg(args, "--task")?, arg(args, "--lease")?);
    let (other_task, other_lease) = (arg(args, "--other-task")?, arg(args, "--other-lease")?);
    let feature = var("ZERG_FEATURE")?;
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
        let ch = Endpoint::from_shared(url.clone())
            .map_err(|e| e.to_string())?
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca)))
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
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
