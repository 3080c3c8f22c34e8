//! Whose memory a message reads and feeds: `<channel>:<user id>`, unless
//! `[[memory.identities]]` links that id with ids on other platforms to one person, whose
//! memory is then `person:<name>`.
//!
//! Channel names never hold `:` (they are a fixed set of words), so splitting a key at its
//! first `:` is unambiguous, whatever the platform's user id holds.

use std::collections::HashMap;

use super::MemoryConfig;

/// The memory key of each linked `<channel>:<user id>`; built once from config.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemoryIdentities {
    linked: HashMap<String, String>,
}

impl MemoryIdentities {
    /// The links of `[[memory.identities]]` (already validated: no id in two people).
    pub(crate) fn from_config(config: &MemoryConfig) -> Self {
        let mut linked = HashMap::new();
        for person in &config.identities {
            for id in &person.ids {
                linked.insert(id.clone(), format!("person:{}", person.name));
            }
        }
        Self { linked }
    }

    /// The memory key of `user_id` on `channel`.
    pub(crate) fn key(&self, channel: &str, user_id: &str) -> String {
        let own = format!("{channel}:{user_id}");
        match self.linked.get(&own) {
            Some(person) => person.clone(),
            None => own,
        }
    }

    /// Every name that `key`'s memory goes by: the key itself and, for a person, each linked
    /// `<channel>:<user id>` (queued updates may carry either).
    pub(crate) fn names_of(&self, key: &str) -> Vec<String> {
        let mut names = vec![key.to_owned()];
        names.extend(
            self.linked
                .iter()
                .filter(|(_, person)| person.as_str() == key)
                .map(|(id, _)| id.clone()),
        );
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::memory::config::IdentityLink;

    fn identities() -> MemoryIdentities {
        MemoryIdentities::from_config(&MemoryConfig {
            identities: vec![IdentityLink {
                name: "ada".to_owned(),
                ids: vec!["telegram:42".to_owned(), "slack:T1:U9".to_owned()],
            }],
            ..MemoryConfig::default()
        })
    }

    #[test]
    fn linked_ids_share_one_key_and_others_keep_their_own() {
        let ids = identities();
        assert_eq!(ids.key("telegram", "42"), "person:ada");
        assert_eq!(ids.key("slack", "T1:U9"), "person:ada");
        assert_eq!(ids.key("telegram", "43"), "telegram:43");
        assert_eq!(ids.key("api", "42"), "api:42");
    }

    #[test]
    fn a_person_goes_by_their_key_and_every_linked_id() {
        let ids = identities();
        let mut names = ids.names_of("person:ada");
        names.sort();
        assert_eq!(names, ["person:ada", "slack:T1:U9", "telegram:42"]);
        assert_eq!(ids.names_of("api:bob"), ["api:bob"]);
    }

    #[test]
    fn a_colon_in_a_user_id_cannot_pose_as_another_channel() {
        let ids = identities();
        // `slack` + `T1:U9` is linked; `slack:T1` + `U9` cannot be built: channels have no `:`.
        assert_eq!(ids.key("api", "telegram:42"), "api:telegram:42");
    }
}
