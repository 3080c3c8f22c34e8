//! `/plan`, `/plan on`, `/plan off`: plan mode (the `write_todos` tool and its reminders) for
//! the conversation's thread, kept with the thread (the [`PlanMode`] extension). When the
//! operator fixed it (`agent.middleware.todo.plan_command = false`) the answer says so and
//! nothing changes.

use crate::agent::middleware::todo::{PlanMode, TodoConfig};
use crate::agent::thread::ThreadState;

use super::CommandInfo;

/// `/plan` in `/help` and the command menus.
pub(crate) const INFO: CommandInfo = CommandInfo {
    name: "plan",
    aliases: &[],
    help: "plan mode on or off for this conversation (/plan on, /plan off)",
    menu: "Plan mode on or off for this conversation",
};

/// How `/plan` is used, for a form it does not know.
pub(crate) const USAGE: &str = "Use /plan (switch), /plan on or /plan off.";

/// What `/plan` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlanSwitch {
    /// `/plan`: the other way round.
    Toggle,
    /// `/plan on`
    On,
    /// `/plan off`
    Off,
    /// `/plan <something else>`: answered with how to use it.
    Invalid,
}

/// The word after `/plan`.
pub(super) fn parse<'a>(words: &mut impl Iterator<Item = &'a str>) -> PlanSwitch {
    match words.next().map(str::to_ascii_lowercase).as_deref() {
        None => PlanSwitch::Toggle,
        Some("on") => PlanSwitch::On,
        Some("off") => PlanSwitch::Off,
        Some(_) => PlanSwitch::Invalid,
    }
}

/// The answer when plan mode cannot be switched per conversation here, if it cannot.
pub(crate) fn fixed(config: &TodoConfig) -> Option<&'static str> {
    if config.plan_command {
        return None;
    }
    Some(if config.enabled {
        "Plan mode is always on here; it cannot be switched per conversation."
    } else {
        "Plan mode is off here; it cannot be switched per conversation."
    })
}

/// Switches plan mode on `thread` as `switch` asks and answers; an invalid form is answered
/// with [`USAGE`] (`Err`) and changes nothing.
pub(crate) fn switch(
    config: &TodoConfig,
    switch: PlanSwitch,
    thread: &mut ThreadState,
    now_ms: u64,
) -> Result<&'static str, &'static str> {
    let on = match switch {
        PlanSwitch::Toggle => !config.plan_mode(thread),
        PlanSwitch::On => true,
        PlanSwitch::Off => false,
        PlanSwitch::Invalid => return Err(USAGE),
    };
    thread.extensions.set(&PlanMode { on });
    thread.updated_at_ms = now_ms;
    Ok(if on {
        "📋 Plan mode is on for this conversation: for work of several steps the assistant \
         keeps a todo list, shown in /status. /plan off turns it off."
    } else {
        "Plan mode is off for this conversation. /plan on turns it on."
    })
}
