//! The shell's sandbox against the attacks an outside review ran as a hostile chat user and a
//! prompt-injected model (issue 21): each is a `bash` call through the API, scripted by the
//! mock model, against a real `antler serve` whose config file (with its API key) sits beside
//! its store, as in a deployment. Every backend runs the same list; one that the machine
//! cannot provide (no bubblewrap, no user namespaces, no Landlock) is skipped with the reason
//! `antler` itself gives.

use std::path::Path;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::support::{Behaviour, ChildRig, Client, MockModel};

const ADMIN_TOKEN: &str = "admin-token-0123456789";
/// In antler's environment only: a command must never see it.
const ENV_SECRET: &str = "env-secret-5f0c1d9e";

fn bash(command: &str) -> Behaviour {
    Behaviour::TurnScript(vec![(
        "bash".to_owned(),
        json!({ "command": command }).to_string(),
    )])
}

fn overrides(backend: &str) -> String {
    format!(
        r#"
[channels.api]
token = "{ADMIN_TOKEN}"

[agent.tools.bash]
sandbox = "{backend}"

[agent.tools.bash.limits]
processes = 32
memory_mb = 256
file_mb = 16
"#
    )
}

/// The command's output as the model got it (`done: <result>`).
async fn run(client: &Client, mock: &MockModel, conversation: &str, command: &str) -> String {
    mock.set_behaviour(bash(command));
    let answer = client
        .post(&json!({"conversation": conversation, "text": "run it", "wait": true}))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    eprintln!("{conversation}: {}", answer.json["reply"]);
    answer.json["reply"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("done: ")
        .to_owned()
}

/// The shell's part of `/readyz` once the sandbox's probe has decided (antler answers while
/// the probe of its start still runs).
async fn settled_shell(client: &Client) -> Value {
    let start = Instant::now();
    loop {
        let shell = client.get("/readyz").await.json["shell"].clone();
        if shell["probing"] != Value::Bool(true) || start.elapsed() > Duration::from_secs(60) {
            return shell;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a process with `marker` in its command line is alive.
fn alive(marker: &str) -> bool {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries.flatten().any(|entry| {
                std::fs::read(entry.path().join("cmdline"))
                    .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(marker))
            })
        })
        .unwrap_or(false)
}

async fn gone(marker: &str) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if !alive(marker) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// A TCP listener on 127.0.0.1 that counts the connections it accepts.
async fn counting_listener() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&count);
    tokio::spawn(async move {
        while let Ok((_socket, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (port, count)
}

/// The unprivileged user a root test run starts antler as, for the runs that check antler
/// not being root changes nothing.
const UNPRIVILEGED: u32 = 65534;

/// Starts antler with `backend` (as `as_user`, when given); `None` (with the reason printed)
/// when it is not offered here.
async fn start(
    backend: &str,
    mock: &MockModel,
    as_user: Option<u32>,
) -> Option<(ChildRig, crate::support::Child, Client)> {
    let rig = ChildRig::new(mock, &overrides(backend));
    if let Some(uid) = as_user {
        // Its config and store are its own, as in a deployment.
        let owner = Some(rustix::fs::Uid::from_raw(uid));
        let group = Some(rustix::fs::Gid::from_raw(uid));
        std::fs::File::create(&rig.log).unwrap();
        for path in [rig.dir.path(), rig.config.as_path(), rig.log.as_path()] {
            rustix::fs::chown(path, owner, group).unwrap();
        }
    }
    let child = crate::support::Child::serve_as(
        &rig.config,
        rig.port,
        &rig.log,
        &[("ANTLER_E2E_SECRET", ENV_SECRET)],
        as_user,
    )
    .await;
    let client = child.client.with_token(ADMIN_TOKEN);
    let shell = &settled_shell(&client).await;
    if shell["offered"] != Value::Bool(true) {
        eprintln!(
            "skipped: the {backend} sandbox is not available here: {}",
            shell["detail"]
        );
        return None;
    }
    assert_eq!(shell["sandbox"], backend, "{shell}");
    Some((rig, child, client))
}

/// The attacks every isolating backend must stop, with antler as `as_user` (or this test's
/// user).
async fn confines(backend: &str, as_user: Option<u32>) {
    let mock = MockModel::start(bash("true")).await;
    let Some((rig, child, client)) = start(backend, &mock, as_user).await else {
        return;
    };
    let store = rig.dir.path().join("store");
    let pid = child.process.id().unwrap();

    // Who it runs as: never root, no capabilities, also when antler is root.
    let out = run(
        &client,
        &mock,
        "who",
        "id -u; grep CapEff /proc/self/status",
    )
    .await;
    assert!(out.starts_with("65534\n"), "{out}");
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");

    // antler's environment, its working directory, its config file and the store.
    let config = rig.config.display().to_string();
    let out = run(
        &client,
        &mock,
        "steal",
        &format!(
            "cat /proc/{pid}/environ; ls /proc/{pid}/cwd/; cat {config}; ls {store}; \
             cat {store}/db; cat {store}/audit/shell.log; echo end",
            store = store.display()
        ),
    )
    .await;
    assert!(out.contains("end"), "{out}");
    // The environment's secret, the config's API key and section names, the store's files.
    for secret in [ENV_SECRET, "sk-e2e-test-key", "[model]", "snap.", "blobs"] {
        assert!(!out.contains(secret), "{secret} leaked: {out}");
    }
    // Nor can it write the audit log (or anything else of the store).
    let out = run(
        &client,
        &mock,
        "steal",
        &format!(
            "echo forged >> {store}/audit/shell.log; touch {store}/planted; echo end",
            store = store.display()
        ),
    )
    .await;
    assert!(out.contains("end"), "{out}");
    assert!(!store.join("planted").exists());
    let audit = std::fs::read_to_string(store.join("audit/shell.log")).unwrap();
    // (The command itself is audited, so "forged" is in the log, but never as a line of its own.)
    assert!(audit.lines().all(|line| line != "forged"), "{audit}");

    // Another thread's files.
    let other = store.join("threads/other-thread/workspace");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "other-users-notes").unwrap();
    let out = run(
        &client,
        &mock,
        "steal",
        &format!(
            "cat {}/notes.txt; ls {}; echo end",
            other.display(),
            store.join("threads").display()
        ),
    )
    .await;
    assert!(!out.contains("other-users-notes"), "{out}");
    assert!(
        out.lines().all(|line| line != "other-thread"),
        "listed: {out}"
    );

    // Remounting the read-only system (as root this wrote a file the host saw).
    let marker = format!("/usr/antler-{backend}-{pid}");
    let out = run(
        &client,
        &mock,
        "root",
        &format!("mount -o remount,bind,rw /usr 2>&1; touch {marker} 2>&1; echo end"),
    )
    .await;
    assert!(out.contains("end"), "{out}");
    assert!(!Path::new(&marker).exists(), "the host saw {marker}");

    // The network: antler's own listener, the model's, any other on loopback.
    let (port, connections) = counting_listener().await;
    let model_port = mock
        .base_url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches("/v1")
        .to_owned();
    let out = run(
        &client,
        &mock,
        "net",
        &format!(
            "for p in {port} {} {model_port}; do (exec 3<>/dev/tcp/127.0.0.1/$p && echo CONNECTED $p) 2>&1; done; echo end",
            rig.port
        ),
    )
    .await;
    assert!(out.contains("end") && !out.contains("CONNECTED"), "{out}");
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);

    limits_and_tree(&client, &mock, &store).await;
    drop(child);
}

/// Limits and the process tree, which every backend (`none` too) enforces, and antler's own
/// file access, which no link the command plants can redirect.
async fn limits_and_tree(client: &Client, mock: &MockModel, store: &Path) {
    // The full text of a long result is saved under outputs/tool-output, which the command
    // turned into a link out of the store first: nothing is written through it.
    let elsewhere = store.parent().unwrap().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let out = run(
        client,
        mock,
        "budget",
        &format!(
            "ln -s {} /mnt/user-data/outputs/tool-output && seq 1 20000",
            elsewhere.display()
        ),
    )
    .await;
    assert!(out.contains("the full output could not be saved"), "{out}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);

    // A process storm: stopped at `processes` (32); dash gives up at the first failed fork.
    let out = run(
        client,
        mock,
        "storm",
        "sh -c 'i=0; while [ $i -lt 200 ]; do sleep 1000.601 > /dev/null 2>&1 & i=$((i+1)); done; echo all-started' 2>&1 | tail -2",
    )
    .await;
    assert!(!out.contains("all-started"), "{out}");
    assert!(out.to_lowercase().contains("fork"), "{out}");
    assert!(
        gone("1000.601").await,
        "the storm's processes outlived the call"
    );

    // A memory hog: bash cannot hold 400 MiB with memory_mb = 256.
    let out = run(
        client,
        mock,
        "hog",
        "x=$(head -c 400M /dev/zero | tr '\\0' a); echo got ${#x} bytes",
    )
    .await;
    assert!(!out.contains("got 419430400 bytes"), "{out}");

    // A file over file_mb (16): cut at the limit.
    let out = run(
        client,
        mock,
        "disk",
        "head -c 100M /dev/zero > big.bin; echo wrote",
    )
    .await;
    assert!(out.contains("wrote"), "{out}");
    let big: Vec<u64> = std::fs::read_dir(store.join("threads"))
        .unwrap()
        .flatten()
        .filter_map(|t| std::fs::metadata(t.path().join("workspace/big.bin")).ok())
        .map(|m| m.len())
        .collect();
    assert_eq!(big.len(), 1, "{big:?}");
    assert!(big[0] <= 16 * 1024 * 1024, "{big:?}");

    // Survivors: a `setsid` process and a double fork are gone with the call.
    let out = run(
        client,
        mock,
        "survive",
        "setsid sleep 1000.602 > /dev/null 2>&1 < /dev/null & (sleep 1000.603 > /dev/null 2>&1 < /dev/null &) ; echo left",
    )
    .await;
    assert!(out.contains("left"), "{out}");
    assert!(gone("1000.602").await, "a setsid process survived the call");
    assert!(
        gone("1000.603").await,
        "a double-forked process survived the call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwrap_confines_a_hostile_command() {
    confines("bwrap", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landlock_confines_a_hostile_command() {
    confines("landlock", None).await;
}

/// The same attacks with antler as an unprivileged user (a container's, a systemd unit's).
async fn confines_unprivileged(backend: &str) {
    if !rustix::process::geteuid().is_root() {
        // Not root: the runs above already were unprivileged.
        eprintln!("skipped: only a root test run can start antler as another user");
        return;
    }
    confines(backend, Some(UNPRIVILEGED)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwrap_confines_a_hostile_command_when_antler_is_not_root() {
    confines_unprivileged("bwrap").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landlock_confines_a_hostile_command_when_antler_is_not_root() {
    confines_unprivileged("landlock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_sandbox_the_limits_and_the_tree_kill_still_hold() {
    let mock = MockModel::start(bash("true")).await;
    let Some((rig, child, client)) = start("none", &mock, None).await else {
        return;
    };
    limits_and_tree(&client, &mock, &rig.dir.path().join("store")).await;
    drop(child);
}

/// With `network = true`, the only way out is the shell's proxy, and it never leads to a
/// loopback listener (antler's own, the model's) or the cloud metadata address.
async fn network_only_through_the_proxy(backend: &str) {
    let mock = MockModel::start(bash("true")).await;
    let with_network = overrides(backend).replace(
        "[agent.tools.bash.limits]",
        "network = true\n\n[agent.tools.bash.limits]",
    );
    let rig = ChildRig::new(&mock, &with_network);
    let child = crate::support::Child::serve(&rig.config, rig.port, &rig.log).await;
    let client = child.client.with_token(ADMIN_TOKEN);
    let shell = settled_shell(&client).await;
    if shell["offered"] != Value::Bool(true) {
        eprintln!(
            "skipped: the {backend} sandbox with the network is not available here: {}",
            shell["detail"]
        );
        return;
    }
    assert_eq!(shell["network"], true, "{shell}");
    let (port, connections) = counting_listener().await;
    let out = run(&client, &mock, "net", "echo proxy=$HTTPS_PROXY").await;
    assert!(out.starts_with("proxy=http://127.0.0.1:"), "{out}");
    // Straight to loopback: no route (bubblewrap) or not allowed (Landlock).
    let out = run(
        &client,
        &mock,
        "net",
        &format!(
            "for p in {port} {}; do (exec 3<>/dev/tcp/127.0.0.1/$p && echo CONNECTED $p) 2>&1; done; \
             (exec 3<>/dev/udp/1.1.1.1/53 && echo UDP-OPEN) 2>&1; echo end",
            rig.port
        ),
    )
    .await;
    assert!(out.contains("end"), "{out}");
    assert!(
        !out.contains("CONNECTED") && !out.contains("UDP-OPEN"),
        "{out}"
    );
    // Through the proxy: refused with the reason.
    for target in [
        format!("127.0.0.1:{port}"),
        format!("127.0.0.1:{}", rig.port),
        "169.254.169.254:80".to_owned(),
        "localhost:22".to_owned(),
    ] {
        let out = run(
            &client,
            &mock,
            "net",
            &format!(
                "p=${{HTTPS_PROXY##*:}}; exec 3<>/dev/tcp/127.0.0.1/$p && \
                 printf 'CONNECT {target} HTTP/1.1\\r\\n\\r\\n' >&3 && head -1 <&3"
            ),
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 403 Forbidden"), "{target}: {out}");
    }
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);
    drop(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwrap_with_the_network_reaches_out_only_through_the_proxy() {
    network_only_through_the_proxy("bwrap").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landlock_with_the_network_reaches_out_only_through_the_proxy() {
    network_only_through_the_proxy("landlock").await;
}

/// A skill beside the config file (the default `skills/public`), read through the shell under
/// `backend`: it is readable at `/mnt/skills/<name>`, and nothing the command does changes it.
async fn skills_are_read_only(backend: &str) {
    let mock = MockModel::start(bash("true")).await;
    let rig = ChildRig::new(&mock, &overrides(backend));
    let skill = rig.dir.path().join("skills/public/probe");
    std::fs::create_dir_all(&skill).unwrap();
    let text = "---\nname: probe\ndescription: A probe\n---\n# Probe body\n";
    std::fs::write(skill.join("SKILL.md"), text).unwrap();
    let child = rig.serve().await;
    let client = child.client.with_token(ADMIN_TOKEN);
    let shell = settled_shell(&client).await;
    if shell["offered"] != Value::Bool(true) {
        eprintln!(
            "skipped: the {backend} sandbox is not available here: {}",
            shell["detail"]
        );
        return;
    }
    let out = run(
        &client,
        &mock,
        "skill",
        "cat /mnt/skills/probe/SKILL.md; echo x > /mnt/skills/probe/SKILL.md; \
         touch /mnt/skills/probe/planted; rm -f /mnt/skills/probe/SKILL.md; \
         ls -d /mnt/skills/probe; echo end",
    )
    .await;
    assert!(out.contains("# Probe body"), "{out}");
    assert!(
        out.contains("\n/mnt/skills/probe\n"),
        "host paths shown virtual: {out}"
    );
    assert!(out.contains("end"), "{out}");
    assert!(
        !out.contains(&rig.dir.path().display().to_string()),
        "a host path leaked: {out}"
    );
    assert_eq!(
        std::fs::read_to_string(skill.join("SKILL.md")).unwrap(),
        text
    );
    assert!(!skill.join("planted").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwrap_mounts_skills_read_only() {
    skills_are_read_only("bwrap").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landlock_allows_skills_read_only() {
    skills_are_read_only("landlock").await;
}
