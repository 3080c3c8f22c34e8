//! tool_output_budget (chain position 7): keeps one tool result from flooding the context.
//!
//! In `after_tool`, a result longer than `max_chars` (12,000 characters, DeerFlow's
//! `externalize_min_chars`) is cut to its head and tail (`head_percent` 60 / 40, each end
//! moved to a line break when one is near) with a marker in between saying how much was left
//! out. The full text is saved under the thread's `outputs/tool-output/<call id>.txt` and the
//! marker gives the model its virtual path (`/mnt/user-data/outputs/tool-output/...`), so it
//! can read the part it needs with `read_file` and a line range. An error result stays an
//! error (`is_error` is kept).
//!
//! Where it differs from DeerFlow: DeerFlow exempts `read_file` entirely, so one read can
//! still put 256 KiB into the context. Here a long `read_file` result is cut like any other,
//! but not copied (the file is already there): the marker names the file and asks for a line
//! range instead. When the full text cannot be saved (no folders, a full disk), the result is
//! still cut and the marker says the rest is lost, rather than letting it through whole.
//!
//! Saved results are bounded per thread: `tool-output/` holds at most `quota_mb` (64 MiB) of
//! them, and the oldest are removed first to make room for a new one (a result larger than
//! the whole quota is not saved). The folder is written beneath a handle on the thread's
//! outputs with links refused ([`crate::beneath`]): the sandboxed shell can write outputs, and
//! a `tool-output` it turned into a link must not lead antler's writes out of the thread.
//!
//! Placement: after the guards (`guardrail`, `sandbox_audit`), before `summarization`. Its
//! `after_tool` runs in reverse chain order, so it cuts a result after the later middlewares
//! (loop detection, clarification) have seen it whole and before the guards' `after_tool`
//! (a sandbox warning appended there survives the cut) and before it is stored. It fails
//! open.

use std::ffi::OsStr;
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError, RunContext, ToolOutput};
use crate::agent::input::ThreadFolders;
use crate::agent::message::ToolCall;
use crate::agent::tools::paths::Area;
use crate::beneath::{EntryKind, Refused};

/// The folder under `outputs/` that holds full tool results.
pub(crate) const SAVE_FOLDER: &str = "tool-output";

/// `[agent.middleware.tool_output_budget]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ToolOutputBudgetConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
    /// Results longer than this many characters are cut (at least 1,000).
    pub(crate) max_chars: usize,
    /// The share of `max_chars` kept from the start, in percent (10 to 90); the rest is kept
    /// from the end.
    pub(crate) head_percent: usize,
    /// Whether the full text of a cut result is saved for the model to read.
    pub(crate) save_full: bool,
    /// The most MiB of saved results a thread keeps; the oldest go first.
    pub(crate) quota_mb: u64,
}

impl Default for ToolOutputBudgetConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_chars: 12_000,
            head_percent: 60,
            save_full: true,
            quota_mb: 64,
        }
    }
}

/// Cuts long tool results to head and tail, saving the full text.
#[derive(Debug, Clone)]
pub(crate) struct ToolOutputBudgetMiddleware {
    max_chars: usize,
    head_chars: usize,
    save_full: bool,
    quota_bytes: u64,
    /// Held while a result is saved, so concurrent calls cannot both fill the quota.
    saving: Arc<Mutex<()>>,
}

impl ToolOutputBudgetMiddleware {
    /// The middleware, or `None` when it is disabled.
    pub(crate) fn from_config(cfg: &ToolOutputBudgetConfig) -> Option<Self> {
        let max_chars = cfg.max_chars.max(1_000);
        cfg.enabled.then(|| Self {
            max_chars,
            head_chars: max_chars * cfg.head_percent.clamp(10, 90) / 100,
            save_full: cfg.save_full,
            quota_bytes: cfg.quota_mb.saturating_mul(1024 * 1024),
            saving: Arc::default(),
        })
    }
}

/// A file name for a call id: its safe characters only, at most 64 of them.
fn file_name(call_id: &str) -> String {
    let safe: String = call_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(64)
        .collect();
    if safe.is_empty() {
        "call".to_owned()
    } else {
        safe
    }
}

/// The byte index of the character at `chars` in `text` (its length when shorter).
fn byte_at(text: &str, chars: usize) -> usize {
    text.char_indices()
        .nth(chars)
        .map_or(text.len(), |(index, _)| index)
}

/// `text`'s head (`head_chars`) and tail (`tail_chars`), each end moved back/forward to a
/// line break when one lies within the last/first fifth of it.
fn head_and_tail(text: &str, head_chars: usize, tail_chars: usize) -> (&str, &str) {
    let total = text.chars().count();
    let head_end = byte_at(text, head_chars);
    let tail_start = byte_at(text, total.saturating_sub(tail_chars));
    let head = &text[..head_end];
    let head = match head.rfind('\n') {
        Some(at) if at >= head.len() - head.len() / 5 => &head[..=at],
        _ => head,
    };
    let tail = &text[tail_start..];
    let at_line_start = tail_start == 0 || text[..tail_start].ends_with('\n');
    let tail = match tail.find('\n') {
        Some(at) if !at_line_start && at <= tail.len() / 5 => &tail[at + 1..],
        _ => tail,
    };
    (head, tail)
}

/// Why a result was not saved.
#[derive(Debug, thiserror::Error)]
enum SaveError {
    #[error("outputs/{SAVE_FOLDER} {0}")]
    Refused(#[from] Refused),
    #[error("{size} bytes is more than the thread's quota of {quota} bytes for saved output")]
    OverQuota { size: u64, quota: u64 },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Saves `content` as `outputs/tool-output/<name>.txt` (`<name>-2.txt`, ... when that is
/// taken: some models number their calls afresh in every response), first removing the
/// oldest saved files while the folder would hold more than `quota` bytes; its virtual path.
/// Blocking.
fn save(
    folders: &ThreadFolders,
    name: &str,
    content: &str,
    quota: u64,
) -> Result<String, SaveError> {
    let size = content.len() as u64;
    if size > quota {
        return Err(SaveError::OverQuota { size, quota });
    }
    let folder = folders
        .open_area(Area::Outputs)?
        .create_dir_all(Path::new(SAVE_FOLDER))?;
    let mut saved: Vec<_> = folder
        .entries()?
        .into_iter()
        .filter(|entry| entry.kind == EntryKind::File)
        .collect();
    saved.sort_by(|a, b| (a.modified_ns, &a.name).cmp(&(b.modified_ns, &b.name)));
    let mut used: u64 = saved.iter().map(|entry| entry.size).sum();
    for oldest in &saved {
        if used + size <= quota {
            break;
        }
        folder.remove_file(&oldest.name)?;
        used = used.saturating_sub(oldest.size);
        metrics::counter!("antler_tool_output_evicted_total").increment(1);
    }
    for attempt in 1..=100 {
        let file_name = if attempt == 1 {
            format!("{name}.txt")
        } else {
            format!("{name}-{attempt}.txt")
        };
        match folder.create_new(OsStr::new(&file_name)) {
            Ok(mut file) => {
                file.write_all(content.as_bytes())?;
                return Ok(format!(
                    "{}/{SAVE_FOLDER}/{file_name}",
                    Area::Outputs.virtual_path()
                ));
            }
            Err(Refused::Io(e)) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(SaveError::Io(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        "100 saved results of this name exist already",
    )))
}

/// The `path` argument of a call, if it has one.
fn path_argument(call: &ToolCall) -> Option<String> {
    let arguments: serde_json::Value = serde_json::from_str(&call.arguments).ok()?;
    arguments.get("path")?.as_str().map(str::to_owned)
}

#[async_trait::async_trait]
impl Middleware for ToolOutputBudgetMiddleware {
    fn name(&self) -> &'static str {
        "tool_output_budget"
    }

    async fn after_tool(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
        output: &mut ToolOutput,
    ) -> Result<(), MiddlewareError> {
        let total = output.content.chars().count();
        if total <= self.max_chars {
            return Ok(());
        }
        let (head, tail) = head_and_tail(
            &output.content,
            self.head_chars,
            self.max_chars - self.head_chars,
        );
        let omitted = total - head.chars().count() - tail.chars().count();
        let whereabouts = if call.name == "read_file" {
            let file = path_argument(call).unwrap_or_else(|| "the file".to_owned());
            format!("read {file} in smaller parts with start_line and end_line")
        } else if !self.save_full {
            "the rest is not kept".to_owned()
        } else {
            let saved = match &cx.folders {
                Some(folders) => {
                    let folders = folders.clone();
                    let name = file_name(&call.id);
                    let content = output.content.clone();
                    let quota = self.quota_bytes;
                    let saving = Arc::clone(&self.saving);
                    tokio::task::spawn_blocking(move || {
                        let _saving = saving.lock().unwrap_or_else(|e| e.into_inner());
                        save(&folders, &name, &content, quota).map_err(|e| e.to_string())
                    })
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()))
                }
                None => Err("the thread has no folders".to_owned()),
            };
            match saved {
                Ok(path) => format!(
                    "the full output is saved at {path}; read the part you need with \
                     read_file and start_line/end_line"
                ),
                Err(error) => {
                    tracing::warn!(thread = %cx.thread.id, tool = %call.name, %error, "cannot save a long tool result");
                    "the full output could not be saved".to_owned()
                }
            }
        };
        metrics::counter!("antler_tool_output_cut_total").increment(1);
        output.content = format!(
            "{head}\n\n[… {omitted} of {total} characters left out: {whereabouts}.]\n\n{tail}"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::middleware::test_context;
    use crate::agent::thread::ThreadState;

    fn middleware() -> ToolOutputBudgetMiddleware {
        ToolOutputBudgetMiddleware::from_config(&ToolOutputBudgetConfig::default()).unwrap()
    }

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.to_owned(),
            name: name.to_owned(),
            arguments: arguments.to_owned(),
        }
    }

    async fn cut(
        folders: Option<ThreadFolders>,
        call: &ToolCall,
        mut output: ToolOutput,
    ) -> ToolOutput {
        let mut thread = ThreadState::new("t1".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        cx.folders = folders;
        middleware()
            .after_tool(&mut cx, call, &mut output)
            .await
            .unwrap();
        output
    }

    /// Numbered lines, `lines` of them, 10 characters each with the newline.
    fn numbered(lines: usize) -> String {
        (0..lines).map(|i| format!("line {i:04}\n")).collect()
    }

    #[tokio::test]
    async fn short_output_is_untouched() {
        let output = ToolOutput::ok("x".repeat(12_000));
        assert_eq!(
            cut(None, &call("c1", "bash", "{}"), output.clone()).await,
            output
        );
    }

    #[tokio::test]
    async fn long_output_keeps_head_and_tail_and_is_saved_in_full() {
        let dir = tempfile::tempdir().unwrap();
        let folders = ThreadFolders::new(dir.path(), "t1").unwrap();
        // The run makes the folders before any tool runs.
        folders.create().await.unwrap();
        let full = numbered(3000);
        let out = cut(
            Some(folders.clone()),
            &call("call/../7", "bash", "{}"),
            ToolOutput::ok(full.clone()),
        )
        .await;
        assert!(!out.is_error);
        assert!(
            out.content.chars().count() < 12_000 + 300,
            "{}",
            out.content.len()
        );
        assert!(out.content.starts_with("line 0000\n"));
        assert!(out.content.ends_with("line 2999\n"));
        // Cut on line breaks: 720 lines of head (7,200 chars), 480 of tail (4,800 chars).
        assert!(out.content.contains("line 0719\n\n\n[… 18000 of 30000 characters left out: the full output is saved at /mnt/user-data/outputs/tool-output/call7.txt;"), "{}", &out.content[7000..7400]);
        assert!(out.content.contains(".]\n\nline 2520\n"));
        let saved =
            std::fs::read_to_string(folders.outputs().join("tool-output/call7.txt")).unwrap();
        assert_eq!(saved, full);
        // The same call id again (some models number calls afresh each response) does not
        // overwrite the first.
        let again = cut(
            Some(folders.clone()),
            &call("call7", "bash", "{}"),
            ToolOutput::ok(numbered(1500)),
        )
        .await;
        assert!(
            again
                .content
                .contains("/mnt/user-data/outputs/tool-output/call7-2.txt;"),
            "{}",
            again.content
        );
        assert_eq!(
            std::fs::read_to_string(folders.outputs().join("tool-output/call7.txt")).unwrap(),
            full
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_tool_output_folder_turned_into_a_link_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let folders = ThreadFolders::new(dir.path(), "t1").unwrap();
        folders.create().await.unwrap();
        // The sandboxed shell can write outputs: it points tool-output outside the thread.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, folders.outputs().join(SAVE_FOLDER)).unwrap();
        let out = cut(
            Some(folders.clone()),
            &call("c9", "bash", "{}"),
            ToolOutput::ok(numbered(3000)),
        )
        .await;
        assert!(
            out.content.contains("the full output could not be saved"),
            "{}",
            &out.content[7000..7400]
        );
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn saved_output_stays_within_the_quota_the_oldest_going_first() {
        let dir = tempfile::tempdir().unwrap();
        let folders = ThreadFolders::new(dir.path(), "t1").unwrap();
        folders.create().await.unwrap();
        let m = ToolOutputBudgetMiddleware::from_config(&ToolOutputBudgetConfig {
            quota_mb: 1,
            ..ToolOutputBudgetConfig::default()
        })
        .unwrap();
        // 400,000 bytes each: two fit in 1 MiB, a third makes room by removing the oldest.
        let result = |i: usize| format!("{i}{}", "y".repeat(399_999));
        let mut thread = ThreadState::new("t1".into(), "c".into(), 0, 0);
        for i in 0..3 {
            let mut cx = test_context(&mut thread);
            cx.folders = Some(folders.clone());
            let mut output = ToolOutput::ok(result(i));
            m.after_tool(&mut cx, &call(&format!("q{i}"), "bash", "{}"), &mut output)
                .await
                .unwrap();
            assert!(
                output.content.contains(&format!("tool-output/q{i}.txt")),
                "{i}"
            );
        }
        let folder = folders.outputs().join(SAVE_FOLDER);
        let mut names: Vec<String> = std::fs::read_dir(&folder)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["q1.txt", "q2.txt"]);
        // A result larger than the whole quota is cut and not saved; nothing is removed.
        let mut cx = test_context(&mut thread);
        cx.folders = Some(folders.clone());
        let mut huge = ToolOutput::ok("z".repeat(2 * 1024 * 1024));
        m.after_tool(&mut cx, &call("big", "bash", "{}"), &mut huge)
            .await
            .unwrap();
        assert!(huge.content.contains("could not be saved"));
        assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 2);
    }

    #[tokio::test]
    async fn errors_stay_errors_and_unsaved_output_is_still_cut() {
        let out = cut(
            None,
            &call("c1", "bash", "{}"),
            ToolOutput::error("é".repeat(20_000)),
        )
        .await;
        assert!(out.is_error);
        assert!(
            out.content.contains(
                "[… 8000 of 20000 characters left out: the full output could not be saved.]"
            ),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn a_long_read_is_cut_but_not_copied() {
        let dir = tempfile::tempdir().unwrap();
        let folders = ThreadFolders::new(dir.path(), "t1").unwrap();
        let out = cut(
            Some(folders.clone()),
            &call(
                "c1",
                "read_file",
                r#"{"path":"/mnt/user-data/uploads/log.txt"}"#,
            ),
            ToolOutput::ok(numbered(2000)),
        )
        .await;
        assert!(
            out.content.contains(
                "left out: read /mnt/user-data/uploads/log.txt in smaller parts with start_line and end_line.]"
            ),
            "{}",
            out.content
        );
        assert!(!folders.outputs().join(SAVE_FOLDER).exists());
    }

    #[test]
    fn config_is_clamped() {
        let m = ToolOutputBudgetMiddleware::from_config(&ToolOutputBudgetConfig {
            max_chars: 10,
            head_percent: 100,
            ..ToolOutputBudgetConfig::default()
        })
        .unwrap();
        assert_eq!((m.max_chars, m.head_chars), (1_000, 900));
        assert!(
            ToolOutputBudgetMiddleware::from_config(&ToolOutputBudgetConfig {
                enabled: false,
                ..ToolOutputBudgetConfig::default()
            })
            .is_none()
        );
    }
}
