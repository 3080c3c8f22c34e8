//! `bash`: runs a shell command in the thread's workspace.
//!
//! What the model writes is hostile, so one call is bounded in every direction:
//! - **Paths.** Virtual paths (`/mnt/user-data/{workspace,uploads,outputs}`) in the command
//!   become the thread's host folders before it runs, and host folders in the output become
//!   virtual paths again (both longest prefix first, [`ThreadFolders::to_host`] and
//!   [`ThreadFolders::to_virtual`]). The working directory and `HOME` are the workspace.
//! - **Time.** The command runs in a process group of its own; when the call's deadline
//!   passes, the run is stopped or the call is dropped for any reason, the whole group gets
//!   `SIGKILL`, so a `sleep 1000 &` left behind dies with it. When the command itself ends,
//!   whatever it left running in the background is killed too: a call never outlives itself.
//!   (A process that leaves the group on purpose, with `setsid`, escapes a plain run; under
//!   bwrap the PID namespace ends with the call and takes it along.)
//! - **Output.** stdout and stderr share one pipe, so they interleave as in a terminal. At
//!   most `max_output_bytes` (64 KiB) are kept, the rest is counted and dropped, and the
//!   model is told how much was cut; a command that writes more than [`MAX_DRAIN_BYTES`] is
//!   stopped. The exit code (or the signal) is always reported.
//! - **Environment.** It starts empty: only `PATH`, `HOME` (the workspace), `LANG`, `TERM=dumb`
//!   and a few pager settings are set, so no API key, token or other setting of antler's
//!   reaches the command (DeerFlow filters its environment by name patterns such as `*KEY*`;
//!   an allowlist cannot miss a secret named `OPENAI_ORG` or `DATABASE_URL`).
//! - **Isolation.** With `sandbox = "bwrap"` (or `"auto"` when bubblewrap is installed and
//!   works) the command runs under `bwrap`: the system read-only, only the thread's folders
//!   visible (workspace and outputs writable, uploads read-only as for the file tools), every
//!   namespace unshared (the network only when `network = true`), killed when antler dies.
//!   With `"none"` it runs as antler's user with antler's view of the file system: the
//!   guardrail (admin-only by default) and `sandbox_audit` are then the only fences.
//!
//! Where it differs from DeerFlow: DeerFlow's local sandbox turns bash off by default
//! (`allow_host_bash: false`) and caps output at 20,000 characters cut in the middle. Here the
//! tool is on but admin-only (the guardrail's default), isolated when bubblewrap works, and
//! keeps the head of the output: the start of a log or a listing is where commands put what
//! matters, and the model is told how to read the rest from a file.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::AsyncReadExt as _;

use super::{Tool, ToolContext, ToolError, parse_arguments};
use crate::agent::input::ThreadFolders;
use crate::agent::model::ToolSpec;

/// The tool's name.
pub(crate) const TOOL_NAME: &str = "bash";

/// A command that writes more than this is stopped: what is beyond `max_output_bytes` is
/// dropped anyway, and reading it only burns CPU until the deadline.
pub(crate) const MAX_DRAIN_BYTES: u64 = 64 * 1024 * 1024;

/// The largest `max_output_bytes` accepted.
pub(crate) const MAX_OUTPUT_BYTES_LIMIT: usize = 16 * 1024 * 1024;

/// How long the output of a finished command is still read (from processes that escaped its
/// group) before the rest is given up.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(5);

/// `PATH` when antler's own is not set.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// How the command is isolated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SandboxMode {
    /// bubblewrap when it is installed and works, else none.
    #[default]
    Auto,
    /// Always bubblewrap; a call fails when it cannot be used.
    Bwrap,
    /// A plain child process.
    None,
}

/// `[agent.tools.bash]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct BashConfig {
    /// Whether the tool is offered (the guardrail still decides who may call it).
    pub(crate) enabled: bool,
    /// `auto`, `bwrap` or `none`.
    pub(crate) sandbox: SandboxMode,
    /// Whether a sandboxed command may use the network (`none` cannot take it away).
    pub(crate) network: bool,
    /// At most this many bytes of output are shown to the model.
    pub(crate) max_output_bytes: usize,
}

impl Default for BashConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            sandbox: SandboxMode::Auto,
            network: true,
            max_output_bytes: 64 * 1024,
        }
    }
}

/// How a call ends up being run.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Runner {
    /// `bash -c` directly.
    Plain,
    /// Under the `bwrap` at this path.
    Bwrap(PathBuf),
    /// Cannot run: the reason, for the model.
    Unavailable(String),
}

/// The `bash` tool.
#[derive(Debug)]
pub(crate) struct BashTool {
    mode: SandboxMode,
    network: bool,
    max_output_bytes: usize,
    /// `bwrap` as found on `PATH` at start.
    bwrap: Option<PathBuf>,
    /// The runner, decided on the first call (`auto` tries bwrap once).
    runner: tokio::sync::OnceCell<Runner>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BashArguments {
    command: String,
    /// Some models explain their commands; accepted and ignored.
    #[serde(default)]
    #[allow(dead_code, reason = "accepted so such calls do not fail; not used")]
    description: Option<String>,
}

impl BashTool {
    /// The tool, or `None` when it is disabled.
    pub(crate) fn from_config(cfg: &BashConfig) -> Option<Self> {
        if !cfg.enabled {
            return None;
        }
        let path = std::env::var_os("PATH");
        let bwrap = match cfg.sandbox {
            SandboxMode::None => None,
            SandboxMode::Auto | SandboxMode::Bwrap => {
                find_on_path("bwrap", path.as_deref().and_then(|p| p.to_str()))
            }
        };
        if cfg.sandbox == SandboxMode::Bwrap && bwrap.is_none() {
            tracing::error!(
                "agent.tools.bash.sandbox is \"bwrap\" but bwrap is not on PATH; every bash call will fail"
            );
        }
        Some(Self {
            mode: cfg.sandbox,
            network: cfg.network,
            max_output_bytes: cfg.max_output_bytes.clamp(1, MAX_OUTPUT_BYTES_LIMIT),
            bwrap,
            runner: tokio::sync::OnceCell::new(),
        })
    }

    /// How calls run: decided once. `auto` checks that bwrap really works (user namespaces
    /// may be disabled), and falls back to a plain process only when the network need not
    /// be taken away.
    async fn runner(&self, folders: &ThreadFolders) -> &Runner {
        self.runner
            .get_or_init(|| async {
                match (self.mode, &self.bwrap) {
                    (SandboxMode::None, _) => Runner::Plain,
                    (SandboxMode::Bwrap, None) => Runner::Unavailable(
                        "the shell sandbox (bubblewrap) is configured but not installed".to_owned(),
                    ),
                    (SandboxMode::Bwrap, Some(bwrap)) => Runner::Bwrap(bwrap.clone()),
                    (SandboxMode::Auto, Some(bwrap)) if bwrap_works(bwrap, folders).await => {
                        tracing::info!(bwrap = %bwrap.display(), "bash runs under bubblewrap");
                        Runner::Bwrap(bwrap.clone())
                    }
                    (SandboxMode::Auto, _) if !self.network => Runner::Unavailable(
                        "the shell may not use the network, which needs bubblewrap, and \
                         bubblewrap is not available here"
                            .to_owned(),
                    ),
                    (SandboxMode::Auto, _) => {
                        tracing::warn!(
                            "bash runs without a sandbox: bubblewrap is not installed or does not work here"
                        );
                        Runner::Plain
                    }
                }
            })
            .await
    }

    /// The process to start for `command` (already in host paths).
    fn command(&self, runner: &Runner, folders: &ThreadFolders, command: &str) -> Command {
        let mut cmd = match runner {
            Runner::Bwrap(bwrap) => {
                let mut cmd = tokio::process::Command::new(bwrap);
                cmd.args(bwrap_args(folders, self.network, command));
                cmd
            }
            Runner::Plain | Runner::Unavailable(_) => {
                let mut cmd = tokio::process::Command::new("bash");
                cmd.arg("-c").arg(command);
                cmd
            }
        };
        cmd.env_clear()
            .envs(scrubbed_env(&folders.workspace()))
            .current_dir(folders.workspace())
            .stdin(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        Command(cmd)
    }
}

/// A command ready to start (a newtype so the spawning code stays in one place).
struct Command(tokio::process::Command);

/// The environment a command gets: nothing of antler's but `PATH`.
fn scrubbed_env(workspace: &Path) -> Vec<(String, String)> {
    let path = std::env::var("PATH")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PATH.to_owned());
    vec![
        ("PATH".to_owned(), path),
        ("HOME".to_owned(), workspace.display().to_string()),
        ("PWD".to_owned(), workspace.display().to_string()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ("LC_ALL".to_owned(), "C.UTF-8".to_owned()),
        ("TERM".to_owned(), "dumb".to_owned()),
        ("NO_COLOR".to_owned(), "1".to_owned()),
        ("PAGER".to_owned(), "cat".to_owned()),
        ("GIT_PAGER".to_owned(), "cat".to_owned()),
        ("GIT_TERMINAL_PROMPT".to_owned(), "0".to_owned()),
        ("DEBIAN_FRONTEND".to_owned(), "noninteractive".to_owned()),
    ]
}

/// The first executable file called `name` in the `PATH` list `path`.
fn find_on_path(name: &str, path: Option<&str>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;

    path?
        .split(':')
        .filter(|dir| dir.starts_with('/'))
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
}

/// System folders bound read-only into the sandbox (when they exist).
const SYSTEM_BINDS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/opt"];

/// Files and folders of `/etc` a shell needs (names, DNS, certificates, time zone) and
/// nothing more: `/etc` as a whole may hold antler's own config and its secrets.
const ETC_BINDS: &[&str] = &[
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

/// bwrap's arguments for `command`: the system read-only, the thread's folders at their real
/// paths (uploads read-only), a private `/tmp`, `/proc` and `/dev`, every namespace unshared
/// except the network when `network`, killed with its parent, then `bash -c command`.
pub(crate) fn bwrap_args(folders: &ThreadFolders, network: bool, command: &str) -> Vec<String> {
    let mut args: Vec<String> = ["--die-with-parent", "--new-session", "--unshare-all"]
        .map(str::to_owned)
        .to_vec();
    if network {
        args.push("--share-net".to_owned());
    }
    for path in SYSTEM_BINDS.iter().chain(ETC_BINDS) {
        args.extend([
            "--ro-bind-try".to_owned(),
            (*path).to_owned(),
            (*path).to_owned(),
        ]);
    }
    args.extend(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"].map(str::to_owned));
    let workspace = folders.workspace().display().to_string();
    let outputs = folders.outputs().display().to_string();
    let uploads = folders.uploads().display().to_string();
    args.extend(["--bind".to_owned(), workspace.clone(), workspace.clone()]);
    args.extend(["--bind".to_owned(), outputs.clone(), outputs]);
    args.extend(["--ro-bind".to_owned(), uploads.clone(), uploads]);
    args.extend(["--chdir".to_owned(), workspace]);
    args.extend(["--", "bash", "-c"].map(str::to_owned));
    args.push(command.to_owned());
    args
}

/// Whether bwrap can start a sandbox here (user namespaces may be disabled).
async fn bwrap_works(bwrap: &Path, folders: &ThreadFolders) -> bool {
    let mut cmd = tokio::process::Command::new(bwrap);
    cmd.args(bwrap_args(folders, false, "true"))
        .env_clear()
        .envs(scrubbed_env(&folders.workspace()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    matches!(
        tokio::time::timeout(Duration::from_secs(10), cmd.status()).await,
        Ok(Ok(status)) if status.success()
    )
}

/// Kills a process group when dropped: however a call ends (done, timed out, cancelled, its
/// future dropped), nothing it started keeps running.
struct GroupKill(Option<rustix::process::Pid>);

impl GroupKill {
    fn now(&mut self) {
        if let Some(pid) = self.0.take() {
            // ESRCH: the group is already gone, which is what we want.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.now();
    }
}

/// What a finished command left for the model.
#[derive(Debug)]
struct Finished {
    /// The kept head of the output.
    kept: Vec<u8>,
    /// All output bytes, kept or not.
    total: u64,
    /// The exit code, or how it was stopped.
    status: String,
    /// Why antler stopped it early, if it did.
    stopped: Option<String>,
}

/// Reads `pipe` into `kept` (at most `cap` bytes), counting the rest; `Err` once more than
/// [`MAX_DRAIN_BYTES`] came.
async fn pump(
    pipe: &mut tokio::net::unix::pipe::Receiver,
    kept: &mut Vec<u8>,
    total: &mut u64,
    cap: usize,
) -> std::io::Result<bool> {
    let mut buffer = [0_u8; 16 * 1024];
    let n = pipe.read(&mut buffer).await?;
    if n == 0 {
        return Ok(false);
    }
    *total += n as u64;
    let room = cap.saturating_sub(kept.len());
    kept.extend_from_slice(buffer.get(..n.min(room)).unwrap_or_default());
    Ok(*total <= MAX_DRAIN_BYTES)
}

async fn run(mut command: Command, cap: usize) -> Result<Finished, ToolError> {
    let failed = |what: &str, e: std::io::Error| ToolError::Failed(format!("{what}: {e}"));
    let (writer, mut pipe) =
        tokio::net::unix::pipe::pipe().map_err(|e| failed("cannot make a pipe", e))?;
    // The child writes blocking, like to any terminal or file.
    let writer = writer
        .into_blocking_fd()
        .map_err(|e| failed("cannot make a pipe", e))?;
    let writer_too = writer
        .try_clone()
        .map_err(|e| failed("cannot make a pipe", e))?;
    command.0.stdout(writer).stderr(writer_too);
    let mut child = command
        .0
        .spawn()
        .map_err(|e| failed("cannot start the shell", e))?;
    let mut group = GroupKill(
        child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw),
    );
    // The parent's copies of the write end must go, or the pipe never reports its end.
    drop(command);

    let mut kept = Vec::new();
    let mut total = 0_u64;
    let mut stopped = None;
    let mut open = true;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            more = pump(&mut pipe, &mut kept, &mut total, cap), if open => match more {
                Ok(true) => {}
                Ok(false) | Err(_) => open = false,
            },
        }
        if total > MAX_DRAIN_BYTES && stopped.is_none() {
            stopped = Some(format!(
                "it wrote more than {} MiB of output",
                MAX_DRAIN_BYTES / (1024 * 1024)
            ));
            group.now();
        }
    };
    // Background processes die with the command; their write ends close, and what is left
    // in the pipe is read (bounded, in case something escaped the group).
    group.now();
    let drain = async {
        while open {
            match pump(&mut pipe, &mut kept, &mut total, cap).await {
                Ok(true) => {}
                Ok(false) | Err(_) => open = false,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, drain).await;
    let status = status.map_err(|e| failed("lost the shell", e))?;
    Ok(Finished {
        kept,
        total,
        status: describe(status),
        stopped,
    })
}

/// `exit code 0`, `killed by signal 9`.
fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;

    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "ended".to_owned(),
    }
}

/// The model's view of a finished command: its output (virtual paths), a note when it was
/// cut, and how it ended.
fn render(finished: &Finished, folders: &ThreadFolders) -> String {
    let text = String::from_utf8_lossy(&finished.kept);
    // A cut in the middle of a character shows as one replacement character at the end.
    let mut out = folders.to_virtual(text.trim_end_matches('\n'));
    if out.is_empty() {
        out.push_str("(no output)");
    }
    out.push('\n');
    let kept = finished.kept.len() as u64;
    if finished.total > kept {
        out.push_str(&format!(
            "[output cut: showing the first {kept} of {} bytes; redirect to a file under \
             /mnt/user-data/workspace and read parts of it to see more]\n",
            finished.total
        ));
    }
    if let Some(why) = &finished.stopped {
        out.push_str(&format!("[stopped by antler: {why}]\n"));
    }
    out.push_str(&format!("[{}]", finished.status));
    out
}

#[async_trait::async_trait]
impl Tool for BashTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: TOOL_NAME.to_owned(),
            description: format!(
                "Runs a bash command (`bash -c`) in /mnt/user-data/workspace and returns its \
                 output (stdout and stderr together, at most {} bytes) and exit code. Use the \
                 paths /mnt/user-data/workspace, /mnt/user-data/uploads (read-only) and \
                 /mnt/user-data/outputs (files for the user). No input can be typed: use \
                 non-interactive flags. Background processes are stopped when the command \
                 ends.",
                self.max_output_bytes
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The bash command to run."},
                    "description": {"type": "string", "description": "Optional: why you run it, in a few words."}
                },
                "required": ["command"],
                "additionalProperties": false
            }),
        }
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        cx: &ToolContext,
    ) -> Result<String, ToolError> {
        let BashArguments { command, .. } = parse_arguments(arguments)?;
        if command.trim().is_empty() {
            return Err(ToolError::InvalidArguments("`command` is empty".to_owned()));
        }
        if command.contains('\0') {
            return Err(ToolError::InvalidArguments(
                "`command` contains a NUL byte".to_owned(),
            ));
        }
        let runner = self.runner(&cx.folders).await;
        if let Runner::Unavailable(why) = runner {
            return Err(ToolError::Failed(format!("the shell cannot run: {why}")));
        }
        tokio::fs::create_dir_all(cx.folders.workspace())
            .await
            .map_err(|e| ToolError::Failed(format!("the workspace is not available: {e}")))?;
        let host_command = cx.folders.to_host(&command);
        let finished = run(
            self.command(runner, &cx.folders, &host_command),
            self.max_output_bytes,
        )
        .await?;
        Ok(render(&finished, &cx.folders))
    }
}

/// The shell tool, for the registry, when enabled.
pub(crate) fn bash_tool(cfg: &BashConfig) -> Option<Arc<dyn Tool>> {
    BashTool::from_config(cfg).map(|tool| Arc::new(tool) as Arc<dyn Tool>)
}

#[cfg(test)]
mod tests {
    use std::time::Instant as StdInstant;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::agent::message::ToolCall;
    use crate::agent::tools::ToolRegistry;

    fn plain(max_output_bytes: usize) -> BashTool {
        BashTool::from_config(&BashConfig {
            sandbox: SandboxMode::None,
            max_output_bytes,
            ..BashConfig::default()
        })
        .unwrap()
    }

    async fn context(dir: &Path) -> ToolContext {
        let folders = ThreadFolders::new(dir, "t1").unwrap();
        folders.create().await.unwrap();
        ToolContext {
            folders,
            ..crate::agent::tools::tests::context()
        }
    }

    async fn bash(tool: &BashTool, cx: &ToolContext, command: &str) -> String {
        tool.call(json!({ "command": command }), cx).await.unwrap()
    }

    #[tokio::test]
    async fn runs_in_the_workspace_with_virtual_paths_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let cx = context(dir.path()).await;
        let tool = plain(64 * 1024);
        let out = bash(
            &tool,
            &cx,
            "echo hi > /mnt/user-data/workspace/a.txt && cat /mnt/user-data/workspace/a.txt \
             && pwd && echo $HOME && ls /mnt/user-data",
        )
        .await;
        assert_eq!(
            out,
            "hi\n/mnt/user-data/workspace\n/mnt/user-data/workspace\noutputs\nuploads\nworkspace\n[exit code 0]"
        );
        assert_eq!(
            std::fs::read_to_string(cx.folders.workspace().join("a.txt")).unwrap(),
            "hi\n"
        );
        assert!(!out.contains(&dir.path().display().to_string()), "{out}");
    }

    #[tokio::test]
    async fn stderr_and_the_exit_code_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let cx = context(dir.path()).await;
        let out = bash(&plain(1024), &cx, "echo out; echo err >&2; exit 3").await;
        assert_eq!(out, "out\nerr\n[exit code 3]");
        let out = bash(&plain(1024), &cx, "true").await;
        assert_eq!(out, "(no output)\n[exit code 0]");
        let out = bash(&plain(1024), &cx, "kill -9 $$").await;
        assert!(out.ends_with("[killed by signal 9]"), "{out}");
    }

    #[tokio::test]
    async fn the_environment_holds_nothing_of_antlers() {
        let dir = tempfile::tempdir().unwrap();
        let cx = context(dir.path()).await;
        let out = bash(&plain(64 * 1024), &cx, "env | sort").await;
        let names: Vec<&str> = out
            .lines()
            .filter_map(|line| line.split_once('=').map(|(name, _)| name))
            .collect();
        for name in &names {
            assert!(
                [
                    "PATH",
                    "HOME",
                    "PWD",
                    "LANG",
                    "LC_ALL",
                    "TERM",
                    "NO_COLOR",
                    "PAGER",
                    "GIT_PAGER",
                    "GIT_TERMINAL_PROMPT",
                    "DEBIAN_FRONTEND",
                    "SHLVL",
                    "_",
                    "OLDPWD"
                ]
                .contains(name),
                "unexpected variable {name} in\n{out}"
            );
        }
        assert!(out.contains("TERM=dumb"), "{out}");
        assert!(
            out.contains("HOME=/mnt/user-data/workspace"),
            "HOME is the workspace, shown virtual: {out}"
        );
        // Whatever the test process has (CARGO_*, RUST_*) stays out.
        assert!(!out.contains("CARGO"), "{out}");
    }

    #[tokio::test]
    async fn output_is_capped_with_a_note() {
        let dir = tempfile::tempdir().unwrap();
        let cx = context(dir.path()).await;
        let out = bash(&plain(1000), &cx, "head -c 300000 /dev/zero | tr '\\0' x").await;
        assert!(
            out.starts_with(&"x".repeat(1000)) && !out.starts_with(&"x".repeat(1001)),
            "{}",
            &out[..1100.min(out.len())]
        );
        assert!(
            out.contains("[output cut: showing the first 1000 of 300000 bytes"),
            "{}",
            &out[1000..]
        );
        assert!(out.ends_with("[exit code 0]"), "{}", &out[1000..]);
    }

    #[tokio::test]
    async fn a_flood_of_output_is_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let cx = context(dir.path()).await;
        let out = bash(&plain(100), &cx, "yes").await;
        assert!(
            out.contains("[stopped by antler: it wrote more than 64 MiB"),
            "{out}"
        );
        assert!(out.ends_with("[killed by signal 9]"), "{out}");
    }

    /// Whether a process with `marker` in its command line is alive.
    fn alive(marker: &str) -> bool {
        std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(marker))
        })
    }

    async fn gone(marker: &str) -> bool {
        let start = StdInstant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if !alive(marker) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    #[tokio::test]
    async fn background_processes_die_when_the_command_ends() {
        let dir = tempfile::tempdir().unwrap();
        let cx = context(dir.path()).await;
        // A unique number of seconds marks this test's sleeper among other processes.
        let out = bash(&plain(1024), &cx, "sleep 1000.123 & echo started").await;
        assert_eq!(out, "started\n[exit code 0]");
        assert!(gone("1000.123").await, "the background sleep survived");
    }

    #[tokio::test]
    async fn a_timed_out_or_cancelled_call_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let base = context(dir.path()).await;
        let mut registry = ToolRegistry::default();
        registry.register(Arc::new(plain(1024)));
        let call = |command: &str| ToolCall {
            id: "c1".to_owned(),
            name: TOOL_NAME.to_owned(),
            arguments: json!({ "command": command }).to_string(),
        };

        let cx = ToolContext {
            deadline: tokio::time::Instant::now() + Duration::from_millis(500),
            ..base.clone()
        };
        let out = registry
            .call(&call("sleep 1000.234 & sleep 1000.235"), &cx)
            .await;
        assert!(
            out.is_error && out.content.contains("did not finish"),
            "{}",
            out.content
        );
        assert!(gone("1000.234").await && gone("1000.235").await);

        let cancel = CancellationToken::new();
        let cx = ToolContext {
            cancel: cancel.clone(),
            ..base
        };
        let stop = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            cancel.cancel();
        });
        let out = registry
            .call(&call("sleep 1000.345 & sleep 1000.346"), &cx)
            .await;
        stop.await.unwrap();
        assert!(
            out.is_error && out.content.contains("cancelled"),
            "{}",
            out.content
        );
        assert!(gone("1000.345").await && gone("1000.346").await);
    }

    #[tokio::test]
    async fn bad_commands_are_invalid_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let cx = context(dir.path()).await;
        let tool = plain(1024);
        for arguments in [
            json!({"command": "  "}),
            json!({"command": "a\u{0}b"}),
            json!({}),
        ] {
            let error = tool.call(arguments.clone(), &cx).await.unwrap_err();
            assert!(
                matches!(error, ToolError::InvalidArguments(_)),
                "{arguments}: {error}"
            );
        }
    }

    #[test]
    fn bwrap_arguments_confine_to_the_threads_folders() {
        let folders = ThreadFolders::new(Path::new("/data"), "t1").unwrap();
        let args = bwrap_args(&folders, false, "ls -la");
        let joined = args.join(" ");
        assert!(
            joined.starts_with("--die-with-parent --new-session --unshare-all "),
            "{joined}"
        );
        assert!(!args.contains(&"--share-net".to_owned()), "{joined}");
        assert!(
            joined.contains("--bind /data/threads/t1/workspace /data/threads/t1/workspace")
                && joined.contains("--bind /data/threads/t1/outputs /data/threads/t1/outputs")
                && joined.contains("--ro-bind /data/threads/t1/uploads /data/threads/t1/uploads")
                && joined.contains("--ro-bind-try /usr /usr")
                && joined.contains("--ro-bind-try /etc/resolv.conf /etc/resolv.conf")
                && joined.contains("--tmpfs /tmp")
                && joined.contains("--chdir /data/threads/t1/workspace"),
            "{joined}"
        );
        // Neither the store nor all of /etc is visible.
        assert!(!joined.contains("/data "), "{joined}");
        assert!(!args.iter().any(|a| a == "/etc" || a == "/"), "{joined}");
        assert_eq!(
            args.iter().rev().take(4).rev().collect::<Vec<_>>(),
            ["--", "bash", "-c", "ls -la"]
        );
        let with_net = bwrap_args(&folders, true, "true");
        assert_eq!(
            with_net.iter().position(|a| a == "--share-net"),
            Some(3),
            "{with_net:?}"
        );
    }

    #[test]
    fn bwrap_is_looked_up_on_path() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let fake = bin.join("bwrap");
        std::fs::write(&fake, "#!/bin/sh\n").unwrap();
        let path = format!("relative:/nonexistent:{}", bin.display());
        assert_eq!(find_on_path("bwrap", Some(&path)), None, "not executable");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_on_path("bwrap", Some(&path)), Some(fake));
        assert_eq!(find_on_path("bwrap", None), None);
    }

    #[tokio::test]
    async fn without_bwrap_the_modes_decide_the_runner() {
        let dir = tempfile::tempdir().unwrap();
        let folders = ThreadFolders::new(dir.path(), "t1").unwrap();
        let tool = |sandbox, network| BashTool {
            mode: sandbox,
            network,
            max_output_bytes: 10,
            bwrap: None,
            runner: tokio::sync::OnceCell::new(),
        };
        assert_eq!(
            *tool(SandboxMode::None, false).runner(&folders).await,
            Runner::Plain
        );
        assert_eq!(
            *tool(SandboxMode::Auto, true).runner(&folders).await,
            Runner::Plain
        );
        for (mode, network) in [(SandboxMode::Bwrap, true), (SandboxMode::Auto, false)] {
            let tool = tool(mode, network);
            assert!(
                matches!(tool.runner(&folders).await, Runner::Unavailable(_)),
                "{mode:?} network={network}"
            );
            let cx = ToolContext {
                folders: folders.clone(),
                ..crate::agent::tools::tests::context()
            };
            let error = tool
                .call(json!({"command": "echo ran"}), &cx)
                .await
                .unwrap_err();
            assert!(error.to_string().contains("cannot run"), "{error}");
        }
    }
}
