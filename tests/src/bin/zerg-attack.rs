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
        _ => Err("usage: zerg-attack swap-file|swap-dir|link|flood|bomb|spam ...".into()),
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
