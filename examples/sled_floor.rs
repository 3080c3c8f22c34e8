//! The floor sled 0.34 sets under two of issue 27's targets, measured by a minimal program
//! that makes only antler's sled calls, so its figures can stand beside the pipeline bench's:
//!
//! - **start**: opening a fresh store as `SledStore::open` does (sled's open, antler's 20
//!   trees, the schema record, one flush and `fdatasync`), against "start → first answered
//!   turn ≤ 15 ms";
//! - **CPU per sequential turn**: the durable writes one plain turn makes when it is the only
//!   one running (accept, start, finish, delivered: four writes, each waiting for sled's
//!   `flush()` and an `fdatasync` of its log, as the group commit does with a single writer),
//!   and a tool turn's five (plus the checkpoint after the tool result), with records of the
//!   sizes antler writes, against "CPU per plain turn ≤ 0.4 ms, per tool turn ≤ 0.6 ms".
//!
//! `cargo run --release --example sled_floor -- [--opens N] [--turns T]`
//!
//! CPU is this process's user + system time (`/proc/self/stat`); the file system's journal
//! commits run in kernel threads of their own and are not in it, as they are not in antler's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs::File;
use std::time::Instant;

use sled::Transactional;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The trees a fresh antler store has once it accepted its first message.
const TREES: [&str; 20] = [
    "conversations",
    "threads",
    "messages",
    "inbox",
    "outbox.2",
    "memory",
    "memory_queue",
    "subagents",
    "subagent_calls",
    "skills",
    "pairing_requests",
    "paired_users",
    "schedules",
    "schedule_marks",
    "approvals",
    "approval_calls",
    "approvals_open",
    "dedupe.0.86400000",
    "dedupe.0.0",
    "meta",
];

/// This process's CPU time so far, seconds.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// An open store: the database, its trees by name, and its log file for syncing.
struct Store {
    db: sled::Db,
    trees: Vec<sled::Tree>,
    log: File,
}

impl Store {
    /// Opens the store at `path` as antler does, ending with a durable write.
    fn open(path: &std::path::Path) -> Self {
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(8 * 1024 * 1024)
            .open()
            .unwrap();
        let trees: Vec<sled::Tree> = TREES.iter().map(|t| db.open_tree(t).unwrap()).collect();
        trees[19].insert("schema", &3u32.to_be_bytes()).unwrap();
        let log = File::open(path.join("db")).unwrap();
        let store = Self { db, trees, log };
        store.sync();
        store
    }

    fn tree(&self, name: &str) -> &sled::Tree {
        &self.trees[TREES.iter().position(|t| *t == name).unwrap()]
    }

    /// What the group commit does for a single writer.
    fn sync(&self) {
        self.db.flush().unwrap();
        self.log.sync_data().unwrap();
    }

    /// One turn's durable writes on a new conversation `i`; `tool` adds the checkpoint.
    fn turn(&self, i: u64, tool: bool) {
        let conversation = format!("api:s{i}");
        let thread_id = format!("0192f7a1c3e04d5b8a{i:014x}");
        let inbox_key = i.to_be_bytes();
        let (dedupe, previous, conversations, inbox, threads) = (
            self.tree("dedupe.0.86400000"),
            self.tree("dedupe.0.0"),
            self.tree("conversations"),
            self.tree("inbox"),
            self.tree("threads"),
        );
        let dedupe_key = format!("{conversation}\0r-s{i}");
        let item = vec![2u8; 120];
        // Accept: one transaction over five trees.
        (dedupe, previous, conversations, inbox, threads)
            .transaction(|(dedupe, previous, conversations, inbox, threads)| {
                previous.get(dedupe_key.as_bytes())?;
                dedupe.get(dedupe_key.as_bytes())?;
                conversations.get(conversation.as_bytes())?;
                threads.insert(thread_id.as_bytes(), vec![b't'; 210])?;
                conversations.insert(conversation.as_bytes(), vec![b'c'; 110])?;
                inbox.insert(&inbox_key, item.clone())?;
                dedupe.insert(dedupe_key.as_bytes(), vec![1u8; 45])?;
                Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
            })
            .unwrap();
        self.sync();
        // Start: the inbox item marked running.
        inbox.insert(inbox_key, vec![3u8; 121]).unwrap();
        self.sync();
        let messages = self.tree("messages");
        let mut saved = 0u32;
        let mut message = |len: usize| {
            let mut key = thread_id.as_bytes().to_vec();
            key.extend_from_slice(&saved.to_be_bytes());
            saved += 1;
            (key, vec![b'm'; len])
        };
        if tool {
            // The checkpoint after the tool result: metadata, the call and its result.
            let call = message(160);
            let result = message(140);
            (threads, messages)
                .transaction(|(threads, messages)| {
                    threads.insert(thread_id.as_bytes(), vec![b't'; 230])?;
                    messages.insert(call.0.as_slice(), call.1.as_slice())?;
                    messages.insert(result.0.as_slice(), result.1.as_slice())?;
                    Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
                })
                .unwrap();
            self.sync();
        }
        // Finish: the thread (metadata and new messages), the reply into the outbox, the
        // inbox item removed, in one transaction.
        let question = message(90);
        let answer = message(110);
        let outbox = self.tree("outbox.2");
        let outbox_key = (i << 16).to_be_bytes();
        (threads, messages, outbox, inbox)
            .transaction(|(threads, messages, outbox, inbox)| {
                threads.insert(thread_id.as_bytes(), vec![b't'; 240])?;
                messages.insert(question.0.as_slice(), question.1.as_slice())?;
                messages.insert(answer.0.as_slice(), answer.1.as_slice())?;
                outbox.insert(&outbox_key, vec![4u8; 180])?;
                inbox.remove(&inbox_key)?;
                Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
            })
            .unwrap();
        self.sync();
        // Delivered: the outbox item's receipt.
        outbox.insert(outbox_key, vec![5u8; 220]).unwrap();
        self.sync();
    }
}

fn main() {
    let (mut opens, mut turns) = (20usize, 2000u64);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--opens" => opens = value.parse::<usize>().unwrap().max(1),
            "--turns" => turns = value.parse::<u64>().unwrap().max(1),
            other => panic!("unknown argument {other}"),
        }
    }
    let open_ms: Vec<f64> = (0..opens)
        .map(|_| {
            let dir = tempfile::tempdir().unwrap();
            let started = Instant::now();
            let store = Store::open(&dir.path().join("data"));
            let ms = started.elapsed().as_secs_f64() * 1e3;
            drop(store);
            ms
        })
        .collect();
    println!(
        "sled 0.34 alone: open a fresh store ({} trees, schema record, flush + fdatasync): \
         median {:.1} ms of {opens}",
        TREES.len(),
        median(open_ms)
    );
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path());
    for (label, tool, writes) in [("plain", false, 4), ("tool", true, 5)] {
        let base = if tool { turns } else { 0 };
        let (cpu0, started) = (cpu_secs(), Instant::now());
        for i in 0..turns {
            store.turn(base + i, tool);
        }
        let cpu_ms = (cpu_secs() - cpu0) * 1e3 / turns as f64;
        let wall_ms = started.elapsed().as_secs_f64() * 1e3 / turns as f64;
        println!(
            "  {label} turn, sequential ({writes} durable writes): {cpu_ms:.3} ms CPU, \
             {wall_ms:.3} ms wall per turn ({turns} turns)"
        );
    }
}
