//! `zerg-probe`: what a worker can reach from inside its container, as code an agent wrote
//! could try it. The end-to-end tests copy it into a live worker's worktree and run it there
//! with `docker exec`; it prints one JSON object with what it found and what it managed to do.
//!
//! It tries, and reports on:
//! - every Unix socket it can find (and the paths given with `--socket`): does any answer a
//!   control-plane RPC (`Control.List`)?
//! - moving `refs/heads/zerg/<feature>/staging`, with git and by writing the ref file;
//! - writing the rush's state file, at the host path and at `/zerg/state`;
//! - worker RPCs with no token, with another worker's token, and for another worker.
//!
//! Usage: `zerg-probe --feature F [--other-token T] [--other-worker N] [--socket PATH]...`

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use tonic::metadata::{Ascii, MetadataValue};
use zerg_proto::v1;
use zerg_proto::v1::control_client::ControlClient;
use zerg_proto::v1::worker_client::WorkerClient;

/// How long any one RPC may take before it counts as "no answer".
const RPC_TIMEOUT: Duration = Duration::from_secs(5);

struct Args {
    feature: String,
    other_token: String,
    other_worker: u32,
    sockets: Vec<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        feature: String::new(),
        other_token: String::new(),
        other_worker: u32::MAX,
        sockets: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--feature" => a.feature = value()?,
            "--other-token" => a.other_token = value()?,
            "--other-worker" => {
                a.other_worker = value()?
                    .parse()
                    .map_err(|_| "--other-worker: not a number")?
            }
            "--socket" => a.sockets.push(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.feature.is_empty() {
        return Err("--feature is required".into());
    }
    Ok(a)
}

/// Every socket below `dir` (not following links, skipping kernel filesystems).
fn find_sockets(dir: &Path, depth: u32, out: &mut Vec<PathBuf>) {
    if depth > 8
        || ["/proc", "/sys", "/dev"]
            .iter()
            .any(|p| dir == Path::new(p))
    {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_socket() {
            out.push(e.path());
        } else if t.is_dir() {
            find_sockets(&e.path(), depth + 1, out);
        }
    }
}

fn code_of<T>(r: Result<Result<T, tonic::Status>, tokio::time::error::Elapsed>) -> String {
    match r {
        Ok(Ok(_)) => "answered".into(),
        Ok(Err(s)) => format!("{:?}", s.code()),
        Err(_) => "timeout".into(),
    }
}

async fn control_answers(path: &Path) -> String {
    match zerg_proto::transport::connect(path).await {
        Err(e) => format!("no connection: {e}"),
        Ok(ch) => code_of(
            tokio::time::timeout(RPC_TIMEOUT, ControlClient::new(ch).list(v1::ListRequest {}))
                .await,
        ),
    }
}

/// A `Lease` call for `worker` carrying `token` (none when empty).
async fn lease_as(socket: &Path, token: &str, worker: v1::WorkerRef) -> String {
    let ch = match zerg_proto::transport::connect(socket).await {
        Ok(c) => c,
        Err(e) => return format!("no connection: {e}"),
    };
    let header: Option<MetadataValue<Ascii>> = (!token.is_empty())
        .then(|| zerg_proto::contract::bearer(token).parse().ok())
        .flatten();
    let mut client = WorkerClient::with_interceptor(ch, move |mut req: tonic::Request<()>| {
        if let Some(h) = &header {
            req.metadata_mut()
                .insert(zerg_proto::contract::TOKEN_METADATA, h.clone());
        }
        Ok(req)
    });
    let req = v1::LeaseRequest {
        worker: Some(worker),
    };
    code_of(tokio::time::timeout(RPC_TIMEOUT, client.lease(req)).await)
}

fn run(cmd: &mut Command) -> Value {
    match cmd.output() {
        Ok(o) if o.status.success() => json!("ok"),
        Ok(o) => json!(format!(
            "failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => json!(format!("cannot run: {e}")),
    }
}

fn write(path: &Path, text: &str) -> Value {
    if let Some(d) = path.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    match std::fs::write(path, text) {
        Ok(()) => json!("ok"),
        Err(e) => json!(format!("failed: {e}")),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("zerg-probe: {e}");
            std::process::exit(64);
        }
    };
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let f = &args.feature;

    // Sockets, and whether any of them serves the control plane.
    let mut sockets = Vec::new();
    find_sockets(Path::new("/"), 0, &mut sockets);
    sockets.extend(args.sockets.iter().cloned());
    sockets.push(PathBuf::from(env("ZERG_SOCKET")));
    sockets.sort();
    sockets.dedup();
    let mut found = Vec::new();
    for s in &sockets {
        found.push(json!({"path": s, "control": control_answers(s).await}));
    }

    // The staging ref.
    let common = Command::new("git")
        .args(["rev-parse", "--path-format=absolute", "--git-common-dir"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let staging = format!("refs/heads/zerg/{f}/staging");
    let staging_git = run(Command::new("git").args(["update-ref", &staging, "HEAD"]));
    let staging_file = write(
        &Path::new(&common).join(&staging),
        "0123456789012345678901234567890123456789\n",
    );

    // The state file.
    let marker = "{\"zerg-probe\": true}\n";
    let state_host = write(
        &Path::new(&env("ZERG_REPO_PATH")).join(format!(".zerg/state/{f}.json")),
        marker,
    );
    let state_mount = write(Path::new(&format!("/zerg/state/{f}.json")), marker);

    // Worker RPCs that must be refused.
    let socket = PathBuf::from(env("ZERG_SOCKET"));
    let me = v1::WorkerRef {
        rush_id: env("ZERG_RUSH_ID"),
        worker_id: env("ZERG_WORKER_ID").parse().unwrap_or(0),
        generation: env("ZERG_GENERATION").parse().unwrap_or(0),
    };
    let other = v1::WorkerRef {
        worker_id: args.other_worker,
        ..me.clone()
    };
    let own_token = env(zerg_proto::contract::env::WORKER_TOKEN);
    let no_token = lease_as(&socket, "", me.clone()).await;
    let other_token = lease_as(&socket, &args.other_token, me.clone()).await;
    let other_worker = lease_as(&socket, &own_token, other).await;

    let report = json!({
        "sockets": found,
        "docker_sock": Path::new("/var/run/docker.sock").exists(),
        "state_dir_inside": Path::new("/zerg/state").exists(),
        "git_common_dir": common,
        "staging_update_ref": staging_git,
        "staging_ref_file": staging_file,
        "state_file_host_path": state_host,
        "state_file_mount": state_mount,
        "rpc_no_token": no_token,
        "rpc_other_token": other_token,
        "rpc_other_worker": other_worker,
    });
    println!("{report}");
}
