//! Interactions as antler's normalized messages.
//!
//! Only application commands carry a message: `/ask prompt:…` is the prompt, a message
//! context-menu command ("Ask antler") the text of the message it was used on, and any other
//! command (`/new`, `/status`, `/memory args:forget 2`) its name and values as a chat command
//! (`/memory forget 2`), which the gateway's command handling reads like anyone's.

use antler_channel::{Button, ConversationKey, InboundEvent, Press, ReplyContext, UserRef};
use serenity::model::application::{
    AuthorizingIntegrationOwner, AuthorizingIntegrationOwners, CommandDataOption,
    CommandDataOptionValue, CommandInteraction, CommandType, ComponentInteraction,
    ComponentInteractionDataKind, ResolvedTarget,
};
use serenity::model::guild::Member;
use serenity::model::user::User;

/// The channel's name.
pub(crate) const NAME: &str = "discord";

/// The slash command whose `prompt` is a message for the model.
pub(crate) const ASK: &str = "ask";

/// The longest text taken from one interaction, in bytes (Discord's own limits are lower: a
/// string option holds 6,000 characters, a message 4,000).
const MAX_TEXT_BYTES: usize = 32 * 1024;

/// What an application command became.
#[derive(Debug)]
pub(crate) enum Normalized {
    Event(Box<InboundEvent>),
    /// Not for antler (an unhandled command type); the user is told at once, privately.
    Refused(String),
}

/// The reply context of an interaction: when it arrived, whether the app answers it as a
/// user-installed app only (limited to 5 follow-ups), and its token, which lives 15 minutes
/// from then. Tokens are URL-safe characters, never `:`.
pub(crate) fn reply_context(received_at_ms: u64, user_install: bool, token: &str) -> ReplyContext {
    if user_install {
        ReplyContext::new(format!("{received_at_ms}:u:{token}"))
    } else {
        ReplyContext::new(format!("{received_at_ms}:{token}"))
    }
}

/// What a reply context made by [`reply_context`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answering<'a> {
    pub(crate) received_at_ms: u64,
    pub(crate) user_install: bool,
    pub(crate) token: &'a str,
}

/// The arrival time, install kind and token of a reply context made by [`reply_context`]
/// (one stored before the install kind was kept reads as a guild install).
pub(crate) fn read_reply_context(context: &ReplyContext) -> Option<Answering<'_>> {
    let (at, rest) = context.expose().split_once(':')?;
    let received_at_ms = at.parse().ok()?;
    let (user_install, token) = match rest.strip_prefix("u:") {
        Some(token) => (true, token),
        None => (false, rest),
    };
    (!token.is_empty()).then_some(Answering {
        received_at_ms,
        user_install,
        token,
    })
}

/// Whether the app answers `command` only as installed to the user (Discord's
/// `authorizing_integration_owners` names a user install, key `1`, and no guild install,
/// key `0`): "Apps installed to a user ... are limited to 5 followup messages per
/// interaction".
fn user_install_only(owners: &AuthorizingIntegrationOwners) -> bool {
    let owners = &owners.0;
    owners
        .iter()
        .any(|owner| matches!(owner, AuthorizingIntegrationOwner::UserInstall(_)))
        && !owners
            .iter()
            .any(|owner| matches!(owner, AuthorizingIntegrationOwner::GuildInstall(_)))
}

/// `discord:<channel>` in a DM, `discord:<guild>:<channel>` in a server (threads are channels).
pub(crate) fn conversation(guild: Option<&str>, channel: &str) -> ConversationKey {
    match guild {
        Some(guild) => ConversationKey::new(NAME, [guild, channel]),
        None => ConversationKey::new(NAME, [channel]),
    }
}

/// The channel id of a conversation key made by [`conversation`].
pub(crate) fn channel_of(key: &ConversationKey) -> Option<&str> {
    let mut parts = key.as_str().split(':');
    if parts.next() != Some(NAME) {
        return None;
    }
    let segments: Vec<&str> = parts.collect();
    match segments.as_slice() {
        [channel] | [_, channel] if !channel.is_empty() => Some(channel),
        _ => None,
    }
}

/// An application command as a message.
pub(crate) fn normalize_command(command: &CommandInteraction, received_at_ms: u64) -> Normalized {
    let text = match command.data.kind {
        CommandType::ChatInput if command.data.name == ASK => {
            let prompt = command
                .data
                .options
                .iter()
                .find(|option| option.name == "prompt")
                .and_then(|option| match &option.value {
                    CommandDataOptionValue::String(text) => Some(text.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            if prompt.trim().is_empty() {
                "/help".to_owned()
            } else {
                prompt
            }
        }
        CommandType::ChatInput => {
            let mut text = format!("/{}", command.data.name);
            options_text(&command.data.options, &mut text);
            text
        }
        CommandType::Message => match command.data.target() {
            Some(ResolvedTarget::Message(message)) => message.content.clone(),
            _ => String::new(),
        },
        _ => {
            return Normalized::Refused("This command is not one antler answers.".to_owned());
        }
    };
    let unsupported = (command.data.kind == CommandType::Message && text.trim().is_empty())
        .then(|| "a message without text".to_owned());
    let guild = command.guild_id.map(|id| id.to_string());
    let channel = command.channel_id.to_string();
    Normalized::Event(Box::new(InboundEvent {
        channel: NAME.to_owned(),
        event_id: command.id.to_string(),
        conversation: conversation(guild.as_deref(), &channel),
        user: user_ref(command.member.as_deref(), &command.user),
        text: truncate(text, MAX_TEXT_BYTES),
        reply_to: None,
        received_at_ms,
        attachments: Vec::new(),
        group: guild.is_some(),
        chat: Some(channel),
        refused: false,
        follow_up: false,
        unsupported,
        // The user watches "thinking…" until the answer arrives.
        interactive: true,
        reply_context: Some(reply_context(
            received_at_ms,
            user_install_only(&command.authorizing_integration_owners),
            &command.token,
        )),
        media_group: None,
    }))
}

/// Who sent an interaction: their id, and the name the server shows (the member's nickname),
/// else their display name, else their username. `admin` is decided by the gateway's access
/// rules, as for every message.
fn user_ref(member: Option<&Member>, user: &User) -> UserRef {
    let name = member
        .and_then(|member| member.nick.clone())
        .or_else(|| user.global_name.clone())
        .unwrap_or_else(|| user.name.clone());
    UserRef {
        id: user.id.to_string(),
        name: Some(name),
        admin: false,
        aliases: Vec::new(),
    }
}

/// What a component interaction became.
#[derive(Debug)]
pub(crate) enum Pressed {
    Press(Box<Press>),
    /// Not a button antler could have made (a select menu, an action too long or not ASCII):
    /// the presser is told at once, privately.
    Refused(String),
}

/// A press of a button on one of the bot's messages, with the conversation and user a command
/// from the same person in the same place gets; what answering it needs (the interaction's id
/// and token) is its answer context.
pub(crate) fn normalize_press(component: &ComponentInteraction) -> Pressed {
    if !matches!(component.data.kind, ComponentInteractionDataKind::Button) {
        return Pressed::Refused("antler does not handle menus or forms.".to_owned());
    }
    let action = &component.data.custom_id;
    // antler's actions are short ASCII ([`Button::MAX_ACTION_BYTES`]); anything else is not
    // one of its buttons, and is not carried further.
    if action.is_empty() || action.len() > Button::MAX_ACTION_BYTES || !action.is_ascii() {
        return Pressed::Refused("This button is not one antler answers.".to_owned());
    }
    let guild = component.guild_id.map(|id| id.to_string());
    let channel = component.channel_id.to_string();
    Pressed::Press(Box::new(Press {
        channel: NAME.to_owned(),
        conversation: conversation(guild.as_deref(), &channel),
        user: user_ref(component.member.as_ref(), &component.user),
        chat: Some(channel),
        action: action.clone(),
        message_id: component.message.id.to_string(),
        answer_context: Some(press_context(&component.id.to_string(), &component.token)),
    }))
}

/// The answer context of a press: the interaction's id and its token (an answer over the
/// Gateway goes to `/interactions/{id}/{token}/callback`).
pub(crate) fn press_context(interaction_id: &str, token: &str) -> ReplyContext {
    ReplyContext::new(format!("{interaction_id}:{token}"))
}

/// The interaction id and token of a context made by [`press_context`].
#[cfg(test)]
pub(crate) fn read_press_context(context: &ReplyContext) -> Option<(&str, &str)> {
    let (id, token) = context.expose().split_once(':')?;
    (!id.is_empty() && !token.is_empty()).then_some((id, token))
}

/// The option the built-in commands take their words in (`/memory args: forget 3`): its value
/// is words to split. Any other option (an operator command's argument) is one value.
const WORDS_OPTION: &str = "args";

/// Appends a command's subcommands and values, space-separated. A value of one option that
/// holds spaces or quotes is written in double quotes (`\"` and `\\` escaped), so the words
/// parsed from the text give it back whole.
fn options_text(options: &[CommandDataOption], text: &mut String) {
    for option in options {
        match &option.value {
            CommandDataOptionValue::SubCommand(inner)
            | CommandDataOptionValue::SubCommandGroup(inner) => {
                text.push(' ');
                text.push_str(&option.name);
                options_text(inner, text);
            }
            CommandDataOptionValue::String(value) if !value.trim().is_empty() => {
                let value = value.trim();
                text.push(' ');
                if option.name != WORDS_OPTION
                    && value.contains(|c: char| c.is_whitespace() || "\"'\\".contains(c))
                {
                    text.push('"');
                    text.push_str(&value.replace('\\', "\\\\").replace('"', "\\\""));
                    text.push('"');
                } else {
                    text.push_str(value);
                }
            }
            CommandDataOptionValue::Integer(value) => {
                text.push(' ');
                text.push_str(&value.to_string());
            }
            CommandDataOptionValue::Number(value) => {
                text.push(' ');
                text.push_str(&value.to_string());
            }
            CommandDataOptionValue::Boolean(value) => {
                text.push(' ');
                text.push_str(&value.to_string());
            }
            _ => {}
        }
    }
}

/// `text` cut to at most `max` bytes at a character boundary.
fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_keys_follow_the_design() {
        let dm = conversation(None, "11");
        assert_eq!(dm.as_str(), "discord:11");
        assert_eq!(channel_of(&dm), Some("11"));
        let guild = conversation(Some("1"), "50");
        assert_eq!(guild.as_str(), "discord:1:50");
        assert_eq!(channel_of(&guild), Some("50"));
        assert_eq!(channel_of(&ConversationKey::new("slack", ["1", "2"])), None);
        assert_eq!(
            channel_of(&ConversationKey::new("discord", ["1", "2", "3"])),
            None
        );
    }

    #[test]
    fn a_reply_context_round_trips() {
        let context = reply_context(42, false, "tok:en");
        let read = |context| {
            read_reply_context(context).map(|i| (i.received_at_ms, i.user_install, i.token))
        };
        assert_eq!(read(&context), Some((42, false, "tok:en")));
        assert_eq!(
            read(&reply_context(42, true, "tok")),
            Some((42, true, "tok"))
        );
        assert_eq!(read_reply_context(&ReplyContext::new("x")), None);
        assert_eq!(read_reply_context(&ReplyContext::new("1:")), None);
    }

    #[test]
    fn an_argument_with_spaces_or_quotes_stays_one_value_and_args_stay_words() {
        let options: Vec<CommandDataOption> = serde_json::from_value(serde_json::json!([
            {"name": "service", "type": 3, "value": "api server"},
            {"name": "note", "type": 3, "value": "say \"hi\" \\ bye"},
            {"name": "version", "type": 3, "value": "v1.2.3"}
        ]))
        .unwrap();
        let mut text = "/deploy".to_owned();
        options_text(&options, &mut text);
        assert_eq!(text, r#"/deploy "api server" "say \"hi\" \\ bye" v1.2.3"#);
        let words: Vec<CommandDataOption> = serde_json::from_value(serde_json::json!([
            {"name": "args", "type": 3, "value": "forget 3"}
        ]))
        .unwrap();
        let mut text = "/memory".to_owned();
        options_text(&words, &mut text);
        assert_eq!(text, "/memory forget 3");
    }

    #[test]
    fn long_text_is_cut_at_a_character() {
        assert_eq!(truncate("héllo".to_owned(), 2), "h");
        assert_eq!(truncate("abc".to_owned(), 10), "abc");
    }
}
