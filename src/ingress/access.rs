//! Access control, the same for every channel, checked once per message before it is stored.
//!
//! Each channel's config names `allowed_users`, `allowed_chats` and `admins` (platform ids),
//! and a platform's its `dm_policy` ([`DmPolicy`]). The rule: a message is let through when
//! its author is in `admins` or `allowed_users` or was approved through DM pairing (an
//! operator's `antler pairing approve`), or when it was written in a chat listed in
//! `allowed_chats` (an allowed chat lets everyone in it talk; an allowed user may talk
//! anywhere the bot is). With
//! `dm_policy = "open"` (the API channel: both allowlists empty) anyone may talk, and startup
//! warns. An author the channel itself already marked as an admin (the API's admin token) is
//! let through too. An author in `admins`, or approved as one, gets
//! [`UserRef::admin`](antler_channel::UserRef), so the turn runs with the admin role.
//!
//! With `dm_policy = "pairing"`, an unknown author of a private message (not in a group) is
//! refused with a pairing code instead of the refusal ([`Access::pairs`]); they are answered
//! up to [`PAIRING_REPLIES`] times an hour, each time with the same code. In a group the
//! refusal is the usual one: pairing happens in private only.
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
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use antler_channel::{InboundEvent, UserRef};
use tokio::time::Instant;

use crate::config::{ChannelsConfig, DmPolicy};

/// How long after a refusal the same user is not told again.
pub(crate) const REFUSAL_INTERVAL: Duration = Duration::from_secs(3600);

/// How often within [`REFUSAL_INTERVAL`] an unknown user who writes privately is answered
/// with their pairing code (the same code each time); further messages are dropped.
pub(crate) const PAIRING_REPLIES: u32 = 3;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AccessRules {
    allowed_users: HashSet<String>,
    allowed_chats: HashSet<String>,
    admins: HashSet<String>,
    dm_policy: DmPolicy,
}

impl Default for AccessRules {
    /// No lists: open.
    fn default() -> Self {
        Self::new(&[], &[], &[])
    }
}

impl AccessRules {
    /// The lists, open when both allowlists are empty (as the API channel is).
    pub(crate) fn new(
        allowed_users: &[String],
        allowed_chats: &[String],
        admins: &[String],
    ) -> Self {
        let set = |ids: &[String]| ids.iter().cloned().collect();
        let open = allowed_users.is_empty() && allowed_chats.is_empty();
        Self {
            allowed_users: set(allowed_users),
            allowed_chats: set(allowed_chats),
            admins: set(admins),
            dm_policy: if open {
                DmPolicy::Open
            } else {
                DmPolicy::Allowlist
            },
        }
    }

    /// The same lists under a platform's `dm_policy` (`None`: its default).
    pub(crate) fn with_dm_policy(mut self, configured: Option<DmPolicy>) -> Self {
        self.dm_policy = match configured {
            Some(policy) => policy,
            None if self.allowed_users.is_empty() && self.allowed_chats.is_empty() => {
                DmPolicy::Pairing
            }
            None => DmPolicy::Allowlist,
        };
        self
    }

    /// Anyone may talk.
    pub(crate) fn is_open(&self) -> bool {
        self.dm_policy == DmPolicy::Open
    }

    /// Whether `user` (by any of their ids) is an operator.
    fn is_admin(&self, user: &UserRef) -> bool {
        user.ids().any(|id| self.admins.contains(id))
    }

    /// Whether `user` may talk in `chat`, or in the chat it was before (`moved_from`), admins
    /// aside.
    fn allows(&self, user: &UserRef, chat: Option<&str>, moved_from: Option<&str>) -> bool {
        self.dm_policy == DmPolicy::Open
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
    /// By channel name; a channel without rules is open. Replaced whole when the
    /// configuration is reloaded ([`Access::reload`]); a check reads one snapshot.
    rules: RwLock<Arc<HashMap<String, AccessRules>>>,
    /// Users approved through pairing: channel → user id → admin. Loaded from the store at
    /// start and added to on approval, so checking costs no store read.
    paired: RwLock<HashMap<String, HashMap<String, bool>>>,
    refusals: Mutex<Refusals>,
}

impl Access {
    /// The rules of `channels` (the API channel's `admins` and `allowed_users` are API users).
    pub(crate) fn from_config(channels: &ChannelsConfig) -> Self {
        Self::new(Self::rules_of(channels))
    }

    /// Applies the access rules of a reloaded configuration (allowlists, admins, `dm_policy`)
    /// from the next check on; who was approved through pairing, and the memory of refusals,
    /// stay.
    pub(crate) fn reload(&self, channels: &ChannelsConfig) {
        let rules: HashMap<String, AccessRules> = Self::rules_of(channels).collect();
        if let Ok(mut current) = self.rules.write() {
            *current = Arc::new(rules);
        }
    }

    /// The rules of every channel in `channels`.
    fn rules_of(channels: &ChannelsConfig) -> impl Iterator<Item = (String, AccessRules)> {
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
                )
                .with_dm_policy(channels.telegram.dm_policy),
            ),
            (
                "slack",
                AccessRules::new(
                    &channels.slack.allowed_users,
                    &channels.slack.allowed_chats,
                    &channels.slack.admins,
                )
                .with_dm_policy(channels.slack.dm_policy),
            ),
            (
                "discord",
                AccessRules::new(
                    &channels.discord.allowed_users,
                    &channels.discord.allowed_chats,
                    &channels.discord.admins,
                )
                .with_dm_policy(channels.discord.dm_policy),
            ),
            (
                "feishu",
                AccessRules::new(
                    &channels.feishu.allowed_users,
                    &channels.feishu.allowed_chats,
                    &channels.feishu.admins,
                )
                .with_dm_policy(channels.feishu.dm_policy),
            ),
        ];
        rules
            .into_iter()
            .map(|(name, rules)| (name.to_owned(), rules))
    }

    pub(crate) fn new(rules: impl IntoIterator<Item = (String, AccessRules)>) -> Self {
        Self {
            rules: RwLock::new(Arc::new(rules.into_iter().collect())),
            paired: RwLock::default(),
            refusals: Mutex::default(),
        }
    }

    /// The rules in effect now.
    fn rules(&self) -> Arc<HashMap<String, AccessRules>> {
        self.rules
            .read()
            .map(|rules| Arc::clone(&rules))
            .unwrap_or_default()
    }

    /// Whether `channel` lets anyone talk (for the startup warning).
    pub(crate) fn is_open(&self, channel: &str) -> bool {
        self.rules().get(channel).is_none_or(AccessRules::is_open)
    }

    /// The `dm_policy` in effect on `channel` (`open` for a channel without rules).
    pub(crate) fn dm_policy(&self, channel: &str) -> DmPolicy {
        self.rules()
            .get(channel)
            .map_or(DmPolicy::Open, |rules| rules.dm_policy)
    }

    /// Lets `user_id` talk on `channel` from now on (approved through pairing), as an admin
    /// with `admin`.
    pub(crate) fn pair(&self, channel: &str, user_id: &str, admin: bool) {
        if let Ok(mut paired) = self.paired.write() {
            paired
                .entry(channel.to_owned())
                .or_default()
                .insert(user_id.to_owned(), admin);
        }
    }

    /// Whether `user_id` was approved on `channel` through pairing.
    #[cfg(test)]
    pub(crate) fn is_paired(&self, channel: &str, user_id: &str) -> bool {
        self.paired_as(
            channel,
            &UserRef {
                id: user_id.to_owned(),
                name: None,
                admin: false,
                aliases: Vec::new(),
            },
        )
        .is_some()
    }

    /// `Some(admin)` when `user` (by any of their ids) was approved on `channel`.
    fn paired_as(&self, channel: &str, user: &UserRef) -> Option<bool> {
        let paired = self.paired.read().ok()?;
        let users = paired.get(channel)?;
        let mut found = None;
        for id in user.ids() {
            if let Some(&admin) = users.get(id) {
                found = Some(found.unwrap_or(false) || admin);
            }
        }
        found
    }

    /// Whether a refused `event` is answered with a pairing code: its platform's `dm_policy`
    /// is `pairing` and it was written privately.
    pub(crate) fn pairs(&self, event: &InboundEvent) -> bool {
        !event.group && self.dm_policy(&event.channel) == DmPolicy::Pairing
    }

    /// Marks `event`'s author an admin when they are one; then whether they may talk in
    /// `chat` (or `moved_from`).
    fn decide(
        &self,
        rules: &AccessRules,
        event: &mut InboundEvent,
        moved_from: Option<&str>,
    ) -> bool {
        let paired = self.paired_as(&event.channel, &event.user);
        if rules.is_admin(&event.user) || paired == Some(true) {
            event.user.admin = true;
        }
        event.user.admin
            || paired.is_some()
            || rules.allows(&event.user, event.chat.as_deref(), moved_from)
    }

    /// Whether `user` is an operator on `channel`: in its `admins`, approved as one through
    /// pairing, or marked so by the channel itself (the API's admin token).
    pub(crate) fn is_admin(&self, channel: &str, user: &UserRef) -> bool {
        user.admin
            || self.paired_as(channel, user) == Some(true)
            || self
                .rules()
                .get(channel)
                .is_some_and(|rules| rules.is_admin(user))
    }

    /// Whether `event` passes as it is (its author is an operator or allowed there), with no
    /// chat it moved from to consider.
    pub(crate) fn admits(&self, event: &InboundEvent) -> bool {
        self.rules().get(&event.channel).is_none_or(|rules| {
            rules.is_admin(&event.user)
                || self.paired_as(&event.channel, &event.user).is_some()
                || rules.allows(&event.user, event.chat.as_deref(), None)
        })
    }

    /// Decides about `event` now, marking its author an admin or the event refused. Its chat
    /// continues the chat `moved_from`, when that is given (a group upgraded to a supergroup),
    /// and is allowed where that one was.
    pub(crate) fn check(&self, event: &mut InboundEvent, moved_from: Option<&str>) -> Admit {
        let all = self.rules();
        let Some(rules) = all.get(&event.channel) else {
            return Admit::Run;
        };
        if self.decide(rules, event, moved_from) {
            return Admit::Run;
        }
        let limit = if self.pairs(event) {
            PAIRING_REPLIES
        } else {
            1
        };
        let first = self.refusals.lock().map_or(true, |mut refusals| {
            refusals.answer_in_interval(&event.channel, &event.user.id, Instant::now(), limit)
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
        let all = self.rules();
        let Some(rules) = all.get(&event.channel) else {
            return true;
        };
        let allowed = self.decide(rules, event, None);
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

/// When each (channel, user) pair was first refused in its interval and how often it was
/// answered since, oldest first, bounded.
#[derive(Debug)]
struct Refusals {
    last: HashMap<(String, String), (Instant, u32)>,
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
    #[cfg(test)]
    fn first_in_interval(&mut self, channel: &str, user: &str, now: Instant) -> bool {
        self.answer_in_interval(channel, user, now, 1)
    }

    /// Whether a refusal of (`channel`, `user`) at `now` is among the first `limit` in its
    /// interval, which is counted.
    fn answer_in_interval(&mut self, channel: &str, user: &str, now: Instant, limit: u32) -> bool {
        while let Some((at, _)) = self.order.front() {
            if now.duration_since(*at) < self.interval {
                break;
            }
            self.pop_front();
        }
        let key = (channel.to_owned(), user.to_owned());
        if let Some((_, count)) = self.last.get_mut(&key) {
            if *count >= limit {
                return false;
            }
            *count += 1;
            return true;
        }
        while self.order.len() >= self.cap {
            self.pop_front();
        }
        self.last.insert(key.clone(), (now, 1));
        self.order.push_back((now, key));
        true
    }

    fn pop_front(&mut self) {
        if let Some((_, key)) = self.order.pop_front() {
            self.last.remove(&key);
        }
    }

    /// Takes back the last answer counted for (`channel`, `user`).
    fn forget(&mut self, channel: &str, user: &str) {
        let key = (channel.to_owned(), user.to_owned());
        if let Some((_, count)) = self.last.get_mut(&key) {
            if *count > 1 {
                *count -= 1;
                return;
            }
            self.last.remove(&key);
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

    fn telegram(config: &str) -> Access {
        let config: crate::config::ChannelsConfig = toml::from_str(config).unwrap();
        Access::from_config(&config)
    }

    fn dm(user: &str) -> InboundEvent {
        let mut event = from(user, Some(user));
        event.channel = "telegram".to_owned();
        event
    }

    fn in_group(user: &str) -> InboundEvent {
        let mut event = from(user, Some("-100"));
        event.channel = "telegram".to_owned();
        event.group = true;
        event
    }

    #[test]
    fn the_dm_policy_defaults_to_pairing_without_allowlists_and_allowlist_with_them() {
        let access = telegram("[telegram]\n");
        assert_eq!(access.dm_policy("telegram"), DmPolicy::Pairing);
        assert!(!access.is_open("telegram"), "pairing is not open");
        let access = telegram("[telegram]\nallowed_chats = [\"-100\"]\n");
        assert_eq!(access.dm_policy("telegram"), DmPolicy::Allowlist);
        let access = telegram("[telegram]\ndm_policy = \"open\"\n");
        assert_eq!(access.dm_policy("telegram"), DmPolicy::Open);
        assert!(access.is_open("telegram"));
        assert_eq!(access.check(&mut dm("bob"), None), Admit::Run);
        // The API channel keeps its own rule: no allowlist, anyone.
        assert!(access.is_open("api"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unknown_user_is_paired_in_private_and_refused_in_groups() {
        let access = telegram("[telegram]\nadmins = [\"root\"]\n");
        let mut bob = dm("bob");
        assert_eq!(access.check(&mut bob, None), Admit::Refuse);
        assert!(bob.refused && access.pairs(&bob));
        // Asked again, they are answered (with the same code) a few times an hour, no more.
        for _ in 1..PAIRING_REPLIES {
            assert_eq!(access.check(&mut dm("bob"), None), Admit::Refuse);
        }
        assert_eq!(access.check(&mut dm("bob"), None), Admit::Drop);
        tokio::time::advance(REFUSAL_INTERVAL).await;
        assert_eq!(access.check(&mut dm("bob"), None), Admit::Refuse);
        // In a group pairing does not apply: the usual refusal, once an hour.
        let mut carol = in_group("carol");
        assert_eq!(access.check(&mut carol, None), Admit::Refuse);
        assert!(carol.refused && !access.pairs(&carol));
        assert_eq!(access.check(&mut in_group("carol"), None), Admit::Drop);
        // An admin passes anywhere.
        assert_eq!(access.check(&mut dm("root"), None), Admit::Run);
        // With "allowlist" a private message is refused, not paired.
        let strict = telegram("[telegram]\ndm_policy = \"allowlist\"\n");
        let mut dave = dm("dave");
        assert_eq!(strict.check(&mut dave, None), Admit::Refuse);
        assert!(!strict.pairs(&dave));
    }

    #[test]
    fn an_approved_user_talks_anywhere_and_an_approved_admin_runs_as_admin() {
        let access = telegram("[telegram]\nallowed_users = [\"ada\"]\n");
        let mut bob = in_group("bob");
        assert!(!access.admits(&bob));
        access.pair("telegram", "bob", false);
        assert!(access.admits(&bob) && access.is_paired("telegram", "bob"));
        assert_eq!(access.check(&mut bob, None), Admit::Run);
        assert!(!bob.user.admin);
        // Approved on one platform is not approved on another.
        assert!(!access.is_paired("slack", "bob"));
        access.pair("telegram", "eve", true);
        let mut eve = dm("eve");
        assert_eq!(access.check(&mut eve, None), Admit::Run);
        assert!(eve.user.admin, "approved with --admin");
        let mut eve_at_once = dm("eve");
        assert!(access.allows(&mut eve_at_once) && eve_at_once.user.admin);
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
