//! What sled 0.34 itself holds in memory for a backlog: the writes antler makes when it accepts
//! Q messages, one per conversation (issue 27's "conversations waiting"), done by a minimal
//! program with nothing else in the process, so its RSS can stand beside antler's.
//!
//! `cargo run --release --example sled_backlog -- [--messages Q] [--batch B]
//! [--cache-bytes C] [--batches-as-transactions true|false]`
//!
//! Defaults: Q=16000, B=64 (accepts per group commit, what antler's ingress batches under the
//! bench's 256 concurrent posts), C=8 MiB (antler's default `cache_capacity_bytes`), one
//! multi-tree transaction per batch (as antler's accept). Each accept writes what antler's
//! writes for a message that starts a conversation, with records of the same sizes: the dedupe
//! key and entry (a tree per generation), the conversation record, the new thread's metadata
//! and the inbox item. After each batch: sled's `flush()` and an `fdatasync` of its log, as the
//! group commit does. The process uses jemalloc, as antler does. Prints VmRSS and anonymous
//! RSS at 15,000 accepts (if Q reaches it) and at Q, and the store's size on disk.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs::File;
use std::time::Instant;

use sled::Transactional;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Where issue 27 sets the "conversations waiting" target.
const WAITING: usize = 15_000;

struct Args {
    messages: usize,
    batch: usize,
    cache_bytes: u64,
    transactions: bool,
}

impl Args {
    fn parse() -> Self {
        let mut a = Self {
            messages: 16_000,
            batch: 64,
            cache_bytes: 8 * 1024 * 1024,
            transactions: true,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
            match flag.as_str() {
                "--messages" => a.messages = value.parse().unwrap(),
                "--batch" => a.batch = value.parse::<usize>().unwrap().max(1),
                "--cache-bytes" => a.cache_bytes = value.parse().unwrap(),
                "--batches-as-transactions" => a.transactions = value.parse().unwrap(),
                other => panic!("unknown argument {other}"),
            }
        }
        a
    }
}

/// VmRSS and RssAnon of this process, MiB.
fn rss() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (kib("VmRSS:"), kib("RssAnon:"))
}

/// A length-prefixed tuple key, as antler's `keys::tuple`.
fn tuple(parts: &[&[u8]]) -> Vec<u8> {
    let mut key = Vec::new();
    for part in parts {
        key.extend_from_slice(&(part.len() as u32).to_be_bytes());
        key.extend_from_slice(part);
    }
    key
}

/// The records antler writes for message `i` (same shapes and sizes).
struct Accept {
    dedupe_key: Vec<u8>,
    dedupe: Vec<u8>,
    conversation_key: Vec<u8>,
    conversation: Vec<u8>,
    thread_key: Vec<u8>,
    thread: Vec<u8>,
    inbox: Vec<u8>,
}

fn accept(i: usize, now_ms: u64) -> Accept {
    let conversation = format!("api:q{i}");
    let thread_id = format!("{conversation}:0:{now_ms:x}{i:08x}");
    let conversation_record = format!(
        r#"{{"key":"{conversation}","generation":0,"thread_id":"{thread_id}","user_id":"bench"}}"#
    );
    let thread = format!(
        r#"{{"id":"{thread_id}","conversation":"{conversation}","generation":0,"usage":{{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}},"turns":0,"created_at_ms":{now_ms},"updated_at_ms":{now_ms}}}"#
    );
    // An inbox item record: format byte, then postcard (varints, length-prefixed strings).
    let mut inbox = vec![2];
    for text in [
        "api",
        &format!("r0-q{i}"),
        &conversation,
        "bench",
        &format!("hello {i}"),
        &thread_id,
    ] {
        inbox.push(text.len() as u8);
        inbox.extend_from_slice(text.as_bytes());
    }
    inbox.extend_from_slice(&[0; 24]);
    let mut dedupe = vec![1, 0xc0, 0xb5, 0xe2, 0x98, 0xd6, 0x33];
    dedupe.push(thread_id.len() as u8);
    dedupe.extend_from_slice(thread_id.as_bytes());
    dedupe.extend_from_slice(&[1, 0x80, 0x01]);
    Accept {
        dedupe_key: tuple(&[conversation.as_bytes(), format!("r0-q{i}").as_bytes()]),
        dedupe,
        conversation_key: conversation.clone().into_bytes(),
        conversation: conversation_record.into_bytes(),
        thread_key: thread_id.into_bytes(),
        thread: thread.into_bytes(),
        inbox,
    }
}

fn main() {
    let a = Args::parse();
    let dir = tempfile::tempdir().unwrap();
    let db = sled::Config::new()
        .path(dir.path())
        .cache_capacity(a.cache_bytes)
        .open()
        .unwrap();
    let log = File::open(dir.path().join("db")).unwrap();
    let dedupe = db.open_tree("dedupe.0.86400000").unwrap();
    let previous = db.open_tree("dedupe.0.0").unwrap();
    let conversations = db.open_tree("conversations").unwrap();
    let threads = db.open_tree("threads").unwrap();
    let inbox = db.open_tree("inbox").unwrap();
    let started = Instant::now();
    let mut done = 0;
    let mut waiting = None;
    while done < a.messages {
        let n = a.batch.min(a.messages - done);
        let batch: Vec<Accept> = (done..done + n)
            .map(|i| accept(i, 1_764_000_000_000))
            .collect();
        if a.transactions {
            (&dedupe, &previous, &conversations, &inbox, &threads)
                .transaction(|(dedupe, previous, conversations, inbox, threads)| {
                    for accept in &batch {
                        previous.get(&accept.dedupe_key)?;
                        dedupe.get(&accept.dedupe_key)?;
                        conversations.get(&accept.conversation_key)?;
                        threads.insert(accept.thread_key.as_slice(), accept.thread.as_slice())?;
                        conversations.insert(
                            accept.conversation_key.as_slice(),
                            accept.conversation.as_slice(),
                        )?;
                        let seq = inbox.generate_id()?;
                        inbox.insert(&seq.to_be_bytes(), accept.inbox.as_slice())?;
                        dedupe.insert(accept.dedupe_key.as_slice(), accept.dedupe.as_slice())?;
                    }
                    Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
                })
                .unwrap();
        } else {
            let mut batches: [sled::Batch; 4] = Default::default();
            for accept in &batch {
                let seq = db.generate_id().unwrap();
                batches[0].insert(accept.dedupe_key.as_slice(), accept.dedupe.as_slice());
                batches[1].insert(
                    accept.conversation_key.as_slice(),
                    accept.conversation.as_slice(),
                );
                batches[2].insert(accept.thread_key.as_slice(), accept.thread.as_slice());
                batches[3].insert(&seq.to_be_bytes(), accept.inbox.as_slice());
            }
            let [d, c, t, i] = batches;
            dedupe.apply_batch(d).unwrap();
            conversations.apply_batch(c).unwrap();
            threads.apply_batch(t).unwrap();
            inbox.apply_batch(i).unwrap();
        }
        db.flush().unwrap();
        log.sync_data().unwrap();
        done += n;
        if done >= WAITING && waiting.is_none() {
            waiting = Some(rss());
        }
    }
    let elapsed = started.elapsed();
    let (rss_q, anon_q) = rss();
    println!(
        "sled 0.34 alone: {} accepts in batches of {} ({}), cache_capacity {} B, {:.0} accepts/s",
        a.messages,
        a.batch,
        if a.transactions {
            "one transaction over five trees per batch"
        } else {
            "one sled::Batch per tree per batch"
        },
        a.cache_bytes,
        a.messages as f64 / elapsed.as_secs_f64()
    );
    if let Some((rss_w, anon_w)) = waiting {
        println!("  RSS at {WAITING}: {rss_w:.1} MiB (anonymous {anon_w:.1} MiB)");
    }
    println!(
        "  RSS at {}: {rss_q:.1} MiB (anonymous {anon_q:.1} MiB); store on disk {:.1} MiB",
        a.messages,
        db.size_on_disk().unwrap() as f64 / 1_048_576.0
    );
}
