//! `/new` (also `/reset`): a fresh thread for the conversation. The ingress starts it when it
//! accepts the message (the next generation; the old thread is kept), so the answer only
//! names it.

use super::CommandInfo;

/// `/new` in `/help` and the command menus.
pub(crate) const INFO: CommandInfo = CommandInfo {
    name: "new",
    aliases: &["reset"],
    help: "start a fresh conversation (the old one is kept)",
    menu: "Start a fresh conversation (the old one is kept)",
};

/// The answer to `/new`, which started thread `thread_id`.
pub(crate) fn answer(thread_id: &str) -> String {
    format!("New conversation started (thread {thread_id}).")
}
