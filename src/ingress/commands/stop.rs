//! `/stop` (also `/cancel`): stops the answer being written in the conversation. The ingress
//! acts on it as it accepts the message, ahead of the queue (waiting behind the turn it stops
//! would be useless); the answer says whether there was one.

use super::CommandInfo;

/// `/stop` in `/help` and the command menus.
pub(crate) const INFO: CommandInfo = CommandInfo {
    name: "stop",
    aliases: &["cancel"],
    help: "stop the answer being written",
    menu: "Stop the answer being written",
};

/// The answer to `/stop`: `stopped` says whether a running answer was stopped.
pub(crate) fn answer(stopped: bool) -> &'static str {
    if stopped {
        "⏹ Stopped the answer that was being written."
    } else {
        "Nothing was running in this conversation."
    }
}
