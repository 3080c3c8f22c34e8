//! Running an operator command: the program directly (no shell, no sandbox: it is vetted and
//! may need the network), its environment only what `env` lists, in its own process group,
//! which is killed when it times out, is stopped or ends; its output bounded, handed on as it
//! comes and reported with how it ended and how long it took. Each run is audited before it
//! starts (a run that cannot be audited does not start) and when it ends.

use std::os::fd::{AsFd as _, AsRawFd as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::OperatorCommand;
use crate::agent::input::{Role, ThreadFolders};
use crate::agent::middleware::sandbox_audit::append_audit_line;
use crate::agent::tools::bash::{Finished, OutputSink, Watch, run_watched};
use crate::beneath::Dir;

/// The most characters of one argv item written to the audit log.
const MAX_AUDIT_ITEM_CHARS: usize = 1024;

/// Who runs a command, from where, for the audit log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin<'a> {
    /// `chat` (typed) or `tool` (the model called it).
    pub(crate) via: &'static str,
    pub(crate) channel: &'a str,
    pub(crate) user_id: &'a str,
    pub(crate) role: Role,
    /// The conversation's thread.
    pub(crate) thread_id: &'a str,
}

/// How a run ended, as the chat and the model see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// The output (fenced), then how it ended and how long it took.
    pub(crate) text: String,
    /// Whether it failed (did not start, exited non-zero, was killed or stopped).
    pub(crate) failed: bool,
}

/// One run: the command, its argv, who runs it and what bounds it.
pub(crate) struct Run<'a> {
    pub(crate) command: &'a OperatorCommand,
    pub(crate) argv: Vec<String>,
    pub(crate) origin: Origin<'a>,
    /// The thread's folders: the workspace is where it runs unless `cwd` says otherwise.
    pub(crate) folders: Option<&'a ThreadFolders>,
    /// Stops it (`/stop`, a stopped agent run).
    pub(crate) cancel: Option<CancellationToken>,
    /// A deadline before the command's own `timeout_secs` (a tool call's).
    pub(crate) deadline: Option<Instant>,
    /// Gets the output as it comes.
    pub(crate) output: Option<OutputSink<'a>>,
}

/// Runs operator commands and audits them.
#[derive(Debug)]
pub(crate) struct Runner {
    audit_log: PathBuf,
    max_output_bytes: usize,
    /// One audit line at a time.
    writing: tokio::sync::Mutex<()>,
}

impl Runner {
    /// Audits to `<data_root>/audit/commands.log`; keeps at most `max_output_bytes` of output.
    pub(crate) fn new(data_root: &Path, max_output_bytes: usize) -> Self {
        Self {
            audit_log: data_root.join("audit").join("commands.log"),
            max_output_bytes: max_output_bytes.max(1),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    /// Runs it to its end; never fails, the outcome says what happened.
    pub(crate) async fn run(&self, run: Run<'_>) -> Outcome {
        let Run {
            command,
            argv,
            origin,
            folders,
            cancel,
            deadline,
            output,
        } = run;
        let name = &command.config.name;
        let failed = |why: String| Outcome {
            text: format!("❌ /{name} did not run: {why}"),
            failed: true,
        };
        if let Err(e) = self.audit(&origin, name, &argv, None).await {
            tracing::error!(command = %name, error = %e, "cannot write the command audit log; the command is refused");
            metrics::counter!("antler_command_audit_failures_total").increment(1);
            return failed("its run cannot be audited".to_owned());
        }
        let started = Instant::now();
        let finished = self
            .execute(command, &argv, folders, cancel, deadline, output)
            .await;
        let took = started.elapsed();
        let (outcome, exit) = match finished {
            Ok(finished) => (render(name, &finished, took), finished.status.clone()),
            Err(why) => (failed(why.clone()), format!("did not start: {why}")),
        };
        let end = End {
            exit: &exit,
            failed: outcome.failed,
            took,
        };
        if let Err(e) = self.audit(&origin, name, &argv, Some(&end)).await {
            tracing::error!(command = %name, error = %e, "cannot write the command audit log");
            metrics::counter!("antler_command_audit_failures_total").increment(1);
        }
        metrics::counter!(
            "antler_operator_commands_total",
            "command" => name.clone(),
            "outcome" => if outcome.failed { "failed" } else { "ok" }
        )
        .increment(1);
        outcome
    }

    async fn execute(
        &self,
        command: &OperatorCommand,
        argv: &[String],
        folders: Option<&ThreadFolders>,
        cancel: Option<CancellationToken>,
        deadline: Option<Instant>,
        output: Option<OutputSink<'_>>,
    ) -> Result<Finished, String> {
        let config = &command.config;
        let Some((program, args)) = argv.split_first() else {
            return Err("it has no program".to_owned());
        };
        // Held until the program started in it: its cwd is the handle, not a path that could
        // be swapped for a link in between.
        let mut workspace: Option<Dir> = None;
        let cwd = match (&config.cwd, folders) {
            (Some(cwd), _) => cwd.clone(),
            (None, Some(folders)) => {
                folders
                    .create()
                    .await
                    .map_err(|e| format!("the workspace is not available: {e}"))?;
                let path = folders.workspace();
                let dir = tokio::task::spawn_blocking(move || Dir::open_trusted(&path))
                    .await
                    .map_err(|e| format!("the workspace is not available: {e}"))?
                    .map_err(|e| format!("the workspace is not available: it {e}"))?;
                let cwd = PathBuf::from(format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd()));
                workspace = Some(dir);
                cwd
            }
            (None, None) => return Err("it has no folder to run in".to_owned()),
        };
        let mut process = tokio::process::Command::new(program);
        process
            .args(args)
            .env_clear()
            .envs(config.env.iter().map(|(k, v)| (k, v.expose())))
            .current_dir(cwd)
            .stdin(std::process::Stdio::null())
            .process_group(0);
        let limit = Instant::now() + Duration::from_secs(config.timeout_secs);
        let deadline = deadline.map_or(limit, |deadline| deadline.min(limit));
        let finished = run_watched(
            process,
            Watch {
                cap: self.max_output_bytes,
                deadline: Some(deadline),
                cancel,
                output,
                own_group: true,
            },
        )
        .await
        .map_err(|e| e.to_string());
        drop(workspace);
        finished
    }

    /// Appends the start (`end` is `None`) or the end of a run to the audit log.
    async fn audit(
        &self,
        origin: &Origin<'_>,
        name: &str,
        argv: &[String],
        end: Option<&End<'_>>,
    ) -> std::io::Result<()> {
        let time = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let argv: Vec<String> = argv
            .iter()
            .map(|item| item.chars().take(MAX_AUDIT_ITEM_CHARS).collect())
            .collect();
        let mut line = serde_json::json!({
            "time": time,
            "event": if end.is_some() { "end" } else { "start" },
            "command": name,
            "via": origin.via,
            "thread": origin.thread_id,
            "channel": origin.channel,
            "user": origin.user_id,
            "role": match origin.role {
                Role::Admin => "admin",
                Role::User => "user",
            },
            "argv": argv,
        });
        if let (Some(end), Some(fields)) = (end, line.as_object_mut()) {
            fields.insert("exit".to_owned(), end.exit.into());
            fields.insert("failed".to_owned(), end.failed.into());
            fields.insert(
                "duration_ms".to_owned(),
                u64::try_from(end.took.as_millis())
                    .unwrap_or(u64::MAX)
                    .into(),
            );
        }
        let _turn = self.writing.lock().await;
        append_audit_line(self.audit_log.clone(), line.to_string()).await
    }
}

/// How a run ended, for the audit log.
struct End<'a> {
    exit: &'a str,
    failed: bool,
    took: Duration,
}

/// The chat's and the model's view of a finished run.
fn render(name: &str, finished: &Finished, took: Duration) -> Outcome {
    let text = String::from_utf8_lossy(&finished.kept);
    let text = text.trim_end_matches('\n');
    let mut out = if text.is_empty() {
        "(no output)\n".to_owned()
    } else {
        fenced(text)
    };
    let kept = finished.kept.len() as u64;
    if finished.total > kept {
        out.push_str(&format!(
            "[output cut: showing the first {kept} of {} bytes]\n",
            finished.total
        ));
    }
    let failed = !finished.success || finished.stopped.is_some();
    let seconds = took.as_secs_f64();
    let ending = match &finished.stopped {
        Some(why) => format!("{} ({why})", finished.status),
        None => finished.status.clone(),
    };
    if failed {
        out.push_str(&format!("❌ /{name} failed: {ending} · {seconds:.1} s"));
    } else {
        out.push_str(&format!("✅ /{name} finished: {ending} · {seconds:.1} s"));
    }
    Outcome { text: out, failed }
}

/// `text` in a code block whose fence no run of backticks in it can close.
pub(crate) fn fenced(text: &str) -> String {
    let longest = text
        .split(|c| c != '`')
        .map(str::len)
        .max()
        .unwrap_or_default();
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}\n{text}\n{fence}\n")
}

/// Turns output bytes into text as they come: a character cut between two pieces waits for
/// the rest; bytes that are no UTF-8 become `�`.
#[derive(Debug, Default)]
pub(crate) struct Utf8Pieces {
    pending: Vec<u8>,
}

impl Utf8Pieces {
    /// The text `bytes` complete.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(text) => {
                    out.push_str(text);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(
                        self.pending.get(..valid).unwrap_or_default(),
                    ));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                    }
                }
            }
        }
    }
}
