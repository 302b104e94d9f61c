//! Unit tests of the image builder.

use super::rootfs::*;
use super::*;
use zerg_proto::testkit::{docker_or_skip, skip};

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
    let tar = dockerfile_context(DOCKERFILE, &agent, &[extra]).unwrap();
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
    if !docker_or_skip() {
        return;
    }
    let docker = connect()
        .await
        .expect("docker info answers, so zergctl connects");
    if which("git").is_none() {
        skip("no git on this host to put in the image");
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
        from: None,
        devcontainer: None,
    };
    let id = build(&opts).await.unwrap();
    let created = |docker: &Docker| {
        let docker = docker.clone();
        let tag = opts.tag.clone();
        async move { docker.inspect_image(&tag).await.unwrap().created }
    };
    let first = created(&docker).await;
    // An unchanged rebuild imports nothing: the same image, created once.
    assert_eq!(
        build(&opts).await.unwrap(),
        id,
        "an unchanged rebuild is cached"
    );
    assert_eq!(
        created(&docker).await,
        first,
        "the image was imported again"
    );

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
    remove_images(&docker, &[&opts.tag]).await;
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

/// Builds `dockerfile` (context: the Dockerfile alone) into `tag`, as a user builds their own
/// project image.
async fn docker_build(docker: &Docker, tag: &str, dockerfile: &str) {
    let mut fs_ = Rootfs::default();
    fs_.data("Dockerfile", dockerfile.to_string(), 0o644);
    let tar = fs_.to_tar().unwrap();
    let options = BuildImageOptionsBuilder::new()
        .dockerfile("Dockerfile")
        .t(tag)
        .rm(true)
        .build();
    let mut stream =
        std::pin::pin!(docker.build_image(options, None, Some(bollard::body_full(tar.into()))));
    while let Some(item) = stream.next().await {
        item.unwrap_or_else(|e| panic!("building {tag}: {e}"));
    }
}

/// The `zerg.image.base` label of `tag`: the base a `--from` build layered onto.
async fn base_label(docker: &Docker, tag: &str) -> Option<String> {
    let labels = docker.inspect_image(tag).await.ok()?.config?.labels?;
    labels.get("zerg.image.base").cloned()
}

async fn remove_images(docker: &Docker, tags: &[&str]) {
    for t in tags {
        let _ = docker
            .remove_image(
                t,
                Some(
                    bollard::query_parameters::RemoveImageOptionsBuilder::new()
                        .force(true)
                        .build(),
                ),
                None,
            )
            .await;
    }
}

/// `image build --from`: the project's own local image (here one with a project tool and no
/// `worker` user) gets the agent, the uid-10001 user and the worker's directories, with no
/// registry; a base without git, and one without a shell, are refused with the cause named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_built_from_a_local_base_keeps_its_tools_and_gains_the_worker() {
    if !docker_or_skip() {
        return;
    }
    let docker = connect().await.expect("docker info answers");
    if which("git").is_none() {
        skip("no git on this host to put in the base image");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Prints what the real agent prints when started without its environment.
    let agent = dir.path().join("zerg-worker-agent");
    fs::write(
        &agent,
        "#!/bin/sh\necho 'zerg-worker-agent: ZERG_SOCKET is not set' >&2\nexit 1\n",
    )
    .unwrap();
    let (root, project, no_git, from, from_no_git, no_shell, from_no_shell) = (
        "zerg-from-test:root",
        "zerg-from-test:project",
        "zerg-from-test:nogit",
        "zerg-from-test:worker",
        "zerg-from-test:worker-nogit",
        "zerg-from-test:noshell",
        "zerg-from-test:worker-noshell",
    );
    // The project's image: a shell, git and coreutils (the offline root filesystem), a tool of
    // the project's own, and no `worker` user.
    build(&BuildOptions {
        offline: true,
        tag: root.into(),
        agent: Some(agent.clone()),
        with: vec![],
        from: None,
        devcontainer: None,
    })
    .await
    .unwrap();
    docker_build(
        &docker,
        project,
        &format!(
            "FROM {root}\nUSER 0\nRUN sed -i '/^worker:/d' /etc/passwd /etc/group && rm -f /usr/local/bin/zerg-worker-agent && printf '#!/bin/sh\\necho project-tool-ok\\n' > /usr/local/bin/project-tool && chmod 755 /usr/local/bin/project-tool\n"
        ),
    )
    .await;
    let out = run_in(
        &docker,
        project,
        &[
            "sh",
            "-c",
            "id -u; grep -c worker /etc/passwd; ls /usr/local/bin",
        ],
    )
    .await;
    assert!(
        out.1.starts_with("0\n0\n") && !out.1.contains("zerg-worker-agent"),
        "the base runs as root, without a worker user or the agent: {out:?}"
    );

    let opts = |tag: &str, base: &str| BuildOptions {
        offline: false,
        tag: tag.into(),
        agent: Some(agent.clone()),
        with: vec![],
        from: Some(base.into()),
        devcontainer: None,
    };
    build(&opts(from, project)).await.unwrap();
    let script = "id -u; id -g; grep '^worker:x:10001:10001:' /etc/passwd; echo home=$HOME; pwd; project-tool; git --version; ls -ld /zerg/logs; zerg-worker-agent; echo agent-exit=$?";
    let (code, text) = run_in(&docker, from, &["sh", "-c", script]).await;
    assert_eq!(code, 0, "{text}");
    for want in [
        "10001\n10001\n",
        "worker:x:10001:10001:",
        "home=/home/worker",
        "/workspace",
        "project-tool-ok",
        "git version",
        "drwxrwxrwt",
        "zerg-worker-agent: ZERG_SOCKET is not set",
        "agent-exit=1",
    ] {
        assert!(text.contains(want), "{want:?} missing from {text:?}");
    }
    assert_eq!(base_label(&docker, from).await.as_deref(), Some(project));

    // A base without git: refused, naming git.
    docker_build(
        &docker,
        no_git,
        &format!("FROM {project}\nUSER 0\nRUN rm -f \"$(command -v git)\"\n"),
    )
    .await;
    let err = build(&opts(from_no_git, no_git))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("has no: git"), "{err}");

    // A base without a shell (a root filesystem of one file): refused, naming the shell.
    let mut fs_ = Rootfs::default();
    fs_.data("etc/hostname", "x\n".into(), 0o644);
    let tar = fs_.to_tar().unwrap();
    let (repo, tag) = split_tag(no_shell);
    let import = CreateImageOptionsBuilder::new()
        .from_src("-")
        .repo(repo)
        .tag(tag)
        .build();
    let mut stream = std::pin::pin!(docker.create_image(
        Some(import),
        Some(bollard::body_full(tar.into())),
        None
    ));
    while let Some(item) = stream.next().await {
        item.unwrap();
    }
    let err = build(&opts(from_no_shell, no_shell))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("has no shell (/bin/sh)"), "{err}");

    // A base that is not on this machine: named, with no registry contacted.
    let err = build(&opts(from_no_shell, "zerg-from-test:absent"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--from zerg-from-test:absent: no such image on this machine"),
        "{err}"
    );

    // `--devcontainer`: the Dockerfile devcontainer.json names (with comments, a build arg and
    // a context one level up) is built first, then the worker is layered onto it.
    let repo = tempfile::tempdir().unwrap();
    fs::create_dir_all(repo.path().join(".devcontainer")).unwrap();
    fs::write(repo.path().join("project-file.txt"), "from-the-context\n").unwrap();
    fs::write(
        repo.path().join(".devcontainer/Dockerfile"),
        format!("FROM {project}\nARG MARK\nCOPY project-file.txt /etc/project-file.txt\nRUN printf '%s' \"$MARK\" > /etc/devc-mark\n"),
    )
    .unwrap();
    fs::write(
        repo.path().join(".devcontainer/devcontainer.json"),
        r#"{
  // what VS Code reads too
  "name": "project",
  "build": {"dockerfile": "Dockerfile", "context": "..", "args": {"MARK": "devc-ok"},},
}"#,
    )
    .unwrap();
    let devc = "zerg-from-test:devcontainer";
    build(&BuildOptions {
        devcontainer: Some(repo.path().to_path_buf()),
        ..opts(devc, "unused")
    })
    .await
    .unwrap();
    let (code, text) = run_in(
        &docker,
        devc,
        &[
            "sh",
            "-c",
            "cat /etc/devc-mark /etc/project-file.txt; id -u; project-tool",
        ],
    )
    .await;
    assert_eq!(code, 0, "{text}");
    for want in ["devc-ok", "from-the-context", "10001", "project-tool-ok"] {
        assert!(text.contains(want), "{want:?} missing from {text:?}");
    }
    let devc_base = format!("{devc}-devcontainer-base");
    // `image` instead of `build`: that image is the base.
    fs::write(
        repo.path().join(".devcontainer/devcontainer.json"),
        format!(r#"{{"image": "{project}"}}"#),
    )
    .unwrap();
    build(&BuildOptions {
        devcontainer: Some(repo.path().to_path_buf()),
        ..opts(devc, "unused")
    })
    .await
    .unwrap();
    assert_eq!(base_label(&docker, devc).await.as_deref(), Some(project));
    remove_images(&docker, &[devc, &devc_base]).await;

    remove_images(
        &docker,
        &[
            from,
            from_no_git,
            from_no_shell,
            no_shell,
            no_git,
            project,
            root,
        ],
    )
    .await;
}
