//! bubblewrap's arguments: the namespaces and mounts around the launcher.

use std::path::Path;

use super::{ETC_PATHS, SANDBOX_GID, SANDBOX_UID, SYSTEM_PATHS, Spec};

/// Where the launcher (antler's own binary) is mounted inside the sandbox.
pub(super) const LAUNCHER_INSIDE: &str = "/run/antler/launcher";
/// Where the shell's proxy socket is mounted inside the sandbox (`network = true`).
pub(super) const EGRESS_INSIDE: &str = "/run/antler/egress.sock";

/// bwrap's arguments for `spec`, up to and including the launcher's path: every namespace
/// unshared (the network always: with `network = true` the proxy's socket `egress` is mounted
/// inside instead), a user namespace that maps the command to uid 65534 with no capabilities,
/// killed with antler, a session of its own, the system read-only, the thread's workspace and
/// outputs writable and its uploads read-only at their real paths, private `/tmp`, `/proc` and
/// `/dev`, nothing else.
pub(super) fn args(spec: &Spec, launcher: &Path, egress: Option<&Path>) -> Vec<String> {
    let mut args: Vec<String> = [
        "--die-with-parent",
        "--new-session",
        "--unshare-all",
        "--unshare-user",
        "--cap-drop",
        "ALL",
        "--hostname",
        "sandbox",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend([
        "--uid".to_owned(),
        SANDBOX_UID.to_string(),
        "--gid".to_owned(),
        SANDBOX_GID.to_string(),
    ]);
    for path in SYSTEM_PATHS.iter().chain(ETC_PATHS) {
        args.extend([
            "--ro-bind-try".to_owned(),
            (*path).to_owned(),
            (*path).to_owned(),
        ]);
    }
    args.extend(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"].map(str::to_owned));
    let workspace = spec.workdir.display().to_string();
    for path in &spec.read_write {
        let shown = path.display().to_string();
        if shown.starts_with("/dev/") || shown == "/tmp" {
            continue;
        }
        args.extend(["--bind".to_owned(), shown.clone(), shown]);
    }
    for path in &spec.read_only {
        let shown = path.display().to_string();
        let system = SYSTEM_PATHS.contains(&shown.as_str()) || ETC_PATHS.contains(&shown.as_str());
        if system || shown.starts_with("/dev/") || shown == "/proc" {
            continue;
        }
        args.extend(["--ro-bind".to_owned(), shown.clone(), shown]);
    }
    args.extend([
        "--ro-bind".to_owned(),
        launcher.display().to_string(),
        LAUNCHER_INSIDE.to_owned(),
    ]);
    if let Some(egress) = egress {
        args.extend([
            "--bind".to_owned(),
            egress.display().to_string(),
            EGRESS_INSIDE.to_owned(),
        ]);
    }
    args.extend(["--chdir".to_owned(), workspace]);
    args.extend(["--".to_owned(), LAUNCHER_INSIDE.to_owned()]);
    args
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::sandbox::{Backend, Folders, Sandbox, SandboxLimits};

    #[test]
    fn bwrap_arguments_confine_to_the_threads_folders() {
        let folders = Folders {
            workspace: PathBuf::from("/data/threads/t1/workspace"),
            outputs: PathBuf::from("/data/threads/t1/outputs"),
            uploads: PathBuf::from("/data/threads/t1/uploads"),
            tmp: PathBuf::from("/data/threads/t1/tmp"),
            skills: Vec::new(),
        };
        let sandbox = Sandbox::new(
            Backend::Bwrap,
            false,
            SandboxLimits::default(),
            PathBuf::from("/usr/local/bin/antler"),
            Some(PathBuf::from("/usr/bin/bwrap")),
        );
        let spec = sandbox.spec(&folders, "ls -la", Duration::from_secs(30));
        let args = args(&spec, Path::new("/usr/local/bin/antler"), None);
        let joined = args.join(" ");
        assert!(
            joined.starts_with(
                "--die-with-parent --new-session --unshare-all --unshare-user --cap-drop ALL "
            ),
            "{joined}"
        );
        assert!(joined.contains("--uid 65534 --gid 65534"), "{joined}");
        assert!(!args.contains(&"--share-net".to_owned()), "{joined}");
        assert!(
            joined.contains("--bind /data/threads/t1/workspace /data/threads/t1/workspace")
                && joined.contains("--bind /data/threads/t1/outputs /data/threads/t1/outputs")
                && joined.contains("--ro-bind /data/threads/t1/uploads /data/threads/t1/uploads")
                && joined.contains("--ro-bind-try /usr /usr")
                && joined.contains("--ro-bind-try /etc/resolv.conf /etc/resolv.conf")
                && joined.contains("--tmpfs /tmp")
                && joined.contains("--ro-bind /usr/local/bin/antler /run/antler/launcher")
                && joined.contains("--chdir /data/threads/t1/workspace"),
            "{joined}"
        );
        // Neither the store, nor the thread's own folder, nor all of /etc is visible.
        assert!(!joined.contains("/data "), "{joined}");
        assert!(!joined.contains("/data/threads/t1 "), "{joined}");
        assert!(!joined.contains("/data/threads/t1/tmp"), "{joined}");
        assert!(!args.iter().any(|a| a == "/etc" || a == "/"), "{joined}");
        assert_eq!(
            args.iter().rev().take(2).rev().collect::<Vec<_>>(),
            ["--", LAUNCHER_INSIDE]
        );
        // With the network, the namespace stays empty and the proxy's socket is mounted.
        let with_net = args_with_network().join(" ");
        assert!(!with_net.contains("--share-net"), "{with_net}");
        assert!(
            with_net.contains("--bind /data/egress.sock /run/antler/egress.sock"),
            "{with_net}"
        );
    }

    #[test]
    fn skill_folders_are_bound_read_only_at_their_paths() {
        let folders = Folders {
            workspace: PathBuf::from("/w"),
            outputs: PathBuf::from("/o"),
            uploads: PathBuf::from("/u"),
            tmp: PathBuf::from("/t"),
            skills: vec![PathBuf::from("/etc/antler/skills/public/postmortem")],
        };
        let spec = Sandbox::new(
            Backend::Bwrap,
            false,
            SandboxLimits::default(),
            PathBuf::from("/a"),
            None,
        )
        .spec(&folders, "true", Duration::from_secs(1));
        let joined = args(&spec, Path::new("/a"), None).join(" ");
        let skill = "/etc/antler/skills/public/postmortem";
        assert!(
            joined.contains(&format!("--ro-bind {skill} {skill}")),
            "{joined}"
        );
        assert!(!joined.contains(&format!("--bind {skill}")), "{joined}");
        assert!(spec.read_only.contains(&PathBuf::from(skill)));
        assert!(!spec.read_write.contains(&PathBuf::from(skill)));
    }

    fn args_with_network() -> Vec<String> {
        let spec = Sandbox::new(
            Backend::Bwrap,
            true,
            SandboxLimits::default(),
            PathBuf::from("/a"),
            None,
        )
        .spec(
            &Folders {
                workspace: PathBuf::from("/w"),
                outputs: PathBuf::from("/o"),
                uploads: PathBuf::from("/u"),
                tmp: PathBuf::from("/t"),
                skills: Vec::new(),
            },
            "true",
            Duration::from_secs(1),
        );
        args(&spec, Path::new("/a"), Some(Path::new("/data/egress.sock")))
    }
}
