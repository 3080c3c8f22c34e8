//! What of a user's memory a group chat may hear: the one rule that both the `<memory>`
//! block of a group run and `/memory` sent in a group follow, so what the bot says in a
//! group never holds more than `/memory` shows there.
//!
//! A fact goes into a group when its author shared it (`shareable`, set with `/memory share
//! <n>` in a direct message), or when `memory.group_facts` lets its kind in: `work` (the
//! default) admits facts the updater labelled `about: work`, `all` admits every fact,
//! `shareable` only shared ones. A fact without the label counts as personal: it was learned
//! before labels existed, or the model left the label out, and guessing "work" would put a
//! private fact in front of a team. The summaries go in except `personalContext`, unless
//! `memory.group_personal_context` is on; the updater is asked to keep personal matters in
//! `personalContext` only, and each summary is about the user as the team knows them.

use super::MemoryConfig;
use super::config::GroupFacts;
use super::schema::{About, Fact, MemoryDocument, Summary};

/// `[memory]`'s rule for group chats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupPolicy {
    pub(crate) facts: GroupFacts,
    pub(crate) personal_context: bool,
}

impl Default for GroupPolicy {
    fn default() -> Self {
        Self::from_config(&MemoryConfig::default())
    }
}

impl GroupPolicy {
    /// From `memory.group_facts` and `memory.group_personal_context`.
    pub(crate) fn from_config(config: &MemoryConfig) -> Self {
        Self {
            facts: config.group_facts,
            personal_context: config.group_personal_context,
        }
    }

    /// Whether `fact` may be told in a group chat.
    pub(crate) fn admits(&self, fact: &Fact) -> bool {
        fact.shareable
            || match self.facts {
                GroupFacts::Shareable => false,
                GroupFacts::Work => fact.about == Some(About::Work),
                GroupFacts::All => true,
            }
    }

    /// The part of `doc` a group chat may hear: the admitted facts, and the summaries
    /// without `personalContext` unless it is allowed.
    pub(crate) fn group_view(&self, doc: &MemoryDocument) -> MemoryDocument {
        let mut view = doc.clone();
        view.facts.retain(|fact| self.admits(fact));
        if !self.personal_context {
            view.user.personal_context = Summary::default();
        }
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::memory::schema::FactSource;

    fn fact(id: &str, about: Option<About>, shareable: bool) -> Fact {
        Fact {
            id: id.to_owned(),
            content: format!("fact {id}"),
            category: "context".to_owned(),
            confidence: 0.9,
            created_at: String::new(),
            updated_at: String::new(),
            source: FactSource::default(),
            about,
            shareable,
        }
    }

    fn doc() -> MemoryDocument {
        let mut doc = MemoryDocument {
            facts: vec![
                fact("work", Some(About::Work), false),
                fact("personal", Some(About::Personal), false),
                fact("unlabelled", None, false),
                fact("shared", Some(About::Personal), true),
            ],
            ..MemoryDocument::default()
        };
        doc.user.work_context.summary = "Runs payments.".to_owned();
        doc.user.personal_context.summary = "Expecting a baby.".to_owned();
        doc
    }

    fn ids(view: &MemoryDocument) -> Vec<&str> {
        view.facts.iter().map(|f| f.id.as_str()).collect()
    }

    #[test]
    fn by_default_groups_get_work_and_shared_facts_and_no_personal_context() {
        let view = GroupPolicy::default().group_view(&doc());
        assert_eq!(ids(&view), ["work", "shared"]);
        assert_eq!(view.user.work_context.summary, "Runs payments.");
        assert_eq!(view.user.personal_context, Summary::default());
    }

    #[test]
    fn config_widens_or_narrows_what_groups_get() {
        let only_shared = GroupPolicy {
            facts: GroupFacts::Shareable,
            personal_context: false,
        };
        assert_eq!(ids(&only_shared.group_view(&doc())), ["shared"]);
        let everything = GroupPolicy {
            facts: GroupFacts::All,
            personal_context: true,
        };
        let view = everything.group_view(&doc());
        assert_eq!(view, doc());
    }
}
