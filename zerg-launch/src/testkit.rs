//! For tests of zerg's launchers against a real engine (here and in zergd's): staging host
//! binaries into a root filesystem that is then imported as an image, since no registry can
//! be reached.

use std::fs;
use std::path::{Path, PathBuf};

/// Copies `file` (following symlinks) and the shared libraries `ldd` names into `root`.
pub fn stage(root: &Path, file: &Path) {
    let mut files = vec![file.to_path_buf()];
    let out = std::process::Command::new("ldd")
        .arg(file)
        .output()
        .unwrap();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(lib) = line.split_whitespace().find(|t| t.starts_with('/')) {
            files.push(PathBuf::from(lib));
        }
    }
    for f in files {
        let dest = root.join(f.strip_prefix("/").unwrap());
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::copy(&f, &dest).unwrap();
    }
}
