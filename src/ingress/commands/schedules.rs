//! `/schedules` (also `/schedule`, `/schedule list`): the schedules of this conversation, with
//! when they fire and their next run (admins see every schedule). Admins add one firing in
//! this conversation with `/schedule add NAME "<cron expression or every 15m>" <prompt>` and
//! remove a chat-made one with `/schedule remove NAME`; config schedules cannot be taken or
//! removed from chat.
//!
//! What is echoed (names, times, prompts, conversation keys) is escaped for the chat's
//! Markdown and bounded.

use antler_channel::InboundEvent;
use jiff::Timestamp;

use crate::memory::edit::escape_markdown;
use crate::schedule::spec::{MAX_NAME_CHARS, MAX_PROMPT_CHARS};
use crate::schedule::{AddError, RemoveError, Schedule, Schedules, When, next_run};

use super::CommandInfo;

/// `/schedules` in `/help` and the command menus.
pub(crate) const LIST_INFO: CommandInfo = CommandInfo {
    name: "schedules",
    aliases: &[],
    help: "the schedules of this conversation and their next run",
    menu: "The schedules of this conversation and their next run",
};

/// `/schedule` in `/help` and the command menus.
pub(crate) const INFO: CommandInfo = CommandInfo {
    name: "schedule",
    aliases: &[],
    help: "admins: /schedule add <name> \"<cron or every 15m>\" <prompt>, /schedule remove <name>",
    menu: "Admins: add or remove a schedule that sends a prompt here",
};

/// What `/schedule` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScheduleAction {
    List,
    Add {
        name: String,
        when: String,
        prompt: String,
    },
    Remove(String),
    /// Anything else: answered with how to use it.
    Invalid,
}

const USAGE: &str = "Use /schedules to list the schedules; admins can use /schedule add <name> \
\"<cron expression or every 15m>\" <prompt> and /schedule remove <name>. Example: /schedule add \
morning-errors \"0 9 * * 1-5\" Summarise yesterday's errors.";

/// The answer to a store failure; the cause goes to the log.
const UNAVAILABLE: &str = "Sorry, I can't reach the schedules right now; try again in a moment.";

/// The most schedules a list shows.
const MAX_LISTED: usize = 50;

/// The longest prompt a list shows.
const MAX_SHOWN_PROMPT: usize = 120;

/// Quote characters a time may be wrapped in (phones turn `"` into `“ ”`).
const QUOTES: [char; 3] = ['"', '“', '”'];

/// The text after `/schedule`.
pub(super) fn parse(rest: &str) -> ScheduleAction {
    let rest = rest.trim();
    let (verb, rest) = rest
        .split_once(char::is_whitespace)
        .map_or((rest, ""), |(verb, rest)| (verb, rest.trim()));
    match verb.to_ascii_lowercase().as_str() {
        "" | "list" if rest.is_empty() => ScheduleAction::List,
        "remove" | "delete" if !rest.is_empty() && !rest.contains(char::is_whitespace) => {
            ScheduleAction::Remove(rest.to_owned())
        }
        "add" => parse_add(rest).unwrap_or(ScheduleAction::Invalid),
        _ => ScheduleAction::Invalid,
    }
}

/// `NAME "<when>" <prompt>`.
fn parse_add(rest: &str) -> Option<ScheduleAction> {
    let (name, rest) = rest.split_once(char::is_whitespace)?;
    let rest = rest.trim_start().strip_prefix(QUOTES)?;
    let (when, prompt) = rest.split_once(QUOTES)?;
    Some(ScheduleAction::Add {
        name: name.to_owned(),
        when: when.trim().to_owned(),
        prompt: prompt.trim().to_owned(),
    })
}

/// The reply to `/schedule ...` from the author of `event`, in its conversation.
pub(crate) async fn answer(
    book: &Schedules,
    event: &InboundEvent,
    action: ScheduleAction,
) -> String {
    let admin = event.user.admin;
    match action {
        ScheduleAction::List => list(book, event).await,
        ScheduleAction::Add { .. } | ScheduleAction::Remove(_) if !admin => {
            "Only admins can add or remove schedules.".to_owned()
        }
        ScheduleAction::Add { name, when, prompt } => {
            let author = format!("{}:{}", event.channel, event.user.id);
            match book
                .add(&name, &when, &prompt, &event.conversation, &author)
                .await
            {
                Ok(schedule) => format!(
                    "Schedule {} added: {}; next run {}.",
                    shown_name(&schedule.name),
                    escape_markdown(&schedule.when_text, 200),
                    next_text(&schedule, book.now_ms())
                ),
                Err(AddError::Store(e)) => {
                    tracing::error!(error = %e, "/schedule add failed");
                    UNAVAILABLE.to_owned()
                }
                Err(e) => format!(
                    "Not added: {}. {USAGE}",
                    escape_markdown(&e.to_string(), 300)
                ),
            }
        }
        ScheduleAction::Remove(name) => match book.remove(&name).await {
            Ok(()) => format!("Schedule {} removed.", shown_name(&name)),
            Err(RemoveError::Store(e)) => {
                tracing::error!(error = %e, "/schedule remove failed");
                UNAVAILABLE.to_owned()
            }
            Err(e) => format!("{}.", escape_markdown(&e.to_string(), 300)),
        },
        ScheduleAction::Invalid => USAGE.to_owned(),
    }
}

async fn list(book: &Schedules, event: &InboundEvent) -> String {
    let all = match book.all().await {
        Ok(all) => all,
        Err(e) => {
            tracing::error!(error = %e, "/schedules failed");
            return UNAVAILABLE.to_owned();
        }
    };
    let here = &event.conversation;
    let shown: Vec<&Schedule> = all
        .iter()
        .filter(|s| event.user.admin || s.conversation == *here)
        .collect();
    if shown.is_empty() {
        return format!("No schedules here. {USAGE}");
    }
    let now = book.now_ms();
    let mut out = if event.user.admin {
        "Schedules (all conversations):\n".to_owned()
    } else {
        "Schedules here:\n".to_owned()
    };
    for schedule in shown.iter().take(MAX_LISTED) {
        out.push_str(&format!(
            "• {} — {} — next run {}{}{}\n  {}\n",
            shown_name(&schedule.name),
            escape_markdown(&schedule.when_text, 200),
            next_text(schedule, now),
            if schedule.created_at_ms.is_none() {
                " (config)"
            } else {
                ""
            },
            if schedule.conversation == *here {
                String::new()
            } else {
                format!(
                    " in {}",
                    escape_markdown(schedule.conversation.as_str(), 120)
                )
            },
            escape_markdown(&schedule.prompt, MAX_SHOWN_PROMPT.min(MAX_PROMPT_CHARS)),
        ));
    }
    if shown.len() > MAX_LISTED {
        out.push_str(&format!("…and {} more.\n", shown.len() - MAX_LISTED));
    }
    out.trim_end().to_owned()
}

fn shown_name(name: &str) -> String {
    escape_markdown(name, MAX_NAME_CHARS)
}

/// The next run, in the schedule's zone (UTC for `every`).
fn next_text(schedule: &Schedule, now_ms: u64) -> String {
    let Some(next) = next_run(schedule, now_ms)
        .and_then(|ms| i64::try_from(ms).ok())
        .and_then(|ms| Timestamp::from_millisecond(ms).ok())
    else {
        return "never".to_owned();
    };
    let zone = match &schedule.when {
        When::Cron { zone, .. } => zone.clone(),
        When::Every { .. } => jiff::tz::TimeZone::UTC,
    };
    next.to_zoned(zone)
        .strftime("%Y-%m-%d %H:%M %Z")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_takes_a_name_a_quoted_time_and_the_rest_as_the_prompt() {
        assert_eq!(parse(""), ScheduleAction::List);
        assert_eq!(parse("list"), ScheduleAction::List);
        assert_eq!(
            parse(r#"add morning-errors "0 9 * * 1-5" Summarise   the errors "now""#),
            ScheduleAction::Add {
                name: "morning-errors".to_owned(),
                when: "0 9 * * 1-5".to_owned(),
                prompt: r#"Summarise   the errors "now""#.to_owned(),
            }
        );
        assert_eq!(
            parse("ADD ticks “every 15m” status?"),
            ScheduleAction::Add {
                name: "ticks".to_owned(),
                when: "every 15m".to_owned(),
                prompt: "status?".to_owned(),
            }
        );
        assert_eq!(
            parse("remove ticks"),
            ScheduleAction::Remove("ticks".to_owned())
        );
        for invalid in [
            "add",
            "add ticks",
            "add ticks every 15m status",
            "add ticks \"every 15m status",
            "remove",
            "remove a b",
            "list all",
            "pause ticks",
        ] {
            assert_eq!(parse(invalid), ScheduleAction::Invalid, "{invalid}");
        }
    }
}
