//! The group addressing rule, the same on every platform: in a private chat every message is
//! for the bot; in a group only one that is addressed to it.

/// What a platform's `parse` knows about one message, normalized, to decide with
/// [`addressed`] whether it is for the bot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Addressing<'a> {
    /// It was written in a group (or channel) rather than a private chat with the bot.
    pub is_group: bool,
    /// It @mentions the bot.
    pub mentions_bot: bool,
    /// It replies to a message the bot wrote.
    pub replies_to_bot: bool,
    /// It is a bot command (`/status`, a slash command, an application command).
    pub is_command: bool,
    /// The bot a command names explicitly (`/status@opsbot` names `opsbot`), if any.
    pub command_target: Option<&'a str>,
    /// The bot's own username, to compare `command_target` with (case-insensitively, a
    /// leading `@` ignored).
    pub bot_username: &'a str,
}

/// Whether a message is for the bot: in a private chat always; in a group only when it
/// @mentions the bot, replies to one of the bot's messages, or is a command that is not
/// explicitly addressed to another bot (`/cmd@otherbot`).
#[must_use]
pub fn addressed(facts: &Addressing<'_>) -> bool {
    if !facts.is_group || facts.mentions_bot || facts.replies_to_bot {
        return true;
    }
    if !facts.is_command {
        return false;
    }
    match facts.command_target {
        None => true,
        Some(target) => same_bot(target, facts.bot_username),
    }
}

/// Usernames compare case-insensitively (Telegram's do) with an optional leading `@`.
fn same_bot(a: &str, b: &str) -> bool {
    let a = a.strip_prefix('@').unwrap_or(a);
    let b = b.strip_prefix('@').unwrap_or(b);
    !a.is_empty() && a.eq_ignore_ascii_case(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_addressing_rule_holds_for_every_case() {
        let base = Addressing {
            bot_username: "opsbot",
            ..Addressing::default()
        };
        let group = Addressing {
            is_group: true,
            ..base
        };
        let command = Addressing {
            is_command: true,
            ..group
        };
        let cases: &[(&str, Addressing<'_>, bool)] = &[
            ("private, plain text", base, true),
            (
                "private, a command for another bot",
                Addressing {
                    is_command: true,
                    command_target: Some("otherbot"),
                    ..base
                },
                true,
            ),
            ("group, plain text", group, false),
            (
                "group, @mention",
                Addressing {
                    mentions_bot: true,
                    ..group
                },
                true,
            ),
            (
                "group, reply to the bot",
                Addressing {
                    replies_to_bot: true,
                    ..group
                },
                true,
            ),
            ("group, bare command", command, true),
            (
                "group, command for this bot",
                Addressing {
                    command_target: Some("OpsBot"),
                    ..command
                },
                true,
            ),
            (
                "group, command for this bot with @",
                Addressing {
                    command_target: Some("@opsbot"),
                    ..command
                },
                true,
            ),
            (
                "group, command for another bot",
                Addressing {
                    command_target: Some("otherbot"),
                    ..command
                },
                false,
            ),
            (
                "group, command with an empty target",
                Addressing {
                    command_target: Some(""),
                    bot_username: "",
                    ..command
                },
                false,
            ),
            (
                "group, command for another bot that also mentions this one",
                Addressing {
                    command_target: Some("otherbot"),
                    mentions_bot: true,
                    ..command
                },
                true,
            ),
        ];
        for (name, facts, expected) in cases {
            assert_eq!(addressed(facts), *expected, "{name}");
        }
    }
}
