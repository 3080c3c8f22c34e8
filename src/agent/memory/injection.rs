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
//! (`tokens::count_tokens`) when its bytes alone do not show that it fits (`tokens::TokenBudget`). What goes in, in this order of precedence: corrections
//! (most confident first), then the summaries, then the other facts by confidence, each
//! line only if it still fits; so an oversized summary is what is left out, never a
//! correction. All values are HTML-escaped, so a stored text cannot close the block.

use super::MemoryDocument;
use crate::agent::tokens::TokenBudget;

/// The block for `doc` within `max_tokens`, or `None` when there is nothing to say.
pub(crate) fn render(doc: &MemoryDocument, max_tokens: usize) -> Option<String> {
    const OPEN: &str = "<memory>\n";
    const CLOSE: &str = "</memory>";
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
    let corrections: Vec<String> = corrections.into_iter().map(line_of).collect();
    let others: Vec<String> = others.into_iter().map(line_of).collect();
    let section = |entries: [(&str, &str); 3]| {
        entries
            .into_iter()
            .filter(|(_, text)| !text.trim().is_empty())
            .map(|(label, text)| format!("- {label}: {}", escape(text.trim())))
            .collect::<Vec<_>>()
    };
    let user = section([
        ("Work", &doc.user.work_context.summary),
        ("Personal", &doc.user.personal_context.summary),
        ("Current Focus", &doc.user.top_of_mind.summary),
    ]);
    let history = section([
        ("Recent", &doc.history.recent_months.summary),
        ("Earlier", &doc.history.earlier_context.summary),
        ("Background", &doc.history.long_term_background.summary),
    ]);

    // The frame and some slack first, then each line (and its newline) in order of
    // precedence, only if it still fits; the other facts stop at the first that does not.
    let mut budget = TokenBudget::new(max_tokens);
    if !(budget.take(OPEN, 0) && budget.take(CLOSE, 12)) {
        return None;
    }
    let mut fact_lines = fitting(&mut budget, &corrections);
    let user = fitting(&mut budget, &user);
    let history = fitting(&mut budget, &history);
    fact_lines.extend(
        others
            .iter()
            .map(String::as_str)
            .take_while(|line| budget.take(line, 1)),
    );

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

/// The lines that still fit `budget` (each with its newline), in order.
fn fitting<'a>(budget: &mut TokenBudget<'a>, lines: &'a [String]) -> Vec<&'a str> {
    lines
        .iter()
        .map(String::as_str)
        .filter(|line| budget.take(line, 1))
        .collect()
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
    use crate::agent::tokens::count_tokens;

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
    fn a_memory_that_fits_by_its_bytes_is_rendered_without_the_tokenizer() {
        let mut doc = MemoryDocument::default();
        doc.user.work_context.summary = "Builds antler.".to_owned();
        doc.facts = vec![fact("likes tea", "preference", 0.8)];
        let before = crate::agent::tokens::tokenized_on_this_thread();
        let block = render(&doc, 2_000).unwrap();
        assert_eq!(crate::agent::tokens::tokenized_on_this_thread(), before);
        assert!(block.contains("likes tea") && block.contains("Builds antler."));
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
