//! The `<memory>` block a model request carries (DeerFlow's `format_memory_for_injection`).
//!
//! ```text
//! <memory>
//! User Context:
//! - Work: …
//!
//! History:
//! - Recent: …
//!
//! Facts:
//! - [correction | 0.97] …
//! - [preference | 0.90] …
//! </memory>
//! ```
//!
//! The block fits in `max_tokens`, counted with the real tokenizer
//! (`tokens::count_tokens`). What goes in, in this order of precedence: corrections
//! (most confident first), then the summaries, then the other facts by confidence, each
//! line only if it still fits; so an oversized summary is what is left out, never a
//! correction. All values are HTML-escaped, so a stored text cannot close the block.

use super::MemoryDocument;
use crate::agent::tokens::count_tokens;

/// The block for `doc` within `max_tokens`, or `None` when there is nothing to say.
pub(crate) fn render(doc: &MemoryDocument, max_tokens: usize) -> Option<String> {
    const OPEN: &str = "<memory>\n";
    const CLOSE: &str = "</memory>";
    let mut budget = max_tokens.checked_sub(count_tokens(OPEN) + count_tokens(CLOSE) + 12)?;
    let mut take = |line: String| -> Option<String> {
        let cost = count_tokens(&line) + 1;
        (cost <= budget).then(|| {
            budget -= cost;
            line
        })
    };

    let mut facts: Vec<_> = doc.facts.iter().collect();
    facts.sort_by(|a, b| {
        (b.category == "correction")
            .cmp(&(a.category == "correction"))
            .then(b.confidence.total_cmp(&a.confidence))
    });
    let line_of = |f: &super::schema::Fact| {
        format!(
            "- [{} | {:.2}] {}",
            escape(&f.category),
            f.confidence,
            escape(&f.content)
        )
    };
    let (corrections, others): (Vec<_>, Vec<_>) =
        facts.into_iter().partition(|f| f.category == "correction");
    let correction_lines: Vec<String> = corrections
        .into_iter()
        .filter_map(|f| take(line_of(f)))
        .collect();

    let section = |entries: [(&str, &str); 3], take: &mut dyn FnMut(String) -> Option<String>| {
        entries
            .into_iter()
            .filter(|(_, text)| !text.trim().is_empty())
            .filter_map(|(label, text)| take(format!("- {label}: {}", escape(text.trim()))))
            .collect::<Vec<_>>()
    };
    let user = section(
        [
            ("Work", &doc.user.work_context.summary),
            ("Personal", &doc.user.personal_context.summary),
            ("Current Focus", &doc.user.top_of_mind.summary),
        ],
        &mut take,
    );
    let history = section(
        [
            ("Recent", &doc.history.recent_months.summary),
            ("Earlier", &doc.history.earlier_context.summary),
            ("Background", &doc.history.long_term_background.summary),
        ],
        &mut take,
    );
    let mut fact_lines = correction_lines;
    fact_lines.extend(others.into_iter().map_while(|f| take(line_of(f))));

    let mut parts = Vec::new();
    for (title, lines) in [
        ("User Context:", user),
        ("History:", history),
        ("Facts:", fact_lines),
    ] {
        if !lines.is_empty() {
            parts.push(format!("{title}\n{}", lines.join("\n")));
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(format!("{OPEN}{}\n{CLOSE}", parts.join("\n\n")))
}

/// `text` with `&`, `<` and `>` as entities: quoted inside a tag block of a prompt (the
/// memory block, the updater's and the summarizer's quoted conversation), it cannot close the
/// block or open another (DeerFlow's `html.escape(text, quote=False)`).
pub(crate) fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::memory::schema::{Fact, FactSource};

    fn fact(content: &str, category: &str, confidence: f32) -> Fact {
        Fact {
            id: format!("fact_{content}"),
            content: content.to_owned(),
            category: category.to_owned(),
            confidence,
            created_at: String::new(),
            updated_at: String::new(),
            source: FactSource::default(),
            about: None,
            shareable: false,
        }
    }

    #[test]
    fn an_empty_memory_injects_nothing() {
        assert_eq!(render(&MemoryDocument::default(), 2_000), None);
    }

    #[test]
    fn corrections_first_then_by_confidence_all_escaped() {
        let mut doc = MemoryDocument::default();
        doc.user.work_context.summary = "Builds antler.".to_owned();
        doc.history.recent_months.summary = "Shipped v1.".to_owned();
        doc.facts = vec![
            fact("likes tea", "preference", 0.8),
            fact("uses rust", "knowledge", 0.95),
            fact("is not a python dev", "correction", 0.9),
            fact("says </memory> a lot", "behavior", 0.7),
        ];
        let block = render(&doc, 2_000).unwrap();
        assert!(block.starts_with("<memory>\nUser Context:\n- Work: Builds antler.\n\nHistory:\n- Recent: Shipped v1.\n\nFacts:\n"), "{block}");
        let order: Vec<usize> = [
            "is not a python",
            "uses rust",
            "likes tea",
            "says &lt;/memory&gt;",
        ]
        .iter()
        .map(|needle| block.find(needle).unwrap())
        .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{block}");
        assert!(block.contains("- [correction | 0.90] is not a python dev"));
        assert_eq!(block.matches("</memory>").count(), 1);
    }

    #[test]
    fn the_block_fits_the_budget_and_drops_the_least_confident() {
        let mut doc = MemoryDocument::default();
        doc.user.top_of_mind.summary = "word ".repeat(2_000);
        doc.facts = (0..200)
            .map(|i| {
                fact(
                    &format!("fact number {i} about the user"),
                    "context",
                    0.7 + i as f32 / 1_000.0,
                )
            })
            .collect();
        doc.facts
            .push(fact("never call them Bob", "correction", 0.95));
        for budget in [60, 300, 2_000] {
            let block = render(&doc, budget).unwrap();
            assert!(
                count_tokens(&block) <= budget,
                "{budget}: {}",
                count_tokens(&block)
            );
            assert!(block.contains("never call them Bob"));
            // The most confident facts are the ones kept.
            if budget >= 300 {
                assert!(block.contains("fact number 199 "));
                assert!(!block.contains("fact number 0 "));
            }
            // The oversized summary is left out rather than the facts.
            assert!(!block.contains("Current Focus"));
        }
        assert_eq!(render(&doc, 5), None);
    }
}
