//! `/help` (also `/start`, which Telegram sends first): the commands, made from
//! [`COMMANDS`]; also the answer to a command antler does not know.

use super::{COMMANDS, CommandInfo};

/// `/help` in `/help` and the command menus.
pub(crate) const INFO: CommandInfo = CommandInfo {
    name: "help",
    aliases: &["start"],
    help: "this list",
    menu: "List the commands",
};

/// The commands, for `/help` and the unknown-command reply, made from [`COMMANDS`].
pub(crate) fn help() -> &'static str {
    static HELP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let mut text = "Commands:\n".to_owned();
        for command in COMMANDS {
            text.push_str(&format!("/{} — {}\n", command.name, command.help));
        }
        text.push_str("Anything else is a message for the assistant.");
        text
    });
    &HELP
}

/// The answer to `/name` when no command has that name.
pub(crate) fn unknown(name: &str) -> String {
    format!("Unknown command /{name}.\n{}", help())
}
