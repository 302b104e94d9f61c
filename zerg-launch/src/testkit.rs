//! For tests of zerg's launchers against a real engine (here and in zergd's): staging host
//! binaries into a root filesystem that is then imported as an image, since no registry can
//! be reached.

use std::fs;
use std::path::{Path, PathBuf};

use bollard::Docker;
use bollard::query_parameters::{CreateImageOptionsBuilder, RemoveImageOptionsBuilder};
use tokio_stream::StreamExt;

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

/// Imports the root filesystem `root` as the image `tag` (`repo:tag`), with a `PATH` of the
/// usual directories, as `docker import` would.
pub async fn import_image(docker: &Docker, root: &Path, tag: &str) {
    let tar = std::process::Command::new("tar")
        .arg("-C")
        .arg(root)
        .args(["-cf", "-", "."])
        .output()
        .unwrap();
    assert!(tar.status.success(), "tar failed");
    let (repo, tag) = tag.split_once(':').unwrap();
    let opts = CreateImageOptionsBuilder::new()
        .from_src("-")
        .repo(repo)
        .tag(tag)
        .changes(vec!["ENV PATH=/usr/local/bin:/usr/bin:/bin".to_string()])
        .build();
    let mut s = std::pin::pin!(docker.create_image(
        Some(opts),
        Some(bollard::body_full(tar.stdout.into())),
        None
    ));
    while let Some(item) = s.next().await {
        item.expect("image import failed");
    }
}

/// Removes the image `tag`, whatever still uses it.
pub async fn remove_image(docker: &Docker, tag: &str) {
    let opts = RemoveImageOptionsBuilder::new().force(true).build();
    let _ = docker.remove_image(tag, Some(opts), None).await;
}
