//! Approvals, the gateway's side (the `approval` middleware holds the calls): deciding once,
//! resuming through the inbox, and expiry.
//!
//! - **Deciding**: [`Approvals::decide`] checks who decides (`approvals.approvers`,
//!   `approvals.self_approval`), then stores the decision with a compare-and-set, so a second
//!   decision, a redelivered one or two approvers at once change nothing after the first.
//! - **Resuming**: the winning decision queues an inbox item on the approval's conversation
//!   (event id `antler-approval:<id>`, so the inbox's dedupe makes it one item however often
//!   it is queued), ordered with the conversation's messages; its turn resumes the held call.
//!   The record is marked queued once the item is in the inbox; a decision whose item was not
//!   queued (a crash between the two writes, a full backlog) is queued again by the timer.
//! - **Expiry**: the timer denies every pending approval past `expires_at_ms` ("expired") and
//!   resumes it the same way; it runs at start (so what expired while antler was down is
//!   denied then) and wakes for the next expiry, or when a new approval is opened.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use antler_channel::{ConversationKey, InboundEvent, UserRef};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::WeakIngress;
use crate::agent::approvals::{ApprovalLedger, ApprovalRecord, ApprovalState, Opened};
use crate::agent::middleware::approval::{
    ApprovalsConfig, MAX_PENDING_PER_CONVERSATION, MAX_REASON_CHARS, bounded,
};
use crate::store::{ApprovalDecision, Decided, Store, StoreError};

/// The event id prefix of an approval's resume item.
const RESUME_PREFIX: &str = "antler-approval:";

/// How soon the timer tries again what failed (a store error, a full backlog).
const RETRY_MS: u64 = 5_000;

/// The longest the timer sleeps between passes (a decision left unqueued is retried then).
const TIMER_MAX_SLEEP: Duration = Duration::from_secs(60);

/// Who decides: a chat user or the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decider {
    /// `<channel>:<user id>`; `None` for the admin API.
    pub(crate) key: Option<String>,
    pub(crate) name: Option<String>,
    /// An admin where they wrote (or the admin API).
    pub(crate) admin: bool,
}

impl Decider {
    /// As the chat and the model are told: `alice (telegram:42)`.
    fn shown(&self) -> String {
        match (&self.name, &self.key) {
            (Some(name), Some(key)) => format!("{name} ({key})"),
            (None, Some(key)) => key.clone(),
            (_, None) => "an operator (admin API)".to_owned(),
        }
    }
}

/// Why a decision was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecideError {
    #[error("there is no approval {0}")]
    NotFound(String),
    #[error("only approvers may decide")]
    NotApprover,
    #[error("the requester may not approve their own call")]
    SelfApproval,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The approval service: the store, the rules, and the way back into the inbox.
pub(crate) struct Approvals {
    store: Arc<dyn Store>,
    config: ApprovalsConfig,
    ingress: OnceLock<WeakIngress>,
    wake: Notify,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The store as the middleware's ledger; opening an approval wakes the timer.
struct Ledger(Arc<Approvals>);

#[async_trait::async_trait]
impl ApprovalLedger for Ledger {
    async fn for_call(
        &self,
        thread_id: &str,
        call_key: &str,
    ) -> Result<Option<ApprovalRecord>, String> {
        self.0
            .store
            .approval_for_call(thread_id, call_key)
            .await
            .map_err(|e| e.to_string())
    }

    async fn open(&self, record: ApprovalRecord) -> Result<Opened, String> {
        let opened = self
            .0
            .store
            .open_approval(&record, MAX_PENDING_PER_CONVERSATION)
            .await
            .map_err(|e| e.to_string())?;
        self.0.wake.notify_one();
        Ok(opened)
    }
}

/// Keeps the earlier of `next` and `at`.
fn earliest(next: &mut Option<u64>, at: u64) {
    *next = Some(next.map_or(at, |n| n.min(at)));
}

/// The approval an inbox item resumes, when it is a resume item.
pub(crate) fn resumed_id(event: &InboundEvent) -> Option<&str> {
    event
        .event_id
        .strip_prefix(RESUME_PREFIX)
        .filter(|_| event.text.is_empty() && event.attachments.is_empty())
}

impl Approvals {
    pub(crate) fn new(store: Arc<dyn Store>, config: ApprovalsConfig) -> Arc<Self> {
        Arc::new(Self {
            store,
            config,
            ingress: OnceLock::new(),
            wake: Notify::new(),
        })
    }

    /// The ledger the `approval` middleware keeps approvals in.
    pub(crate) fn ledger(self: &Arc<Self>) -> Arc<dyn ApprovalLedger> {
        Arc::new(Ledger(Arc::clone(self)))
    }

    /// Lets decisions queue their resume items (the ingress is built after the runner).
    pub(crate) fn attach(&self, ingress: WeakIngress) {
        let _ = self.ingress.set(ingress);
    }

    /// Pending approvals, oldest first: those of `conversation`, or all with `None`.
    pub(crate) async fn pending(
        &self,
        conversation: Option<&str>,
    ) -> Result<Vec<ApprovalRecord>, StoreError> {
        Ok(self
            .store
            .open_approvals()
            .await?
            .into_iter()
            .filter(|r| r.state == ApprovalState::Pending)
            .filter(|r| conversation.is_none_or(|c| r.conversation == c))
            .collect())
    }

    /// Approves or denies approval `id` for `decider`. The first decision wins: the answer
    /// is the record as decided now ([`Decided::Now`]) or before ([`Decided::Before`]).
    pub(crate) async fn decide(
        &self,
        id: &str,
        decider: &Decider,
        approve: bool,
        reason: Option<&str>,
    ) -> Result<Decided, DecideError> {
        // Who may decide is checked first: others learn nothing, not even whether `id` exists.
        let may = match &decider.key {
            Some(key) => self.config.may_decide(key, decider.admin),
            None => decider.admin,
        };
        if !may {
            return Err(DecideError::NotApprover);
        }
        let record = self
            .store
            .approval(id)
            .await?
            .ok_or_else(|| DecideError::NotFound(id.to_owned()))?;
        if !self.config.self_approval
            && approve
            && decider.key.as_deref() == Some(record.requester_key().as_str())
        {
            return Err(DecideError::SelfApproval);
        }
        let decision = ApprovalDecision {
            state: if approve {
                ApprovalState::Approved
            } else {
                ApprovalState::Denied
            },
            by: decider.shown(),
            reason: reason
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .map(|r| bounded(r, MAX_REASON_CHARS)),
            at_ms: crate::now_ms(),
        };
        let decided = self.store.decide_approval(id, &decision).await?;
        if let Decided::Now(record) = &decided {
            tracing::info!(approval = %record.id, state = record.state.as_str(), "approval decided");
            metrics::counter!("antler_approvals_total", "state" => record.state.as_str())
                .increment(1);
            self.queue_resume(record).await;
        }
        Ok(decided)
    }

    /// Queues the resume item of a decided approval; a failure is retried by the timer.
    /// Returns whether it is queued.
    async fn queue_resume(&self, record: &ApprovalRecord) -> bool {
        let Some(ingress) = self.ingress.get().and_then(WeakIngress::upgrade) else {
            return false;
        };
        let event = InboundEvent {
            channel: record.channel.clone(),
            event_id: format!("{RESUME_PREFIX}{}", record.id),
            conversation: ConversationKey::from(record.conversation.clone()),
            user: UserRef {
                id: record.requester.user_id.clone(),
                name: record.requester.name.clone(),
                admin: record.requester.admin,
                aliases: Vec::new(),
            },
            text: String::new(),
            reply_to: None,
            received_at_ms: crate::now_ms(),
            attachments: Vec::new(),
            group: record.requester.group,
            chat: None,
            refused: false,
            follow_up: false,
            unsupported: None,
            interactive: false,
            reply_context: None,
            media_group: None,
        };
        match ingress.resume(event).await {
            Ok(_) => {
                if let Err(e) = self.store.approval_queued(&record.id).await {
                    // Queued again later: the inbox's dedupe recognises it.
                    tracing::warn!(approval = %record.id, error = %e, "cannot mark an approval queued");
                }
                true
            }
            Err(e) => {
                tracing::warn!(approval = %record.id, error = %e, "cannot queue an approval's resume; retrying later");
                false
            }
        }
    }

    /// One pass: pending approvals past their time are denied as expired, and decided ones
    /// whose resume is not queued are queued. Returns when the next one expires.
    pub(crate) async fn tick(&self, now_ms: u64) -> Option<u64> {
        let open = match self.store.open_approvals().await {
            Ok(open) => open,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read pending approvals");
                return Some(now_ms.saturating_add(RETRY_MS));
            }
        };
        let mut next: Option<u64> = None;
        for record in open {
            if record.state == ApprovalState::Withdrawn {
                // Its call was answered by the turn that withdrew it: nothing to resume.
                if let Err(e) = self.store.approval_queued(&record.id).await {
                    tracing::warn!(approval = %record.id, error = %e, "cannot close a withdrawn approval");
                }
                continue;
            }
            if record.state != ApprovalState::Pending {
                if !self.queue_resume(&record).await {
                    earliest(&mut next, now_ms.saturating_add(RETRY_MS));
                }
                continue;
            }
            if record.expires_at_ms > now_ms {
                earliest(&mut next, record.expires_at_ms);
                continue;
            }
            let decision = ApprovalDecision {
                state: ApprovalState::Expired,
                by: "antler".to_owned(),
                reason: Some("nobody decided in time".to_owned()),
                at_ms: now_ms,
            };
            match self.store.decide_approval(&record.id, &decision).await {
                Ok(Decided::Now(record) | Decided::Before(record)) => {
                    if record.state == ApprovalState::Expired {
                        metrics::counter!("antler_approvals_total", "state" => "expired")
                            .increment(1);
                    }
                    if !self.queue_resume(&record).await {
                        earliest(&mut next, now_ms.saturating_add(RETRY_MS));
                    }
                }
                Err(e) => {
                    tracing::warn!(approval = %record.id, error = %e, "cannot expire an approval");
                    earliest(&mut next, now_ms.saturating_add(RETRY_MS));
                }
            }
        }
        next
    }

    /// The expiry timer: a pass now (what expired while antler was down), then at each
    /// expiry, when an approval is opened, and at least every minute; until `stop`.
    pub(crate) async fn run(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let next = self.tick(crate::now_ms()).await;
            let sleep = next.map_or(TIMER_MAX_SLEEP, |at| {
                Duration::from_millis(at.saturating_sub(crate::now_ms())).min(TIMER_MAX_SLEEP)
            });
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(sleep) => {}
            }
        }
    }
}
