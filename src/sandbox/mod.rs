//! The shell's sandbox: how a `bash` call is confined, whatever deployment antler runs in.
//!
//! Every command runs under antler's own launcher (`antler __sandbox`, [`launcher`]), a fresh
//! single-threaded process that confines itself and then starts `bash -c`:
//! - **limits** (`[agent.tools.bash.limits]`): processes, memory (`RLIMIT_DATA`, per process),
//!   CPU seconds, file size and open files; no core dumps;
//! - **no new privileges** and a **seccomp** filter ([`seccomp`]): no `ptrace`, mounts, new
//!   namespaces, kernel keyrings, BPF, `io_uring` or module loading, and no sockets but local
//!   ones (and the proxy's, with `network = true`);
//! - **Landlock** ([`rules`]): reads of the system folders and a few `/etc` files, writes only
//!   to the thread's `workspace/`, `outputs/` and `tmp/`, `uploads/` read-only, no TCP, no
//!   signals or abstract sockets outside the sandbox;
//! - **the whole tree**: the launcher is a subreaper in a session of its own; when the command
//!   ends, times out or is cancelled (antler closes the launcher's stdin), every process the
//!   command left (a `setsid` or double-fork survivor included) is killed before it exits.
//!
//! Backends ([`Backend`]): `bwrap` adds bubblewrap's namespaces around the launcher (new user,
//! mount, PID, IPC, UTS and network namespaces, all capabilities dropped, uid 65534 inside,
//! only the system folders and the thread's folders mounted, a private `/tmp`); Landlock is
//! then a second wall. `landlock` is for hosts and containers where user namespaces are not
//! allowed (Docker's default seccomp profile, most Kubernetes pods): Landlock is the wall, and
//! a root antler starts the launcher as uid 65534. `none` keeps only the limits, the filter and
//! the tree kill: the command sees the file system as antler's user does.
//!
//! [`detect`] decides at start which backend works and proves it with a probe run inside it
//! (`antler doctor` prints the result); `auto` takes `bwrap`, then `landlock`, and when neither
//! works the shell is not offered at all.

mod bwrap;
mod detect;
mod launcher;
mod rules;
mod seccomp;

#[cfg(test)]
pub(crate) use detect::find_on_path;
pub(crate) use detect::{Detection, detect};
pub use launcher::main_if_launcher;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The argument that makes the binary the launcher.
pub(crate) const LAUNCHER_ARG: &str = "__sandbox";

/// The exit code of a launcher that could not set the sandbox up; its stderr says why.
pub(crate) const SETUP_FAILED: i32 = 125;

/// What the launcher writes first on stderr when it cannot set the sandbox up.
pub(crate) const SETUP_FAILED_PREFIX: &str = "antler sandbox: ";

/// The unprivileged user commands run as when antler is root (`nobody`).
pub(crate) const SANDBOX_UID: u32 = 65534;
/// Its group (`nogroup`).
pub(crate) const SANDBOX_GID: u32 = 65534;

/// `[agent.tools.bash] sandbox`: which isolation the shell gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SandboxMode {
    /// `bwrap` when it works, else `landlock`; no shell when neither does.
    #[default]
    Auto,
    /// bubblewrap's namespaces around the launcher.
    Bwrap,
    /// Landlock, for where user namespaces are not allowed.
    Landlock,
    /// No isolation of the file system: limits, the seccomp filter and the tree kill only.
    None,
}

impl SandboxMode {
    /// Its name as the config writes it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SandboxMode::Auto => "auto",
            SandboxMode::Bwrap => "bwrap",
            SandboxMode::Landlock => "landlock",
            SandboxMode::None => "none",
        }
    }
}

/// The backend a command really runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Backend {
    Bwrap,
    Landlock,
    None,
}

impl Backend {
    /// Its name as the config writes it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Bwrap => "bwrap",
            Backend::Landlock => "landlock",
            Backend::None => "none",
        }
    }
}

/// `[agent.tools.bash.limits]`: what one command may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct SandboxLimits {
    /// Processes (threads count) the command may run at once.
    pub(crate) processes: u64,
    /// Memory of each process, in MiB (`RLIMIT_DATA`: heap and private mappings).
    pub(crate) memory_mb: u64,
    /// CPU seconds of each process; unset means the call's time limit.
    pub(crate) cpu_secs: Option<u64>,
    /// The largest file it may write, in MiB.
    pub(crate) file_mb: u64,
    /// Files each process may have open.
    pub(crate) open_files: u64,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            processes: 64,
            memory_mb: 1024,
            cpu_secs: None,
            file_mb: 256,
            open_files: 256,
        }
    }
}

/// Where the shell's HTTP proxy listens (`network = true`): the only way out of the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Egress {
    /// Its Unix socket, bound into bubblewrap's sandbox.
    pub(crate) unix: PathBuf,
    /// Its port on 127.0.0.1, the one TCP port a Landlock-confined command may connect to.
    pub(crate) port: u16,
}

/// The port, inside bubblewrap's network namespace, where the launcher relays to the proxy.
pub(crate) const RELAY_PORT: u16 = 3128;

/// A thread's folders, on the host, as the sandbox confines a command to them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Folders {
    /// Writable; the working directory and `HOME`.
    pub(crate) workspace: PathBuf,
    /// Writable: files for the user.
    pub(crate) outputs: PathBuf,
    /// Read-only: what the user sent.
    pub(crate) uploads: PathBuf,
    /// Writable scratch space (`TMPDIR`) where there is no private `/tmp`.
    pub(crate) tmp: PathBuf,
    /// Read-only: the run's skill folders, at their host paths.
    pub(crate) skills: Vec<PathBuf>,
}

/// What the launcher is told to do: serialized into its argument list.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Spec {
    pub(crate) backend: Backend,
    pub(crate) network: bool,
    pub(crate) limits: SandboxLimits,
    /// CPU seconds, resolved from the limits and the call's time limit.
    pub(crate) cpu_secs: u64,
    /// Landlock: folders and files that may be read (and run).
    pub(crate) read_only: Vec<PathBuf>,
    /// Landlock: folders and files that may be written.
    pub(crate) read_write: Vec<PathBuf>,
    /// Landlock: folders that may be listed (the thread's own: `/mnt/user-data`), nothing more.
    #[serde(default)]
    pub(crate) list_only: Vec<PathBuf>,
    /// The working directory.
    pub(crate) workdir: PathBuf,
    /// What `bash -c` runs.
    pub(crate) command: String,
    /// With the network: the one TCP port (on 127.0.0.1) commands may connect to, the proxy's.
    #[serde(default)]
    pub(crate) egress_port: Option<u16>,
    /// Under bubblewrap with the network: the proxy's Unix socket inside, which the launcher
    /// relays `127.0.0.1:egress_port` to.
    #[serde(default)]
    pub(crate) relay_to: Option<PathBuf>,
    /// A probe: first report what the sandbox looks like from inside, and whether this file
    /// (one of the store's, beside the probe's folders) can be read.
    #[serde(default)]
    pub(crate) probe_hidden: Option<PathBuf>,
    /// The user (uid, gid) the launcher becomes before anything else, when antler is root
    /// (Landlock and none; bubblewrap itself is started as that user). The launcher starts as
    /// antler's user so that it can run from wherever antler is installed.
    #[serde(default)]
    pub(crate) run_as: Option<(u32, u32)>,
}

/// System folders the command may read (when they exist).
pub(crate) const SYSTEM_PATHS: &[&str] =
    &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/opt"];

/// Files and folders of `/etc` a shell needs (names, DNS, certificates, time zone) and nothing
/// more: `/etc` as a whole may hold antler's own config and its secrets.
pub(crate) const ETC_PATHS: &[&str] = &[
    "/etc/alternatives",
    "/etc/ca-certificates",
    "/etc/group",
    "/etc/host.conf",
    "/etc/hosts",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/pki",
    "/etc/resolv.conf",
    "/etc/ssl",
];

/// Devices a command may write (`/dev/null` and its kin).
const DEVICES_RW: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];
/// Devices a command may read.
const DEVICES_RO: &[&str] = &["/dev/random", "/dev/urandom"];

/// Owner of the thread folders the sandboxed user must write, once antler knows it runs its
/// commands as another user (a root antler under `landlock` or `none`).
static FOLDER_OWNER: OnceLock<(u32, u32)> = OnceLock::new();

/// The user and group that must own a thread's writable folders, if not antler itself.
pub(crate) fn folder_owner() -> Option<(u32, u32)> {
    FOLDER_OWNER.get().copied()
}

/// The launcher: this binary when it is `antler`, else (a test binary in `target/*/deps`) the
/// `antler` built beside it.
pub(crate) fn launcher_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    if exe.file_stem().is_some_and(|stem| stem == "antler") {
        return Some(exe);
    }
    let beside = exe.parent()?.parent()?.join("antler");
    beside.is_file().then_some(beside)
}

/// A working sandbox: how every command of the shell runs.
#[derive(Debug, Clone)]
pub(crate) struct Sandbox {
    backend: Backend,
    network: bool,
    limits: SandboxLimits,
    launcher: PathBuf,
    /// bubblewrap, for [`Backend::Bwrap`].
    bwrap: Option<PathBuf>,
    /// The user the launcher (or bubblewrap) starts as, when antler is root.
    run_as: Option<(u32, u32)>,
    /// The proxy, with the network.
    egress: Option<Egress>,
}

impl Sandbox {
    /// A sandbox of `backend` (not yet proven: [`detect`] runs the probe).
    pub(crate) fn new(
        backend: Backend,
        network: bool,
        limits: SandboxLimits,
        launcher: PathBuf,
        bwrap: Option<PathBuf>,
    ) -> Self {
        let root = rustix::process::geteuid().is_root();
        // Under bubblewrap too: its user namespace would map the command to host root, for
        // whom the kernel does not enforce RLIMIT_NPROC.
        let run_as = root.then_some((SANDBOX_UID, SANDBOX_GID));
        Self {
            backend,
            network,
            limits,
            launcher,
            bwrap,
            run_as,
            egress: None,
        }
    }

    /// The same, with commands' connections going through the proxy at `egress`.
    pub(crate) fn with_egress(mut self, egress: Option<Egress>) -> Self {
        self.egress = egress;
        self
    }

    /// The proxy URL commands are given (`HTTP_PROXY`), with the network.
    pub(crate) fn proxy_url(&self) -> Option<String> {
        let egress = self.egress.as_ref().filter(|_| self.network)?;
        let port = match self.backend {
            Backend::Bwrap => RELAY_PORT,
            Backend::Landlock | Backend::None => egress.port,
        };
        Some(format!("http://127.0.0.1:{port}"))
    }

    /// The backend commands run under.
    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether commands may use the network.
    pub(crate) fn network(&self) -> bool {
        self.network
    }

    /// The user commands run as on the host, when it is not antler's.
    pub(crate) fn run_as(&self) -> Option<(u32, u32)> {
        self.run_as
    }

    /// Makes the thread folders the given owner's from now on (see [`folder_owner`]).
    pub(crate) fn adopt_folders(&self) {
        if let Some(owner) = self.run_as {
            let _ = FOLDER_OWNER.set(owner);
        }
    }

    /// The launcher's spec for `command` in `folders`, with `time_limit` left for the call.
    pub(crate) fn spec(&self, folders: &Folders, command: &str, time_limit: Duration) -> Spec {
        let cpu_secs = self
            .limits
            .cpu_secs
            .unwrap_or_else(|| time_limit.as_secs() + u64::from(time_limit.subsec_nanos() > 0))
            .max(1);
        let existing = |paths: &[&str]| -> Vec<PathBuf> {
            paths
                .iter()
                .map(PathBuf::from)
                .filter(|p| p.exists())
                .collect()
        };
        let mut read_only = existing(SYSTEM_PATHS);
        read_only.extend(existing(ETC_PATHS));
        read_only.extend(existing(DEVICES_RO));
        read_only.push(PathBuf::from("/proc"));
        read_only.push(folders.uploads.clone());
        read_only.extend(folders.skills.iter().cloned());
        let list_only = folders
            .workspace
            .parent()
            .map(Path::to_path_buf)
            .into_iter()
            .collect();
        let mut read_write = existing(DEVICES_RW);
        read_write.extend([folders.workspace.clone(), folders.outputs.clone()]);
        match self.backend {
            // A private tmpfs.
            Backend::Bwrap => read_write.push(PathBuf::from("/tmp")),
            Backend::Landlock | Backend::None => read_write.push(folders.tmp.clone()),
        }
        let egress = self.egress.as_ref().filter(|_| self.network);
        let (egress_port, relay_to) = match (self.backend, egress) {
            (_, None) => (None, None),
            (Backend::Bwrap, Some(_)) => {
                (Some(RELAY_PORT), Some(PathBuf::from(bwrap::EGRESS_INSIDE)))
            }
            (Backend::Landlock | Backend::None, Some(egress)) => (Some(egress.port), None),
        };
        Spec {
            backend: self.backend,
            network: self.network,
            limits: self.limits,
            cpu_secs,
            read_only,
            read_write,
            list_only,
            workdir: folders.workspace.clone(),
            command: command.to_owned(),
            egress_port,
            relay_to,
            probe_hidden: None,
            run_as: self.run_as.filter(|_| self.backend != Backend::Bwrap),
        }
    }

    /// The process that runs `spec`: the launcher, under bubblewrap for [`Backend::Bwrap`],
    /// with the environment `env` only. Its stdin is the control pipe: closing it stops the
    /// command and everything it started.
    pub(crate) fn command(
        &self,
        spec: &Spec,
        env: &[(String, String)],
    ) -> Result<tokio::process::Command, serde_json::Error> {
        let spec_json = serde_json::to_string(spec)?;
        let mut cmd = match (self.backend, &self.bwrap) {
            (Backend::Bwrap, Some(bwrap)) => {
                let mut cmd = tokio::process::Command::new(bwrap);
                let egress = self.egress.as_ref().filter(|_| self.network);
                cmd.args(bwrap::args(
                    spec,
                    &self.launcher,
                    egress.map(|e| e.unix.as_path()),
                ));
                cmd.arg(LAUNCHER_ARG).arg(spec_json);
                // Killed with its process group when the call is dropped; its PID namespace
                // takes everything inside along.
                cmd.process_group(0);
                // Its user namespace would otherwise map the command to host root, for whom
                // the kernel does not enforce RLIMIT_NPROC.
                if let Some((uid, gid)) = self.run_as {
                    cmd.uid(uid).gid(gid);
                }
                cmd
            }
            // The launcher becomes `spec.run_as` itself (see [`Spec::run_as`]).
            _ => {
                let mut cmd = tokio::process::Command::new(&self.launcher);
                cmd.arg(LAUNCHER_ARG).arg(spec_json);
                cmd
            }
        };
        cmd.env_clear()
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(match self.backend {
                // bubblewrap changes into the workspace itself (`--chdir`).
                Backend::Bwrap => Path::new("/"),
                Backend::Landlock | Backend::None => spec.workdir.as_path(),
            })
            .stdin(Stdio::piped());
        Ok(cmd)
    }
}

/// Gives the sandbox's user what it needs of a thread (when commands run as another user):
/// see [`hand_over`]. Best effort: what fails shows as a command that cannot reach its folders.
pub(crate) fn prepare_folders(folders: &Folders, data_root: &Path) {
    if let Some(owner) = folder_owner() {
        hand_over(folders, data_root, owner);
    }
}

/// Makes the thread's writable folders (and the files antler wrote in its uploads) `owner`'s,
/// and the folders above them searchable. Everything inside the thread is reached beneath a
/// handle on the thread's folder with links refused, and each file is changed through the
/// descriptor that was checked (a regular file with one name): a link the command planted
/// cannot hand it anything outside.
fn hand_over(folders: &Folders, data_root: &Path, (uid, gid): (u32, u32)) {
    let Some(thread_root) = folders.workspace.parent() else {
        return;
    };
    let Ok(thread) = crate::beneath::Dir::open_trusted(thread_root) else {
        return;
    };
    let owner = (
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    );
    for folder in [
        &folders.workspace,
        &folders.outputs,
        &folders.uploads,
        &folders.tmp,
    ] {
        let Some(name) = folder.file_name() else {
            continue;
        };
        let Ok(dir) = thread.open_dir(Path::new(name)) else {
            continue;
        };
        let _ = dir.chown(owner.0, owner.1);
        if folder == &folders.uploads {
            for entry in dir.entries().unwrap_or_default() {
                if entry.kind != crate::beneath::EntryKind::File {
                    continue;
                }
                if let Ok(opened) = dir.open_file(Path::new(&entry.name), u64::MAX) {
                    let _ = rustix::fs::fchown(&opened.file, owner.0, owner.1);
                }
            }
        }
    }
    for dir in [data_root.to_path_buf(), data_root.join("threads")] {
        add_permission(&dir, 0o011);
    }
    // The thread's own folder lists its folders, as `/mnt/user-data` does to the model.
    add_permission(thread_root, 0o055);
}

/// `chmod +bits` of a folder (`0o011`: others may pass through, not list).
fn add_permission(dir: &Path, bits: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & bits != bits {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | bits));
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    #[test]
    fn handing_the_folders_over_never_follows_a_planted_link() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: only root can hand folders to another user");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let thread = dir.path().join("threads/t1");
        let folders = Folders {
            workspace: thread.join("workspace"),
            outputs: thread.join("outputs"),
            uploads: thread.join("uploads"),
            tmp: thread.join("tmp"),
            skills: Vec::new(),
        };
        for folder in [
            &folders.workspace,
            &folders.outputs,
            &folders.uploads,
            &folders.tmp,
        ] {
            std::fs::create_dir_all(folder).unwrap();
        }
        let outside = dir.path().join("antler.toml");
        std::fs::write(&outside, "secret").unwrap();
        std::fs::write(folders.uploads.join("report.pdf"), "mine").unwrap();
        std::os::unix::fs::symlink(&outside, folders.uploads.join("link")).unwrap();
        std::fs::hard_link(&outside, folders.uploads.join("hard")).unwrap();
        hand_over(&folders, dir.path(), (SANDBOX_UID, SANDBOX_GID));
        let uid = |path: &Path| std::fs::symlink_metadata(path).unwrap().uid();
        for folder in [
            &folders.workspace,
            &folders.outputs,
            &folders.uploads,
            &folders.tmp,
        ] {
            assert_eq!(uid(folder), SANDBOX_UID, "{}", folder.display());
        }
        assert_eq!(uid(&folders.uploads.join("report.pdf")), SANDBOX_UID);
        assert_eq!(
            uid(&outside),
            0,
            "a link led the hand-over outside the thread"
        );
        let mode = |path: &Path| std::fs::metadata(path).unwrap().mode() & 0o777;
        assert_eq!(mode(dir.path()) & 0o011, 0o011);
        assert_eq!(mode(&thread) & 0o055, 0o055);
    }
}
