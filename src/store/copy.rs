//! Moving a deployment from one store to another (`antler store copy`): every kind of record,
//! page by page, so a large store is never in memory at once. Inbox numbers, outbox keys and
//! thread ids are kept as they are, so the copied deployment resumes where it stopped.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::agent::approvals::ApprovalRecord;
use crate::agent::memory::{MemoryDocument, MemoryUpdate};
use crate::agent::subagents::SubagentRecord;
use crate::agent::thread::ThreadState;
use crate::store::rules::DedupeEntry;
use crate::store::{
    ConversationRecord, InboxItem, OutboxItem, PairedUser, PairingRequest, PgOptions, PgStore,
    ScheduleRecord, SledStore, StoreError, mask_pg_url,
};

/// Records read and written at a time.
pub(crate) const PAGE: usize = 256;

/// The kinds of record a deployment holds, in the order they are copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum CopyKind {
    Conversations,
    Threads,
    Messages,
    Inbox,
    Outbox,
    Dedupe,
    Memory,
    MemoryQueue,
    Subagents,
    SubagentCalls,
    Skills,
    PairingRequests,
    PairedUsers,
    Schedules,
    ScheduleMarks,
    Approvals,
}

impl CopyKind {
    pub(crate) const ALL: [Self; 16] = [
        Self::Conversations,
        Self::Threads,
        Self::Messages,
        Self::Inbox,
        Self::Outbox,
        Self::Dedupe,
        Self::Memory,
        Self::MemoryQueue,
        Self::Subagents,
        Self::SubagentCalls,
        Self::Skills,
        Self::PairingRequests,
        Self::PairedUsers,
        Self::Schedules,
        Self::ScheduleMarks,
        Self::Approvals,
    ];

    /// Its name in the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Conversations => "conversations",
            Self::Threads => "threads",
            Self::Messages => "thread messages",
            Self::Inbox => "inbox items",
            Self::Outbox => "outbox items",
            Self::Dedupe => "dedupe keys",
            Self::Memory => "memory documents",
            Self::MemoryQueue => "memory updates queued",
            Self::Subagents => "subagent records",
            Self::SubagentCalls => "subagent call index entries",
            Self::Skills => "skill switches",
            Self::PairingRequests => "pairing requests",
            Self::PairedUsers => "paired users",
            Self::Schedules => "schedules",
            Self::ScheduleMarks => "schedule marks",
            Self::Approvals => "approvals",
        }
    }
}

/// One record of one kind, as every backend reads and writes it.
#[derive(Debug, Clone)]
pub(crate) enum CopyItem {
    Conversation(ConversationRecord),
    /// A thread's metadata (its messages are [`CopyItem::Message`]s).
    Thread(ThreadState),
    /// One message of a thread: its place and its stored record (the same on every backend).
    Message {
        thread_id: String,
        position: u64,
        record: Vec<u8>,
    },
    Inbox(InboxItem),
    Outbox(OutboxItem),
    /// A dedupe key still remembered, with its expiry.
    Dedupe {
        conversation: String,
        event_id: String,
        entry: DedupeEntry,
    },
    Memory {
        user_key: String,
        document: MemoryDocument,
    },
    MemoryUpdate(MemoryUpdate),
    Subagent(SubagentRecord),
    /// Which task a turn's tool call started.
    SubagentCall {
        thread_id: String,
        turn: u64,
        call_id: String,
        subagent_id: String,
    },
    Skill {
        name: String,
        on: bool,
    },
    PairingRequest(PairingRequest),
    PairedUser(PairedUser),
    Schedule(ScheduleRecord),
    ScheduleMark {
        name: String,
        fire_ms: u64,
    },
    Approval(ApprovalRecord),
}

/// A store a deployment can be copied out of and into.
#[async_trait::async_trait]
pub(crate) trait CopyStore: Send + Sync + std::fmt::Debug {
    /// At most `limit` records of `kind` after `after` (the last record of the previous page,
    /// `None`: from the start) in the store's own order. Dedupe keys expired at `now_ms` are
    /// left out.
    async fn export_page(
        &self,
        kind: CopyKind,
        after: Option<&CopyItem>,
        limit: usize,
        now_ms: u64,
    ) -> Result<Vec<CopyItem>, StoreError>;
    /// Writes `items` as they are, replacing records with the same keys.
    async fn import_page(&self, items: &[CopyItem]) -> Result<(), StoreError>;
    /// Whether the store holds any conversation.
    async fn holds_conversations(&self) -> Result<bool, StoreError>;
    /// After the last page: whatever keeps the store consistent with what was written (the
    /// next inbox number, counts), and everything durable.
    async fn finish_import(&self) -> Result<(), StoreError>;
}

/// The errors of `antler store copy`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CopyError {
    #[error("{0}: a store is sled:PATH or postgres://USER@HOST/DB")]
    Endpoint(String),
    #[error("the target {0} holds conversations already; copy into it anyway with --force")]
    TargetNotEmpty(String),
    #[error("there is no sled store at {0}")]
    NoSource(String),
    #[error("the source and the target are the same store ({0})")]
    Same(String),
    #[error("{at}: {source}")]
    Store {
        at: String,
        #[source]
        source: StoreError,
    },
}

/// Where a store is, as `--from` and `--to` name it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Sled(std::path::PathBuf),
    Postgres(String),
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

impl Endpoint {
    /// The store `text` names: `sled:PATH` or a PostgreSQL URL.
    pub(crate) fn parse(text: &str) -> Result<Self, CopyError> {
        if let Some(path) = text.strip_prefix("sled:") {
            if path.is_empty() {
                return Err(CopyError::Endpoint(text.to_owned()));
            }
            return Ok(Self::Sled(path.into()));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(Self::Postgres(text.to_owned()));
        }
        Err(CopyError::Endpoint(redacted(text)))
    }

    /// How messages name `text` (a URL's password masked).
    pub(crate) fn shown_text(text: &str) -> String {
        Self::parse(text).map_or_else(|_| redacted(text), |endpoint| endpoint.shown())
    }

    /// How messages name it (a URL's password masked).
    pub(crate) fn shown(&self) -> String {
        match self {
            Self::Sled(path) => format!("sled:{}", path.display()),
            Self::Postgres(url) => mask_pg_url(url),
        }
    }

    /// Opens the store (its migrations applied); a `source` must exist already. Another
    /// process using it is refused: sled's lock, or a live lease on the database (`now_ms`).
    async fn open(&self, source: bool, now_ms: u64) -> Result<Arc<dyn CopyStore>, CopyError> {
        let at = self.shown();
        let failed = |source| CopyError::Store {
            at: at.clone(),
            source,
        };
        match self {
            Self::Sled(path) => {
                if source && !path.join("conf").exists() {
                    return Err(CopyError::NoSource(at));
                }
                let path = path.clone();
                let store =
                    tokio::task::spawn_blocking(move || SledStore::open(&path, 8 * 1024 * 1024))
                        .await
                        .map_err(|e| failed(StoreError::backend(format!("opening stopped: {e}"))))?
                        .map_err(failed)?;
                Ok(Arc::new(store))
            }
            Self::Postgres(url) => {
                let store = PgStore::open(&PgOptions {
                    url: url.clone(),
                    pool_size: 2,
                    schema: None,
                    owner: None,
                })
                .await
                .map_err(failed)?;
                store.refuse_live_lease(now_ms).await.map_err(failed)?;
                Ok(Arc::new(store))
            }
        }
    }
}

/// `text` with what stands between `://` and `@` (a user and password) masked.
fn redacted(text: &str) -> String {
    match text.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://***@{host}"),
            None => text.to_owned(),
        },
        None => text.to_owned(),
    }
}

/// `antler store copy`: copies everything in `from` into `to` (refused when `to` holds a
/// conversation, unless `force`). Returns the counts per kind.
pub(crate) async fn copy_between(
    from: &str,
    to: &str,
    force: bool,
    now_ms: u64,
) -> Result<Vec<(CopyKind, u64)>, CopyError> {
    let source = Endpoint::parse(from)?;
    let target = Endpoint::parse(to)?;
    if source == target {
        return Err(CopyError::Same(source.shown()));
    }
    let reader = source.open(true, now_ms).await?;
    let writer = target.open(false, now_ms).await?;
    copy_stores(
        reader.as_ref(),
        writer.as_ref(),
        force,
        &target.shown(),
        now_ms,
    )
    .await
}

/// Copies every record of `from` into `to`, a page at a time; `to_shown` names the target in
/// errors.
pub(crate) async fn copy_stores(
    from: &dyn CopyStore,
    to: &dyn CopyStore,
    force: bool,
    to_shown: &str,
    now_ms: u64,
) -> Result<Vec<(CopyKind, u64)>, CopyError> {
    let at_target = |source| CopyError::Store {
        at: to_shown.to_owned(),
        source,
    };
    if !force && to.holds_conversations().await.map_err(at_target)? {
        return Err(CopyError::TargetNotEmpty(to_shown.to_owned()));
    }
    let mut counts = BTreeMap::new();
    for kind in CopyKind::ALL {
        let mut after: Option<CopyItem> = None;
        let mut copied = 0u64;
        loop {
            let page = from
                .export_page(kind, after.as_ref(), PAGE, now_ms)
                .await
                .map_err(|source| CopyError::Store {
                    at: "the source".to_owned(),
                    source,
                })?;
            if page.is_empty() {
                break;
            }
            to.import_page(&page).await.map_err(at_target)?;
            copied += page.len() as u64;
            let full = page.len() == PAGE;
            after = page.into_iter().last();
            if !full {
                break;
            }
        }
        counts.insert(kind, copied);
    }
    to.finish_import().await.map_err(at_target)?;
    Ok(counts.into_iter().collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::agent::approvals::{ApprovalState, Requester};
    use crate::agent::memory::MemoryDocument;
    use crate::agent::message::ChatMessage;
    use crate::agent::subagents::SubagentStatus;
    use crate::store::conformance::{accept, accept_new, memory_update, reply, subagent};
    use crate::store::{FinishTurn, InboxStore, MaintenanceStore, Store, ThreadChoice};

    /// Every record of every kind in `store`, as text, read in pages of two.
    pub(crate) async fn everything(store: &dyn CopyStore, now_ms: u64) -> Vec<String> {
        let mut all = Vec::new();
        for kind in CopyKind::ALL {
            let mut after: Option<CopyItem> = None;
            loop {
                let page = store
                    .export_page(kind, after.as_ref(), 2, now_ms)
                    .await
                    .unwrap();
                all.extend(page.iter().map(|item| format!("{item:?}")));
                if page.len() < 2 {
                    break;
                }
                after = page.into_iter().last();
            }
        }
        all
    }

    /// Writes records of every kind into `store` at `now_ms`, through its own methods.
    pub(crate) async fn fill(store: &dyn Store, now_ms: u64) {
        let first = accept_new(store, accept("m1", ThreadChoice::Current, now_ms)).await;
        // Left in the inbox, pending.
        accept_new(store, accept("m2", ThreadChoice::Current, now_ms)).await;
        accept_new(store, accept("m3", ThreadChoice::Current, now_ms)).await;
        store.start_turn(first.seq).await.unwrap();
        let mut thread = store.thread(&first.thread_id).await.unwrap().unwrap();
        thread.messages.push(ChatMessage::user("hi"));
        thread.messages.push(ChatMessage::assistant("hello"));
        thread.messages.push(ChatMessage::assistant("and more"));
        store
            .finish_turn(FinishTurn {
                inbox_seq: first.seq,
                trace: crate::telemetry::TraceContext::fresh(),
                thread: Some(thread),
                replies: vec![reply(&first.thread_id, "a"), reply(&first.thread_id, "b")],
                memory_update: Some(memory_update("api:u1", &first.thread_id, now_ms)),
                draft: None,
                absorbed: Vec::new(),
                now_ms,
            })
            .await
            .unwrap();
        store
            .queue_memory_update(memory_update("api:u2", "t9", now_ms))
            .await
            .unwrap();
        store
            .put_memory("api:u1", &MemoryDocument::default())
            .await
            .unwrap();
        store
            .put_memory("api:u3", &MemoryDocument::default())
            .await
            .unwrap();
        for (id, status) in [
            ("s1", SubagentStatus::Running),
            ("s2", SubagentStatus::Pending),
            ("s3", SubagentStatus::Pending),
        ] {
            store.create_subagent(&subagent(id, status)).await.unwrap();
        }
        store.set_skill_switch("web", false).await.unwrap();
        store.set_skill_switch("shell", true).await.unwrap();
        let request = |user: &str| PairingRequest {
            channel: "telegram".to_owned(),
            user_id: user.to_owned(),
            name: None,
            code: format!("code-{user}"),
            created_at_ms: now_ms,
        };
        store
            .put_pairing_request(&request("u7"), &[])
            .await
            .unwrap();
        store
            .put_pairing_request(&request("u8"), &[])
            .await
            .unwrap();
        let paired = PairedUser {
            channel: "telegram".to_owned(),
            user_id: "u8".to_owned(),
            admin: true,
            approved_at_ms: now_ms,
        };
        store
            .settle_pairing("telegram", "u8", Some(&paired))
            .await
            .unwrap();
        for name in ["daily", "weekly"] {
            let schedule = ScheduleRecord {
                name: name.to_owned(),
                when: "every 15m".to_owned(),
                timezone: "UTC".to_owned(),
                conversation: "api:c1".to_owned(),
                prompt: "status".to_owned(),
                created_by: "api:u1".to_owned(),
                created_at_ms: now_ms,
            };
            store.add_schedule(&schedule, 10).await.unwrap();
            store.set_schedule_mark(name, now_ms + 7).await.unwrap();
        }
        for (id, message) in [("ap1", 1), ("ap2", 2)] {
            let record = ApprovalRecord {
                id: id.to_owned(),
                conversation: "api:c1".to_owned(),
                channel: "api".to_owned(),
                thread_id: first.thread_id.clone(),
                message,
                call_id: "call_1".to_owned(),
                tool: "bash".to_owned(),
                arguments: "{}".to_owned(),
                requester: Requester {
                    user_id: "ada".to_owned(),
                    name: None,
                    admin: false,
                    group: false,
                },
                created_at_ms: now_ms,
                expires_at_ms: now_ms + 60_000,
                state: ApprovalState::Pending,
                decided_by: None,
                reason: None,
                decided_at_ms: None,
                queued: false,
            };
            store.open_approval(&record, 10).await.unwrap();
        }
    }

    fn sled_at(dir: &std::path::Path) -> SledStore {
        SledStore::open(dir, 1024 * 1024).unwrap()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_sled_store_copies_into_another_equal_and_a_full_target_needs_force() {
        let now = crate::now_ms();
        let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let source = sled_at(dirs.0.path());
        fill(&source, now).await;
        let target = sled_at(dirs.1.path());
        let counts = copy_stores(&source, &target, false, "target", now)
            .await
            .unwrap();
        for (kind, count) in &counts {
            assert!(*count > 0, "no {} copied: {counts:?}", kind.name());
        }
        let original = everything(&source, now).await;
        assert_eq!(everything(&target, now).await, original);
        let refused = copy_stores(&source, &target, false, "target", now).await;
        assert!(
            matches!(refused, Err(CopyError::TargetNotEmpty(_))),
            "{refused:?}"
        );
        copy_stores(&source, &target, true, "target", now)
            .await
            .unwrap();
        assert_eq!(everything(&target, now).await, original);
        // The copy resumes: its counts are the source's, and the next accept is numbered
        // after the copied ones.
        assert_eq!(target.stats().await.unwrap().inbox, 2);
        assert_eq!(target.stats().await.unwrap().outbox_pending, 2);
        drop(target);
        let reopened = sled_at(dirs.1.path());
        let next = accept_new(&reopened, accept("m4", ThreadChoice::Current, now)).await;
        let highest = reopened
            .inbox()
            .await
            .unwrap()
            .iter()
            .map(|item| item.seq)
            .max();
        assert_eq!(Some(next.seq), highest);
        assert!(next.seq > 3);
        // A dedupe key copied is still recognised.
        assert!(matches!(
            reopened
                .accept(accept("m2", ThreadChoice::Current, now))
                .await
                .unwrap(),
            crate::store::Accepted::Duplicate { .. }
        ));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_sled_store_copies_into_memory_and_back_equal() {
        let now = crate::now_ms();
        let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let source = sled_at(dirs.0.path());
        fill(&source, now).await;
        let original = everything(&source, now).await;
        let memory = crate::store::MemStore::new();
        copy_stores(&source, &memory, false, "memory", now)
            .await
            .unwrap();
        assert_eq!(everything(&memory, now).await, original);
        let back = sled_at(dirs.1.path());
        copy_stores(&memory, &back, false, "sled", now)
            .await
            .unwrap();
        assert_eq!(everything(&back, now).await, original);
        // Filled through its own methods, the in-memory store exports what sled does.
        let filled = crate::store::MemStore::new();
        fill(&filled, now).await;
        assert_eq!(everything(&filled, now).await.len(), original.len());
    }

    #[test]
    fn endpoints_are_sled_paths_or_postgres_urls_and_passwords_are_masked() {
        assert!(matches!(
            Endpoint::parse("sled:data"),
            Ok(Endpoint::Sled(_))
        ));
        assert!(Endpoint::parse("sled:").is_err());
        assert!(Endpoint::parse("mysql://u:pw@h/db").is_err());
        let url = Endpoint::parse("postgres://u:s3cret@h/db").unwrap();
        assert!(!url.shown().contains("s3cret"), "{}", url.shown());
        let refused = Endpoint::parse("postgre://u:s3cret@h/db")
            .unwrap_err()
            .to_string();
        assert!(!refused.contains("s3cret"), "{refused}");
        assert!(refused.contains("postgre://***@h/db"), "{refused}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_sled_source_that_does_not_exist_is_refused_not_made() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nothing");
        let from = format!("sled:{}", missing.display());
        let to = format!("sled:{}", dir.path().join("to").display());
        let refused = copy_between(&from, &to, false, 0).await;
        assert!(
            matches!(refused, Err(CopyError::NoSource(_))),
            "{refused:?}"
        );
        assert!(!missing.exists());
        let same = copy_between(&to, &to, false, 0).await;
        assert!(matches!(same, Err(CopyError::Same(_))), "{same:?}");
    }
}
