//! What turning HTML into text costs `web_fetch`: html5ever's tokenizer within a budget (the
//! converter in use, `src/agent/tools/web_fetch/html.rs`) against the hand-written scanner it
//! replaced (kept below as the baseline), on hostile 1 MiB pages, and what either does to a
//! `/healthz` served by the same runtime while four such pages are converted.
//!
//! `cargo run --release --example html_to_text_cost -- [--runs R] [--no-baseline]`
//!
//! Each conversion figure is the median of R runs (default 3) in this process. The `/healthz`
//! phase runs a two-worker Tokio runtime serving `GET /healthz` on 127.0.0.1, converts four
//! 1 MiB pages of `&` at once on it (the baseline inline on the async workers, as `web_fetch`
//! did; the converter in use on `spawn_blocking` threads, as `web_fetch` does), and probes
//! `/healthz` every 20 ms from another thread, reporting the slowest answer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../src/agent/tools/web_fetch/html.rs"]
mod html;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The budget `web_fetch` gives a page (`CONVERSION_BUDGET`).
const BUDGET: html::Budget = html::Budget {
    time: Duration::from_millis(250),
    max_text_bytes: MIB,
};

const MIB: usize = 1024 * 1024;

fn repeated(unit: &str) -> String {
    unit.repeat(MIB / unit.len())
}

fn distinct_attributes() -> String {
    let mut page = String::from("<p ");
    let mut i = 0;
    while page.len() < MIB - 16 {
        page.push_str(&format!("a{i} "));
        i += 1;
    }
    page.push('>');
    page
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The median milliseconds of `runs` calls of `f`, and what the last one returned.
fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut last = None;
    let ms = (0..runs)
        .map(|_| {
            let started = Instant::now();
            last = Some(f());
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    (median(ms), last.unwrap())
}

/// Converts four 1 MiB pages of `&` at once on a two-worker runtime that serves `/healthz`;
/// the slowest `/healthz` answer in the meantime, and the time the four took.
fn healthz_while_converting(off_the_workers: bool) -> (Duration, Duration) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let address = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        address
    });
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let probe = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            probe.block_on(async {
                let client = reqwest::Client::new();
                let url = format!("http://{address}/healthz");
                let mut slowest = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let response = client.get(&url).send().await.unwrap();
                    assert!(response.status().is_success());
                    slowest = slowest.max(started.elapsed());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                slowest
            })
        })
    };
    // Let the prober connect before the workers are busy.
    std::thread::sleep(Duration::from_millis(200));
    let page = Arc::new(repeated("&"));
    let started = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let page = Arc::clone(&page);
                tokio::spawn(async move {
                    if off_the_workers {
                        tokio::task::spawn_blocking(move || html::html_to_text(&page, BUDGET).text)
                            .await
                            .unwrap()
                    } else {
                        legacy::html_to_text(&page)
                    }
                })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.unwrap().len(), MIB);
        }
    });
    let took = started.elapsed();
    // A few more probes once the workers are free again.
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    (prober.join().unwrap(), took)
}

fn main() {
    let mut runs = 3;
    let mut baseline = true;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => runs = args.next().and_then(|r| r.parse().ok()).expect("--runs R"),
            "--no-baseline" => baseline = false,
            other => panic!("unknown argument {other}"),
        }
    }
    let ordinary = "<div class=\"post\"><h2>A title</h2><p>Some <b>bold</b> words, a \
                    <a href=\"/x?a=1&amp;b=2\">link</a> &mdash; and caf&eacute;.</p></div>\n";
    let pages: Vec<(&str, String, bool)> = vec![
        ("ordinary markup", repeated(ordinary), true),
        ("`&`", repeated("&"), true),
        ("`&amp;`", repeated("&amp;"), true),
        ("`&#`", repeated("&#"), true),
        ("`&am` (unterminated)", repeated("&am"), true),
        ("nested `<div>`", repeated("<div>"), true),
        ("nested `<ul><li>`", repeated("<ul><li>"), true),
        ("one tag, distinct attributes", distinct_attributes(), false),
    ];
    println!("html_to_text on 1 MiB pages, median of {runs} runs (ms)");
    println!("| page | html5ever tokenizer, 250 ms budget | cut | hand-written scanner (before) |");
    println!("|---|---|---|---|");
    for (name, page, with_baseline) in &pages {
        let (new_ms, converted) = time(runs, || html::html_to_text(page, BUDGET));
        let old = if baseline && *with_baseline {
            format!("{:.1}", time(runs, || legacy::html_to_text(page)).0)
        } else {
            "-".to_owned()
        };
        println!("| {name} | {new_ms:.1} | {:?} | {old} |", converted.cut);
    }
    println!();
    println!("four 1 MiB pages of `&` at once on a 2-worker runtime serving /healthz");
    println!("| conversion | slowest /healthz | four pages took |");
    println!("|---|---|---|");
    let mut phases = vec![("spawn_blocking + budget (now)", true)];
    if baseline {
        phases.push(("inline on the async workers (before)", false));
    }
    for (name, off) in phases {
        let (slowest, took) = healthz_while_converting(off);
        println!(
            "| {name} | {:.1} ms | {:.1} ms |",
            slowest.as_secs_f64() * 1e3,
            took.as_secs_f64() * 1e3
        );
    }
}

/// The converter `web_fetch` used before html5ever, unchanged: the baseline.
mod legacy {
    /// Readable text from HTML: `script`, `style`, `noscript`, `template`, `svg`, `head` and
    /// comments dropped, block elements on their own lines, entities decoded, runs of spaces
    /// collapsed and blank lines dropped. A small scanner, not a parser: good enough for reading a page.
    pub(super) fn html_to_text(html: &str) -> String {
        const SKIPPED: [&str; 6] = ["script", "style", "noscript", "template", "svg", "head"];
        const BLOCKS: [&str; 27] = [
            "p",
            "br",
            "div",
            "li",
            "ul",
            "ol",
            "tr",
            "table",
            "h1",
            "h2",
            "h3",
            "h4",
            "h5",
            "h6",
            "section",
            "article",
            "header",
            "footer",
            "nav",
            "main",
            "aside",
            "pre",
            "blockquote",
            "hr",
            "dt",
            "dd",
            "title",
        ];
        let mut out = String::with_capacity(html.len() / 2);
        let mut rest = html;
        while let Some(open) = rest.find('<') {
            out.push_str(&decode_entities(&rest[..open]));
            rest = &rest[open..];
            let opens_tag = rest
                .as_bytes()
                .get(1)
                .is_some_and(|b| b.is_ascii_alphabetic() || matches!(b, b'/' | b'!' | b'?'));
            if !opens_tag {
                // `5 < 6`: a `<` that opens no tag is text.
                out.push('<');
                rest = &rest[1..];
                continue;
            }
            if let Some(after) = rest.strip_prefix("<!--") {
                rest = after.find("-->").map_or("", |end| &after[end + 3..]);
                continue;
            }
            let Some(close) = rest.find('>') else {
                // A `<` that opens no tag is text.
                out.push_str(&decode_entities(rest));
                rest = "";
                break;
            };
            let tag = &rest[1..close];
            rest = &rest[close + 1..];
            let closing = tag.starts_with('/');
            let name: String = tag
                .trim_start_matches('/')
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect::<String>()
                .to_ascii_lowercase();
            if !closing && SKIPPED.contains(&name.as_str()) && !tag.ends_with('/') {
                // Skip to the matching end tag (case-insensitive), or to the end.
                let end = format!("</{name}");
                rest = find_ci(rest, &end).map_or("", |at| {
                    let after = &rest[at..];
                    after.find('>').map_or("", |gt| &after[gt + 1..])
                });
                out.push('\n');
                continue;
            }
            if BLOCKS.contains(&name.as_str()) {
                out.push('\n');
            } else if name == "td" || name == "th" {
                out.push(' ');
            }
        }
        out.push_str(&decode_entities(rest));
        collapse_whitespace(&out)
    }

    /// The byte offset of `needle` (ASCII) in `haystack`, ignoring ASCII case.
    fn find_ci(haystack: &str, needle: &str) -> Option<usize> {
        let needle = needle.as_bytes();
        haystack
            .as_bytes()
            .windows(needle.len())
            .position(|w| w.eq_ignore_ascii_case(needle))
    }

    /// Decodes the common named entities and numeric references; others stay as written.
    fn decode_entities(text: &str) -> String {
        if !text.contains('&') {
            return text.to_owned();
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(amp) = rest.find('&') {
            out.push_str(&rest[..amp]);
            rest = &rest[amp..];
            let end = rest.find(';').filter(|&end| end <= 10);
            let decoded = end.and_then(|end| {
                let entity = &rest[1..end];
                let c = match entity {
                    "amp" => Some('&'),
                    "lt" => Some('<'),
                    "gt" => Some('>'),
                    "quot" => Some('"'),
                    "apos" => Some('\''),
                    "nbsp" => Some(' '),
                    "mdash" => Some('—'),
                    "ndash" => Some('–'),
                    "hellip" => Some('…'),
                    "copy" => Some('©'),
                    _ => {
                        let number = entity.strip_prefix('#')?;
                        let code = match number.strip_prefix(['x', 'X']) {
                            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                            None => number.parse().ok()?,
                        };
                        char::from_u32(code)
                    }
                }?;
                Some((c, end))
            });
            match decoded {
                Some((c, end)) => {
                    out.push(c);
                    rest = &rest[end + 1..];
                }
                None => {
                    out.push('&');
                    rest = &rest[1..];
                }
            }
        }
        out.push_str(rest);
        out
    }

    /// Each line's runs of whitespace become one space; blank lines are dropped (the model reads
    /// fewer tokens, and block elements already start new lines).
    fn collapse_whitespace(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for line in text.lines() {
            let mut words = line.split_whitespace().peekable();
            if words.peek().is_none() {
                continue;
            }
            if !out.is_empty() {
                out.push('\n');
            }
            for (i, word) in words.enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(word);
            }
        }
        out
    }
}
