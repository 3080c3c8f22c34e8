//! Access control, the same for every channel, checked once per message before it is stored.
//!
//! Each channel's config names `allowed_users`, `allowed_chats` and `admins` (platform ids).
//! The rule: a message is let through when its author is in `admins` or `allowed_users`, or
//! when it was written in a chat listed in `allowed_chats` (an allowed chat lets everyone in
//! it talk; an allowed user may talk anywhere the bot is). With both allowlists empty the
//! channel is open: anyone may talk, and startup warns. An author the channel itself already
//! marked as an admin (the API's admin token) is let through too. An author in `admins` gets
//! [`UserRef::admin`](antler_channel::UserRef), so the turn runs with the admin role.
//!
//! Anyone else is refused: the first message of a (channel, user) pair in an hour is accepted
//! like any other, marked [`InboundEvent::refused`], and its turn answers with one short
//! reply naming the user id instead of running anything. Going through the inbox and outbox
//! keeps the refusal as durable, deduplicated and ordered as every other reply. Further
//! messages within the hour are acknowledged and dropped, never stored. Who was refused
//! when is remembered for at most [`MAX_REMEMBERED`] pairs; beyond that the oldest are
//! forgotten (they may be refused once more within their hour), so memory stays bounded
//! whoever writes to the bot.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use antler_channel::{InboundEvent, UserRef};
use tokio::time::Instant;

use crate::config::ChannelsConfig;

/// How long after a refusal the same user is not told again.
pub(crate) const REFUSAL_INTERVAL: Duration = Duration::from_secs(3600);

/// The most (channel, user) pairs whose last refusal is remembered.
pub(crate) const MAX_REMEMBERED: usize = 10_000;

/// What to do with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Accept it and run its turn.
    Run,
    /// Accept it, marked refused: its turn answers with the refusal.
    Refuse,
    /// Acknowledge it and store nothing (refused within the last hour).
    Drop,
}

/// One channel's lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AccessRules {
    allowed_users: HashSet<String>,
    allowed_chats: HashSet<String>,
    admins: HashSet<String>,
}

impl AccessRules {
    pub(crate) fn new(
        allowed_users: &[String],
        allowed_chats: &[String],
        admins: &[String],
    ) -> Self {
        let set = |ids: &[String]| ids.iter().cloned().collect();
        Self {
            allowed_users: set(allowed_users),
            allowed_chats: set(allowed_chats),
            admins: set(admins),
        }
    }

    /// Both allowlists are empty: anyone may talk.
    pub(crate) fn is_open(&self) -> bool {
        self.allowed_users.is_empty() && self.allowed_chats.is_empty()
    }

    /// Whether `user` (by any of their ids) is an operator.
    fn is_admin(&self, user: &UserRef) -> bool {
        user.ids().any(|id| self.admins.contains(id))
    }

    /// Whether `user` may talk in `chat`, or in the chat it was before (`moved_from`), admins
    /// aside.
    fn allows(&self, user: &UserRef, chat: Option<&str>, moved_from: Option<&str>) -> bool {
        self.is_open()
            || user.ids().any(|id| self.allowed_users.contains(id))
            || [chat, moved_from]
                .into_iter()
                .flatten()
                .any(|chat| self.allowed_chats.contains(chat))
    }
}

/// The access check of every channel, with the memory of recent refusals.
#[derive(Debug, Default)]
pub(crate) struct Access {
    /// By channel name; a channel without rules is open.
    rules: HashMap<String, AccessRules>,
    refusals: Mutex<Refusals>,
}

impl Access {
    /// The rules of `channels` (the API channel's `admins` and `allowed_users` are API users).
    pub(crate) fn from_config(channels: &ChannelsConfig) -> Self {
        let api = &channels.api;
        let rules = [
            (
                "api",
                AccessRules::new(&api.allowed_users, &[], &api.admins),
            ),
            (
                "telegram",
                AccessRules::new(
                    &channels.telegram.allowed_users,
                    &channels.telegram.allowed_chats,
                    &channels.telegram.admins,
                ),
            ),
            (
                "slack",
                AccessRules::new(
                    &channels.slack.allowed_users,
                    &channels.slack.allowed_chats,
                    &channels.slack.admins,
                ),
            ),
            (
                "discord",
                AccessRules::new(
                    &channels.discord.allowed_users,
                    &channels.discord.allowed_chats,
                    &channels.discord.admins,
                ),
            ),
            (
                "feishu",
                AccessRules::new(
                    &channels.feishu.allowed_users,
                    &channels.feishu.allowed_chats,
                    &channels.feishu.admins,
                ),
            ),
        ];
        Self::new(
            rules
                .into_iter()
                .map(|(name, rules)| (name.to_owned(), rules)),
        )
    }

    pub(crate) fn new(rules: impl IntoIterator<Item = (String, AccessRules)>) -> Self {
        Self {
            rules: rules.into_iter().collect(),
            refusals: Mutex::default(),
        }
    }

    /// Whether `channel` lets anyone talk (for the startup warning).
    pub(crate) fn is_open(&self, channel: &str) -> bool {
        self.rules.get(channel).is_none_or(AccessRules::is_open)
    }

    /// Whether `event` passes as it is (its author is an operator or allowed there), with no
    /// chat it moved from to consider.
    pub(crate) fn admits(&self, event: &InboundEvent) -> bool {
        self.rules.get(&event.channel).is_none_or(|rules| {
            rules.is_admin(&event.user) || rules.allows(&event.user, event.chat.as_deref(), None)
        })
    }

    /// Decides about `event` now, marking its author an admin or the event refused. Its chat
    /// continues the chat `moved_from`, when that is given (a group upgraded to a supergroup),
    /// and is allowed where that one was.
    pub(crate) fn check(&self, event: &mut InboundEvent, moved_from: Option<&str>) -> Admit {
        let Some(rules) = self.rules.get(&event.channel) else {
            return Admit::Run;
        };
        if rules.is_admin(&event.user) {
            event.user.admin = true;
        }
        if event.user.admin || rules.allows(&event.user, event.chat.as_deref(), moved_from) {
            return Admit::Run;
        }
        let first = self.refusals.lock().map_or(true, |mut refusals| {
            refusals.first_in_interval(&event.channel, &event.user.id, Instant::now())
        });
        if first {
            tracing::info!(
                channel = %event.channel,
                user = %event.user.id,
                "refusing a message from a user who is not allowed"
            );
            metrics::counter!("antler_access_refused_total", "channel" => event.channel.clone())
                .increment(1);
            event.refused = true;
            Admit::Refuse
        } else {
            metrics::counter!("antler_access_dropped_total", "channel" => event.channel.clone())
                .increment(1);
            Admit::Drop
        }
    }

    /// Whether `event`'s author may talk, marking an admin as [`Access::check`] does, for a
    /// channel that refuses at once ([`antler_channel::Channel::refusal_reply`]): nothing is
    /// stored then, so nothing is remembered either and every refused request is told.
    pub(crate) fn allows(&self, event: &mut InboundEvent) -> bool {
        let Some(rules) = self.rules.get(&event.channel) else {
            return true;
        };
        if rules.is_admin(&event.user) {
            event.user.admin = true;
        }
        let allowed = event.user.admin || rules.allows(&event.user, event.chat.as_deref(), None);
        if !allowed {
            tracing::info!(
                channel = %event.channel,
                user = %event.user.id,
                "refusing a request from a user who is not allowed"
            );
            metrics::counter!("antler_access_refused_total", "channel" => event.channel.clone())
                .increment(1);
        }
        allowed
    }

    /// Forgets the refusal just decided for `event`: it was not accepted after all (the
    /// backlog was full, the store failed), so the next message is refused again.
    pub(crate) fn forget(&self, event: &InboundEvent) {
        if let Ok(mut refusals) = self.refusals.lock() {
            refusals.forget(&event.channel, &event.user.id);
        }
    }
}

/// The text a refused user gets.
pub(crate) fn refusal_text(event: &InboundEvent) -> String {
    format!(
        "Sorry, you are not allowed to use this bot. Your user id is {}; an operator can add \
         it to channels.{}.allowed_users.",
        event.user.id, event.channel
    )
}

/// When each (channel, user) pair was last refused, oldest first, bounded.
#[derive(Debug)]
struct Refusals {
    last: HashMap<(String, String), Instant>,
    /// The same pairs in the order they were refused: refusal times only grow, so the
    /// expired and the oldest are always at the front.
    order: VecDeque<(Instant, (String, String))>,
    interval: Duration,
    cap: usize,
}

impl Default for Refusals {
    fn default() -> Self {
        Self::new(REFUSAL_INTERVAL, MAX_REMEMBERED)
    }
}

impl Refusals {
    fn new(interval: Duration, cap: usize) -> Self {
        Self {
            last: HashMap::new(),
            order: VecDeque::new(),
            interval,
            cap: cap.max(1),
        }
    }

    /// Whether a refusal of (`channel`, `user`) at `now` is the first in its interval; if so,
    /// it is remembered.
    fn first_in_interval(&mut self, channel: &str, user: &str, now: Instant) -> bool {
        while let Some((at, _)) = self.order.front() {
            if now.duration_since(*at) < self.interval {
                break;
            }
            self.pop_front();
        }
        let key = (channel.to_owned(), user.to_owned());
        if self.last.contains_key(&key) {
            return false;
        }
        while self.order.len() >= self.cap {
            self.pop_front();
        }
        self.last.insert(key.clone(), now);
        self.order.push_back((now, key));
        true
    }

    fn pop_front(&mut self) {
        if let Some((_, key)) = self.order.pop_front() {
            self.last.remove(&key);
        }
    }

    fn forget(&mut self, channel: &str, user: &str) {
        let key = (channel.to_owned(), user.to_owned());
        if self.last.remove(&key).is_some() {
            self.order.retain(|(_, other)| *other != key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.last.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::event;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|id| (*id).to_owned()).collect()
    }

    fn access(users: &[&str], chats: &[&str], admins: &[&str]) -> Access {
        Access::new([(
            "api".to_owned(),
            AccessRules::new(&ids(users), &ids(chats), &ids(admins)),
        )])
    }

    fn from(user: &str, chat: Option<&str>) -> InboundEvent {
        let mut event = event("c", "m1", "hi");
        event.user.id = user.to_owned();
        event.chat = chat.map(str::to_owned);
        event
    }

    #[test]
    fn refusing_at_once_remembers_nothing() {
        let access = access(&["ada"], &[], &["root"]);
        let mut bob = from("bob", None);
        for _ in 0..3 {
            assert!(!access.allows(&mut bob), "told every time");
        }
        assert_eq!(access.refusals.lock().unwrap().len(), 0);
        let mut root = from("root", None);
        assert!(access.allows(&mut root) && root.user.admin);
        assert!(access.allows(&mut from("ada", None)));
    }

    #[test]
    fn a_chat_that_moved_is_allowed_where_the_old_one_was() {
        let access = access(&[], &["-100"], &[]);
        let mut member = from("ada", Some("-1009"));
        assert!(!access.admits(&member), "the new chat is not in the list");
        assert_eq!(access.check(&mut member, Some("-100")), Admit::Run);
        let mut elsewhere = from("bob", Some("-2009"));
        assert_eq!(access.check(&mut elsewhere, Some("-200")), Admit::Refuse);
    }

    #[test]
    fn a_user_is_known_by_any_of_their_ids() {
        let access = access(&["ada01"], &[], &["root01"]);
        let mut ada = from("ou_ada", None);
        ada.user.aliases = vec!["ada01".to_owned()];
        assert_eq!(access.check(&mut ada, None), Admit::Run);
        assert!(!ada.user.admin);
        let mut root = from("ou_root", None);
        root.user.aliases = vec!["root01".to_owned()];
        assert_eq!(access.check(&mut root, None), Admit::Run);
        assert!(root.user.admin, "an admin by user_id");
        let mut bob = from("ou_bob", None);
        bob.user.aliases = vec!["bob01".to_owned()];
        assert_eq!(access.check(&mut bob, None), Admit::Refuse);
    }

    #[test]
    fn access_decisions_follow_the_rule() {
        // (case, allowed_users, allowed_chats, admins, user, chat, admitted, admin)
        type Case<'a> = (
            &'a str,
            &'a [&'a str],
            &'a [&'a str],
            &'a [&'a str],
            &'a str,
            Option<&'a str>,
            bool,
            bool,
        );
        let cases: &[Case<'_>] = &[
            ("open channel", &[], &[], &[], "bob", None, true, false),
            (
                "open channel, admin",
                &[],
                &[],
                &["bob"],
                "bob",
                None,
                true,
                true,
            ),
            (
                "allowed user",
                &["alice"],
                &[],
                &[],
                "alice",
                None,
                true,
                false,
            ),
            (
                "other user",
                &["alice"],
                &[],
                &[],
                "bob",
                None,
                false,
                false,
            ),
            (
                "allowed user in any chat",
                &["alice"],
                &["g1"],
                &[],
                "alice",
                Some("g2"),
                true,
                false,
            ),
            (
                "anyone in an allowed chat",
                &["alice"],
                &["g1"],
                &[],
                "bob",
                Some("g1"),
                true,
                false,
            ),
            (
                "chats only, other chat",
                &[],
                &["g1"],
                &[],
                "bob",
                Some("g2"),
                false,
                false,
            ),
            (
                "chats only, no chat",
                &[],
                &["g1"],
                &[],
                "bob",
                None,
                false,
                false,
            ),
            (
                "admin not in the allowlists",
                &["alice"],
                &["g1"],
                &["root"],
                "root",
                Some("g2"),
                true,
                true,
            ),
            (
                "ids are exact",
                &["alice"],
                &[],
                &[],
                "Alice",
                None,
                false,
                false,
            ),
        ];
        for (name, users, chats, admins, user, chat, admitted, admin) in cases {
            let access = access(users, chats, admins);
            let mut event = from(user, *chat);
            let decision = access.check(&mut event, None);
            let expected = if *admitted { Admit::Run } else { Admit::Refuse };
            assert_eq!(decision, expected, "{name}");
            assert_eq!(event.user.admin, *admin, "{name}: admin");
            assert_eq!(event.refused, !*admitted, "{name}: refused");
        }
    }

    #[test]
    fn a_channel_admin_is_let_through_and_unknown_channels_are_open() {
        let access = access(&["alice"], &[], &[]);
        let mut event = from("bob", None);
        event.user.admin = true;
        assert_eq!(access.check(&mut event, None), Admit::Run);
        let mut elsewhere = from("bob", None);
        elsewhere.channel = "test".to_owned();
        assert_eq!(access.check(&mut elsewhere, None), Admit::Run);
        assert!(access.is_open("test"));
        assert!(!access.is_open("api"));
    }

    #[test]
    fn the_refusal_names_the_user_id_and_the_key() {
        let text = refusal_text(&from("12345", None));
        assert!(text.contains("Your user id is 12345;"), "{text}");
        assert!(text.contains("channels.api.allowed_users"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_user_is_refused_once_an_hour_per_channel() {
        let access = access(&["alice"], &[], &[]);
        assert_eq!(access.check(&mut from("bob", None), None), Admit::Refuse);
        let mut again = from("bob", None);
        assert_eq!(access.check(&mut again, None), Admit::Drop);
        assert!(!again.refused);
        // Someone else is refused on their own account.
        assert_eq!(access.check(&mut from("carol", None), None), Admit::Refuse);
        tokio::time::advance(REFUSAL_INTERVAL - Duration::from_secs(1)).await;
        assert_eq!(access.check(&mut from("bob", None), None), Admit::Drop);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(access.check(&mut from("bob", None), None), Admit::Refuse);
        // A refusal that was not accepted after all is not counted.
        access.forget(&from("bob", None));
        assert_eq!(access.check(&mut from("bob", None), None), Admit::Refuse);
    }

    #[tokio::test(start_paused = true)]
    async fn the_memory_of_refusals_is_capped_and_swept() {
        let mut refusals = Refusals::new(REFUSAL_INTERVAL, 3);
        let now = Instant::now();
        for user in ["a", "b", "c"] {
            assert!(refusals.first_in_interval("api", user, now));
        }
        assert!(!refusals.first_in_interval("api", "a", now));
        // A fourth pushes the oldest out: the cap holds, and "a" may be told once more.
        assert!(refusals.first_in_interval("api", "d", now));
        assert_eq!(refusals.len(), 3);
        assert_eq!(refusals.order.len(), 3);
        assert!(refusals.first_in_interval("api", "a", now));
        assert!(!refusals.first_in_interval("api", "d", now));
        // An hour later everything has expired and is swept on the next check.
        let later = now + REFUSAL_INTERVAL;
        assert!(refusals.first_in_interval("api", "e", later));
        assert_eq!(refusals.len(), 1);
        assert_eq!(refusals.order.len(), 1);
    }

    #[test]
    fn the_default_memory_holds_ten_thousand_pairs() {
        let mut refusals = Refusals::default();
        let now = Instant::now();
        for user in 0..MAX_REMEMBERED + 5 {
            assert!(refusals.first_in_interval("telegram", &user.to_string(), now));
        }
        assert_eq!(refusals.len(), MAX_REMEMBERED);
        assert!(!refusals.first_in_interval("telegram", &(MAX_REMEMBERED + 4).to_string(), now));
    }
}
