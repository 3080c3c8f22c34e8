//! thread_data (chain position 1): tells the model where the thread's files are.
//!
//! Each thread has three folders on disk (`uploads/`, `workspace/`, `outputs/`), made by the
//! runtime before tools run and handed to every tool call (`ToolContext::folders`) and to
//! hooks (`RunContext::folders`). The model only ever sees them as `/mnt/user-data/...`
//! (`tools::paths`). In `before_model` this middleware adds a short note naming the three
//! folders and what each is for, so the model does not guess paths.
//!
//! The note is added only when the request offers a tool that works on files (the file tools
//! or `bash`): a run without them has nothing to do with paths, and the note would only cost
//! tokens. It goes into the leading system message (not a second system message: some
//! providers refuse several, which DeerFlow has to repair with a coalescing middleware), and
//! only into the request, never into the stored history.
//!
//! It also contributes `present_files` (`tools::present_files`), the model's way to hand
//! files under outputs to the user. The tool checks the paths; this middleware's
//! `after_tool` then records a successful call's files on the run's outputs
//! (`RunOutputs::files`, plain data: name, media type, size, host path), which the caller
//! delivers with the final answer, and in the thread (the [`PresentedFiles`] extension), so the
//! thread's history can show which answer carried which files. The files are checked again
//! there (one may have changed between the tool and the hook), and a run delivers at most
//! [`MAX_FILES`] of them; a file presented twice is delivered once.
//!
//! A turn re-run after a crash (resumed from its checkpoint) starts with empty run outputs:
//! `before_run` finds the presentations its earlier attempt made (`present_files` calls of
//! this turn that have a result, in [`PresentedFiles`]), checks their files again and puts
//! them back, so the answer still carries them.
//!
//! Where it improves on DeerFlow, which finds `present_files` calls in the turn's messages
//! after the run and resolves them then: antler records the files when the call is answered,
//! after every other `after_tool` hook (this one runs last, in reverse order), so a call the
//! guardrail refused, or any call answered with an error, never delivers anything.
//!
//! Placement: first. It describes the ground every later middleware and tool stands on;
//! `uploads` (next) lists files inside those folders. It fails open: without the note the
//! model can still `ls /mnt/user-data`; a presentation that cannot be recorded is answered to
//! the model as an error.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError, RunContext, ToolOutput};
use crate::agent::message::{ChatMessage, ToolCall};
use crate::agent::model::ModelRequest;
use crate::agent::thread::Extension;
use crate::agent::tools::files::FILE_TOOL_NAMES;
use crate::agent::tools::paths::Area;
use crate::agent::tools::present_files::{
    self, Arguments, MAX_FILES, PresentFiles, PresentedFile, check_paths, describe,
};
use crate::agent::tools::{Tool, intercepted_arguments};

/// Presentations the thread keeps at most (the oldest go first).
const MAX_PRESENTATIONS: usize = 100;

/// The note added to the system message.
pub(crate) const NOTE: &str = "Files of this conversation (use these paths with the file tools):
- /mnt/user-data/workspace: your scratch space
- /mnt/user-data/uploads: the user's files (read-only)
- /mnt/user-data/outputs: files for the user; put what you make for them here, then hand them over with present_files";

/// `[agent.middleware.thread_data]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ThreadDataConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
}

impl Default for ThreadDataConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// One file of a presentation, as the thread keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PresentedSummary {
    /// Its path under the thread's outputs folder.
    pub(crate) name: String,
    /// Its media type.
    pub(crate) media_type: String,
    /// Its size in bytes when presented.
    pub(crate) size: u64,
}

/// The files one `present_files` call delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Presentation {
    /// The id of the call: its answer (the next assistant text after the call's result) is
    /// the message the files came with.
    pub(crate) call_id: String,
    /// The files.
    pub(crate) files: Vec<PresentedSummary>,
}

/// The thread's presentations, newest last.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PresentedFiles {
    pub(crate) entries: Vec<Presentation>,
}

impl Extension for PresentedFiles {
    const KEY: &'static str = "presented_files";
}

/// Names the thread's folders for the model and records the files it presents.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ThreadDataMiddleware {
    /// `agent.max_attachment_bytes`: the largest file that may be presented.
    max_file_bytes: u64,
}

impl ThreadDataMiddleware {
    /// The middleware, or `None` when it is disabled; presented files may be at most
    /// `max_file_bytes` each.
    pub(crate) fn from_config(cfg: &ThreadDataConfig, max_file_bytes: u64) -> Option<Self> {
        cfg.enabled.then_some(Self { max_file_bytes })
    }

    /// Records the files of an answered `present_files` call; the output is rewritten when
    /// they cannot all be delivered.
    /// The files this turn's answered `present_files` calls presented before the run began
    /// (a resumed turn), checked again; files that went or grew past the limit are left out.
    async fn presented_earlier(&self, cx: &RunContext<'_>) -> Vec<PresentedFile> {
        let (Some(start), Some(folders)) = (cx.thread.turn_start(), cx.folders.clone()) else {
            return Vec::new();
        };
        let turn = cx.thread.messages.get(start..).unwrap_or_default();
        let answered = |id: &str| {
            turn.iter()
                .any(|m| matches!(m, ChatMessage::Tool { tool_call_id, .. } if tool_call_id == id))
        };
        let presenting: Vec<&str> = turn
            .iter()
            .filter_map(|m| match m {
                ChatMessage::Assistant { tool_calls, .. } => Some(tool_calls),
                _ => None,
            })
            .flatten()
            .filter(|call| call.name == present_files::TOOL_NAME && answered(&call.id))
            .map(|call| call.id.as_str())
            .collect();
        if presenting.is_empty() {
            return Vec::new();
        }
        let presented = cx
            .thread
            .extensions
            .get::<PresentedFiles>()
            .unwrap_or_default();
        // Newest first: a call id an earlier turn also used names this turn's presentation.
        let mut paths: Vec<String> = Vec::new();
        for id in presenting {
            if let Some(entry) = presented.entries.iter().rev().find(|e| e.call_id == id) {
                for file in &entry.files {
                    let path = format!("{}/{}", Area::Outputs.virtual_path(), file.name);
                    if !paths.contains(&path) {
                        paths.push(path);
                    }
                }
            }
        }
        let max_bytes = self.max_file_bytes;
        tokio::task::spawn_blocking(move || {
            paths
                .into_iter()
                .filter_map(|path| check_paths(&folders, &[path], max_bytes).ok())
                .flatten()
                .take(MAX_FILES)
                .collect()
        })
        .await
        .unwrap_or_default()
    }

    async fn record(&self, cx: &mut RunContext<'_>, call: &ToolCall, output: &mut ToolOutput) {
        let Some(folders) = cx.folders.clone() else {
            *output = ToolOutput::error("Error: the thread's files are not available.");
            return;
        };
        let Ok(arguments) = intercepted_arguments::<Arguments>(call) else {
            return;
        };
        let max_bytes = self.max_file_bytes;
        let checked =
            tokio::task::spawn_blocking(move || check_paths(&folders, &arguments.paths, max_bytes))
                .await
                .unwrap_or_else(|_| Err("Error: the files could not be checked.".to_owned()));
        let files = match checked {
            Ok(files) => files,
            Err(reason) => {
                *output = ToolOutput::error(reason);
                return;
            }
        };
        let mut kept = Vec::with_capacity(files.len());
        let mut left_out = Vec::new();
        for file in files {
            if let Some(earlier) = cx.outputs.files.iter_mut().find(|f| f.name == file.name) {
                *earlier = file.clone();
            } else if cx.outputs.files.len() < MAX_FILES {
                cx.outputs.files.push(file.clone());
            } else {
                left_out.push(file.name);
                continue;
            }
            kept.push(file);
        }
        if !left_out.is_empty() {
            *output = ToolOutput::ok(format!(
                "{}\nNot delivered (an answer carries at most {MAX_FILES} files): {}",
                describe(&kept),
                left_out.join(", ")
            ));
        }
        if kept.is_empty() {
            return;
        }
        metrics::counter!("antler_presented_files_total").increment(kept.len() as u64);
        let mut presented = cx
            .thread
            .extensions
            .get::<PresentedFiles>()
            .unwrap_or_default();
        presented.entries.push(Presentation {
            call_id: call.id.clone(),
            files: kept
                .into_iter()
                .map(|f| PresentedSummary {
                    name: f.name,
                    media_type: f.media_type,
                    size: f.size,
                })
                .collect(),
        });
        let excess = presented.entries.len().saturating_sub(MAX_PRESENTATIONS);
        presented.entries.drain(..excess);
        cx.thread.extensions.set(&presented);
    }
}

/// Whether the request offers a tool that reads or writes the thread's files.
fn offers_file_tools(request: &ModelRequest) -> bool {
    request
        .tools
        .iter()
        .any(|tool| tool.name == "bash" || FILE_TOOL_NAMES.contains(&tool.name.as_str()))
}

#[async_trait::async_trait]
impl Middleware for ThreadDataMiddleware {
    fn name(&self) -> &'static str {
        "thread_data"
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        vec![Arc::new(PresentFiles::new(self.max_file_bytes))]
    }

    async fn before_run(&self, cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
        let earlier = self.presented_earlier(cx).await;
        if !earlier.is_empty() {
            tracing::info!(thread = %cx.thread.id, files = earlier.len(), "a resumed turn delivers the files its earlier attempt presented");
            cx.outputs.files = earlier;
        }
        Ok(())
    }

    async fn after_tool(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
        output: &mut ToolOutput,
    ) -> Result<(), MiddlewareError> {
        if call.name == present_files::TOOL_NAME && !output.is_error {
            self.record(cx, call, output).await;
        }
        Ok(())
    }

    async fn before_model(
        &self,
        _cx: &mut RunContext<'_>,
        request: &mut ModelRequest,
    ) -> Result<(), MiddlewareError> {
        if !offers_file_tools(request) {
            return Ok(());
        }
        match request.messages.first_mut() {
            Some(ChatMessage::System { content }) => {
                if !content.contains(NOTE) {
                    if !content.trim().is_empty() {
                        content.push_str("\n\n");
                    }
                    content.push_str(NOTE);
                }
            }
            _ => request.messages.insert(0, ChatMessage::system(NOTE)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::agent::middleware::test_context;
    use crate::agent::model::ToolSpec;
    use crate::agent::thread::ThreadState;

    fn tool(name: &str) -> Arc<ToolSpec> {
        Arc::new(ToolSpec {
            name: name.to_owned(),
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
        })
    }

    async fn prepared(messages: Vec<ChatMessage>, tools: &[&str]) -> Vec<ChatMessage> {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        let mut request = ModelRequest {
            messages,
            tools: tools.iter().map(|name| tool(name)).collect(),
        };
        middleware()
            .before_model(&mut cx, &mut request)
            .await
            .unwrap();
        // A second pass (the next model call of the run builds a new request; a re-used one
        // must not grow) adds nothing.
        middleware()
            .before_model(&mut cx, &mut request)
            .await
            .unwrap();
        request.messages
    }

    #[tokio::test]
    async fn the_note_joins_the_system_message_when_file_tools_are_offered() {
        let messages = prepared(
            vec![ChatMessage::system("Be brief."), ChatMessage::user("hi")],
            &["current_time", "read_file"],
        )
        .await;
        assert_eq!(
            messages,
            vec![
                ChatMessage::system(format!("Be brief.\n\n{NOTE}")),
                ChatMessage::user("hi")
            ]
        );
        assert!(NOTE.contains("/mnt/user-data/uploads: the user's files (read-only)"));
        let messages = prepared(vec![ChatMessage::user("hi")], &["bash"]).await;
        assert_eq!(
            messages,
            vec![ChatMessage::system(NOTE), ChatMessage::user("hi")]
        );
    }

    #[tokio::test]
    async fn no_file_tools_no_note() {
        let messages = vec![ChatMessage::system("Be brief."), ChatMessage::user("hi")];
        assert_eq!(
            prepared(messages.clone(), &["current_time"]).await,
            messages
        );
        assert_eq!(prepared(messages.clone(), &[]).await, messages);
    }

    fn middleware() -> ThreadDataMiddleware {
        ThreadDataMiddleware {
            max_file_bytes: 100,
        }
    }

    #[test]
    fn disabled_means_absent() {
        assert!(ThreadDataMiddleware::from_config(&ThreadDataConfig::default(), 1).is_some());
        assert!(
            ThreadDataMiddleware::from_config(&ThreadDataConfig { enabled: false }, 1).is_none()
        );
        let tools = middleware().tools();
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].spec().name, present_files::TOOL_NAME);
    }

    fn present(id: &str, paths: &[&str]) -> ToolCall {
        ToolCall {
            id: id.to_owned(),
            name: present_files::TOOL_NAME.to_owned(),
            arguments: serde_json::json!({ "paths": paths }).to_string(),
        }
    }

    #[tokio::test]
    async fn a_resumed_turn_delivers_what_its_earlier_attempt_presented() {
        let dir = tempfile::tempdir().unwrap();
        let folders = crate::agent::input::ThreadFolders::new(dir.path(), "t").unwrap();
        folders.create().await.unwrap();
        for name in ["old.txt", "report.txt", "gone.txt"] {
            std::fs::write(folders.outputs().join(name), "hello").unwrap();
        }
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let shown = |paths: &[&str]| -> Vec<String> {
            paths
                .iter()
                .map(|p| format!("/mnt/user-data/outputs/{p}"))
                .collect()
        };
        let presentation = |id: &str, names: &[&str]| Presentation {
            call_id: id.to_owned(),
            files: names
                .iter()
                .map(|n| PresentedSummary {
                    name: (*n).to_owned(),
                    media_type: "text/plain".to_owned(),
                    size: 5,
                })
                .collect(),
        };
        // An earlier turn presented old.txt with the same call id this turn uses.
        let earlier_call = present("c0", &[shown(&["old.txt"])[0].as_str()]);
        thread.messages.push(ChatMessage::user("first"));
        thread.messages.push(ChatMessage::Assistant {
            content: String::new(),
            tool_calls: vec![earlier_call],
            reasoning: None,
        });
        thread.messages.push(ChatMessage::tool("c0", "delivered"));
        thread.messages.push(ChatMessage::assistant("here"));
        // This turn, cut short by a crash after its present_files call was answered.
        let start = thread.messages.len();
        let paths = shown(&["report.txt", "gone.txt"]);
        let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
        thread.messages.push(ChatMessage::user("again"));
        thread.messages.push(ChatMessage::Assistant {
            content: String::new(),
            tool_calls: vec![present("c0", &paths)],
            reasoning: None,
        });
        thread.messages.push(ChatMessage::tool("c0", "delivered"));
        thread.extensions.set(&PresentedFiles {
            entries: vec![
                presentation("c0", &["old.txt"]),
                presentation("c0", &["report.txt", "gone.txt"]),
            ],
        });
        thread.running = Some(crate::agent::thread::RunningTurn {
            inbox_seq: 9,
            start,
        });
        std::fs::remove_file(folders.outputs().join("gone.txt")).unwrap();

        let mut cx = test_context(&mut thread);
        cx.folders = Some(folders.clone());
        middleware().before_run(&mut cx).await.unwrap();
        let names: Vec<&str> = cx.outputs.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["report.txt"], "this turn's files that still exist");

        // A fresh turn (only its user message so far) starts with none.
        let mut fresh = ThreadState::new("t".into(), "c".into(), 0, 0);
        fresh.messages.push(ChatMessage::user("new"));
        let mut cx = test_context(&mut fresh);
        cx.folders = Some(folders);
        middleware().before_run(&mut cx).await.unwrap();
        assert!(cx.outputs.files.is_empty());
    }

    #[tokio::test]
    async fn answered_presentations_are_recorded_refused_ones_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let folders = crate::agent::input::ThreadFolders::new(dir.path(), "t").unwrap();
        folders.create().await.unwrap();
        std::fs::write(folders.outputs().join("report.txt"), "hello").unwrap();
        std::fs::write(folders.outputs().join("big.txt"), [b'x'; 101]).unwrap();
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        cx.folders = Some(folders.clone());

        // Refused by an earlier hook (an error output): nothing recorded.
        let call = present("c0", &["/mnt/user-data/outputs/report.txt"]);
        let mut refused = ToolOutput::error("Tool `present_files` needs an operator.");
        middleware()
            .after_tool(&mut cx, &call, &mut refused)
            .await
            .unwrap();
        assert!(cx.outputs.files.is_empty());

        let mut output = ToolOutput::ok("delivered");
        middleware()
            .after_tool(&mut cx, &call, &mut output)
            .await
            .unwrap();
        assert_eq!(output, ToolOutput::ok("delivered"));
        // The same file again is delivered once.
        let again = present("c1", &["/mnt/user-data/outputs/report.txt"]);
        middleware()
            .after_tool(&mut cx, &again, &mut ToolOutput::ok("delivered"))
            .await
            .unwrap();
        assert_eq!(cx.outputs.files.len(), 1);
        assert_eq!(cx.outputs.files[0].name, "report.txt");
        assert_eq!(cx.outputs.files[0].size, 5);

        // A file that grew past the limit since the tool checked it is refused now.
        let big = present("c2", &["/mnt/user-data/outputs/big.txt"]);
        let mut output = ToolOutput::ok("delivered");
        middleware()
            .after_tool(&mut cx, &big, &mut output)
            .await
            .unwrap();
        assert!(output.is_error && output.content.contains("at most 100 bytes"));
        assert_eq!(cx.outputs.files.len(), 1);

        let presented = thread.extensions.get::<PresentedFiles>().unwrap();
        let ids: Vec<&str> = presented
            .entries
            .iter()
            .map(|e| e.call_id.as_str())
            .collect();
        assert_eq!(ids, ["c0", "c1"]);
        assert_eq!(presented.entries[0].files[0].media_type, "text/plain");
    }

    #[tokio::test]
    async fn an_answer_carries_at_most_ten_files() {
        let dir = tempfile::tempdir().unwrap();
        let folders = crate::agent::input::ThreadFolders::new(dir.path(), "t").unwrap();
        folders.create().await.unwrap();
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        cx.folders = Some(folders.clone());
        for batch in 0..2 {
            let names: Vec<String> = (0..6)
                .map(|i| {
                    let name = format!("f{batch}{i}.txt");
                    std::fs::write(folders.outputs().join(&name), "x").unwrap();
                    format!("/mnt/user-data/outputs/{name}")
                })
                .collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let mut output = ToolOutput::ok("delivered");
            middleware()
                .after_tool(&mut cx, &present(&format!("b{batch}"), &names), &mut output)
                .await
                .unwrap();
            if batch == 1 {
                assert!(
                    output.content.contains("Not delivered") && output.content.contains("f15.txt"),
                    "{}",
                    output.content
                );
            }
        }
        assert_eq!(cx.outputs.files.len(), MAX_FILES);
    }
}
