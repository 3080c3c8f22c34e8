//! What users and operators do with a memory document: read it (`/memory`), forget one fact
//! (`/memory forget <n>`, `DELETE .../facts/{id}`), let one into group chats or take it back
//! (`/memory share <n>`, `/memory unshare <n>`), forget everything (`/memory clear`), and
//! replace it (`PUT /api/v1/memory/{user_key}`, validated here).
//!
//! Two views: in a direct message [`render_for_user`] shows everything, numbered, each fact
//! with what it is about and whether group chats hear it; in a group [`render_for_group`]
//! shows the group view (`GroupPolicy::group_view`, the same one group runs inject), without
//! numbers, since the numbers to act on are the direct message's.
//!
//! Everything in a document was written by the model from what users said, so it is hostile
//! text: the rendering escapes Markdown, folds line breaks (a fact cannot forge a list entry
//! or a heading) and bounds every item and the whole reply.
//!
//! Facts are numbered as the rendering lists them: highest confidence first, then oldest, then
//! by id, so the same document always gives the same numbers and `/memory forget 2` removes
//! the fact the user saw as 2. DeerFlow's `/memory` only counts facts ("Memory contains N
//! fact(s).") and has no forget or clear command in chat; antler shows the facts and lets the
//! user remove them.

use std::cmp::Ordering;
use std::collections::HashSet;

use crate::agent::memory::schema::{About, Fact, MemoryDocument, Summary};
use crate::agent::memory::sharing::GroupPolicy;

/// The reply to `/memory` when there is nothing to show.
pub(crate) const NOTHING_REMEMBERED: &str = "I don't remember anything about you yet.";

/// The end of `/memory` in a group chat.
const GROUP_FOOTER: &str =
    "Send /memory to me in a direct message to see everything and to change it.";

/// A summary or fact shown at most this long (characters); longer ones end in `…`.
const MAX_ITEM_CHARS: usize = 400;
/// The rendering at most this long (characters), under Telegram's 4,096 per message.
const MAX_RENDER_CHARS: usize = 3_500;

/// A user key (`<channel>:<user id>` or `person:<name>`) at most this long.
pub(crate) const MAX_USER_KEY_CHARS: usize = 300;
/// The prefixes a user key may have: the channels, and `person` for linked identities.
const KEY_PREFIXES: &[&str] = &["api", "telegram", "slack", "discord", "feishu", "person"];

/// Bounds on a document written through the API.
const MAX_SUMMARY_CHARS: usize = 4_000;
const MAX_FACT_CHARS: usize = 2_000;
const MAX_SHORT_FIELD_CHARS: usize = 128;

/// The errors of editing a document.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum EditError {
    /// `/memory forget <n>` named no listed fact.
    #[error("there is no fact {n}; {}", count_phrase(*.count))]
    NoSuchFact { n: usize, count: usize },
    /// A document given to replace the stored one breaks a rule; the text says which.
    #[error("invalid memory document: {0}")]
    Invalid(String),
    /// A user key that is not `<channel>:<user id>` or `person:<name>`.
    #[error(
        "invalid user key: expected `<channel>:<user id>` or `person:<name>` \
         (channel one of api, telegram, slack, discord, feishu), at most {MAX_USER_KEY_CHARS} \
         printable characters"
    )]
    BadUserKey,
}

fn count_phrase(count: usize) -> String {
    match count {
        0 => "no facts are remembered".to_owned(),
        1 => "the only fact is 1".to_owned(),
        n => format!("facts are numbered 1 to {n}"),
    }
}

/// The order facts are listed and numbered in: confidence (highest first), then creation
/// time, then id.
fn listing_order(a: &Fact, b: &Fact) -> Ordering {
    b.confidence
        .partial_cmp(&a.confidence)
        .unwrap_or(Ordering::Equal)
        .then_with(|| a.created_at.cmp(&b.created_at))
        .then_with(|| a.id.cmp(&b.id))
}

/// The indexes into `doc.facts` in listing order: the fact numbered `n` is at `[n - 1]`.
fn numbered(doc: &MemoryDocument) -> Vec<usize> {
    let mut order: Vec<usize> = (0..doc.facts.len()).collect();
    order.sort_by(|&a, &b| listing_order(&doc.facts[a], &doc.facts[b]));
    order
}

/// `text` safe to show inside a Markdown line: one line, at most `max` characters, with every
/// character that Markdown (or a chat platform's flavour of it) reads as markup escaped.
pub(crate) fn escape_markdown(text: &str, max: usize) -> String {
    let folded: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::with_capacity(folded.len().min(max * 2));
    for (count, c) in folded.chars().enumerate() {
        if count == max {
            out.push('…');
            break;
        }
        // Inline markup only: the text sits mid-line after a label or list number, where
        // block markers (`#`, `1.`, `-`) mean nothing.
        if matches!(
            c,
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '~' | '&'
        ) {
            out.push('\\');
        }
        if !c.is_control() {
            out.push(c);
        }
    }
    out
}

/// What antler remembers about a user, as a direct-message reply: the non-empty summaries,
/// then the numbered facts (highest confidence first) with their category, what they are
/// about and whether `group` lets group chats hear them, bounded in length.
pub(crate) fn render_for_user(doc: &MemoryDocument, group: &GroupPolicy) -> String {
    if is_blank(doc) {
        return NOTHING_REMEMBERED.to_owned();
    }
    let mut out = String::from("Here is what I remember about you:\n");
    render_items(doc, Some(group), &mut out);
    out.push_str(
        "\nSend /memory forget <n> to remove a fact, /memory share <n> to let group chats \
         hear it (/memory unshare <n> to stop), or /memory clear to forget everything.",
    );
    out
}

/// What a group chat hears of a user's memory, as a reply in that group: `view` is
/// `GroupPolicy::group_view` of the document (the same one group runs inject), shown without
/// numbers.
pub(crate) fn render_for_group(view: &MemoryDocument) -> String {
    if is_blank(view) {
        return format!("In group chats I use nothing I remember about you. {GROUP_FOOTER}");
    }
    let mut out = String::from("In group chats I use this of what I remember about you:\n");
    render_items(view, None, &mut out);
    out.push('\n');
    out.push_str(GROUP_FOOTER);
    out
}

/// Whether `doc` has nothing to show: no facts and only blank summaries.
fn is_blank(doc: &MemoryDocument) -> bool {
    doc.facts.is_empty() && summaries(doc).is_empty()
}

/// The non-empty summaries with their labels.
fn summaries(doc: &MemoryDocument) -> Vec<(&'static str, &Summary)> {
    let all: [(&'static str, &Summary); 6] = [
        ("Work", &doc.user.work_context),
        ("Personal", &doc.user.personal_context),
        ("Current focus", &doc.user.top_of_mind),
        ("Recent months", &doc.history.recent_months),
        ("Earlier", &doc.history.earlier_context),
        ("Background", &doc.history.long_term_background),
    ];
    all.into_iter()
        .filter(|(_, s)| !s.summary.trim().is_empty())
        .collect()
}

/// The summaries and facts of `doc` onto `out`, bounded: numbered with each fact's labels in
/// a direct message (`group` given), bulleted with the category only in a group.
fn render_items(doc: &MemoryDocument, group: Option<&GroupPolicy>, out: &mut String) {
    let summaries = summaries(doc);
    if !summaries.is_empty() {
        out.push('\n');
        for (label, summary) in summaries {
            let line = format!(
                "**{label}:** {}\n",
                escape_markdown(&summary.summary, MAX_ITEM_CHARS)
            );
            if out.chars().count() + line.chars().count() > MAX_RENDER_CHARS {
                break;
            }
            out.push_str(&line);
        }
    }
    let order = numbered(doc);
    if !order.is_empty() {
        out.push_str("\n**Facts:**\n");
        for (shown, &index) in order.iter().enumerate() {
            let fact = &doc.facts[index];
            let content = escape_markdown(&fact.content, MAX_ITEM_CHARS);
            let category = escape_markdown(&fact.category, MAX_SHORT_FIELD_CHARS);
            let line = match group {
                Some(group) => {
                    let mut labels = vec![fact.about.unwrap_or(About::Personal).as_str()];
                    if fact.shareable {
                        labels.push("shared");
                    }
                    if group.admits(fact) {
                        labels.push("in groups");
                    }
                    format!(
                        "{}. {content} ({category}, {:.2}; {})\n",
                        shown + 1,
                        fact.confidence,
                        labels.join(", ")
                    )
                }
                None => format!("- {content} ({category})\n"),
            };
            if out.chars().count() + line.chars().count() > MAX_RENDER_CHARS {
                out.push_str(&format!("…and {} more not shown.\n", order.len() - shown));
                break;
            }
            out.push_str(&line);
        }
    }
}

/// Removes the fact numbered `n` (1-based, as [`render_for_user`] numbers them); returns it.
pub(crate) fn forget(doc: &mut MemoryDocument, n: usize) -> Result<Fact, EditError> {
    let order = numbered(doc);
    let count = order.len();
    let index = n
        .checked_sub(1)
        .and_then(|i| order.get(i).copied())
        .ok_or(EditError::NoSuchFact { n, count })?;
    Ok(doc.facts.remove(index))
}

/// The fact numbered `n` (1-based, as [`render_for_user`] numbers them).
pub(crate) fn numbered_fact(doc: &MemoryDocument, n: usize) -> Result<&Fact, EditError> {
    let order = numbered(doc);
    n.checked_sub(1)
        .and_then(|i| order.get(i))
        .map(|&index| &doc.facts[index])
        .ok_or(EditError::NoSuchFact {
            n,
            count: order.len(),
        })
}

/// Sets whether the fact with id `id` is shared with group chats; returns whether there was
/// such a fact.
pub(crate) fn set_shareable(doc: &mut MemoryDocument, id: &str, shareable: bool) -> bool {
    match doc.facts.iter_mut().find(|f| f.id == id) {
        Some(fact) => {
            fact.shareable = shareable;
            true
        }
        None => false,
    }
}

/// Removes the fact with id `id`, if there is one.
pub(crate) fn forget_id(doc: &mut MemoryDocument, id: &str) -> Option<Fact> {
    let index = doc.facts.iter().position(|f| f.id == id)?;
    Some(doc.facts.remove(index))
}

/// Forgets everything: no summaries, no facts.
#[cfg(test)]
pub(crate) fn clear(doc: &mut MemoryDocument) {
    *doc = MemoryDocument::default();
}

/// Whether `doc` holds nothing at all.
pub(crate) fn is_empty(doc: &MemoryDocument) -> bool {
    let empty = MemoryDocument::default();
    doc.user == empty.user && doc.history == empty.history && doc.facts.is_empty()
}

fn check_text(field: &str, value: &str, max: usize) -> Result<(), EditError> {
    if value.chars().count() > max {
        return Err(EditError::Invalid(format!(
            "`{field}` is longer than {max} characters"
        )));
    }
    Ok(())
}

/// Checks a document given to replace a stored one: at most `max_facts` facts, each with a
/// non-empty unique id, content, a confidence in `0..=1`, and every text within its bound.
pub(crate) fn validate(doc: &MemoryDocument, max_facts: usize) -> Result<(), EditError> {
    if doc.facts.len() > max_facts {
        return Err(EditError::Invalid(format!(
            "{} facts; at most {max_facts} (memory.max_facts)",
            doc.facts.len()
        )));
    }
    let summaries = [
        ("user.workContext", &doc.user.work_context),
        ("user.personalContext", &doc.user.personal_context),
        ("user.topOfMind", &doc.user.top_of_mind),
        ("history.recentMonths", &doc.history.recent_months),
        ("history.earlierContext", &doc.history.earlier_context),
        (
            "history.longTermBackground",
            &doc.history.long_term_background,
        ),
    ];
    for (field, summary) in summaries {
        check_text(field, &summary.summary, MAX_SUMMARY_CHARS)?;
        check_text(field, &summary.updated_at, MAX_SHORT_FIELD_CHARS)?;
    }
    let mut ids = HashSet::new();
    for (i, fact) in doc.facts.iter().enumerate() {
        let field = |name: &str| format!("facts[{i}].{name}");
        if fact.id.trim().is_empty() || fact.id.chars().any(char::is_control) {
            return Err(EditError::Invalid(format!(
                "`{}` must be printable and not empty",
                field("id")
            )));
        }
        check_text(&field("id"), &fact.id, MAX_SHORT_FIELD_CHARS)?;
        if !ids.insert(fact.id.as_str()) {
            return Err(EditError::Invalid(format!(
                "`{}` repeats an earlier fact's id",
                field("id")
            )));
        }
        if fact.content.trim().is_empty() {
            return Err(EditError::Invalid(format!(
                "`{}` must not be empty",
                field("content")
            )));
        }
        check_text(&field("content"), &fact.content, MAX_FACT_CHARS)?;
        check_text(&field("category"), &fact.category, MAX_SHORT_FIELD_CHARS)?;
        check_text(&field("createdAt"), &fact.created_at, MAX_SHORT_FIELD_CHARS)?;
        check_text(
            &field("source"),
            &fact.source.thread_id,
            MAX_SHORT_FIELD_CHARS,
        )?;
        if !(0.0..=1.0).contains(&fact.confidence) {
            return Err(EditError::Invalid(format!(
                "`{}` must be between 0 and 1",
                field("confidence")
            )));
        }
    }
    Ok(())
}

/// Checks a user key as the API receives it: a known prefix, a non-empty rest, bounded and
/// printable.
pub(crate) fn check_user_key(key: &str) -> Result<(), EditError> {
    let Some((prefix, rest)) = key.split_once(':') else {
        return Err(EditError::BadUserKey);
    };
    if !KEY_PREFIXES.contains(&prefix)
        || rest.trim().is_empty()
        || key.chars().count() > MAX_USER_KEY_CHARS
        || key.chars().any(char::is_control)
    {
        return Err(EditError::BadUserKey);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(id: &str, content: &str, confidence: f32) -> Fact {
        Fact {
            id: id.to_owned(),
            content: content.to_owned(),
            category: "preference".to_owned(),
            confidence,
            created_at: "2026-01-01T00:00:00Z".to_owned(),
            updated_at: String::new(),
            source: crate::agent::memory::schema::FactSource {
                thread_id: "t1".to_owned(),
            },
            about: None,
            shareable: false,
        }
    }

    fn doc(facts: Vec<Fact>) -> MemoryDocument {
        MemoryDocument {
            facts,
            ..MemoryDocument::default()
        }
    }

    #[test]
    fn an_empty_document_says_nothing_is_remembered() {
        assert_eq!(
            render_for_user(&MemoryDocument::default(), &GroupPolicy::default()),
            NOTHING_REMEMBERED
        );
        let mut blank = MemoryDocument::default();
        blank.user.work_context.summary = "   ".to_owned();
        assert_eq!(
            render_for_user(&blank, &GroupPolicy::default()),
            NOTHING_REMEMBERED
        );
    }

    #[test]
    fn facts_are_numbered_by_confidence_and_summaries_shown_when_set() {
        let mut d = doc(vec![
            fact("a", "likes tea", 0.75),
            fact("b", "works on antler", 0.95),
            fact("c", "lives in Lyon", 0.85),
        ]);
        d.user.work_context.summary = "Runs the ops team".to_owned();
        let text = render_for_user(&d, &GroupPolicy::default());
        assert!(text.contains("**Work:** Runs the ops team"), "{text}");
        assert!(
            !text.contains("Personal"),
            "empty summaries are left out: {text}"
        );
        let first = text.find("\n1. works on antler").unwrap();
        let second = text.find("\n2. lives in Lyon").unwrap();
        let third = text
            .find("\n3. likes tea (preference, 0.75; personal)")
            .unwrap();
        assert!(first < second && second < third, "{text}");
    }

    #[test]
    fn a_direct_message_labels_facts_and_a_group_sees_only_its_view() {
        let mut work = fact("w", "owns the payments service", 0.95);
        work.about = Some(About::Work);
        let personal = fact("p", "is expecting a baby", 0.9);
        let mut shared = fact("s", "runs marathons", 0.85);
        shared.shareable = true;
        let mut d = doc(vec![work, personal, shared]);
        d.user.personal_context.summary = "Lives with two cats".to_owned();
        let policy = GroupPolicy::default();
        let direct = render_for_user(&d, &policy);
        assert!(
            direct.contains("1. owns the payments service (preference, 0.95; work, in groups)"),
            "{direct}"
        );
        assert!(
            direct.contains("2. is expecting a baby (preference, 0.90; personal)\n"),
            "{direct}"
        );
        assert!(
            direct.contains("3. runs marathons (preference, 0.85; personal, shared, in groups)"),
            "{direct}"
        );
        assert!(direct.contains("/memory share <n>"), "{direct}");

        let group = render_for_group(&policy.group_view(&d));
        assert!(
            group.contains("- owns the payments service (preference)"),
            "{group}"
        );
        assert!(group.contains("- runs marathons (preference)"), "{group}");
        assert!(
            !group.contains("baby") && !group.contains("cats"),
            "{group}"
        );
        assert!(
            !group.contains("1."),
            "no numbers to act on in a group: {group}"
        );
        let nothing = render_for_group(&policy.group_view(&doc(vec![fact("p", "x", 0.9)])));
        assert!(
            nothing.starts_with("In group chats I use nothing"),
            "{nothing}"
        );
    }

    #[test]
    fn share_marks_the_fact_by_id() {
        let mut d = doc(vec![
            fact("a", "likes tea", 0.75),
            fact("b", "works on antler", 0.95),
        ]);
        let id = numbered_fact(&d, 2).unwrap().id.clone();
        assert_eq!(id, "a");
        assert!(set_shareable(&mut d, &id, true));
        assert!(d.facts[0].shareable && !d.facts[1].shareable);
        assert!(set_shareable(&mut d, &id, false));
        assert!(!d.facts[0].shareable);
        assert!(!set_shareable(&mut d, "gone", true));
        assert_eq!(
            numbered_fact(&d, 3).unwrap_err(),
            EditError::NoSuchFact { n: 3, count: 2 }
        );
    }

    #[test]
    fn forget_removes_the_fact_with_the_shown_number() {
        let mut d = doc(vec![
            fact("a", "likes tea", 0.75),
            fact("b", "works on antler", 0.95),
        ]);
        let removed = forget(&mut d, 2).unwrap();
        assert_eq!(removed.id, "a");
        assert_eq!(d.facts.len(), 1);
        assert_eq!(
            forget(&mut d, 0),
            Err(EditError::NoSuchFact { n: 0, count: 1 })
        );
        assert_eq!(
            forget(&mut d, 2),
            Err(EditError::NoSuchFact { n: 2, count: 1 })
        );
        assert_eq!(forget(&mut d, 1).unwrap().id, "b");
        assert!(
            forget(&mut d, 1)
                .unwrap_err()
                .to_string()
                .contains("no facts")
        );
    }

    #[test]
    fn forget_id_and_clear() {
        let mut d = doc(vec![fact("a", "x", 0.9), fact("b", "y", 0.8)]);
        d.history.recent_months.summary = "busy".to_owned();
        assert_eq!(forget_id(&mut d, "b").unwrap().content, "y");
        assert!(forget_id(&mut d, "b").is_none());
        assert!(!is_empty(&d));
        clear(&mut d);
        assert!(is_empty(&d));
        assert_eq!(
            render_for_user(&d, &GroupPolicy::default()),
            NOTHING_REMEMBERED
        );
    }

    #[test]
    fn model_text_cannot_forge_markup_or_lines() {
        let d = doc(vec![fact(
            "a",
            "ok\n2. **admin** [click](http://evil) <b>x</b> `code`",
            0.9,
        )]);
        let text = render_for_user(&d, &GroupPolicy::default());
        assert!(!text.contains("\n2. "), "no forged list entry: {text}");
        assert!(!text.contains("**admin**"), "{text}");
        assert!(text.contains("\\[click\\](http"), "{text}");
        assert!(!text.contains("<b>"), "{text}");
        assert!(text.contains("\\*\\*admin\\*\\*"), "{text}");
        // As Telegram gets it: no bold, no link, no HTML of the model's making.
        let html = antler_channel::render::parts(
            &text,
            &antler_channel::render::TelegramHtml,
            antler_channel::render::Limit::Utf16(4096),
        )
        .unwrap()
        .concat();
        assert!(!html.contains("<b>admin"), "{html}");
        assert!(!html.contains("<a "), "{html}");
        assert!(html.contains("**admin**"), "shown literally: {html}");
        assert!(html.contains("&lt;b&gt;"), "{html}");
    }

    #[test]
    fn the_rendering_is_bounded() {
        let long = "word ".repeat(1_000);
        let facts = (0..100)
            .map(|i| fact(&format!("f{i}"), &long, 0.8))
            .collect();
        let mut d = doc(facts);
        d.user.top_of_mind.summary = long.clone();
        let text = render_for_user(&d, &GroupPolicy::default());
        assert!(
            text.chars().count() <= MAX_RENDER_CHARS + 200,
            "{}",
            text.len()
        );
        assert!(text.contains("more not shown"), "{text}");
        assert!(text.contains("…"));
    }

    #[test]
    fn validation_bounds_facts_and_fields() {
        let ok = doc(vec![fact("a", "x", 0.9)]);
        assert_eq!(validate(&ok, 100), Ok(()));
        let many = doc((0..3).map(|i| fact(&format!("f{i}"), "x", 0.9)).collect());
        assert!(
            validate(&many, 2)
                .unwrap_err()
                .to_string()
                .contains("at most 2")
        );
        let dup = doc(vec![fact("a", "x", 0.9), fact("a", "y", 0.9)]);
        assert!(
            validate(&dup, 100)
                .unwrap_err()
                .to_string()
                .contains("repeats")
        );
        let bad_conf = doc(vec![fact("a", "x", 1.5)]);
        assert!(validate(&bad_conf, 100).is_err());
        let nan = doc(vec![fact("a", "x", f32::NAN)]);
        assert!(validate(&nan, 100).is_err());
        let empty = doc(vec![fact("a", " ", 0.9)]);
        assert!(validate(&empty, 100).is_err());
        let mut long = MemoryDocument::default();
        long.history.earlier_context.summary = "x".repeat(MAX_SUMMARY_CHARS + 1);
        assert!(
            validate(&long, 100)
                .unwrap_err()
                .to_string()
                .contains("history.earlierContext")
        );
    }

    #[test]
    fn a_document_may_leave_summaries_out() {
        let doc: MemoryDocument = serde_json::from_str(
            r#"{"version": 1, "user": {"topOfMind": {"summary": "the launch"}}}"#,
        )
        .unwrap();
        assert_eq!(doc.user.top_of_mind.summary, "the launch");
        assert!(doc.user.work_context.summary.is_empty() && doc.facts.is_empty());
        assert_eq!(validate(&doc, 1), Ok(()));
    }

    #[test]
    fn user_keys_name_a_known_channel_or_a_person() {
        for good in ["api:ana", "telegram:42", "slack:T1:U9", "person:ada"] {
            assert_eq!(check_user_key(good), Ok(()), "{good}");
        }
        let too_long = format!("api:{}", "x".repeat(MAX_USER_KEY_CHARS));
        for bad in [
            "ana",
            "irc:ana",
            "api:",
            "api: ",
            ":x",
            "api:a\nb",
            too_long.as_str(),
        ] {
            assert_eq!(check_user_key(bad), Err(EditError::BadUserKey), "{bad:?}");
        }
    }
}
