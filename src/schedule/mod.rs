//! Schedules: prompts sent to a conversation on a timetable (`[[schedules]]` in the config,
//! `/schedule add` in chat).
//!
//! Each firing becomes an inbox item like a message, through the ingress ([`Enqueue`]): it is
//! durable, ordered with the conversation's other messages, and its answer goes through the
//! outbox. Its event id is `schedule:<name>:<fire time ms>`, so the inbox's dedupe recognises
//! a firing enqueued twice. Per schedule the store keeps a mark, the fire time enqueued last
//! ([`ScheduleStore::set_schedule_mark`]), written after the firing is in the inbox: a crash
//! between the two enqueues it again on the next start, and the dedupe drops the copy. So a
//! restart at any moment neither loses a firing nor runs it twice.
//!
//! After downtime, the firings that fell in it are `missed`: `once` runs the latest of them
//! (one catch-up), `skip` none. A firing less than [`LATE_GRACE_MS`] late is on time either way.
//!
//! The scheduler is one task: it sleeps until the next firing is due, and wakes early when a
//! schedule is added or removed.

pub(crate) mod clock;
pub(crate) mod spec;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use antler_channel::{ConversationKey, InboundEvent, UserRef};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::live::Live;
use crate::store::{AddedSchedule, ScheduleRecord, Store, StoreError};
pub(crate) use clock::{Clock, SystemClock};
pub(crate) use spec::{Missed, When};

/// Chat-made schedules kept at most.
pub(crate) const MAX_CHAT_SCHEDULES: usize = 100;

/// How late a firing may be and still count as on time (a busy machine, a slow store), not
/// as missed.
pub(crate) const LATE_GRACE_MS: u64 = 5 * 60_000;

/// How long the scheduler waits before trying again when enqueueing or the store failed.
const RETRY: Duration = Duration::from_secs(5);

/// One schedule, checked.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    pub(crate) name: String,
    pub(crate) when: When,
    /// When it fires, as people read it: `0 9 * * 1-5 (Europe/Berlin)`, `every 15m`.
    pub(crate) when_text: String,
    pub(crate) conversation: ConversationKey,
    pub(crate) prompt: String,
    pub(crate) missed: Missed,
    /// When it was made in chat; `None` for a config schedule.
    pub(crate) created_at_ms: Option<u64>,
}

impl Schedule {
    /// A chat-made schedule as stored.
    fn from_record(record: &ScheduleRecord) -> Result<Self, String> {
        let when = When::parse(&record.when, &record.timezone)?;
        Ok(Self {
            when_text: describe(&record.when, &when, &record.timezone),
            name: record.name.clone(),
            when,
            conversation: ConversationKey::from(record.conversation.clone()),
            prompt: record.prompt.clone(),
            missed: Missed::Once,
            created_at_ms: Some(record.created_at_ms),
        })
    }

    /// The inbox event of its firing at `fire_ms`.
    fn firing(&self, fire_ms: u64, now_ms: u64) -> InboundEvent {
        InboundEvent {
            channel: self.conversation.channel().to_owned(),
            event_id: format!("schedule:{}:{fire_ms}", self.name),
            conversation: self.conversation.clone(),
            // Only admins make schedules (in chat or in the config file): it runs as one.
            user: UserRef {
                id: format!("schedule:{}", self.name),
                name: Some(format!("schedule {}", self.name)),
                admin: true,
                aliases: Vec::new(),
            },
            text: self.prompt.clone(),
            reply_to: None,
            received_at_ms: now_ms,
            attachments: Vec::new(),
            // Others read the answer: no one's personal memory goes into it.
            group: true,
            chat: None,
            refused: false,
            follow_up: false,
            unsupported: None,
            interactive: false,
            reply_context: None,
            media_group: None,
        }
    }
}

/// `when` as a list shows it.
pub(crate) fn describe(text: &str, when: &When, timezone: &str) -> String {
    match when {
        When::Every { .. } => text.trim().to_owned(),
        When::Cron { .. } => format!("{} ({timezone})", text.trim()),
    }
}

/// Why a firing was not enqueued.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EnqueueError {
    /// Intake has stopped: the scheduler stops too.
    #[error("shutting down")]
    ShuttingDown,
    /// Not now (a full backlog, the store): try again later.
    #[error("{0}")]
    Later(String),
}

/// Where firings go: the ingress, which stores them in the inbox like messages.
#[async_trait::async_trait]
pub(crate) trait Enqueue: Send + Sync {
    /// Stores `event` in the inbox (durably) and queues its turn; a redelivery of one stored
    /// before is fine and changes nothing.
    async fn enqueue(&self, event: InboundEvent) -> Result<(), EnqueueError>;
}

/// Why `/schedule add` did not add.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AddError {
    #[error("{0}")]
    Invalid(String),
    #[error("a schedule named {0} exists already")]
    Exists(String),
    #[error("there are {MAX_CHAT_SCHEDULES} schedules already; remove one first")]
    Full,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why `/schedule remove` did not remove.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RemoveError {
    #[error("{0} is set in the config file; it cannot be removed from chat")]
    InConfig(String),
    #[error("there is no schedule named {0}")]
    Unknown(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Every schedule: the config's, read at start and again by a reload, and the chat-made ones
/// in the store. Shared by the scheduler and the `/schedule` commands, which wake it on a
/// change.
#[derive(Debug)]
pub(crate) struct Schedules {
    config: Live<Vec<Schedule>>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// The time zone of chat-made cron schedules (`agent.timezone`).
    timezone: String,
    changed: Notify,
}

impl Schedules {
    pub(crate) fn new(
        config: Vec<Schedule>,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        timezone: String,
    ) -> Self {
        Self {
            config: Live::new(Arc::new(config)),
            store,
            clock,
            timezone,
            changed: Notify::new(),
        }
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Replaces the config's schedules (a reload); the scheduler takes them up at once. A new
    /// one starts from now, a removed one stops.
    pub(crate) fn set_configured(&self, schedules: Vec<Schedule>) {
        self.config.set(Arc::new(schedules));
        self.changed.notify_one();
    }

    /// Whether the config has a schedule called `name`.
    fn configured(&self, name: &str) -> bool {
        self.config.current().iter().any(|s| s.name == name)
    }

    /// The config's schedules, then the chat-made ones, by name. A stored one that no longer
    /// reads (its time zone left the database) or whose name the config took is left out.
    pub(crate) async fn all(&self) -> Result<Vec<Schedule>, StoreError> {
        let config = self.config.current();
        let mut all = Vec::clone(&config);
        for record in self.store.schedules().await? {
            if config.iter().any(|s| s.name == record.name) {
                tracing::warn!(
                    schedule = %record.name,
                    "a chat-made schedule has the name of a config schedule; the config's runs"
                );
                continue;
            }
            match Schedule::from_record(&record) {
                Ok(schedule) => all.push(schedule),
                Err(e) => tracing::warn!(
                    schedule = %record.name,
                    error = %e,
                    "a stored schedule cannot be read; it does not run"
                ),
            }
        }
        Ok(all)
    }

    /// Adds a schedule made in chat by `created_by` in `conversation`. *Durable*; the
    /// scheduler takes it up at once.
    pub(crate) async fn add(
        &self,
        name: &str,
        when: &str,
        prompt: &str,
        conversation: &ConversationKey,
        created_by: &str,
    ) -> Result<Schedule, AddError> {
        spec::check_name(name).map_err(|e| AddError::Invalid(format!("the name {e}")))?;
        spec::check_prompt(prompt).map_err(|e| AddError::Invalid(format!("the prompt {e}")))?;
        if self.configured(name) {
            return Err(AddError::Exists(name.to_owned()));
        }
        let record = ScheduleRecord {
            name: name.to_owned(),
            when: when.trim().to_owned(),
            timezone: self.timezone.clone(),
            conversation: conversation.as_str().to_owned(),
            prompt: prompt.trim().to_owned(),
            created_by: created_by.to_owned(),
            created_at_ms: self.clock.now_ms(),
        };
        let schedule = Schedule::from_record(&record)
            .map_err(|e| AddError::Invalid(format!("the time {e}")))?;
        match self.store.add_schedule(&record, MAX_CHAT_SCHEDULES).await? {
            AddedSchedule::Added => {}
            AddedSchedule::Exists => return Err(AddError::Exists(name.to_owned())),
            AddedSchedule::Full => return Err(AddError::Full),
        }
        tracing::info!(schedule = name, by = created_by, "schedule added");
        self.changed.notify_one();
        Ok(schedule)
    }

    /// Removes the chat-made schedule `name`. *Durable*.
    pub(crate) async fn remove(&self, name: &str) -> Result<(), RemoveError> {
        if self.configured(name) {
            return Err(RemoveError::InConfig(name.to_owned()));
        }
        if !self.store.remove_schedule(name).await? {
            return Err(RemoveError::Unknown(name.to_owned()));
        }
        tracing::info!(schedule = name, "schedule removed");
        self.changed.notify_one();
        Ok(())
    }
}

/// What the scheduler does with a schedule now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Enqueue the firing at this time.
    Fire(u64),
    /// Move the mark past missed firings up to this time, running none.
    Skip(u64),
    /// Nothing is due; the next firing is at this time (`None`: never).
    Wait(Option<u64>),
}

/// The step for a schedule whose firings are enqueued up to `mark`, at `now`.
fn step(schedule: &Schedule, mark: u64, now: u64) -> Step {
    let Some(latest) = schedule.when.latest_in(mark, now) else {
        return Step::Wait(schedule.when.next_after(mark.max(now)));
    };
    if schedule.missed == Missed::Once || now.saturating_sub(latest) <= LATE_GRACE_MS {
        Step::Fire(latest)
    } else {
        Step::Skip(latest)
    }
}

/// Runs the schedules until `stop`: each firing due goes to `enqueue`, then its mark is
/// stored.
pub(crate) async fn run(book: Arc<Schedules>, enqueue: Arc<dyn Enqueue>, stop: CancellationToken) {
    loop {
        // Registered before reading, so a change made during the pass wakes the next wait.
        let changed = book.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let (wake_at, retry) = match pass(&book, enqueue.as_ref()).await {
            Ok(wake_at) => (wake_at, false),
            Err(PassError::ShuttingDown) => return,
            Err(PassError::Later(e)) => {
                tracing::warn!(error = %e, retry_in = ?RETRY, "schedules: cannot fire now; retrying");
                (None, true)
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = &mut changed => {}
            () = book.clock.sleep_until(wake_at.unwrap_or(u64::MAX)), if wake_at.is_some() => {}
            () = tokio::time::sleep(RETRY), if retry => {}
        }
    }
}

enum PassError {
    ShuttingDown,
    Later(String),
}

impl From<StoreError> for PassError {
    fn from(e: StoreError) -> Self {
        Self::Later(e.to_string())
    }
}

/// Fires what is due; returns when the next firing is.
async fn pass(book: &Schedules, enqueue: &dyn Enqueue) -> Result<Option<u64>, PassError> {
    let schedules = book.all().await?;
    let marks: BTreeMap<String, u64> = book.store.schedule_marks().await?;
    let mut next: Option<u64> = None;
    for schedule in &schedules {
        let now = book.clock.now_ms();
        let mark = match marks.get(&schedule.name) {
            Some(mark) => *mark,
            None => match schedule.created_at_ms {
                Some(created) => created,
                None => {
                    // A config schedule seen for the first time: it starts now, and the mark
                    // says so, so downtime before its first firing counts as missed.
                    book.store.set_schedule_mark(&schedule.name, now).await?;
                    now
                }
            },
        };
        let wait = match step(schedule, mark, now) {
            Step::Fire(at) => {
                enqueue
                    .enqueue(schedule.firing(at, now))
                    .await
                    .map_err(|e| match e {
                        EnqueueError::ShuttingDown => PassError::ShuttingDown,
                        EnqueueError::Later(e) => PassError::Later(e),
                    })?;
                book.store.set_schedule_mark(&schedule.name, at).await?;
                tracing::info!(schedule = %schedule.name, fire_ms = at, late_ms = now.saturating_sub(at), "schedule fired");
                metrics::counter!("antler_schedule_firings_total", "outcome" => "fired")
                    .increment(1);
                schedule.when.next_after(at.max(now))
            }
            Step::Skip(at) => {
                book.store.set_schedule_mark(&schedule.name, at).await?;
                tracing::info!(schedule = %schedule.name, missed_ms = at, "schedule: firings missed during downtime are skipped");
                metrics::counter!("antler_schedule_firings_total", "outcome" => "skipped")
                    .increment(1);
                schedule.when.next_after(at.max(now))
            }
            Step::Wait(at) => at,
        };
        if let Some(at) = wait {
            next = Some(next.map_or(at, |n| n.min(at)));
        }
    }
    Ok(next)
}

/// A schedule's next firing after now, for lists.
pub(crate) fn next_run(schedule: &Schedule, now_ms: u64) -> Option<u64> {
    schedule.when.next_after(now_ms)
}
