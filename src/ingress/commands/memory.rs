//! `/memory`: what antler remembers about the message's author, sharing a fact with group
//! chats, and forgetting.
//!
//! The memory is always the author's (`MemoryIdentities::key` of the event's channel and user
//! id), also in a group chat, where nobody can read or change another member's memory. In a
//! group chat `/memory` shows exactly what a group run of the author would inject: the group
//! view (`GroupPolicy::group_view`, the one function both use), so what the bot says there
//! never holds more than `/memory` shows there. Changing a fact (`forget`, `share`,
//! `unshare`) takes the numbers of the direct message's listing, so in a group those point to
//! a direct message; `/memory clear`, which reveals nothing, works anywhere.
//! `/memory share <n>` lets fact `n` into group chats whatever it is about; `/memory unshare
//! <n>` takes that back (a work fact stays in groups when `memory.group_facts` is `work`).
//! `/memory forget <n>` resolves `n` on the document as it is read, then removes that fact by
//! id with [`Store::update_memory`], so an updater writing at the same moment neither loses
//! its changes nor shifts which fact goes. `/memory clear` only explains; `/memory clear
//! confirm` deletes the document and every update still queued for the user
//! ([`Store::clear_memory`]), so nothing learned before comes back.

use crate::agent::memory::identity::MemoryIdentities;
use crate::agent::memory::sharing::GroupPolicy;
use crate::memory::edit::{self, EditError};
use crate::store::{MemoryQueueStore, MemoryStore};

use super::CommandInfo;

/// `/memory` in `/help` and the command menus.
pub(crate) const INFO: CommandInfo = CommandInfo {
    name: "memory",
    aliases: &[],
    help: "what I remember about you (/memory forget <n>, /memory clear)",
    menu: "What I remember about you; forget a fact or everything",
};

/// What `/memory` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemoryAction {
    /// `/memory`: show it.
    Show,
    /// `/memory forget <n>`: remove fact `n` as `/memory` numbers them.
    Forget(usize),
    /// `/memory share <n>` (true) or `/memory unshare <n>` (false): let fact `n` into group
    /// chats, or no longer.
    Share(usize, bool),
    /// `/memory clear`: asks for the confirmation.
    Clear,
    /// `/memory clear confirm`: forget everything. The confirmation is a word of the command,
    /// not a state kept between messages, so nothing expires or leaks between users.
    ClearConfirmed,
    /// Anything else after `/memory`: answered with how to use it.
    Invalid,
}

/// The words after `/memory`. Extra words after a complete form make it invalid, so a typo
/// such as `/memory clear confirm all` does not clear.
pub(super) fn parse<'a>(words: &mut impl Iterator<Item = &'a str>) -> MemoryAction {
    let first = words.next().map(str::to_ascii_lowercase);
    let second = words.next().map(str::to_ascii_lowercase);
    if words.next().is_some() {
        return MemoryAction::Invalid;
    }
    let number = |n: &str| n.parse::<usize>().ok().filter(|&n| n > 0);
    match (first.as_deref(), second.as_deref()) {
        (None | Some("show"), None) => MemoryAction::Show,
        (Some("forget"), Some(n)) => number(n).map_or(MemoryAction::Invalid, MemoryAction::Forget),
        (Some("share"), Some(n)) => {
            number(n).map_or(MemoryAction::Invalid, |n| MemoryAction::Share(n, true))
        }
        (Some("unshare"), Some(n)) => {
            number(n).map_or(MemoryAction::Invalid, |n| MemoryAction::Share(n, false))
        }
        (Some("clear"), None) => MemoryAction::Clear,
        (Some("clear"), Some("confirm")) => MemoryAction::ClearConfirmed,
        _ => MemoryAction::Invalid,
    }
}

/// How `/memory` is used, for a form it does not know.
const USAGE: &str = "Use /memory to see what I remember about you, /memory forget <n> to \
remove fact n, /memory share <n> or /memory unshare <n> to let group chats hear fact n or \
not, or /memory clear to forget everything.";

/// The answer to `/memory forget`, `share` or `unshare` in a group chat.
const PRIVATE: &str = "To change what I remember about you, send /memory to me in a direct \
message.";

/// The answer to a store failure; the cause goes to the log.
const UNAVAILABLE: &str = "Sorry, I can't reach my memory right now; try again in a moment.";

/// Where `/memory` was sent and by whom.
pub(crate) struct Asker<'a> {
    /// The channel (`telegram`, `api`, ...).
    pub(crate) channel: &'a str,
    /// The platform's user id.
    pub(crate) user_id: &'a str,
    /// Whether it was sent in a group chat, where others would read the answer.
    pub(crate) in_group: bool,
}

/// The reply to `/memory ...` from `asker`; `group` decides what group chats hear.
pub(crate) async fn answer(
    store: &dyn MemoryQueueStore,
    identities: &MemoryIdentities,
    group: &GroupPolicy,
    asker: Asker<'_>,
    action: MemoryAction,
) -> String {
    let key = identities.key(asker.channel, asker.user_id);
    let reply = match action {
        MemoryAction::Forget(_) | MemoryAction::Share(..) if asker.in_group => {
            Ok(PRIVATE.to_owned())
        }
        MemoryAction::Show if asker.in_group => show_in_group(store, group, &key).await,
        MemoryAction::Show => show(store, group, &key).await,
        MemoryAction::Forget(n) => forget(store, &key, n).await,
        MemoryAction::Share(n, shareable) => share(store, &key, n, shareable).await,
        MemoryAction::Clear => ask_to_confirm(store, &key).await,
        MemoryAction::ClearConfirmed => clear(store, identities, &key).await,
        MemoryAction::Invalid => Ok(USAGE.to_owned()),
    };
    reply.unwrap_or_else(|e| {
        tracing::error!(error = %e, "/memory failed");
        UNAVAILABLE.to_owned()
    })
}

async fn show(
    store: &dyn MemoryStore,
    group: &GroupPolicy,
    key: &str,
) -> Result<String, crate::store::StoreError> {
    Ok(match store.memory(key).await? {
        Some(doc) => edit::render_for_user(&doc, group),
        None => edit::NOTHING_REMEMBERED.to_owned(),
    })
}

/// `/memory` in a group: the group view, whether or not there is a document (so the reply
/// does not tell the group whether private memory exists).
async fn show_in_group(
    store: &dyn MemoryStore,
    group: &GroupPolicy,
    key: &str,
) -> Result<String, crate::store::StoreError> {
    let doc = store.memory(key).await?.unwrap_or_default();
    Ok(edit::render_for_group(&group.group_view(&doc)))
}

/// `/memory share <n>` / `unshare <n>`: resolves `n` on the document as read, then changes
/// that fact by id (as `forget` does).
async fn share(
    store: &dyn MemoryQueueStore,
    key: &str,
    n: usize,
    shareable: bool,
) -> Result<String, crate::store::StoreError> {
    let seen = store.memory(key).await?.unwrap_or_default();
    let fact = match edit::numbered_fact(&seen, n) {
        Ok(fact) => fact.clone(),
        Err(e) => return Ok(format!("Nothing changed: {e}. Send /memory to see them.")),
    };
    let mut found = false;
    store
        .update_memory(key, &mut |doc| {
            let mut doc = doc?;
            found = edit::set_shareable(&mut doc, &fact.id, shareable);
            Some(doc)
        })
        .await?;
    let content = edit::escape_markdown(&fact.content, 200);
    Ok(match (found, shareable) {
        (false, _) => format!("Fact {n} (“{content}”) is gone."),
        (true, true) => format!("Group chats may now hear fact {n}: “{content}”."),
        (true, false) => format!("Fact {n} (“{content}”) is no longer shared with group chats."),
    })
}

async fn forget(
    store: &dyn MemoryQueueStore,
    key: &str,
    n: usize,
) -> Result<String, crate::store::StoreError> {
    let mut seen = store.memory(key).await?.unwrap_or_default();
    let fact = match edit::forget(&mut seen, n) {
        Ok(fact) => fact,
        Err(e @ EditError::NoSuchFact { .. }) => {
            return Ok(format!("Nothing forgotten: {e}. Send /memory to see them."));
        }
        Err(e) => return Ok(e.to_string()),
    };
    let mut removed = false;
    store
        .update_memory(key, &mut |doc| {
            let mut doc = doc?;
            removed = edit::forget_id(&mut doc, &fact.id).is_some();
            Some(doc)
        })
        .await?;
    let content = edit::escape_markdown(&fact.content, 200);
    Ok(if removed {
        format!("Forgot fact {n}: “{content}”.")
    } else {
        format!("Fact {n} (“{content}”) was already gone.")
    })
}

async fn ask_to_confirm(
    store: &dyn MemoryStore,
    key: &str,
) -> Result<String, crate::store::StoreError> {
    Ok(match store.memory(key).await? {
        Some(doc) if !edit::is_empty(&doc) => format!(
            "This forgets everything I remember about you ({} fact{} and the summaries), and \
             cannot be undone. To go ahead, send `/memory clear confirm`.",
            doc.facts.len(),
            if doc.facts.len() == 1 { "" } else { "s" },
        ),
        _ => edit::NOTHING_REMEMBERED.to_owned(),
    })
}

async fn clear(
    store: &dyn MemoryQueueStore,
    identities: &MemoryIdentities,
    key: &str,
) -> Result<String, crate::store::StoreError> {
    let cleared = store.clear_memory(key, &identities.names_of(key)).await?;
    tracing::info!(
        document = cleared.document,
        queued_updates = cleared.updates,
        "memory cleared by its user"
    );
    Ok(if cleared.document || cleared.updates > 0 {
        "Done: I have forgotten everything I remembered about you.".to_owned()
    } else {
        edit::NOTHING_REMEMBERED.to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::memory::{MemoryConfig, MemoryDocument, MemoryUpdate};
    use crate::store::MemStore;

    fn fact(id: &str, content: &str, confidence: f32) -> crate::agent::memory::schema::Fact {
        crate::agent::memory::schema::Fact {
            id: id.to_owned(),
            content: content.to_owned(),
            category: "context".to_owned(),
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

    fn dm<'a>(channel: &'a str, user_id: &'a str) -> Asker<'a> {
        Asker {
            channel,
            user_id,
            in_group: false,
        }
    }

    #[tokio::test]
    async fn in_a_group_only_the_group_view_is_shown_and_nothing_changes() {
        let store = seeded().await;
        let ids = linked();
        let policy = GroupPolicy::default();
        let group = |action| {
            answer(
                &store,
                &ids,
                &policy,
                Asker {
                    channel: "telegram",
                    user_id: "42",
                    in_group: true,
                },
                action,
            )
        };
        let shown = group(MemoryAction::Show).await;
        assert!(
            shown.contains("- deploys on Fridays"),
            "the work fact: {shown}"
        );
        assert!(
            !shown.contains("payments"),
            "the personal fact stays private: {shown}"
        );
        assert_eq!(group(MemoryAction::Forget(1)).await, PRIVATE);
        assert_eq!(group(MemoryAction::Share(1, true)).await, PRIVATE);
        let doc = store.memory("person:ada").await.unwrap().unwrap();
        assert_eq!(doc.facts.len(), 2, "nothing forgotten");
        let ask = group(MemoryAction::Clear).await;
        assert!(ask.contains("/memory clear confirm"), "{ask}");
        assert!(!ask.contains("payments"), "{ask}");
    }

    fn linked() -> MemoryIdentities {
        let config: MemoryConfig = toml::from_str(
            "[[identities]]\nname = \"ada\"\nids = [\"telegram:42\", \"api:ada\"]\n",
        )
        .unwrap();
        MemoryIdentities::from_config(&config)
    }

    async fn seeded() -> MemStore {
        let store = MemStore::new();
        let mut work = fact("f1", "deploys on Fridays", 0.8);
        work.about = Some(crate::agent::memory::schema::About::Work);
        let doc = MemoryDocument {
            facts: vec![work, fact("f2", "runs the payments team", 0.95)],
            ..MemoryDocument::default()
        };
        store.put_memory("person:ada", &doc).await.unwrap();
        store
    }

    #[tokio::test]
    async fn show_answers_about_the_author_through_linked_identities_only() {
        let store = seeded().await;
        let ids = linked();
        let ada = answer(
            &store,
            &ids,
            &GroupPolicy::default(),
            dm("telegram", "42"),
            MemoryAction::Show,
        )
        .await;
        assert!(ada.contains("1. runs the payments team"), "{ada}");
        let same = answer(
            &store,
            &ids,
            &GroupPolicy::default(),
            dm("api", "ada"),
            MemoryAction::Show,
        )
        .await;
        assert_eq!(ada, same, "one person, one memory");
        let bob = answer(
            &store,
            &ids,
            &GroupPolicy::default(),
            dm("telegram", "43"),
            MemoryAction::Show,
        )
        .await;
        assert_eq!(bob, edit::NOTHING_REMEMBERED);
    }

    #[tokio::test]
    async fn share_lets_a_fact_into_groups_and_unshare_takes_it_back() {
        let store = seeded().await;
        let ids = linked();
        let policy = GroupPolicy::default();
        let in_group = Asker {
            channel: "telegram",
            user_id: "42",
            in_group: true,
        };
        let reply = answer(
            &store,
            &ids,
            &policy,
            dm("api", "ada"),
            MemoryAction::Share(1, true),
        )
        .await;
        assert_eq!(
            reply,
            "Group chats may now hear fact 1: “runs the payments team”."
        );
        let shown = answer(&store, &ids, &policy, in_group, MemoryAction::Show).await;
        assert!(shown.contains("runs the payments team"), "{shown}");
        let listed = answer(&store, &ids, &policy, dm("api", "ada"), MemoryAction::Show).await;
        assert!(listed.contains("personal, shared, in groups"), "{listed}");

        let reply = answer(
            &store,
            &ids,
            &policy,
            dm("api", "ada"),
            MemoryAction::Share(1, false),
        )
        .await;
        assert!(reply.contains("no longer shared"), "{reply}");
        let in_group = Asker {
            channel: "telegram",
            user_id: "42",
            in_group: true,
        };
        let shown = answer(&store, &ids, &policy, in_group, MemoryAction::Show).await;
        assert!(!shown.contains("payments"), "{shown}");
        let none = answer(
            &store,
            &ids,
            &policy,
            dm("api", "ada"),
            MemoryAction::Share(9, true),
        )
        .await;
        assert!(none.contains("there is no fact 9"), "{none}");
    }

    #[test]
    fn share_and_unshare_parse_with_a_number() {
        let parse_all = |text: &str| parse(&mut text.split_whitespace());
        assert_eq!(parse_all("share 2"), MemoryAction::Share(2, true));
        assert_eq!(parse_all("UNSHARE 1"), MemoryAction::Share(1, false));
        assert_eq!(parse_all("share"), MemoryAction::Invalid);
        assert_eq!(parse_all("share 0"), MemoryAction::Invalid);
        assert_eq!(parse_all("share 1 2"), MemoryAction::Invalid);
    }

    #[tokio::test]
    async fn forget_removes_the_numbered_fact_and_says_which() {
        let store = seeded().await;
        let ids = linked();
        let reply = answer(
            &store,
            &ids,
            &GroupPolicy::default(),
            dm("api", "ada"),
            MemoryAction::Forget(1),
        )
        .await;
        assert_eq!(reply, "Forgot fact 1: “runs the payments team”.");
        let doc = store.memory("person:ada").await.unwrap().unwrap();
        assert_eq!(doc.facts.len(), 1);
        assert_eq!(doc.facts[0].id, "f1");
        let none = answer(
            &store,
            &ids,
            &GroupPolicy::default(),
            dm("api", "ada"),
            MemoryAction::Forget(2),
        )
        .await;
        assert!(none.contains("there is no fact 2"), "{none}");
        assert_eq!(
            store
                .memory("person:ada")
                .await
                .unwrap()
                .unwrap()
                .facts
                .len(),
            1
        );
    }

    #[tokio::test]
    async fn clear_asks_first_then_drops_the_document_and_queued_updates() {
        let store = seeded().await;
        let ids = linked();
        store
            .queue_memory_update(MemoryUpdate {
                user_id: "telegram:42".to_owned(),
                thread_id: "t9".to_owned(),
                messages: Vec::new(),
                seen: 0,
                from: 0,
                enqueued_at_ms: 1,
                due_at_ms: 2,
            })
            .await
            .unwrap();
        let ask = answer(
            &store,
            &ids,
            &GroupPolicy::default(),
            dm("telegram", "42"),
            MemoryAction::Clear,
        )
        .await;
        assert!(ask.contains("/memory clear confirm"), "{ask}");
        assert!(ask.contains("2 facts"), "{ask}");
        assert!(
            store.memory("person:ada").await.unwrap().is_some(),
            "not yet"
        );

        let done = answer(
            &store,
            &ids,
            &GroupPolicy::default(),
            dm("api", "ada"),
            MemoryAction::ClearConfirmed,
        )
        .await;
        assert!(done.starts_with("Done"), "{done}");
        assert!(store.memory("person:ada").await.unwrap().is_none());
        assert!(store.due_memory_updates(10, 10).await.unwrap().is_empty());
        let again = answer(
            &store,
            &ids,
            &GroupPolicy::default(),
            dm("api", "ada"),
            MemoryAction::Clear,
        )
        .await;
        assert_eq!(again, edit::NOTHING_REMEMBERED);
        let usage = answer(
            &store,
            &ids,
            &GroupPolicy::default(),
            dm("api", "ada"),
            MemoryAction::Invalid,
        )
        .await;
        assert_eq!(usage, USAGE);
    }
}
