//! DM pairing (issue 25): an unknown user who writes to the bot privately on a platform whose
//! `dm_policy` is `pairing` gets a short code and is told to ask an operator, who runs
//! `antler pairing approve CODE` (or `deny CODE`). Nothing of theirs runs meanwhile.
//!
//! - **Codes** are [`CODE_LEN`] characters from an alphabet without look-alikes (no `0 O 1 I`),
//!   drawn from the OS random source (a v4 UUID's random bytes; 32 letters divide 256, so
//!   every letter is equally likely). They expire after [`CODE_TTL`].
//! - **Rate limit.** A user asking again while their code lives gets the same code; at most
//!   [`MAX_PENDING`] codes are pending at once, the oldest dropped for a new one.
//! - **Nothing leaks.** An unknown, expired, denied or already used code all answer the same
//!   ([`PairingError::UnknownCode`]); codes are compared in constant time, every pending one.
//! - **Durable.** Pending requests and approved users are kept in the store
//!   ([`PairingStore`]); a running serve holds the approved users in memory ([`Access`]) and
//!   applies a decision at once. The CLI (`crate::pairing`) reaches a running serve through
//!   its admin-only API (`/api/v1/pairing`, `http::pairing`), or opens the store itself when
//!   none runs.

use std::sync::Arc;
use std::time::Duration;

use antler_channel::UserRef;
use antler_channel::verify::constant_time_eq;
use serde::Serialize;

use super::access::Access;
use crate::store::{PairedUser, PairingRequest, PairingStore, StoreError};

/// Characters in a code.
pub(crate) const CODE_LEN: usize = 8;

/// The code alphabet: 32 letters and digits, none that reads like another.
const ALPHABET: &[u8; 32] = b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789";

/// How long a code can be approved.
pub(crate) const CODE_TTL: Duration = Duration::from_secs(3600);

/// The most codes pending at once.
pub(crate) const MAX_PENDING: usize = 100;

/// Longer input is not a code (bounds what an operator or the API hands in).
const MAX_CODE_INPUT: usize = 64;

/// Why a pairing decision failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PairingError {
    /// No live request has this code (never issued, expired, denied or used: all the same).
    #[error("no pending pairing request has this code (it may have expired after an hour)")]
    UnknownCode,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A new random code.
fn new_code() -> String {
    let random = uuid::Uuid::new_v4();
    let bytes = random.as_bytes();
    // Bytes 6 and 8 carry the UUID's version and variant bits; the rest are random.
    [0, 1, 2, 3, 4, 5, 10, 11]
        .iter()
        .map(|&i| char::from(ALPHABET[usize::from(bytes[i] % 32)]))
        .collect()
}

/// A code as an operator may type it: case, spaces and dashes do not matter.
pub(crate) fn normalize_code(input: &str) -> Option<String> {
    if input.len() > MAX_CODE_INPUT {
        return None;
    }
    let code: String = input
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '-')
        .map(|c| c.to_ascii_uppercase())
        .collect();
    (code.len() == CODE_LEN && code.bytes().all(|b| ALPHABET.contains(&b))).then_some(code)
}

fn ttl_ms() -> u64 {
    u64::try_from(CODE_TTL.as_millis()).unwrap_or(u64::MAX)
}

fn is_live(request: &PairingRequest, now_ms: u64) -> bool {
    now_ms < request.created_at_ms.saturating_add(ttl_ms())
}

fn key_of(request: &PairingRequest) -> (String, String) {
    (request.channel.clone(), request.user_id.clone())
}

/// What issuing a code decided: the request to hand out, and what to write.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Issue {
    request: PairingRequest,
    /// Whether `request` is new (to store); otherwise the user's live one.
    new: bool,
    /// Requests to remove with it: expired ones, and the oldest beyond [`MAX_PENDING`].
    dropped: Vec<(String, String)>,
}

/// Decides the code of (`channel`, `user`) at `now_ms`, given the `pending` requests: their
/// live request's, else a new one from `code`.
fn decide(
    pending: &[PairingRequest],
    channel: &str,
    user: &UserRef,
    now_ms: u64,
    code: impl FnOnce() -> String,
) -> Issue {
    if let Some(live) = pending
        .iter()
        .find(|r| r.channel == channel && r.user_id == user.id && is_live(r, now_ms))
    {
        return Issue {
            request: live.clone(),
            new: false,
            dropped: Vec::new(),
        };
    }
    let own = |r: &PairingRequest| r.channel == channel && r.user_id == user.id;
    let mut dropped: Vec<(String, String)> = pending
        .iter()
        .filter(|r| !is_live(r, now_ms) && !own(r))
        .map(key_of)
        .collect();
    let mut live: Vec<&PairingRequest> = pending
        .iter()
        .filter(|r| is_live(r, now_ms) && !own(r))
        .collect();
    if live.len() >= MAX_PENDING {
        live.sort_by_key(|r| r.created_at_ms);
        let excess = live.len() + 1 - MAX_PENDING;
        dropped.extend(live.iter().take(excess).map(|r| key_of(r)));
    }
    Issue {
        request: PairingRequest {
            channel: channel.to_owned(),
            user_id: user.id.clone(),
            name: user.name.clone(),
            code: code(),
            created_at_ms: now_ms,
        },
        new: true,
        dropped,
    }
}

/// The live request whose code is `code`, if any. Every pending code is compared, each in
/// constant time, so the time taken tells nothing about which codes exist.
fn find<'a>(pending: &'a [PairingRequest], code: &str, now_ms: u64) -> Option<&'a PairingRequest> {
    let mut found = None;
    for request in pending {
        let matches = constant_time_eq(request.code.as_bytes(), code.as_bytes());
        if matches && found.is_none() {
            found = Some(request);
        }
    }
    found.filter(|request| is_live(request, now_ms))
}

/// A pending request as `antler pairing list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(crate) struct PendingView {
    pub(crate) channel: String,
    pub(crate) user_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    pub(crate) code: String,
    /// Seconds until the code expires.
    pub(crate) expires_in_secs: u64,
}

/// Pairing for one store: issues codes, approves and denies them, and keeps `access`'s set of
/// approved users in step.
#[derive(Debug)]
pub(crate) struct Pairing {
    store: Arc<dyn PairingStore>,
    access: Arc<Access>,
    /// One decision at a time: issuing reads the pending requests, then writes.
    lock: tokio::sync::Mutex<()>,
}

impl Pairing {
    pub(crate) fn new(store: Arc<dyn PairingStore>, access: Arc<Access>) -> Self {
        Self {
            store,
            access,
            lock: tokio::sync::Mutex::new(()),
        }
    }

    /// Whether a refused `event` is answered with a pairing code ([`Access::pairs`]).
    pub(crate) fn applies(&self, event: &antler_channel::InboundEvent) -> bool {
        self.access.pairs(event)
    }

    /// Loads the approved users into the access check (at start); returns how many.
    pub(crate) async fn load(&self) -> Result<usize, StoreError> {
        let users = self.store.paired_users().await?;
        for user in &users {
            self.access.pair(&user.channel, &user.user_id, user.admin);
        }
        Ok(users.len())
    }

    /// The code of `user` on `channel`: their live one, else a new one (stored before it is
    /// returned).
    pub(crate) async fn code_for(
        &self,
        channel: &str,
        user: &UserRef,
    ) -> Result<String, StoreError> {
        let _one = self.lock.lock().await;
        let pending = self.store.pairing_requests().await?;
        let issue = decide(&pending, channel, user, crate::now_ms(), new_code);
        if issue.new {
            self.store
                .put_pairing_request(&issue.request, &issue.dropped)
                .await?;
            tracing::info!(channel, user = %user.id, "pairing code issued");
            metrics::counter!("antler_pairing_codes_total", "channel" => channel.to_owned())
                .increment(1);
        }
        Ok(issue.request.code)
    }

    /// The live pending requests, oldest first.
    pub(crate) async fn list(&self) -> Result<Vec<PendingView>, StoreError> {
        let now_ms = crate::now_ms();
        let mut pending: Vec<PairingRequest> = self
            .store
            .pairing_requests()
            .await?
            .into_iter()
            .filter(|r| is_live(r, now_ms))
            .collect();
        pending.sort_by_key(|r| r.created_at_ms);
        Ok(pending
            .into_iter()
            .map(|r| PendingView {
                expires_in_secs: r
                    .created_at_ms
                    .saturating_add(ttl_ms())
                    .saturating_sub(now_ms)
                    .div_ceil(1000),
                channel: r.channel,
                user_id: r.user_id,
                name: r.name,
                code: r.code,
            })
            .collect())
    }

    /// Approves the request with `code`: its user may talk from now on (as an admin with
    /// `admin`), here and after a restart.
    pub(crate) async fn approve(
        &self,
        code: &str,
        admin: bool,
    ) -> Result<PairedUser, PairingError> {
        let _one = self.lock.lock().await;
        let request = self.take(code).await?;
        let user = approve_user(
            self.store.as_ref(),
            &request.channel,
            &request.user_id,
            admin,
        )
        .await?;
        self.access.pair(&user.channel, &user.user_id, user.admin);
        Ok(user)
    }

    /// Denies the request with `code`: the code is gone; its user may ask again for a new one.
    pub(crate) async fn deny(&self, code: &str) -> Result<PairingRequest, PairingError> {
        let _one = self.lock.lock().await;
        let request = self.take(code).await?;
        self.store
            .settle_pairing(&request.channel, &request.user_id, None)
            .await?;
        tracing::info!(channel = %request.channel, user = %request.user_id, "pairing denied");
        Ok(request)
    }

    /// The live request with `code`.
    async fn take(&self, code: &str) -> Result<PairingRequest, PairingError> {
        let code = normalize_code(code).ok_or(PairingError::UnknownCode)?;
        let pending = self.store.pairing_requests().await?;
        find(&pending, &code, crate::now_ms())
            .cloned()
            .ok_or(PairingError::UnknownCode)
    }
}

/// Approves `user_id` on `channel` without a code, removing their pending request if they
/// have one: for an operator's first user (a future `antler init`) as for
/// [`Pairing::approve`]. A running serve learns of it only through [`Pairing::approve`] or a
/// restart. *Durable.*
pub(crate) async fn approve_user(
    store: &dyn PairingStore,
    channel: &str,
    user_id: &str,
    admin: bool,
) -> Result<PairedUser, StoreError> {
    let user = PairedUser {
        channel: channel.to_owned(),
        user_id: user_id.to_owned(),
        admin,
        approved_at_ms: crate::now_ms(),
    };
    store.settle_pairing(channel, user_id, Some(&user)).await?;
    tracing::info!(channel, user = user_id, admin, "pairing approved");
    Ok(user)
}

/// What a refused `event`'s author is told, and the turn's outcome (`pairing` or `refused`):
/// their pairing code where `pairing` applies ([`Pairing::applies`]; the same code on every
/// try, so a turn run again after a crash says the same), else the refusal (in a group of a
/// platform that pairs, with the hint to write privately).
pub(crate) async fn refusal(
    pairing: Option<&Pairing>,
    event: &antler_channel::InboundEvent,
) -> (String, &'static str) {
    let Some(pairing) = pairing else {
        return (super::access::refusal_text(event), "refused");
    };
    if !pairing.applies(event) {
        let mut text = super::access::refusal_text(event);
        if pairing.access.dm_policy(&event.channel) == crate::config::DmPolicy::Pairing {
            // In a group nobody is paired; a private message is the way in.
            text.push_str(" You can also write to me privately to get a pairing code.");
        }
        return (text, "refused");
    }
    match pairing.code_for(&event.channel, &event.user).await {
        Ok(code) => (
            pairing_text(&event.channel, &event.user.id, &code),
            "pairing",
        ),
        Err(e) => {
            tracing::warn!(channel = %event.channel, error = %e, "cannot issue a pairing code");
            (
                "Sorry, I cannot give you a pairing code right now; please write again later."
                    .to_owned(),
                "refused",
            )
        }
    }
}

/// What an unknown user who wrote privately is told: their code, their id (so the operator
/// can also list it in the config) and the command to run.
pub(crate) fn pairing_text(channel: &str, user_id: &str, code: &str) -> String {
    format!(
        "I don't know you yet. Your pairing code is {code} (valid for an hour). Ask an \
         operator of this bot to run:\n\nantler pairing approve {code}\n\nYour user id is \
         {user_id}; they can also add it to channels.{channel}.allowed_users."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    fn user(id: &str) -> UserRef {
        UserRef {
            id: id.to_owned(),
            name: Some(format!("{id} the user")),
            admin: false,
            aliases: Vec::new(),
        }
    }

    fn request(user_id: &str, code: &str, at: u64) -> PairingRequest {
        PairingRequest {
            channel: "telegram".to_owned(),
            user_id: user_id.to_owned(),
            name: None,
            code: code.to_owned(),
            created_at_ms: at,
        }
    }

    #[test]
    fn codes_are_eight_unambiguous_characters_and_differ() {
        let codes: std::collections::HashSet<String> = (0..200).map(|_| new_code()).collect();
        assert!(codes.len() > 190, "random enough: {}", codes.len());
        for code in &codes {
            assert_eq!(code.len(), CODE_LEN);
            assert!(
                code.bytes().all(|b| ALPHABET.contains(&b)),
                "{code} has no 0, O, 1 or I"
            );
            assert_eq!(normalize_code(code).as_deref(), Some(code.as_str()));
        }
        assert_eq!(normalize_code(" abcd-efgh ").as_deref(), Some("ABCDEFGH"));
        for bad in ["ABCDEFG", "ABCDEFGHJ", "ABCDEFG0", "ABCDEFGI", ""] {
            assert_eq!(normalize_code(bad), None, "{bad}");
        }
        assert_eq!(normalize_code(&"A".repeat(MAX_CODE_INPUT + 1)), None);
    }

    #[test]
    fn the_same_user_gets_the_same_code_until_it_expires() {
        let first = decide(&[], "telegram", &user("42"), 1_000, || {
            "AAAA2222".to_owned()
        });
        assert!(first.new);
        assert_eq!(first.request.code, "AAAA2222");
        assert_eq!(first.request.name.as_deref(), Some("42 the user"));
        let pending = [first.request.clone()];
        let again = decide(
            &pending,
            "telegram",
            &user("42"),
            1_000 + ttl_ms() - 1,
            || "BBBB3333".to_owned(),
        );
        assert!(!again.new, "no new code within the hour");
        assert_eq!(again.request.code, "AAAA2222");
        // The same id on another platform is another user.
        let elsewhere = decide(&pending, "slack", &user("42"), 2_000, || {
            "CCCC4444".to_owned()
        });
        assert!(elsewhere.new);
        // An hour later the code has expired: a new one replaces it (no separate drop).
        let later = decide(&pending, "telegram", &user("42"), 1_000 + ttl_ms(), || {
            "DDDD5555".to_owned()
        });
        assert!(later.new);
        assert_eq!(later.request.code, "DDDD5555");
        assert!(later.dropped.is_empty());
    }

    #[test]
    fn pending_codes_are_capped_oldest_dropped_and_expired_swept() {
        let mut pending: Vec<PairingRequest> = (0..MAX_PENDING as u64)
            .map(|i| request(&format!("u{i}"), "AAAA2222", 10_000 + i))
            .collect();
        pending.push(request("old", "BBBB3333", 0));
        let issue = decide(&pending, "telegram", &user("new"), ttl_ms() + 1, || {
            "CCCC4444".to_owned()
        });
        assert!(issue.new);
        assert_eq!(
            issue.dropped,
            [
                ("telegram".to_owned(), "old".to_owned()),
                ("telegram".to_owned(), "u0".to_owned())
            ],
            "the expired one, and the oldest live one to make room"
        );
    }

    #[test]
    fn a_code_is_found_only_while_it_lives() {
        let pending = [
            request("42", "AAAA2222", 1_000),
            request("7", "BBBB3333", 0),
        ];
        assert_eq!(
            find(&pending, "AAAA2222", 2_000).map(|r| r.user_id.as_str()),
            Some("42")
        );
        assert_eq!(find(&pending, "AAAA2223", 2_000), None);
        assert_eq!(find(&pending, "BBBB3333", ttl_ms()), None, "expired");
        assert_eq!(
            find(&pending, "BBBB3333", ttl_ms() - 1).map(|r| r.user_id.as_str()),
            Some("7")
        );
    }

    #[tokio::test]
    async fn approving_lets_the_user_talk_and_a_used_or_denied_code_is_unknown() {
        let store = Arc::new(MemStore::new());
        let access = Arc::new(Access::default());
        let pairing = Pairing::new(store.clone(), Arc::clone(&access));
        let code = pairing.code_for("telegram", &user("42")).await.unwrap();
        assert_eq!(
            pairing.code_for("telegram", &user("42")).await.unwrap(),
            code
        );
        let listed = pairing.list().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].user_id, "42");
        assert!((3590..=3600).contains(&listed[0].expires_in_secs));

        let other = pairing.code_for("telegram", &user("7")).await.unwrap();
        let denied = pairing.deny(&other.to_lowercase()).await.unwrap();
        assert_eq!(denied.user_id, "7");
        assert!(matches!(
            pairing.deny(&other).await,
            Err(PairingError::UnknownCode)
        ));
        assert!(matches!(
            pairing.approve(&other, false).await,
            Err(PairingError::UnknownCode)
        ));
        assert!(matches!(
            pairing.approve("not a code", false).await,
            Err(PairingError::UnknownCode)
        ));

        assert!(!access.is_paired("telegram", "42"));
        let approved = pairing.approve(&code, true).await.unwrap();
        assert!(approved.admin);
        assert!(access.is_paired("telegram", "42"));
        assert!(matches!(
            pairing.approve(&code, true).await,
            Err(PairingError::UnknownCode)
        ));
        assert!(pairing.list().await.unwrap().is_empty());

        // A restart loads the approved users again.
        let restarted = Arc::new(Access::default());
        let count = Pairing::new(store.clone(), Arc::clone(&restarted))
            .load()
            .await
            .unwrap();
        assert_eq!(count, 1);
        assert!(restarted.is_paired("telegram", "42"));
        assert!(!restarted.is_paired("telegram", "7"));
    }

    #[tokio::test]
    async fn a_private_message_gets_a_code_and_a_group_message_the_refusal_with_a_hint() {
        let config: crate::config::ChannelsConfig = toml::from_str("[telegram]\n").unwrap();
        let access = Arc::new(Access::from_config(&config));
        let pairing = Pairing::new(Arc::new(MemStore::new()), access);
        let mut event = crate::test_support::event("telegram:42", "m1", "hi");
        event.channel = "telegram".to_owned();
        event.user = user("42");
        let (text, outcome) = refusal(Some(&pairing), &event).await;
        assert_eq!(outcome, "pairing");
        let code = pairing.code_for("telegram", &user("42")).await.unwrap();
        assert!(
            text.contains(&format!("antler pairing approve {code}")),
            "{text}"
        );
        event.group = true;
        let (text, outcome) = refusal(Some(&pairing), &event).await;
        assert_eq!(outcome, "refused");
        assert!(
            text.contains("not allowed") && text.contains("privately"),
            "{text}"
        );
        assert!(!text.contains(&code), "{text}");
        let (text, _) = refusal(None, &event).await;
        assert!(!text.contains("privately"), "{text}");
    }

    #[test]
    fn the_text_names_the_code_the_id_and_the_command() {
        let text = pairing_text("telegram", "42", "AAAA2222");
        assert!(text.contains("antler pairing approve AAAA2222"), "{text}");
        assert!(text.contains("Your user id is 42;"), "{text}");
        assert!(text.contains("channels.telegram.allowed_users"), "{text}");
    }
}
