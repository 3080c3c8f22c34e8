//! memory (chain position 12, after `title`, before `view_image`): long-term memory per user
//! (DESIGN.md section 6; the pipeline is in `crate::memory`).
//!
//! - `before_run` reads the author's document from the store once and renders the
//!   `<memory>` block (`memory::injection`) into the run context; no store read happens per
//!   model call.
//! - The block goes into the run's hidden context (`RunContext::hidden_context`), which the
//!   runtime sends as a user-role message just before the turn's user message in each
//!   request (never stored). User-derived text never gets system authority, and the system
//!   prompt stays byte-identical across users, so providers' prompt caches keep hitting.
//! - `after_run`, on answered runs only, puts the filtered conversation
//!   (`memory::conversation`) on the run outputs; the turn runner writes it into the store's
//!   queue in the same transaction as the turn's end, keyed by (author, thread) and due after
//!   `debounce_seconds`. In a direct chat only what follows the author's watermark goes (with
//!   a short tail marked as already seen), and the watermark, kept in the thread's `memory`
//!   extension, moves to the turn's end in the same transaction. A turn whose message is only
//!   an acknowledgement (`ok`, `thanks`, `👍`) queues nothing.
//!
//! Whose memory: the run's author only (`<channel>:<user id>`, or `person:<name>` when
//! `[[memory.identities]]` links the id). In a group chat the block is the part of the
//! author's memory the group may hear (`memory::sharing`, the same rule `/memory` follows
//! there: by default no personal facts and no `personalContext`), and what is queued is the
//! author's own message and the answer to it, never other members' words.
//!
//! Placement: the runtime inserts the hidden context after every `before_model` hook, so
//! `input_sanitization` never neutralises the trusted block and `summarization` never
//! compacts it (it is never stored).
//!
//! Config: the top-level `[memory]` table (`enabled`, `injection_enabled`,
//! `max_injection_tokens`, `debounce_seconds`, `group_facts`, `group_personal_context`);
//! there is no `[agent.middleware.memory]`.
//!
//! Where it differs from DeerFlow: DeerFlow adds the block as a hidden human message after
//! the date message, once per conversation; here it is a hidden user-role message too, but
//! rendered afresh for each run, so facts learned between two runs of a thread show up.

use std::sync::Arc;

use crate::agent::memory::conversation::MemoryMarks;
use crate::agent::memory::identity::MemoryIdentities;
use crate::agent::memory::sharing::GroupPolicy;
use crate::agent::memory::{MemoryConfig, MemoryDocuments, MemoryUpdate, conversation, injection};
use crate::agent::message::ChatMessage;
use crate::agent::tokens::tokenizer_ready;

use super::{Middleware, MiddlewareError, RunContext, RunEnding};

/// The `memory` middleware.
pub(crate) struct MemoryMiddleware {
    documents: Arc<dyn MemoryDocuments>,
    identities: MemoryIdentities,
    group: GroupPolicy,
    injection: Option<usize>,
    debounce_ms: u64,
}

impl MemoryMiddleware {
    /// The middleware for `[memory]`, or `None` when memory is off.
    pub(crate) fn from_config(
        config: &MemoryConfig,
        documents: Arc<dyn MemoryDocuments>,
    ) -> Option<Self> {
        config.enabled.then(|| Self {
            documents,
            identities: MemoryIdentities::from_config(config),
            group: GroupPolicy::from_config(config),
            injection: config
                .injection_enabled
                .then_some(config.max_injection_tokens),
            debounce_ms: config.debounce_seconds.saturating_mul(1_000),
        })
    }

    fn key(&self, cx: &RunContext<'_>) -> String {
        let author = &cx.input.author;
        self.identities.key(&author.channel, &author.user_id)
    }
}

#[async_trait::async_trait]
impl Middleware for MemoryMiddleware {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn before_run(&self, cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
        let Some(max_tokens) = self.injection else {
            return Ok(());
        };
        let key = self.key(cx);
        let doc = self
            .documents
            .document(&key)
            .await
            .map_err(|e| MiddlewareError(format!("cannot read the memory document: {e}")))?;
        let doc = match doc {
            Some(doc) if cx.input.flags.group => Some(self.group.group_view(&doc)),
            doc => doc,
        };
        if doc.is_some() {
            tokenizer_ready().await;
        }
        if let Some(block) = doc.and_then(|doc| injection::render(&doc, max_tokens)) {
            cx.hidden_context.push(block);
        }
        Ok(())
    }

    async fn after_run(&self, cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
        if cx.ending != Some(RunEnding::Answered) {
            return Ok(());
        }
        if conversation::turn_text(cx.thread).is_some_and(|text| conversation::is_trivial(&text)) {
            tracing::debug!(thread = %cx.thread.id, "trivial turn; no memory update");
            return Ok(());
        }
        let key = self.key(cx);
        let group = cx.input.flags.group;
        let mut marks: MemoryMarks = cx.thread.extensions.get().unwrap_or_default();
        let mark = if group {
            0
        } else {
            marks.0.get(&key).copied().unwrap_or(0)
        };
        let portion = conversation::for_memory(cx.thread, group, mark);
        if !portion.messages[portion.seen..]
            .iter()
            .any(|m| matches!(m, ChatMessage::User { .. }))
        {
            return Ok(());
        }
        if !group {
            marks.0.insert(key.clone(), portion.upto);
            cx.thread.extensions.set(&marks);
        }
        let now = crate::now_ms();
        cx.outputs.memory_update = Some(MemoryUpdate {
            user_id: key,
            thread_id: cx.thread.id.clone(),
            messages: portion.messages,
            seen: portion.seen,
            from: portion.from,
            enqueued_at_ms: now,
            due_at_ms: now.saturating_add(self.debounce_ms),
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::input::RunInput;
    use crate::agent::memory::MemoryDocument;
    use crate::agent::memory::config::IdentityLink;
    use crate::agent::memory::schema::{About, Fact, FactSource};
    use crate::agent::model::scripted::ScriptedModel;
    use crate::agent::thread::ThreadState;

    /// Documents in a map, changeable by the test.
    #[derive(Default)]
    struct Docs(std::sync::Mutex<std::collections::HashMap<String, MemoryDocument>>);

    impl Docs {
        fn put(&self, key: &str, doc: MemoryDocument) {
            self.0.lock().unwrap().insert(key.to_owned(), doc);
        }
    }

    #[async_trait::async_trait]
    impl MemoryDocuments for Docs {
        async fn document(&self, key: &str) -> Result<Option<MemoryDocument>, String> {
            Ok(self.0.lock().unwrap().get(key).cloned())
        }
    }

    fn doc_with(content: &str) -> MemoryDocument {
        MemoryDocument {
            facts: vec![Fact {
                id: "fact_1".into(),
                content: content.into(),
                category: "preference".into(),
                confidence: 0.9,
                created_at: String::new(),
                updated_at: String::new(),
                source: FactSource::default(),
                about: None,
                shareable: false,
            }],
            ..MemoryDocument::default()
        }
    }

    fn store_with_ada() -> Arc<Docs> {
        let docs = Arc::new(Docs::default());
        docs.put("api:ada", doc_with("likes green tea"));
        docs.put("person:bob", doc_with("is bob the builder"));
        docs
    }

    /// The hidden context blocks a run of `input` gets.
    async fn blocks(middleware: &MemoryMiddleware, input: &RunInput) -> Vec<String> {
        let model = ScriptedModel::new(Vec::new());
        let mut thread = ThreadState::new("t1".into(), "c".into(), 0, 0);
        let mut cx = RunContext::new(&mut thread, input, &model);
        middleware.before_run(&mut cx).await.unwrap();
        cx.hidden_context
    }

    #[tokio::test]
    async fn the_author_gets_their_memory_and_no_one_else_does() {
        let config = MemoryConfig {
            identities: vec![IdentityLink {
                name: "bob".into(),
                ids: vec!["telegram:7".into()],
            }],
            ..MemoryConfig::default()
        };
        let middleware = MemoryMiddleware::from_config(&config, store_with_ada()).unwrap();

        let ada = blocks(&middleware, &RunInput::text("api", "ada", "hi")).await;
        assert_eq!(ada.len(), 1);
        assert!(ada[0].starts_with("<memory>\n"), "{}", ada[0]);
        assert!(ada[0].contains("likes green tea") && !ada[0].contains("bob"));

        let eve = blocks(&middleware, &RunInput::text("api", "eve", "hi")).await;
        assert!(eve.is_empty());

        // A linked id reads the person's memory.
        let bob = blocks(&middleware, &RunInput::text("telegram", "7", "hi")).await;
        assert!(bob[0].contains("is bob the builder"));
        assert!(!bob[0].contains("green tea"));
    }

    #[tokio::test]
    async fn answered_runs_queue_the_filtered_conversation_for_the_author() {
        let store = store_with_ada();
        let config = MemoryConfig {
            debounce_seconds: 5,
            injection_enabled: false,
            ..MemoryConfig::default()
        };
        let middleware = MemoryMiddleware::from_config(&config, store).unwrap();
        let input = RunInput::text("api", "ada", "I like tea");
        let model = ScriptedModel::new(Vec::new());
        let mut thread = ThreadState::new("t1".into(), "c".into(), 0, 0);
        thread.messages.push(ChatMessage::user("I like tea"));
        thread
            .messages
            .push(ChatMessage::tool("c1", "secret tool output"));
        thread.messages.push(ChatMessage::assistant("Noted."));
        let mut cx = RunContext::new(&mut thread, &input, &model);
        middleware.before_run(&mut cx).await.unwrap();
        assert!(cx.hidden_context.is_empty(), "injection is off");

        cx.ending = Some(RunEnding::Failed);
        middleware.after_run(&mut cx).await.unwrap();
        assert_eq!(cx.outputs.memory_update, None);

        cx.ending = Some(RunEnding::Answered);
        middleware.after_run(&mut cx).await.unwrap();
        let update = cx.outputs.memory_update.take().unwrap();
        assert_eq!(update.user_id, "api:ada");
        assert_eq!(update.thread_id, "t1");
        assert_eq!(
            update.messages,
            vec![
                ChatMessage::user("I like tea"),
                ChatMessage::assistant("Noted.")
            ]
        );
        assert_eq!(update.due_at_ms - update.enqueued_at_ms, 5_000);
    }

    #[tokio::test]
    async fn a_group_run_gets_only_what_the_group_may_hear() {
        let docs = Arc::new(Docs::default());
        let mut doc = doc_with("is expecting a baby");
        doc.facts[0].about = Some(About::Personal);
        let mut work = doc.facts[0].clone();
        work.id = "fact_2".into();
        work.content = "owns the payments service".into();
        work.about = Some(About::Work);
        doc.facts.push(work);
        doc.user.personal_context.summary = "Lives with two cats.".into();
        doc.user.work_context.summary = "Runs payments.".into();
        docs.put("api:ada", doc);
        let middleware = MemoryMiddleware::from_config(&MemoryConfig::default(), docs).unwrap();

        let mut input = RunInput::text("api", "ada", "hi");
        input.flags.group = true;
        let group = blocks(&middleware, &input).await.join("");
        assert!(group.contains("owns the payments service"), "{group}");
        assert!(group.contains("Runs payments."), "{group}");
        assert!(
            !group.contains("baby") && !group.contains("cats"),
            "{group}"
        );

        let direct = blocks(&middleware, &RunInput::text("api", "ada", "hi"))
            .await
            .join("");
        assert!(
            direct.contains("baby") && direct.contains("cats"),
            "{direct}"
        );
    }

    /// The update queued after an answered run of `text` on `thread`.
    async fn queued_after(
        middleware: &MemoryMiddleware,
        thread: &mut ThreadState,
        text: &str,
    ) -> Option<MemoryUpdate> {
        let input = RunInput::text("api", "ada", text);
        let model = ScriptedModel::new(Vec::new());
        thread.messages.push(ChatMessage::user(text));
        thread
            .messages
            .push(ChatMessage::assistant(format!("re: {text}")));
        let mut cx = RunContext::new(thread, &input, &model);
        cx.ending = Some(RunEnding::Answered);
        middleware.after_run(&mut cx).await.unwrap();
        cx.outputs.memory_update.take()
    }

    #[tokio::test]
    async fn the_second_update_of_a_thread_carries_only_what_is_new() {
        let middleware =
            MemoryMiddleware::from_config(&MemoryConfig::default(), store_with_ada()).unwrap();
        let mut thread = ThreadState::new("t1".into(), "c".into(), 0, 0);
        let first = queued_after(&middleware, &mut thread, "I like tea")
            .await
            .unwrap();
        assert_eq!((first.seen, first.from, first.messages.len()), (0, 0, 2));

        // An acknowledgement queues nothing and leaves the watermark.
        assert_eq!(
            queued_after(&middleware, &mut thread, "thanks 👍").await,
            None
        );

        let second = queued_after(&middleware, &mut thread, "I live in Lyon")
            .await
            .unwrap();
        let texts: Vec<&str> = second.messages.iter().map(ChatMessage::text).collect();
        // The turn before the watermark comes as context; the acknowledgement rides along.
        assert_eq!(
            texts,
            [
                "I like tea",
                "re: I like tea",
                "thanks 👍",
                "re: thanks 👍",
                "I live in Lyon",
                "re: I live in Lyon"
            ]
        );
        assert_eq!((second.seen, second.from), (2, 2));
        let marks: MemoryMarks = thread.extensions.get().unwrap();
        assert_eq!(marks.0.get("api:ada"), Some(&6));
    }

    #[test]
    fn memory_off_means_no_middleware() {
        let store = Arc::new(Docs::default());
        let off = MemoryConfig {
            enabled: false,
            ..MemoryConfig::default()
        };
        assert!(MemoryMiddleware::from_config(&off, store).is_none());
    }
}
