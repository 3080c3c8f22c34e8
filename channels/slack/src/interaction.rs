//! Slack interactions → antler's [`Press`].
//!
//! A press of a Block Kit button comes as a `block_actions` payload ("Handling user
//! interaction", api.slack.com/interactivity/handling): to the Interactivity Request URL as a
//! form with one field, `payload`, holding the JSON, or over Socket Mode as an `interactive`
//! envelope carrying the same JSON. Pure, like `normalize.rs`: every id is checked to be what
//! Slack's ids look like before it becomes part of a conversation key.

use antler_channel::{Button, ConversationKey, Press, ReplyContext, UserRef};
use serde::{Deserialize, Serialize};

use crate::normalize::{Context, NAME};

/// The longest id or ts antler takes from a payload; Slack's are about a dozen characters.
const MAX_ID_CHARS: usize = 32;

/// The longest user name kept, in characters (Slack's handles are at most 80).
const MAX_NAME_CHARS: usize = 80;

/// What an interaction means to antler.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Interacted {
    /// A press of one of the bot's buttons.
    Press(Box<Press>),
    /// Nothing to do; the reason is for the debug log.
    Ignored(&'static str),
}

/// Where the answer to a press goes, kept secret in the [`Press::answer_context`]: the
/// message's channel, who pressed, and the thread the message is in (an ephemeral notice
/// there stays in that thread).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PressTo {
    /// The channel (or DM) the button's message is in.
    #[serde(rename = "c")]
    pub(crate) channel: String,
    /// The user who pressed.
    #[serde(rename = "u")]
    pub(crate) user: String,
    /// The thread's root ts, when the message is in a thread.
    #[serde(rename = "th", default, skip_serializing_if = "Option::is_none")]
    pub(crate) thread_ts: Option<String>,
}

impl PressTo {
    fn context(&self) -> ReplyContext {
        ReplyContext::new(serde_json::to_string(self).unwrap_or_default())
    }

    /// What [`PressTo::context`] made; `None` for anything else.
    pub(crate) fn read(context: &ReplyContext) -> Option<Self> {
        serde_json::from_str(context.expose()).ok()
    }
}

/// The fields of an interaction payload antler reads; the rest (`response_url`,
/// `trigger_id`, the message's blocks) is left unread.
#[derive(Debug, Deserialize)]
struct Payload {
    #[serde(rename = "type")]
    kind: String,
    user: Option<User>,
    team: Option<Id>,
    channel: Option<Id>,
    container: Option<Container>,
    message: Option<Message>,
    #[serde(default)]
    actions: Vec<Action>,
}

#[derive(Debug, Deserialize)]
struct User {
    id: String,
    username: Option<String>,
    name: Option<String>,
    team_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Id {
    id: String,
}

#[derive(Debug, Deserialize)]
struct Container {
    #[serde(rename = "type")]
    kind: String,
    message_ts: Option<String>,
    channel_id: Option<String>,
    #[serde(default)]
    is_ephemeral: bool,
    thread_ts: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Message {
    ts: Option<String>,
    thread_ts: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Action {
    #[serde(rename = "type")]
    kind: String,
    action_id: String,
    value: Option<String>,
}

/// Normalizes an interaction payload: a `block_actions` press of a button on a message
/// becomes a [`Press`] in the conversation a message there would be in; other interactions
/// (`view_submission`, `shortcut`, a select menu) are ignored. `Err` names what is malformed.
pub(crate) fn normalize_interaction(
    raw: &serde_json::Value,
    context: &Context<'_>,
) -> Result<Interacted, String> {
    let payload = Payload::deserialize(raw).map_err(|e| format!("not an interaction: {e}"))?;
    if payload.kind != "block_actions" {
        return Ok(Interacted::Ignored(
            "an interaction other than block_actions",
        ));
    }
    let Some(container) = payload.container.as_ref().filter(|c| c.kind == "message") else {
        return Ok(Interacted::Ignored("an action outside a message"));
    };
    if container.is_ephemeral {
        // antler's buttons are on messages chat.update can replace, never ephemeral ones.
        return Ok(Interacted::Ignored("an action on an ephemeral message"));
    }
    let Some(action) = payload.actions.iter().find(|a| a.kind == "button") else {
        return Ok(Interacted::Ignored("not a button"));
    };
    let user = payload.user.as_ref().ok_or("no user")?;
    let team = payload
        .team
        .as_ref()
        .map(|team| team.id.as_str())
        .or(user.team_id.as_deref())
        .ok_or("no team")?;
    if context.team_id.is_some_and(|wanted| wanted != team) {
        return Ok(Interacted::Ignored(
            "from a workspace other than channels.slack.team_id",
        ));
    }
    let channel = payload
        .channel
        .as_ref()
        .map(|channel| channel.id.as_str())
        .or(container.channel_id.as_deref())
        .ok_or("no channel")?;
    let message = payload.message.as_ref();
    let ts = container
        .message_ts
        .as_deref()
        .or_else(|| message.and_then(|m| m.ts.as_deref()))
        .ok_or("no message ts")?;
    let thread_ts = message
        .and_then(|m| m.thread_ts.as_deref())
        .or(container.thread_ts.as_deref());
    for id in [team, channel, user.id.as_str()] {
        if !is_id(id) {
            return Err("an id that is not Slack's".to_owned());
        }
    }
    if !is_ts(ts) || thread_ts.is_some_and(|ts| !is_ts(ts)) {
        return Err("a ts that is not Slack's".to_owned());
    }
    // antler sets `value` and `action_id` both to the button's action.
    let pressed = action.value.as_deref().unwrap_or(&action.action_id);
    if pressed.len() > Button::MAX_ACTION_BYTES || !pressed.is_ascii() {
        return Ok(Interacted::Ignored("a button that is not antler's"));
    }
    // As `normalize.rs` keys a message in that place: in a channel the thread's root (the
    // message itself at the top level); in a DM only a threaded message has one.
    let dm = channel.starts_with('D');
    let conversation = match (dm, thread_ts) {
        (true, None) => ConversationKey::new(NAME, [team, channel]),
        (true, Some(root)) => ConversationKey::new(NAME, [team, channel, root]),
        (false, root) => ConversationKey::new(NAME, [team, channel, root.unwrap_or(ts)]),
    };
    let name = user
        .username
        .as_deref()
        .or(user.name.as_deref())
        .filter(|name| !name.is_empty())
        .map(|name| name.chars().take(MAX_NAME_CHARS).collect());
    Ok(Interacted::Press(Box::new(Press {
        channel: NAME.to_owned(),
        conversation,
        user: UserRef {
            id: user.id.clone(),
            name,
            admin: false,
            aliases: Vec::new(),
        },
        chat: Some(channel.to_owned()),
        action: pressed.to_owned(),
        message_id: ts.to_owned(),
        answer_context: Some(
            PressTo {
                channel: channel.to_owned(),
                user: user.id.clone(),
                thread_ts: thread_ts.map(str::to_owned),
            }
            .context(),
        ),
    })))
}

/// A Slack id (`T…`, `C…`, `U…`): letters and digits.
fn is_id(id: &str) -> bool {
    (1..=MAX_ID_CHARS).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// A Slack ts (`1767229999.000900`): digits and a dot.
fn is_ts(ts: &str) -> bool {
    (1..=MAX_ID_CHARS).contains(&ts.len()) && ts.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(team_id: Option<&str>) -> Context<'_> {
        Context {
            bot_user_id: None,
            team_id,
            thread_follow_ups: true,
            allowed_bots: &[],
            received_at_ms: 42,
        }
    }

    fn fixture() -> serde_json::Value {
        serde_json::from_slice(&antler_testkit::fixture_bytes(
            "slack",
            "slack_block_actions.json",
        ))
        .unwrap()
    }

    fn press(raw: &serde_json::Value) -> Press {
        match normalize_interaction(raw, &context(None)) {
            Ok(Interacted::Press(press)) => *press,
            other => panic!("expected a press: {other:?}"),
        }
    }

    #[test]
    fn a_button_press_in_a_thread_is_a_press_in_that_threads_conversation() {
        let press = press(&fixture());
        assert_eq!(press.channel, "slack");
        assert_eq!(
            press.conversation.as_str(),
            "slack:T0OPS00001:C0SRE00001:1767225500.000100",
            "the key a message in that thread gets"
        );
        assert_eq!(press.user.id, "U0GRC00001");
        assert_eq!(press.user.name.as_deref(), Some("grace"));
        assert!(!press.user.admin && press.user.aliases.is_empty());
        assert_eq!(press.chat.as_deref(), Some("C0SRE00001"));
        assert_eq!(press.action, "approve:k3x9p2ab");
        assert_eq!(press.message_id, "1767229999.000900");
        let to = PressTo::read(press.answer_context.as_ref().unwrap()).unwrap();
        assert_eq!(
            to,
            PressTo {
                channel: "C0SRE00001".into(),
                user: "U0GRC00001".into(),
                thread_ts: Some("1767225500.000100".into()),
            }
        );
        // The response_url, a credential, is not kept.
        assert!(!format!("{press:?}").contains("SECRETresponse"));
    }

    #[test]
    fn a_top_level_message_and_a_dm_key_as_their_messages_do() {
        let mut raw = fixture();
        raw["message"].as_object_mut().unwrap().remove("thread_ts");
        raw["container"]
            .as_object_mut()
            .unwrap()
            .remove("thread_ts");
        assert_eq!(
            press(&raw).conversation.as_str(),
            "slack:T0OPS00001:C0SRE00001:1767229999.000900"
        );
        raw["channel"] = serde_json::json!({"id": "D0ADA00001", "name": "directmessage"});
        let dm = press(&raw);
        assert_eq!(dm.conversation.as_str(), "slack:T0OPS00001:D0ADA00001");
        assert_eq!(dm.chat.as_deref(), Some("D0ADA00001"));
        raw["message"]["thread_ts"] = "1767225500.000100".into();
        assert_eq!(
            press(&raw).conversation.as_str(),
            "slack:T0OPS00001:D0ADA00001:1767225500.000100"
        );
    }

    #[test]
    fn other_interactions_and_elements_are_ignored() {
        let ignored = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut raw = fixture();
            edit(&mut raw);
            match normalize_interaction(&raw, &context(None)) {
                Ok(Interacted::Ignored(_)) => {}
                other => panic!("expected it ignored: {other:?}"),
            }
        };
        ignored(&|raw| raw["type"] = "view_submission".into());
        ignored(&|raw| raw["type"] = "shortcut".into());
        ignored(&|raw| raw["actions"][0]["type"] = "static_select".into());
        ignored(&|raw| raw["container"]["is_ephemeral"] = true.into());
        ignored(&|raw| raw["container"]["type"] = "view".into());
        ignored(&|raw| raw["actions"][0]["value"] = "x".repeat(65).into());
        ignored(&|raw| raw["actions"][0]["value"] = "approve:é".into());
        let elsewhere = normalize_interaction(&fixture(), &context(Some("T0OTHER001")));
        assert!(
            matches!(elsewhere, Ok(Interacted::Ignored(_))),
            "{elsewhere:?}"
        );
        let here = normalize_interaction(&fixture(), &context(Some("T0OPS00001")));
        assert!(matches!(here, Ok(Interacted::Press(_))), "{here:?}");
    }

    #[test]
    fn a_malformed_press_is_an_error_not_a_key() {
        let malformed = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut raw = fixture();
            edit(&mut raw);
            assert!(
                normalize_interaction(&raw, &context(None)).is_err(),
                "{raw}"
            );
        };
        malformed(&|raw| {
            raw.as_object_mut().unwrap().remove("user");
        });
        malformed(&|raw| raw["channel"]["id"] = "C0SRE:0001".into());
        malformed(&|raw| raw["user"]["id"] = "U".repeat(33).into());
        malformed(&|raw| raw["container"]["message_ts"] = "1767229999:1".into());
        malformed(&|raw| raw["message"]["thread_ts"] = "".into());
        malformed(&|raw| raw["actions"] = "approve".into());
        malformed(&|raw| {
            raw.as_object_mut().unwrap().remove("channel");
            raw["container"]
                .as_object_mut()
                .unwrap()
                .remove("channel_id");
        });
        assert!(normalize_interaction(&serde_json::json!([1]), &context(None)).is_err());
    }
}
