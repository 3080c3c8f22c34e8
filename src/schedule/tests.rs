use std::sync::{Arc, Mutex};
use std::time::Duration;

use antler_channel::{ConversationKey, InboundEvent};
use antler_testkit::wait_until;
use tokio_util::sync::CancellationToken;

use super::clock::ManualClock;
use super::spec::{self, Missed, When};
use super::*;
use crate::store::{MemStore, ScheduleStore};

/// Milliseconds since the epoch of a civil time in a zone.
fn at(civil: &str, zone: &str) -> u64 {
    let zoned = civil
        .parse::<jiff::civil::DateTime>()
        .unwrap()
        .in_tz(zone)
        .unwrap();
    u64::try_from(zoned.timestamp().as_millisecond()).unwrap()
}

/// The firings of `when` in `(from, until]`.
fn firings(when: &When, from: u64, until: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut cursor = from;
    while let Some(next) = when.next_after(cursor) {
        if next > until {
            break;
        }
        out.push(next);
        cursor = next;
    }
    out
}

#[test]
fn a_cron_schedule_fires_at_its_local_time() {
    let when = When::cron("0 9 * * 1-5", "Europe/Berlin").unwrap();
    // Friday 4 December 2026, 10:00 in Berlin: the next is Monday at 9:00 there (8:00 UTC).
    let friday = at("2026-12-04T10:00", "Europe/Berlin");
    assert_eq!(when.next_after(friday), Some(at("2026-12-07T08:00", "UTC")));
    // Exclusive: from a firing, the next one.
    let monday = at("2026-12-07T09:00", "Europe/Berlin");
    assert_eq!(
        when.next_after(monday),
        Some(at("2026-12-08T09:00", "Europe/Berlin"))
    );
}

#[test]
fn daylight_saving_changes_neither_skip_nor_double_a_firing() {
    // 29 March 2026: Berlin's clocks jump from 2:00 to 3:00, so 2:30 does not exist that day.
    let when = When::cron("30 2 * * *", "Europe/Berlin").unwrap();
    let spring = firings(
        &when,
        at("2026-03-28T00:00", "Europe/Berlin"),
        at("2026-03-31T00:00", "Europe/Berlin"),
    );
    assert_eq!(spring.len(), 3, "one a day: {spring:?}");
    assert_eq!(spring[0], at("2026-03-28T02:30", "Europe/Berlin"));
    assert_eq!(
        spring[1],
        at("2026-03-29T03:00", "Europe/Berlin"),
        "right after the gap"
    );
    assert_eq!(spring[2], at("2026-03-30T02:30", "Europe/Berlin"));
    // 25 October 2026: the clocks go back from 3:00 to 2:00, so 2:30 happens twice.
    let autumn = firings(
        &when,
        at("2026-10-24T00:00", "Europe/Berlin"),
        at("2026-10-27T00:00", "Europe/Berlin"),
    );
    assert_eq!(autumn.len(), 3, "one a day: {autumn:?}");
    // The first 2:30 of the 25th (summer time, 0:30 UTC).
    assert_eq!(autumn[1], at("2026-10-25T00:30", "UTC"));
}

#[test]
fn a_catch_up_after_a_long_downtime_is_the_latest_missed_firing() {
    let when = When::cron("* * * * *", "Europe/Berlin").unwrap();
    let until = at("2026-12-04T10:07", "UTC") + 30_000;
    assert_eq!(
        when.latest_in(at("2025-01-01T00:00", "UTC"), until),
        Some(at("2026-12-04T10:07", "UTC")),
        "found at once, not by stepping through two years of minutes"
    );
    assert_eq!(when.latest_in(until, until + 10_000), None);
    let daily = When::cron("30 2 * * *", "Europe/Berlin").unwrap();
    assert_eq!(
        daily.latest_in(
            at("2026-03-01T00:00", "UTC"),
            at("2026-03-29T12:00", "Europe/Berlin")
        ),
        Some(at("2026-03-29T03:00", "Europe/Berlin")),
        "the gap's firing, as the forward search has it"
    );
}

#[test]
fn every_fires_at_multiples_of_its_period() {
    let when = When::parse("every 15m", "UTC").unwrap();
    let start = at("2026-12-04T10:07", "UTC");
    assert_eq!(when.next_after(start), Some(at("2026-12-04T10:15", "UTC")));
    assert_eq!(
        when.latest_in(start, at("2026-12-04T11:20", "UTC")),
        Some(at("2026-12-04T11:15", "UTC"))
    );
    assert_eq!(when.latest_in(start, at("2026-12-04T10:14", "UTC")), None);
}

#[test]
fn bad_times_names_and_prompts_are_refused_saying_why() {
    for (period, problem) in [
        ("30s", "at least a minute"),
        ("0m", "at least a minute"),
        ("15", "whole number with a unit"),
        ("m", "whole number with a unit"),
        ("1.5h", "whole number with a unit"),
        ("99999999999999999999d", "whole number with a unit"),
        ("400d", "at most 366 days"),
    ] {
        let error = spec::parse_period(period).unwrap_err();
        assert!(error.contains(problem), "{period}: {error}");
    }
    assert_eq!(spec::parse_period("90s"), Ok(90_000));
    assert_eq!(spec::parse_period("2h"), Ok(7_200_000));
    for cron in [
        "0 9 * *",
        "0 0 9 * * 1-5",
        "61 * * * *",
        "* * * * * * *",
        "hello",
    ] {
        assert!(When::cron(cron, "UTC").is_err(), "{cron}");
    }
    assert!(When::cron("@daily", "UTC").is_ok());
    let error = When::cron("0 9 * * *", "Mars/Olympus").unwrap_err();
    assert!(error.contains("not a known IANA time zone"), "{error}");

    for name in ["morning-errors", "a", "x1-2", &"a".repeat(40)] {
        assert!(spec::check_name(name).is_ok(), "{name}");
    }
    for name in [
        "",
        "Morning",
        "morning errors",
        "morning_errors",
        "é",
        &"a".repeat(41),
    ] {
        assert!(spec::check_name(name).is_err(), "{name}");
    }
    assert!(spec::check_prompt("Summarise the errors").is_ok());
    for prompt in ["", "   ", "/new", &"x".repeat(spec::MAX_PROMPT_CHARS + 1)] {
        assert!(spec::check_prompt(prompt).is_err(), "{prompt:.20}");
    }
}

/// An ingress stand-in: records what it is given, or fails while told to.
#[derive(Default)]
struct Inbox {
    events: Mutex<Vec<InboundEvent>>,
    failing: Mutex<bool>,
}

impl Inbox {
    fn ids(&self) -> Vec<String> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.event_id.clone())
            .collect()
    }
}

#[async_trait::async_trait]
impl Enqueue for Inbox {
    async fn enqueue(&self, event: InboundEvent) -> Result<(), EnqueueError> {
        if *self.failing.lock().unwrap() {
            return Err(EnqueueError::Later("the backlog is full".to_owned()));
        }
        self.events.lock().unwrap().push(event);
        Ok(())
    }
}

fn config_schedule(name: &str, cron: &str, missed: Missed) -> Schedule {
    let when = When::cron(cron, "UTC").unwrap();
    Schedule {
        name: name.to_owned(),
        when_text: describe(cron, &when, "UTC"),
        when,
        conversation: ConversationKey::from("telegram:42".to_owned()),
        prompt: "Summarise the errors".to_owned(),
        missed,
        created_at_ms: None,
    }
}

/// A running scheduler and what it needs.
struct Running {
    book: Arc<Schedules>,
    inbox: Arc<Inbox>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(store: &MemStore, clock: &ManualClock, schedules: Vec<Schedule>) -> Self {
        let book = Arc::new(Schedules::new(
            schedules,
            Arc::new(store.reopen()),
            Arc::new(clock.clone()),
            "Europe/Berlin".to_owned(),
        ));
        let inbox = Arc::new(Inbox::default());
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(
            Arc::clone(&book),
            Arc::clone(&inbox) as Arc<dyn Enqueue>,
            stop.clone(),
        ));
        Self {
            book,
            inbox,
            stop,
            task,
        }
    }

    /// Waits until the scheduler has stored `mark` for `name`: it has finished with that
    /// firing.
    async fn wait_for_mark(&self, store: &MemStore, name: &str, mark: u64) {
        wait_until(&format!("the mark of {name} at {mark}"), || async {
            (store.schedule_marks().await.unwrap().get(name) == Some(&mark)).then_some(())
        })
        .await;
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

/// Lets the scheduler run whatever it would run now (real time: it does not sleep on it).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test]
async fn a_schedule_fires_on_time_once_as_a_message_of_its_conversation() {
    let store = MemStore::new();
    let clock = ManualClock::new(at("2026-12-04T08:59", "UTC"));
    let running = Running::start(
        &store,
        &clock,
        vec![config_schedule("morning", "0 9 * * *", Missed::Once)],
    );
    let started = clock.now_ms();
    running.wait_for_mark(&store, "morning", started).await;
    settle().await;
    assert!(running.inbox.ids().is_empty(), "not yet due");

    let nine = at("2026-12-04T09:00", "UTC");
    clock.set(nine);
    running.wait_for_mark(&store, "morning", nine).await;
    assert_eq!(running.inbox.ids(), [format!("schedule:morning:{nine}")]);
    let event = running.inbox.events.lock().unwrap()[0].clone();
    assert_eq!(event.conversation.as_str(), "telegram:42");
    assert_eq!(event.channel, "telegram");
    assert_eq!(event.text, "Summarise the errors");
    assert_eq!(event.user.id, "schedule:morning");
    assert!(event.user.admin && !event.refused && !event.follow_up);

    // Later that day nothing more; the next day once more.
    clock.set(at("2026-12-04T18:00", "UTC"));
    settle().await;
    assert_eq!(running.inbox.ids().len(), 1);
    let tomorrow = at("2026-12-05T09:00", "UTC");
    clock.set(tomorrow);
    running.wait_for_mark(&store, "morning", tomorrow).await;
    assert_eq!(running.inbox.ids().len(), 2);
    running.stop().await;
}

#[tokio::test]
async fn after_downtime_once_runs_one_catch_up_and_skip_none() {
    let store = MemStore::new();
    let clock = ManualClock::new(at("2026-12-04T08:00", "UTC"));
    let schedules = || {
        vec![
            config_schedule("caught-up", "0 9 * * *", Missed::Once),
            config_schedule("skipped", "0 9 * * *", Missed::Skip),
        ]
    };
    let first = Running::start(&store, &clock, schedules());
    first.wait_for_mark(&store, "skipped", clock.now_ms()).await;
    first.stop().await;

    // Down for three days and a bit: three firings of each fell in it.
    clock.set(at("2026-12-07T12:00", "UTC"));
    let second = Running::start(&store, &clock, schedules());
    let latest = at("2026-12-07T09:00", "UTC");
    second.wait_for_mark(&store, "caught-up", latest).await;
    second.wait_for_mark(&store, "skipped", latest).await;
    settle().await;
    assert_eq!(
        second.inbox.ids(),
        [format!("schedule:caught-up:{latest}")],
        "the latest missed firing, once; none of the skipped one"
    );
    // Both go on as usual.
    let next = at("2026-12-08T09:00", "UTC");
    clock.set(next);
    second.wait_for_mark(&store, "skipped", next).await;
    second.wait_for_mark(&store, "caught-up", next).await;
    assert_eq!(second.inbox.ids().len(), 3);
    second.stop().await;
}

#[tokio::test]
async fn a_firing_whose_mark_was_not_written_is_enqueued_again_with_the_same_id() {
    // The crash between the inbox write and the mark: the firing goes to the inbox again
    // under the same event id, which the inbox's dedupe drops.
    let store = MemStore::new();
    let clock = ManualClock::new(at("2026-12-04T08:00", "UTC"));
    let schedule = || vec![config_schedule("morning", "0 9 * * *", Missed::Skip)];
    let first = Running::start(&store, &clock, schedule());
    first.wait_for_mark(&store, "morning", clock.now_ms()).await;
    let nine = at("2026-12-04T09:00", "UTC");
    clock.set(nine);
    first.wait_for_mark(&store, "morning", nine).await;
    let fired = first.inbox.ids();
    first.stop().await;
    store
        .set_schedule_mark("morning", at("2026-12-04T08:00", "UTC"))
        .await
        .unwrap();

    clock.set(at("2026-12-04T09:01", "UTC"));
    let second = Running::start(&store, &clock, schedule());
    second.wait_for_mark(&store, "morning", nine).await;
    assert_eq!(second.inbox.ids(), fired);
    second.stop().await;
}

#[tokio::test]
async fn a_firing_the_ingress_refuses_is_tried_again_and_not_lost() {
    let store = MemStore::new();
    let clock = ManualClock::new(at("2026-12-04T08:59", "UTC"));
    let running = Running::start(
        &store,
        &clock,
        vec![config_schedule("morning", "0 9 * * *", Missed::Skip)],
    );
    running
        .wait_for_mark(&store, "morning", clock.now_ms())
        .await;
    *running.inbox.failing.lock().unwrap() = true;
    let nine = at("2026-12-04T09:00", "UTC");
    clock.set(nine);
    settle().await;
    assert!(running.inbox.ids().is_empty());
    *running.inbox.failing.lock().unwrap() = false;
    // Tried again after the retry wait (real time: a few seconds).
    running.wait_for_mark(&store, "morning", nine).await;
    assert_eq!(running.inbox.ids(), [format!("schedule:morning:{nine}")]);
    running.stop().await;
}

#[tokio::test]
async fn chat_made_schedules_start_at_once_and_stop_when_removed() {
    let store = MemStore::new();
    let clock = ManualClock::new(at("2026-12-04T08:00", "UTC"));
    let config = vec![config_schedule("from-config", "0 9 * * *", Missed::Once)];
    let running = Running::start(&store, &clock, config);
    let slack = ConversationKey::from("slack:T1:C2".to_owned());
    let book = Arc::clone(&running.book);

    // The config's name is taken; a bad time or name is refused.
    let taken = book
        .add("from-config", "every 1h", "hi", &slack, "slack:U1")
        .await
        .unwrap_err();
    assert!(matches!(taken, AddError::Exists(_)), "{taken}");
    let bad = book
        .add("ticks", "every 10s", "hi", &slack, "slack:U1")
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("at least a minute"), "{bad}");

    let added = book
        .add("ticks", "every 15m", "status?", &slack, "slack:U1")
        .await
        .unwrap();
    assert_eq!(added.when_text, "every 15m");
    let quarter = at("2026-12-04T08:15", "UTC");
    clock.set(quarter);
    running.wait_for_mark(&store, "ticks", quarter).await;
    assert_eq!(running.inbox.ids(), [format!("schedule:ticks:{quarter}")]);
    assert_eq!(running.inbox.events.lock().unwrap()[0].conversation, slack);

    // A cron schedule made in chat is read in `agent.timezone`.
    let berlin = book
        .add("berlin", "0 10 * * *", "hello", &slack, "slack:U1")
        .await
        .unwrap();
    assert_eq!(berlin.when_text, "0 10 * * * (Europe/Berlin)");

    let refused = book.remove("from-config").await.unwrap_err();
    assert!(matches!(refused, RemoveError::InConfig(_)), "{refused}");
    book.remove("ticks").await.unwrap();
    assert!(matches!(
        book.remove("ticks").await.unwrap_err(),
        RemoveError::Unknown(_)
    ));
    clock.set(at("2026-12-04T08:45", "UTC"));
    settle().await;
    assert_eq!(running.inbox.ids().len(), 1, "removed: no more firings");
    running.stop().await;
}

/// A reload replaces the config's schedules: a new one starts from then, a removed one stops,
/// and the names follow (a chat-made schedule may take a name the config gave up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_replaces_the_config_schedules_at_once() {
    let store = MemStore::new();
    let clock = ManualClock::new(at("2026-12-04T08:00", "UTC"));
    let config = vec![config_schedule("old", "0 9 * * *", Missed::Once)];
    let running = Running::start(&store, &clock, config);
    let book = Arc::clone(&running.book);

    book.set_configured(vec![config_schedule("new", "30 8 * * *", Missed::Once)]);
    // Taken up at once: it starts now.
    running
        .wait_for_mark(&store, "new", at("2026-12-04T08:00", "UTC"))
        .await;
    let half_past = at("2026-12-04T08:30", "UTC");
    clock.set(half_past);
    running.wait_for_mark(&store, "new", half_past).await;
    clock.set(at("2026-12-04T09:05", "UTC"));
    settle().await;
    assert_eq!(
        running.inbox.ids(),
        [format!("schedule:new:{half_past}")],
        "the removed schedule did not fire at 9"
    );
    let slack = ConversationKey::from("slack:T1:C2".to_owned());
    book.add("old", "every 1h", "hi", &slack, "slack:U1")
        .await
        .unwrap();
    running.stop().await;
}
