//! uploads (chain position 2): tells the model which files came with the message.
//!
//! The turn runner fetches a message's attachments into the thread's `uploads/` folder before
//! the run (never before the ack). In `before_run` this middleware adds an `<uploaded_files>`
//! block to the run's user message: each file's name, size and path (as the model sees it,
//! `/mnt/user-data/uploads/<name>`), at most `max_listed`
//! (10) of them, then how many more there are. The block is part of the stored message, so
//! later turns still know the files exist; the memory updater strips it (it is about this
//! thread's folder, not about the user).
//!
//! Placement: right after `thread_data` (which makes the folders), before
//! `input_sanitization`, which must not neutralise the block antler itself wrote. A re-run of
//! the same turn after a crash finds the block already there (exactly, at the end) and adds
//! nothing. It fails open:
//! without the block the model still reads the user's words.

use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError, RunContext};
use crate::agent::input::{Attachment, ThreadFolders};
use crate::agent::message::ChatMessage;
use crate::units::human_size;

/// The opening tag of the block.
pub(crate) const OPEN_TAG: &str = "<uploaded_files>";
const CLOSE_TAG: &str = "</uploaded_files>";

/// `[agent.middleware.uploads]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct UploadsConfig {
    /// Whether the middleware is in the chain.
    pub(crate) enabled: bool,
    /// At most this many files are listed.
    pub(crate) max_listed: usize,
}

impl Default for UploadsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_listed: 10,
        }
    }
}

/// Lists the message's files for the model.
#[derive(Debug, Clone)]
pub(crate) struct UploadsMiddleware {
    max_listed: usize,
}

impl UploadsMiddleware {
    /// The middleware, or `None` when it is disabled.
    pub(crate) fn from_config(cfg: &UploadsConfig) -> Option<Self> {
        cfg.enabled.then(|| Self {
            max_listed: cfg.max_listed.max(1),
        })
    }

    /// The block; paths inside the thread's `folders` are shown as the model sees them
    /// (`/mnt/user-data/uploads/...`).
    fn block(&self, files: &[Attachment], folders: Option<&ThreadFolders>) -> String {
        let mut block = format!(
            "{OPEN_TAG}\nThe user sent these files with this message; read them from these \
             paths:\n"
        );
        for file in files.iter().take(self.max_listed) {
            let path = file.path.display().to_string();
            let path = folders.map_or_else(|| path.clone(), |f| f.to_virtual(&path));
            block.push_str(&format!(
                "- {} ({}): {path}\n",
                file.name,
                human_size(file.size),
            ));
        }
        if files.len() > self.max_listed {
            block.push_str(&format!(
                "- … and {} more in the same folder\n",
                files.len() - self.max_listed
            ));
        }
        block.push_str(CLOSE_TAG);
        block
    }
}

#[async_trait::async_trait]
impl Middleware for UploadsMiddleware {
    fn name(&self) -> &'static str {
        "uploads"
    }

    async fn before_run(&self, cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
        if cx.input.attachments.is_empty() {
            return Ok(());
        }
        let block = self.block(&cx.input.attachments, cx.folders.as_ref());
        let Some(ChatMessage::User { content, .. }) = cx
            .thread
            .messages
            .iter_mut()
            .rev()
            .find(|m| matches!(m, ChatMessage::User { .. }))
        else {
            return Err(MiddlewareError("the run has no user message".into()));
        };
        // Only antler's own block counts as already there: a user who types
        // `<uploaded_files>` must not keep the real list from being added.
        if content.ends_with(&block) {
            return Ok(());
        }
        if content.trim().is_empty() {
            *content = block;
        } else {
            content.push_str("\n\n");
            content.push_str(&block);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;
    use crate::agent::input::RunInput;
    use crate::agent::model::scripted::ScriptedModel;
    use crate::agent::thread::ThreadState;

    fn file(name: &str, size: u64) -> Attachment {
        Attachment {
            name: name.into(),
            media_type: None,
            size,
            path: PathBuf::from(format!("/data/threads/t/uploads/{name}")),
        }
    }

    async fn listed(text: &str, files: Vec<Attachment>, max_listed: usize) -> String {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        thread.messages.push(ChatMessage::user(text));
        let input = RunInput {
            attachments: files,
            ..RunInput::text("api", "u", text)
        };
        let model = Arc::new(ScriptedModel::new(Vec::new()));
        let middleware = UploadsMiddleware { max_listed };
        let mut cx = RunContext::new(&mut thread, &input, model.clone());
        middleware.before_run(&mut cx).await.unwrap();
        // A second pass (a re-run after a crash) adds nothing.
        middleware.before_run(&mut cx).await.unwrap();
        thread.messages[0].text().to_owned()
    }

    #[tokio::test]
    async fn files_are_listed_with_sizes_and_paths() {
        let text = listed(
            "summarise this",
            vec![file("report.pdf", 1_234_567), file("notes.txt", 12)],
            10,
        )
        .await;
        assert!(
            text.starts_with("summarise this\n\n<uploaded_files>\n"),
            "{text}"
        );
        assert!(
            text.contains("- report.pdf (1.2 MB): /data/threads/t/uploads/report.pdf\n"),
            "{text}"
        );
        assert!(text.contains("- notes.txt (12 bytes):"), "{text}");
        assert!(text.ends_with("</uploaded_files>"));
        assert_eq!(text.matches(OPEN_TAG).count(), 1);
    }

    #[tokio::test]
    async fn at_most_max_listed_files_are_named() {
        let files = (0..12).map(|i| file(&format!("f{i}.txt"), 2048)).collect();
        let text = listed("", files, 10).await;
        assert!(
            text.starts_with(OPEN_TAG),
            "a file alone is the message: {text}"
        );
        assert!(
            text.contains("f9.txt (2 KB)") && !text.contains("f10.txt"),
            "{text}"
        );
        assert!(text.contains("… and 2 more"), "{text}");
    }

    #[test]
    fn paths_in_the_threads_folders_are_shown_virtual() {
        let folders = ThreadFolders::new(std::path::Path::new("/data"), "t").unwrap();
        let middleware = UploadsMiddleware { max_listed: 10 };
        let block = middleware.block(&[file("report.pdf", 10)], Some(&folders));
        assert!(
            block.contains("- report.pdf (10 bytes): /mnt/user-data/uploads/report.pdf\n"),
            "{block}"
        );
    }

    #[tokio::test]
    async fn no_files_no_block() {
        assert_eq!(listed("hi", Vec::new(), 10).await, "hi");
    }
}
