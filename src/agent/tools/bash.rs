//! `bash`: runs a shell command in the thread's workspace, inside the sandbox.
//!
//! What the model writes is hostile, so one call is bounded in every direction:
//! - **Isolation.** Every command runs under antler's sandbox launcher ([`crate::sandbox`]):
//!   `bwrap` (bubblewrap's namespaces, then Landlock), `landlock` (where user namespaces are
//!   not allowed) or, only when configured explicitly, `none`; in every backend the command
//!   has no capabilities, runs as an unprivileged user when antler is root, under a seccomp
//!   filter, with no network unless `network = true`, and within `[agent.tools.bash.limits]`.
//!   The tool is offered only when a backend works ([`crate::sandbox::detect`] proves it at
//!   start, in the background: [`super::probed_bash`]).
//! - **Paths.** Virtual paths (`/mnt/user-data/{workspace,uploads,outputs}`) in the command
//!   become the thread's host folders before it runs, and host folders in the output become
//!   virtual paths again (both longest prefix first, [`ThreadFolders::to_host`] and
//!   [`ThreadFolders::to_virtual`]). The working directory and `HOME` are the workspace. The
//!   run's skills work the same way: `/mnt/skills/<name>` becomes the skill's host folder,
//!   which the sandbox mounts (bubblewrap) or allows (Landlock) read-only.
//! - **Time and processes.** When the call's deadline passes, the run is stopped or the call
//!   is dropped for any reason, antler closes the launcher's control pipe and the launcher
//!   kills the command's whole tree (it is their subreaper, so a `setsid` or double-forked
//!   process is found too); when the command itself ends, whatever it left running is killed
//!   the same way: a call never outlives itself.
//! - **Output.** stdout and stderr share one pipe, so they interleave as in a terminal. At
//!   most `max_output_bytes` (64 KiB) are kept, the rest is counted and dropped, and the
//!   model is told how much was cut; a command that writes more than [`MAX_DRAIN_BYTES`] is
//!   stopped. The exit code (or the signal) is always reported.
//! - **Environment.** It starts empty: only `PATH`, `HOME` (the workspace), `LANG`, `TERM=dumb`,
//!   a few pager settings and, without a private `/tmp`, `TMPDIR` (the thread's `tmp/`) are
//!   set, so no API key, token or other setting of antler's reaches the command (DeerFlow
//!   filters its environment by name patterns such as `*KEY*`; an allowlist cannot miss a
//!   secret named `OPENAI_ORG` or `DATABASE_URL`).
//!
//! Where it differs from DeerFlow: DeerFlow's local sandbox turns bash off by default
//! (`allow_host_bash: false`) and caps output at 20,000 characters cut in the middle. Here the
//! tool is on but admin-only (the guardrail's default), always sandboxed unless configured
//! otherwise, and keeps the head of the output: the start of a log or a listing is where
//! commands put what matters, and the model is told how to read the rest from a file.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::AsyncReadExt as _;

use super::{Tool, ToolContext, ToolError, parse_arguments};
use crate::agent::input::ThreadFolders;
use crate::agent::model::ToolSpec;
use crate::agent::skills::SkillMounts;
use crate::sandbox::{
    Backend, Folders, SETUP_FAILED, SETUP_FAILED_PREFIX, Sandbox, SandboxLimits, SandboxMode,
};

/// The tool's name.
pub(crate) const TOOL_NAME: &str = "bash";

/// A command that writes more than this is stopped: what is beyond `max_output_bytes` is
/// dropped anyway, and reading it only burns CPU until the deadline.
pub(crate) const MAX_DRAIN_BYTES: u64 = 64 * 1024 * 1024;

/// The largest `max_output_bytes` accepted.
pub(crate) const MAX_OUTPUT_BYTES_LIMIT: usize = 16 * 1024 * 1024;

/// How long the output of a finished command is still read before the rest is given up.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(5);

/// How long a launcher asked to stop may take before its process group is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// `PATH` when antler's own is not set.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// `[agent.tools.bash]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct BashConfig {
    /// Whether the tool is offered (the guardrail still decides who may call it).
    pub(crate) enabled: bool,
    /// `auto`, `bwrap`, `landlock` or `none`.
    pub(crate) sandbox: SandboxMode,
    /// Whether commands may use the network.
    pub(crate) network: bool,
    /// At most this many bytes of output are shown to the model.
    pub(crate) max_output_bytes: usize,
    /// What one command may use.
    pub(crate) limits: SandboxLimits,
}

impl Default for BashConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            sandbox: SandboxMode::Auto,
            network: false,
            max_output_bytes: 64 * 1024,
            limits: SandboxLimits::default(),
        }
    }
}

/// The `bash` tool.
#[derive(Debug)]
pub(crate) struct BashTool {
    sandbox: Sandbox,
    max_output_bytes: usize,
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
    /// The tool, running its commands in `sandbox`.
    pub(crate) fn new(cfg: &BashConfig, sandbox: Sandbox) -> Self {
        sandbox.adopt_folders();
        Self {
            sandbox,
            max_output_bytes: Self::output_limit(cfg),
        }
    }

    /// How much output a call keeps under `cfg`.
    pub(crate) fn output_limit(cfg: &BashConfig) -> usize {
        cfg.max_output_bytes.clamp(1, MAX_OUTPUT_BYTES_LIMIT)
    }
}

/// The thread's folders as the sandbox confines a command to them.
fn sandbox_folders(folders: &ThreadFolders, skills: &SkillMounts) -> Folders {
    Folders {
        workspace: folders.workspace(),
        outputs: folders.outputs(),
        uploads: folders.uploads(),
        tmp: folders.tmp(),
        skills: skills.folders(),
    }
}

/// The environment a command gets: nothing of antler's but `PATH`.
fn scrubbed_env(workspace: &Path, tmp: Option<&Path>) -> Vec<(String, String)> {
    let path = std::env::var("PATH")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PATH.to_owned());
    let mut env = vec![
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
    ];
    if let Some(tmp) = tmp {
        env.push(("TMPDIR".to_owned(), tmp.display().to_string()));
    }
    env
}

/// The running launcher (or, [`Watch::own_group`], a host program leading its own process
/// group). Dropping it (the call ended, timed out or was cancelled) closes the control pipe,
/// which makes the launcher kill the command's whole tree and exit; a launcher that does not
/// exit within [`STOP_GRACE`] is killed with its process group. A host program's group is
/// killed at once, also when the program itself ended: what it left running goes with it.
struct Running {
    child: Option<tokio::process::Child>,
    control: Option<tokio::process::ChildStdin>,
    /// The process group to kill when stopping: a host program's own (no launcher).
    group: Option<rustix::process::Pid>,
}

/// Kills process group `group`.
fn kill_group(group: rustix::process::Pid) {
    // ESRCH: the group is already gone, which is what we want.
    let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
}

impl Running {
    /// Asks the launcher to stop everything now (kills a host program's group).
    fn stop(&mut self) {
        self.control = None;
        if let Some(group) = self.group {
            kill_group(group);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.control = None;
        if let Some(group) = self.group {
            kill_group(group);
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        let group = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw);
        let kill = move || {
            if let Some(group) = group {
                kill_group(group);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if tokio::time::timeout(STOP_GRACE, child.wait())
                        .await
                        .is_err()
                    {
                        kill();
                        let _ = child.wait().await;
                    }
                });
            }
            Err(_) => kill(),
        }
    }
}

/// What a finished command left for the model.
#[derive(Debug)]
pub(crate) struct Finished {
    /// The kept head of the output.
    pub(crate) kept: Vec<u8>,
    /// All output bytes, kept or not.
    pub(crate) total: u64,
    /// The exit code, or how it was stopped.
    pub(crate) status: String,
    /// Whether it exited with code 0.
    pub(crate) success: bool,
    /// Why antler stopped it early, if it did.
    pub(crate) stopped: Option<String>,
}

/// Receives each piece of a command's output as it comes.
pub(crate) type OutputSink<'a> = &'a mut (dyn FnMut(&[u8]) + Send);

/// How [`run_watched`] watches a started command.
pub(crate) struct Watch<'a> {
    /// At most this many bytes of output are kept.
    pub(crate) cap: usize,
    /// When it is stopped (`None`: only when the caller drops the call).
    pub(crate) deadline: Option<tokio::time::Instant>,
    /// Stops it when cancelled.
    pub(crate) cancel: Option<tokio_util::sync::CancellationToken>,
    /// Gets the output as it comes.
    pub(crate) output: Option<OutputSink<'a>>,
    /// The command is a host program that leads its own process group (no launcher):
    /// stopping it, and its end, kill that group.
    pub(crate) own_group: bool,
}

/// Reads `pipe` into `kept` (at most `cap` bytes), counting the rest and handing each piece
/// to `output`; `Err` once more than [`MAX_DRAIN_BYTES`] came.
async fn pump(
    pipe: &mut tokio::net::unix::pipe::Receiver,
    kept: &mut Vec<u8>,
    total: &mut u64,
    cap: usize,
    output: &mut Option<OutputSink<'_>>,
) -> std::io::Result<bool> {
    let mut buffer = [0_u8; 16 * 1024];
    let n = pipe.read(&mut buffer).await?;
    if n == 0 {
        return Ok(false);
    }
    *total += n as u64;
    let room = cap.saturating_sub(kept.len());
    kept.extend_from_slice(buffer.get(..n.min(room)).unwrap_or_default());
    if let Some(output) = output.as_mut() {
        output(buffer.get(..n).unwrap_or_default());
    }
    Ok(*total <= MAX_DRAIN_BYTES)
}

async fn run(command: tokio::process::Command, cap: usize) -> Result<Finished, ToolError> {
    run_watched(
        command,
        Watch {
            cap,
            deadline: None,
            cancel: None,
            output: None,
            own_group: false,
        },
    )
    .await
}

/// Runs `command` with stdout and stderr on one pipe, bounded as [`Watch`] says: a flood of
/// output, the deadline or the cancellation stop it (and its whole tree).
pub(crate) async fn run_watched(
    mut command: tokio::process::Command,
    watch: Watch<'_>,
) -> Result<Finished, ToolError> {
    let Watch {
        cap,
        deadline,
        cancel,
        mut output,
        own_group,
    } = watch;
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
    command.stdout(writer).stderr(writer_too);
    let mut child = command.spawn().map_err(|e| {
        failed(
            if own_group {
                "cannot start the program"
            } else {
                "cannot start the sandbox"
            },
            e,
        )
    })?;
    // The parent's copies of the write end must go, or the pipe never reports its end.
    drop(command);
    let group = own_group
        .then(|| child.id().and_then(|id| i32::try_from(id).ok()))
        .flatten()
        .and_then(rustix::process::Pid::from_raw);
    let mut running = Running {
        control: child.stdin.take(),
        child: Some(child),
        group,
    };
    let deadline = async {
        match deadline {
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let cancelled = async {
        match &cancel {
            Some(cancel) => cancel.cancelled().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(cancelled);

    let mut kept = Vec::new();
    let mut total = 0_u64;
    let mut stopped = None;
    let mut open = true;
    let status = loop {
        let Some(child) = running.child.as_mut() else {
            return Err(ToolError::Failed("lost the sandbox".to_owned()));
        };
        tokio::select! {
            status = child.wait() => break status,
            more = pump(&mut pipe, &mut kept, &mut total, cap, &mut output), if open => match more {
                Ok(true) => {}
                Ok(false) | Err(_) => open = false,
            },
            () = &mut deadline, if stopped.is_none() => {
                stopped = Some("it did not finish in time".to_owned());
                running.stop();
            }
            () = &mut cancelled, if stopped.is_none() => {
                stopped = Some("it was stopped".to_owned());
                running.stop();
            }
        }
        if total > MAX_DRAIN_BYTES && stopped.is_none() {
            stopped = Some(format!(
                "it wrote more than {} MiB of output",
                MAX_DRAIN_BYTES / (1024 * 1024)
            ));
            running.stop();
        }
    };
    if let Some(group) = running.group.take() {
        // A host program's leftovers hold the pipe open; the launcher kills its own. Once
        // only: with the program reaped, its id may be reused once its group is empty.
        kill_group(group);
    }
    // The launcher killed what the command left, so the write ends are closed; what is left
    // in the pipe is read (bounded, in case something held on to it).
    let drain = async {
        while open {
            match pump(&mut pipe, &mut kept, &mut total, cap, &mut output).await {
                Ok(true) => {}
                Ok(false) | Err(_) => open = false,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, drain).await;
    let status = status.map_err(|e| failed("lost the sandbox", e))?;
    if !own_group && status.code() == Some(SETUP_FAILED) {
        let text = String::from_utf8_lossy(&kept);
        if let Some(why) = text
            .lines()
            .find_map(|l| l.strip_prefix(SETUP_FAILED_PREFIX))
        {
            return Err(ToolError::Failed(format!(
                "the sandbox could not be set up, so the command did not run: {why}"
            )));
        }
    }
    Ok(Finished {
        kept,
        total,
        status: describe(status),
        success: status.success(),
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
fn render(finished: &Finished, folders: &ThreadFolders, skills: &SkillMounts) -> String {
    let text = String::from_utf8_lossy(&finished.kept);
    // A cut in the middle of a character shows as one replacement character at the end.
    let mut out = folders.to_virtual_with(text.trim_end_matches('\n'), skills);
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
        bash_spec(self.sandbox.network(), self.max_output_bytes)
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
        cx.folders
            .create()
            .await
            .map_err(|e| ToolError::Failed(format!("the workspace is not available: {e}")))?;
        let folders = sandbox_folders(&cx.folders, &cx.skills);
        crate::sandbox::prepare_folders(&folders, &cx.folders.data_root());
        let host_command = cx.folders.to_host_with(&command, &cx.skills);
        let time_limit = cx
            .deadline
            .saturating_duration_since(tokio::time::Instant::now());
        let spec = self.sandbox.spec(&folders, &host_command, time_limit);
        let tmp = (self.sandbox.backend() != Backend::Bwrap).then_some(folders.tmp.as_path());
        let mut env = scrubbed_env(&folders.workspace, tmp);
        if let Some(proxy) = self.sandbox.proxy_url() {
            for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                env.push((name.to_owned(), proxy.clone()));
            }
        }
        let command = self
            .sandbox
            .command(&spec, &env)
            .map_err(|e| ToolError::Failed(format!("cannot describe the command: {e}")))?;
        let finished = run(command, self.max_output_bytes).await?;
        Ok(render(&finished, &cx.folders, &cx.skills))
    }
}

/// The tool's spec: whether its commands may use the network, and how much output it keeps.
pub(crate) fn bash_spec(network: bool, max_output_bytes: usize) -> ToolSpec {
    let network = if network {
        "It may use the network."
    } else {
        "It has no network access."
    };
    ToolSpec {
        name: TOOL_NAME.to_owned(),
        description: format!(
            "Runs a bash command (`bash -c`) in /mnt/user-data/workspace and returns its \
             output (stdout and stderr together, at most {} bytes) and exit code. Use the \
             paths /mnt/user-data/workspace, /mnt/user-data/uploads (read-only) and \
             /mnt/user-data/outputs (files for the user). No input can be typed: use \
             non-interactive flags. Background processes are stopped when the command \
             ends. {network}",
            max_output_bytes
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant as StdInstant;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::agent::message::ToolCall;
    use crate::agent::tools::ToolRegistry;

    /// The tool under `backend`, or `None` (the test is skipped, saying why) when antler's
    /// binary, the launcher, has not been built beside the tests or the backend does not work.
    fn sandboxed(backend: Backend, max_output_bytes: usize) -> Option<BashTool> {
        let Some(launcher) = crate::sandbox::launcher_path() else {
            eprintln!("skipped: the antler binary (the sandbox launcher) is not built");
            return None;
        };
        let bwrap = crate::sandbox::find_on_path("bwrap", std::env::var("PATH").ok().as_deref());
        if backend == Backend::Bwrap && bwrap.is_none() {
            eprintln!("skipped: bubblewrap is not installed");
            return None;
        }
        let cfg = BashConfig {
            max_output_bytes,
            ..BashConfig::default()
        };
        let sandbox = Sandbox::new(backend, false, cfg.limits, launcher, bwrap);
        Some(BashTool::new(&cfg, sandbox))
    }

    /// The tool without isolation of the file system, or the test returns (skipped).
    macro_rules! plain {
        ($max:expr) => {
            match sandboxed(Backend::None, $max) {
                Some(tool) => tool,
                None => return,
            }
        };
    }

    async fn context(dir: &Path) -> ToolContext {
        // A root antler runs commands as an unprivileged user, who must pass through here.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
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
        let tool = plain!(64 * 1024);
        let out = bash(
            &tool,
            &cx,
            "echo hi > /mnt/user-data/workspace/a.txt && cat /mnt/user-data/workspace/a.txt \
             && pwd && echo $HOME && ls /mnt/user-data",
        )
        .await;
        assert_eq!(
            out,
            "hi\n/mnt/user-data/workspace\n/mnt/user-data/workspace\noutputs\ntmp\nuploads\nworkspace\n[exit code 0]"
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
        let out = bash(&plain!(1024), &cx, "echo out; echo err >&2; exit 3").await;
        assert_eq!(out, "out\nerr\n[exit code 3]");
        let out = bash(&plain!(1024), &cx, "true").await;
        assert_eq!(out, "(no output)\n[exit code 0]");
        let out = bash(&plain!(1024), &cx, "kill -9 $$").await;
        assert!(out.ends_with("[killed by signal 9]"), "{out}");
    }

    #[tokio::test]
    async fn the_environment_holds_nothing_of_antlers() {
        let dir = tempfile::tempdir().unwrap();
        let cx = context(dir.path()).await;
        let out = bash(&plain!(64 * 1024), &cx, "env | sort").await;
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
                    "TMPDIR",
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
        let out = bash(&plain!(1000), &cx, "head -c 300000 /dev/zero | tr '\\0' x").await;
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
        let out = bash(&plain!(100), &cx, "yes").await;
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
        let out = bash(&plain!(1024), &cx, "sleep 1000.123 & echo started").await;
        assert_eq!(out, "started\n[exit code 0]");
        assert!(gone("1000.123").await, "the background sleep survived");
    }

    #[tokio::test]
    async fn a_timed_out_or_cancelled_call_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let base = context(dir.path()).await;
        let mut registry = ToolRegistry::default();
        registry.register(Arc::new(plain!(1024)));
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
        let tool = plain!(1024);
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
}
