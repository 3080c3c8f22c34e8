//! Chaos with the real binary (issue 28): two `antler serve` replicas as child processes on one
//! PostgreSQL schema and one `[store] path`, Telegram webhooks posted to either of them (an
//! update one answers 503 to, or does not answer at all, goes to the other, as Telegram
//! delivers a webhook again), while one replica is SIGKILLed at random moments and restarted.
//! Both replicas serve: each conversation runs on the one holding it, and a killed replica's
//! conversations are adopted by the other once its mark runs out. Every acknowledged message
//! is answered once in its thread and reaches the mock Bot API in its chat's order; after a
//! kill, every message left unanswered is answered within the lease plus a margin (the
//! slowest are the killed replica's: the takeover); the restarted replica rejoins and, once
//! the other stops, serves alone without answering anything twice.
//!
//! A reply may reach the Bot API twice when a kill lands between Telegram accepting it and
//! antler recording that it did (at least once at the platform's edge): such a repeat follows
//! its first copy, and there are at most as many as replicas stopped without warning.
//!
//! The run is random but replayable: it prints its seed, and `ANTLER_CHAOS_SEED=<seed>` runs
//! the same kills and messages again (the timing is the machine's). It runs when
//! `ANTLER_TEST_DATABASE_URL` names a PostgreSQL server; without one it says so and passes.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use antler_testkit::telegram::{MockTelegram, SECRET, secret_headers};
use futures_util::future::join_all;
use serde_json::{Value, json};

use crate::support::postgres::{LEASE_SECS, Schema};
use crate::support::{Behaviour, Child, MockModel, config_text, free_port, sigterm};

/// Conversations (private Telegram chats) the messages flow over.
const CHATS: usize = 8;
/// Messages each chat sends at least (and more while kills remain to be made), at most.
const MIN_MESSAGES: usize = 10;
const MAX_MESSAGES: usize = 40;
/// How long after a kill the work it left may take to go on, beyond the lease: generous, the
/// machine is shared.
const MARGIN: Duration = Duration::from_secs(20);
/// How long an update may wait to be acknowledged by some replica, and the acknowledged
/// messages to be answered at the end.
const PATIENCE: Duration = Duration::from_secs(90);
/// The model's time per answer: long enough that kills land in the middle of turns.
const MODEL_TIME: Duration = Duration::from_millis(300);
/// The first chat's id (and its user's); the others follow.
const FIRST_CHAT: i64 = 5_550_002_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_with_one_killed_at_random_answer_every_acknowledged_message_once_in_order() {
    let Some(schema) = Schema::create().await else {
        return;
    };
    let seed = std::env::var("ANTLER_CHAOS_SEED")
        .ok()
        .map(|seed| seed.parse::<u64>().expect("ANTLER_CHAOS_SEED is a number"))
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("chaos seed {seed} (ANTLER_CHAOS_SEED={seed} runs it again)");
    let started = Instant::now();
    let model = MockModel::start(Behaviour::Slow(MODEL_TIME)).await;
    let api = MockTelegram::start().await;
    let dir = crate::support::searchable_tempdir();
    // Thread folders are files every replica must share.
    let folders = dir.path().join("store");
    let replicas =
        ["a", "b"].map(|name| Replica::new(name, dir.path(), &folders, &model, &api, &schema));
    let mut children = [replicas[0].start().await, replicas[1].start().await];
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let bases = [replicas[0].base.as_str(), replicas[1].base.as_str()];
    let flow = Flow {
        acked: Mutex::new(vec![0; CHATS]),
        killing: AtomicBool::new(true),
        lost: AtomicUsize::new(0),
    };

    // Messages flow over every chat while one replica after the other is killed.
    let mut rng = fastrand::Rng::with_seed(seed);
    let drivers = join_all((0..CHATS).map(|chat| {
        drive(
            chat,
            fastrand::Rng::with_seed(seed ^ (chat as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            &http,
            &bases,
            &flow,
        )
    }));
    let (chaos, ()) = tokio::join!(
        kill_at_random(&mut rng, &replicas, &mut children, &api, &flow, &http),
        async {
            drivers.await;
        }
    );
    let kills = chaos.kills;
    let flowed = flow.acked.lock().unwrap().clone();

    // The restarted replica rejoins: one more message per chat goes to it first (standing by,
    // it sends them on to the other with a 503, as a load balancer would)...
    let restarted = kills.last().expect("at least one kill").victim;
    let other = 1 - restarted;
    join_all((0..CHATS).map(|chat| {
        let update = update(chat, flowed[chat]);
        let http = &http;
        let bases = &bases;
        async move { deliver(http, bases, restarted, &update).await }
    }))
    .await;
    // ... and once the other one stopped (cleanly), it serves alone.
    let stopped = sigterm(&mut children[other].process).await;
    assert!(
        stopped.success(),
        "replica {} stopped with {stopped}\n{}",
        replicas[other].name,
        logs(&replicas)
    );
    let alone = [bases[restarted]];
    join_all((0..CHATS).map(|chat| {
        let update = update(chat, flowed[chat] + 1);
        let http = &http;
        let alone = &alone;
        async move { deliver(http, alone, 0, &update).await }
    }))
    .await;
    let sent: Vec<usize> = flowed.iter().map(|n| n + 2).collect();

    // Every acknowledged message is answered.
    let survivor = &children[restarted];
    wait_for(
        "every acknowledged message is answered",
        &replicas,
        || async {
            let answered = answers(&api).await;
            (0..CHATS)
                .all(|chat| (0..sent[chat]).all(|index| answered[chat].contains(&index)))
                .then_some(())
        },
    )
    .await;
    survivor.wait_idle().await;

    // At the Bot API: each chat's answers in the order of its messages, a repeat only right
    // after its first copy, and no more repeats than replicas stopped without warning.
    let answered = answers(&api).await;
    let mut repeats = 0;
    for chat in 0..CHATS {
        let mut in_order = answered[chat].clone();
        in_order.dedup();
        assert_eq!(
            in_order,
            (0..sent[chat]).collect::<Vec<_>>(),
            "chat {chat}: answers as sent to Telegram {:?} (seed {seed})\n{}",
            answered[chat],
            logs(&replicas)
        );
        repeats += answered[chat].len() - in_order.len();
        for index in flowed[chat]..sent[chat] {
            assert_eq!(
                answered[chat].iter().filter(|i| **i == index).count(),
                1,
                "chat {chat}: message {index}, sent after the last restart, answered once: {:?} (seed {seed})",
                answered[chat]
            );
        }
    }
    let unwarned = kills.len() + chaos.stopped_alone;
    assert!(
        repeats <= unwarned,
        "{repeats} answers reached Telegram twice, after {unwarned} replicas stopped without warning (seed {seed}): {answered:?}"
    );

    // In the store: each thread holds every message of its chat once, each answered once.
    let threads = schema
        .query("SELECT thread_id FROM antler_conversations")
        .await;
    assert_eq!(threads.len(), CHATS, "one conversation per chat");
    let mut checked = vec![false; CHATS];
    for row in threads {
        let id: String = row.get(0);
        let thread = survivor.thread(&id).await;
        let messages = thread["messages"].as_array().unwrap();
        let chat = messages
            .first()
            .and_then(|m| m["content"].as_str())
            .and_then(chat_of)
            .unwrap_or_else(|| {
                panic!("thread {id} does not start with a chat's message: {thread}")
            });
        checked[chat] = true;
        let contents: Vec<(&str, &str)> = messages
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap(),
                    m["content"].as_str().unwrap_or(""),
                )
            })
            .collect();
        let expected: Vec<(&str, String)> = (0..sent[chat])
            .flat_map(|index| {
                [
                    ("user", text(chat, index)),
                    ("assistant", format!("echo: {}", text(chat, index))),
                ]
            })
            .collect();
        let expected: Vec<(&str, &str)> = expected.iter().map(|(r, t)| (*r, t.as_str())).collect();
        assert_eq!(
            contents,
            expected,
            "chat {chat}: thread {id} (seed {seed})\n{}",
            logs(&replicas)
        );
        assert_eq!(thread["turns"], sent[chat], "chat {chat}: {thread}");
    }
    assert!(
        checked.iter().all(|c| *c),
        "a thread for every chat: {checked:?}"
    );
    let total: usize = sent.iter().sum();
    let requests = model.count();
    assert!(
        requests >= total,
        "{requests} model requests for {total} messages"
    );

    // Takeovers: after the kill of a replica that was serving (the work left then was its).
    let mut takeovers: Vec<Duration> = kills
        .iter()
        .filter(|k| k.serving)
        .filter_map(|k| k.takeover)
        .collect();
    takeovers.sort();
    let figure =
        |d: Option<&Duration>| d.map_or("-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
    eprintln!(
        "chaos seed {seed}: {total} messages over {CHATS} chats ({} before the last restart, \
         {} posts of them unanswered and sent again), {} kills, {} replicas stopped alone, {repeats} answers repeated at Telegram, \
         {} model requests ({} turns run again); takeover p50 {} max {} over {} kills of a serving \
         replica with work left; {:.1} s in all",
        flowed.iter().sum::<usize>(),
        flow.lost.load(Ordering::SeqCst),
        kills.len(),
        chaos.stopped_alone,
        requests,
        requests - total,
        figure(takeovers.get(takeovers.len().saturating_sub(1) / 2)),
        figure(takeovers.last()),
        takeovers.len(),
        started.elapsed().as_secs_f64(),
    );
    drop(children);
    schema.drop().await;
}

/// One replica: its config (its own port, the shared schema and folder) and log.
struct Replica {
    name: &'static str,
    config: PathBuf,
    port: u16,
    log: PathBuf,
    base: String,
}

impl Replica {
    fn new(
        name: &'static str,
        dir: &Path,
        folders: &Path,
        model: &MockModel,
        api: &MockTelegram,
        schema: &Schema,
    ) -> Self {
        let port = free_port();
        let config = dir.join(format!("{name}.toml"));
        let text = config_text(
            &model.base_url(),
            folders,
            &format!(
                "[server]\nlisten = \"127.0.0.1:{port}\"\n{}{}",
                schema.store_config_leased(name, LEASE_SECS),
                api.config("")
            ),
        );
        std::fs::write(&config, text).unwrap();
        Self {
            name,
            config,
            port,
            log: dir.join(format!("{name}.log")),
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Starts (or starts again) `antler serve` for this replica; it answers `/healthz` (a
    /// replica standing by does too).
    async fn start(&self) -> Child {
        Child::serve_with_env(&self.config, self.port, &self.log, &[]).await
    }
}

/// The end of both replicas' logs, for a failure's message.
fn logs(replicas: &[Replica; 2]) -> String {
    let mut out = String::new();
    for replica in replicas {
        let text = std::fs::read_to_string(&replica.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out.push_str(&format!("--- replica {} (last lines)\n", replica.name));
        for line in &lines[lines.len().saturating_sub(40)..] {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// What the chats have sent so far.
struct Flow {
    /// Per chat, how many of its messages were acknowledged (they are sent in order).
    acked: Mutex<Vec<usize>>,
    /// Whether kills remain to be made (the chats go on sending until they are).
    killing: AtomicBool,
    /// Posts of an update that got no answer (sent again).
    lost: AtomicUsize,
}

/// The text of a chat's message.
fn text(chat: usize, index: usize) -> String {
    format!("chat {chat} message {index}")
}

/// The chat a message's text names.
fn chat_of(text: &str) -> Option<usize> {
    let (chat, _) = text.strip_prefix("chat ")?.split_once(" message ")?;
    chat.parse().ok()
}

/// The Telegram update carrying a chat's message (a private chat with its one user).
fn update(chat: usize, index: usize) -> String {
    let id = FIRST_CHAT + i64::try_from(chat).unwrap();
    let name = format!("User{chat}");
    json!({
        "update_id": 731_000_000 + chat * 1_000 + index,
        "message": {
            "message_id": index + 1,
            "from": {"id": id, "is_bot": false, "first_name": name},
            "chat": {"id": id, "first_name": name, "type": "private"},
            "date": 1_767_225_600 + index,
            "text": text(chat, index)
        }
    })
    .to_string()
}

/// Sends a chat's messages in order, each once the one before was acknowledged, at random
/// intervals, to a replica chosen at random: at least [`MIN_MESSAGES`], and more while kills
/// remain to be made.
async fn drive(
    chat: usize,
    mut rng: fastrand::Rng,
    http: &reqwest::Client,
    bases: &[&str; 2],
    flow: &Flow,
) {
    let mut index = 0;
    while index < MAX_MESSAGES && (index < MIN_MESSAGES || flow.killing.load(Ordering::SeqCst)) {
        tokio::time::sleep(Duration::from_millis(rng.u64(200..1200))).await;
        let lost = deliver(http, bases, rng.usize(..bases.len()), &update(chat, index)).await;
        flow.lost.fetch_add(lost, Ordering::SeqCst);
        flow.acked.lock().unwrap()[chat] = index + 1;
        index += 1;
    }
}

/// Posts `update` as Telegram does until a replica acknowledges it (2xx): to `bases[first]`,
/// then, after a 503 (standing by, or not serving yet), another 5xx or no answer at all
/// (killed), to the next, after a short wait. Telegram sends an update again with the same
/// `update_id`, so one that was stored before its acknowledgement was lost is a redelivery.
/// Returns how many posts got no answer (the replica was killed, or not listening yet).
async fn deliver(http: &reqwest::Client, bases: &[&str], first: usize, update: &str) -> usize {
    let started = Instant::now();
    let mut lost = 0;
    let mut at = first;
    let mut wait = Duration::from_millis(50);
    loop {
        let url = format!("{}/webhooks/telegram", bases[at]);
        let mut request = http.post(&url).body(update.to_owned());
        for (name, value) in &secret_headers(SECRET) {
            request = request.header(name.as_str(), value.as_bytes());
        }
        match request.send().await {
            Ok(response) if response.status().is_success() => return lost,
            Ok(response) if response.status().is_server_error() => {}
            Ok(response) => panic!(
                "{url} refused an update with {}: {}\n{update}",
                response.status(),
                response.text().await.unwrap_or_default()
            ),
            // Killed, or not listening yet.
            Err(_) => lost += 1,
        }
        assert!(
            started.elapsed() < PATIENCE,
            "no replica acknowledged an update within {PATIENCE:?}: {update}"
        );
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_millis(500));
        at = (at + 1) % bases.len();
    }
}

/// What the mock Bot API was sent, per chat: the indexes of the messages answered, in the
/// order the answers arrived. Anything else sent fails the test.
async fn answers(api: &MockTelegram) -> Vec<Vec<usize>> {
    let mut per_chat = vec![Vec::new(); CHATS];
    for body in api.sent().await {
        let chat = body["chat_id"]
            .as_i64()
            .and_then(|id| usize::try_from(id - FIRST_CHAT).ok())
            .filter(|chat| *chat < CHATS);
        let answer = body["text"]
            .as_str()
            .and_then(|t| t.strip_prefix("echo: "))
            .and_then(|t| Some((chat_of(t)?, t.rsplit_once(' ')?.1.parse::<usize>().ok()?)));
        match (chat, answer) {
            (Some(chat), Some((named, index))) if named == chat => per_chat[chat].push(index),
            _ => panic!("an unexpected message was sent to Telegram: {body}"),
        }
    }
    per_chat
}

/// A kill of one replica, and what followed.
struct Kill {
    victim: usize,
    /// Whether the victim was serving (`/readyz` 200) rather than standing by.
    serving: bool,
    /// How long after the kill an answer to a message acknowledged before it, unanswered at
    /// it, reached Telegram; `None` when nothing was waiting for an answer.
    takeover: Option<Duration>,
}

/// What [`kill_at_random`] did.
struct Chaos {
    kills: Vec<Kill>,
    /// Replicas that were found stopped without being killed (and were started again).
    stopped_alone: usize,
}

/// Kills a replica 2 to 4 times at random moments (SIGKILL), each time measuring how soon the
/// work left unanswered goes on, and starts it again after a short while. The first kill hits
/// the replica that is serving when only one is (active/standby); later ones that one three
/// times in four, else either.
async fn kill_at_random(
    rng: &mut fastrand::Rng,
    replicas: &[Replica; 2],
    children: &mut [Child; 2],
    api: &MockTelegram,
    flow: &Flow,
    http: &reqwest::Client,
) -> Chaos {
    let started = Instant::now();
    let planned = rng.usize(2..=4);
    let mut kills = Vec::new();
    let mut stopped_alone = 0;
    for n in 0..planned {
        tokio::time::sleep(Duration::from_millis(rng.u64(1500..4000))).await;
        for (i, child) in children.iter_mut().enumerate() {
            if let Ok(Some(status)) = child.process.try_wait() {
                eprintln!(
                    "replica {} stopped by itself ({status}); started again\n{}",
                    replicas[i].name,
                    logs(replicas)
                );
                stopped_alone += 1;
                *child = replicas[i].start().await;
            }
        }
        let states = [
            state(http, &replicas[0].base).await,
            state(http, &replicas[1].base).await,
        ];
        let serving: Vec<usize> = (0..2).filter(|i| states[*i] == "ready").collect();
        let victim = match serving[..] {
            [one] if n == 0 || rng.usize(..4) != 0 => one,
            _ => rng.usize(..2),
        };
        let acked = flow.acked.lock().unwrap().clone();
        children[victim].kill().await;
        let killed = Instant::now();
        let answered = answers(api).await;
        let pending: Vec<(usize, usize)> = (0..CHATS)
            .flat_map(|chat| (0..acked[chat]).map(move |index| (chat, index)))
            .filter(|(chat, index)| !answered[*chat].contains(index))
            .collect();
        let down = Duration::from_millis(rng.u64(500..2500));
        let (takeover, restarted) =
            tokio::join!(progress(api, &pending, killed, replicas), async {
                tokio::time::sleep(down).await;
                replicas[victim].start().await
            });
        children[victim] = restarted;
        eprintln!(
            "kill {} at {:.1} s: replica {} (a {}, b {}), {} messages unanswered, all of \
             them answered after {}, started again after {:.1} s",
            n + 1,
            (killed - started).as_secs_f64(),
            replicas[victim].name,
            states[0],
            states[1],
            pending.len(),
            takeover.map_or("-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64())),
            down.as_secs_f64(),
        );
        kills.push(Kill {
            victim,
            serving: states[victim] == "ready",
            takeover,
        });
    }
    flow.killing.store(false, Ordering::SeqCst);
    Chaos {
        kills,
        stopped_alone,
    }
}

/// What a replica's `/readyz` says: `ready`, the state it names (`standing_by`…), or why it
/// did not answer.
async fn state(http: &reqwest::Client, base: &str) -> String {
    match http.get(format!("{base}/readyz")).send().await {
        Ok(response) if response.status().is_success() => "ready".to_owned(),
        Ok(response) => {
            let status = response.status();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            body["state"]
                .as_str()
                .map_or_else(|| format!("HTTP {status}"), str::to_owned)
        }
        Err(e) => format!("unreachable: {e}"),
    }
}

/// How long after `killed` every one of the `pending` messages (chat, index) was answered at
/// the Bot API (`None` when none was pending): the slowest is one the killed replica held,
/// answered once another replica adopted its conversation. Fails after the lease plus
/// [`MARGIN`].
async fn progress(
    api: &MockTelegram,
    pending: &[(usize, usize)],
    killed: Instant,
    replicas: &[Replica; 2],
) -> Option<Duration> {
    if pending.is_empty() {
        return None;
    }
    let limit = Duration::from_secs(LEASE_SECS) + MARGIN;
    loop {
        let answered = answers(api).await;
        if pending
            .iter()
            .all(|(chat, index)| answered[*chat].contains(index))
        {
            return Some(killed.elapsed());
        }
        assert!(
            killed.elapsed() < limit,
            "the messages left unanswered at a kill were not all answered within {limit:?}: \
             {pending:?}\n{}",
            logs(replicas)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `check` until it gives a value, for at most [`PATIENCE`].
async fn wait_for<T, F, Fut>(what: &str, replicas: &[Replica; 2], mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "timed out after {PATIENCE:?} waiting until {what}\n{}",
            logs(replicas)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
