//! Chat commands, the same on every channel: `/help`, `/new`, `/status`, `/stop`, `/plan`,
//! `/memory`, `/tasks`, `/skills`, `/schedules` and `/schedule`, `/approvals` (with `/approve` and `/deny`); one file each, with its name and description ([`CommandInfo`]), how
//! its words are read and its answer. `/help` and the platforms' command menus are made from
//! [`COMMANDS`]; the turn runner gathers what an answer needs and calls the command's file.
//!
//! A command is a message whose first token starts with `/`, matched case-insensitively, with
//! a Telegram-style `@botname` suffix ignored (`/status@opsbot_bot`).

pub(crate) mod approvals;
pub(crate) mod help;
pub(crate) mod memory;
pub(crate) mod new;
pub(crate) mod plan;
pub(crate) mod schedules;
pub(crate) mod skills;
pub(crate) mod status;
pub(crate) mod stop;
pub(crate) mod tasks;

pub(crate) use help::help;
pub(crate) use memory::MemoryAction;
pub(crate) use plan::PlanSwitch;
pub(crate) use schedules::ScheduleAction;
pub(crate) use skills::SkillsAction;

/// A recognised command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    Help,
    New,
    Status,
    /// Stop the answer being written in this conversation.
    Stop,
    /// Switch plan mode (the `write_todos` tool) for this conversation's thread.
    Plan(PlanSwitch),
    /// What antler remembers about the author, and forgetting it.
    Memory(MemoryAction),
    /// The tasks this conversation delegated to subagents.
    Tasks,
    /// The skills, and switching them (admins).
    Skills(SkillsAction),
    /// The schedules, and adding or removing one (admins).
    Schedules(ScheduleAction),
    /// `/approve ID` or `/deny ID [reason]`: a decision on a tool call waiting for a person.
    Decide(approvals::Decision),
    /// The tool calls waiting for a person.
    Approvals,
    /// Something that looks like a command but is not one of ours.
    Unknown(String),
}

/// One chat command, as `/help` and the platforms' command menus show it: the one list both
/// are made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CommandInfo {
    /// What follows the `/`.
    pub(crate) name: &'static str,
    /// Other names it answers to (not in menus).
    pub(crate) aliases: &'static [&'static str],
    /// Its line in `/help`, after `/name — `.
    pub(crate) help: &'static str,
    /// Its entry in a command menu (Telegram's `setMyCommands`, Discord's and Slack's commands):
    /// at most 256 characters.
    pub(crate) menu: &'static str,
}

/// Every chat command, in the order `/help` lists them.
pub(crate) const COMMANDS: &[CommandInfo] = &[
    help::INFO,
    new::INFO,
    status::INFO,
    stop::INFO,
    plan::INFO,
    memory::INFO,
    tasks::INFO,
    skills::INFO,
    schedules::LIST_INFO,
    schedules::INFO,
    approvals::LIST,
    approvals::APPROVE,
    approvals::DENY,
];

/// The text after `/new`, etc. is ignored; `None` for ordinary messages.
pub(crate) fn parse(text: &str) -> Option<Command> {
    let mut words = text.split_whitespace();
    let first = words.next()?;
    let name = first.strip_prefix('/')?;
    let name = name
        .split('@')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    // `-` for operator commands (`/db-backup`).
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        // "/", "/ path", "/etc/hosts" are text, not commands.
        return None;
    }
    let Some(info) = COMMANDS
        .iter()
        .find(|info| info.name == name || info.aliases.contains(&name.as_str()))
    else {
        return Some(Command::Unknown(name));
    };
    Some(match info.name {
        "help" => Command::Help,
        "new" => Command::New,
        "status" => Command::Status,
        "stop" => Command::Stop,
        "plan" => Command::Plan(plan::parse(&mut words)),
        "memory" => Command::Memory(memory::parse(&mut words)),
        "tasks" => Command::Tasks,
        "skills" => Command::Skills(skills::parse(&mut words)),
        "schedules" => Command::Schedules(ScheduleAction::List),
        // The time is quoted and the prompt keeps its spacing: the raw text, not words.
        "schedule" => Command::Schedules(schedules::parse(
            text.trim_start().get(first.len()..).unwrap_or_default(),
        )),
        "approvals" => Command::Approvals,
        "approve" => Command::Decide(approvals::parse(true, &mut words)),
        "deny" => Command::Decide(approvals::parse(false, &mut words)),
        _ => Command::Unknown(name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_case_insensitive_and_ignore_the_bot_suffix() {
        assert_eq!(parse("/help"), Some(Command::Help));
        assert_eq!(parse("  /NEW please"), Some(Command::New));
        assert_eq!(parse("/status@opsbot_bot prod"), Some(Command::Status));
        assert_eq!(parse("/Tasks"), Some(Command::Tasks));
        assert_eq!(
            parse("/deploy now"),
            Some(Command::Unknown("deploy".into()))
        );
        assert_eq!(
            parse("/db-backup@opsbot_bot now"),
            Some(Command::Unknown("db-backup".into()))
        );
    }

    #[test]
    fn help_and_the_menus_are_made_from_one_list_within_telegrams_limits() {
        assert_eq!(
            help(),
            "Commands:\n\
             /help — this list\n\
             /new — start a fresh conversation (the old one is kept)\n\
             /status — the current thread, model, token usage and queue\n\
             /stop — stop the answer being written\n\
             /plan — plan mode on or off for this conversation (/plan on, /plan off)\n\
             /memory — what I remember about you (/memory forget <n>, /memory clear)\n\
             /tasks — the tasks this conversation delegated, with their status\n\
             /skills — the assistant's skills (admins: /skills enable <name>, /skills disable <name>)\n\
             /schedules — the schedules of this conversation and their next run\n\
             /schedule — admins: /schedule add <name> \"<cron or every 15m>\" <prompt>, /schedule remove <name>\n\
             /approvals — the tool calls waiting for approval here (admins: everywhere)\n\
             /approve — run a tool call that waits for approval (/approve <id>)\n\
             /deny — refuse a tool call that waits for approval (/deny <id> [reason])\n\
             Anything else is a message for the assistant."
        );
        for CommandInfo { name, menu, .. } in COMMANDS {
            let parsed = parse(&format!("/{name}"));
            assert!(
                matches!(parsed, Some(ref c) if !matches!(c, Command::Unknown(_))),
                "{name}: {parsed:?}"
            );
            // setMyCommands: "command: Text of the command; 1-32 characters. Can contain only
            // lowercase English letters, digits and underscores"; "description: 1-256
            // characters".
            assert!((3..=256).contains(&menu.chars().count()), "{name}");
            assert!(
                (1..=32).contains(&name.len())
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{name}"
            );
        }
    }

    #[test]
    fn operator_commands_cannot_take_a_built_in_name() {
        for info in COMMANDS {
            for name in std::iter::once(&info.name).chain(info.aliases) {
                assert!(
                    crate::opcommands::BUILTIN_NAMES.contains(name),
                    "/{name} is missing from opcommands::BUILTIN_NAMES"
                );
            }
        }
    }

    #[test]
    fn plan_takes_on_off_or_nothing() {
        assert_eq!(parse("/plan"), Some(Command::Plan(PlanSwitch::Toggle)));
        assert_eq!(parse("/PLAN On"), Some(Command::Plan(PlanSwitch::On)));
        assert_eq!(
            parse("/plan@opsbot off"),
            Some(Command::Plan(PlanSwitch::Off))
        );
        assert_eq!(
            parse("/plan maybe"),
            Some(Command::Plan(PlanSwitch::Invalid))
        );
        assert!(help().contains("/plan — "));
    }

    #[test]
    fn aliases_name_the_same_commands() {
        assert_eq!(parse("/start"), Some(Command::Help));
        assert_eq!(parse("/reset"), Some(Command::New));
        assert_eq!(parse("/cancel"), Some(Command::Stop));
    }

    #[test]
    fn memory_shows_forgets_and_clears_only_when_confirmed() {
        let memory = |text: &str| match parse(text) {
            Some(Command::Memory(action)) => action,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(memory("/memory"), MemoryAction::Show);
        assert_eq!(memory("/Memory@opsbot show"), MemoryAction::Show);
        assert_eq!(memory("/memory forget 3"), MemoryAction::Forget(3));
        assert_eq!(memory("/memory FORGET  12"), MemoryAction::Forget(12));
        assert_eq!(memory("/memory clear"), MemoryAction::Clear);
        assert_eq!(
            memory("/memory clear Confirm"),
            MemoryAction::ClearConfirmed
        );
        for invalid in [
            "/memory forget",
            "/memory forget 0",
            "/memory forget -1",
            "/memory forget two",
            "/memory forget 99999999999999999999999",
            "/memory clear now",
            "/memory clear confirm all",
            "/memory wipe",
        ] {
            assert_eq!(memory(invalid), MemoryAction::Invalid, "{invalid}");
        }
        assert!(help().contains("/memory — "));
    }

    #[test]
    fn text_and_paths_are_not_commands() {
        assert_eq!(parse("hello /new"), None);
        assert_eq!(parse("/etc/hosts is broken"), None);
        assert_eq!(parse("/"), None);
        assert_eq!(parse(""), None);
    }
}
