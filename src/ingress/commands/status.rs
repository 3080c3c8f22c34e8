//! `/status`: the conversation's thread (title, turns, messages, tokens), plan mode and its
//! todo list, the model, and the queue. The turn runner reads the facts; this file words them.

use crate::agent::middleware::todo::{self, TodoConfig};
use crate::agent::thread::ThreadState;

use super::CommandInfo;

/// `/status` in `/help` and the command menus.
pub(crate) const INFO: CommandInfo = CommandInfo {
    name: "status",
    aliases: &[],
    help: "the current thread, model, token usage and queue",
    menu: "The current thread, model, token usage and queue",
};

/// What `/status` reports.
pub(crate) struct Facts<'a> {
    pub(crate) thread_id: &'a str,
    /// The thread, if it could be read.
    pub(crate) thread: Option<&'a ThreadState>,
    pub(crate) todo: &'a TodoConfig,
    pub(crate) model: &'a str,
    /// Messages waiting in this conversation.
    pub(crate) waiting: usize,
    /// Items in the inbox, all conversations.
    pub(crate) backlog: usize,
    /// `telemetry.trace_url`: the template of a link to a trace.
    pub(crate) trace_url: Option<&'a str>,
}

/// The answer to `/status`.
pub(crate) fn answer(facts: &Facts<'_>) -> String {
    let Facts {
        thread_id,
        thread,
        todo: config,
        model,
        waiting,
        backlog,
        trace_url,
    } = facts;
    let mut out = format!("Thread: {thread_id}");
    if let Some(thread) = thread {
        if let Some(title) = &thread.title {
            out.push_str(&format!(" — {title}"));
        }
        let failed: usize = thread.failed.iter().map(ExactSizeIterator::len).sum();
        out.push_str(&format!(
            "\nTurns: {} · messages: {}",
            thread.turns,
            thread.messages.len()
        ));
        if failed > 0 {
            out.push_str(&format!(
                " ({failed} in failed turns, hidden from the model)"
            ));
        }
        out.push_str(&format!(
            "\nTokens: {} prompt + {} completion = {} total",
            thread.usage.prompt_tokens, thread.usage.completion_tokens, thread.usage.total_tokens
        ));
        if let Some(trace) = &thread.last_trace {
            out.push_str(&format!("\nLast trace: {trace}"));
            if let Some(link) = crate::telemetry::trace_link(*trace_url, trace) {
                out.push_str(&format!(" ({link})"));
            }
        }
    }
    let plan_mode = thread.map_or(config.enabled, |thread| config.plan_mode(thread));
    if config.in_chain() {
        out.push_str(if plan_mode {
            "\nPlan mode: on"
        } else {
            "\nPlan mode: off"
        });
    }
    if let Some(list) = thread.and_then(todo::status_list) {
        out.push_str(&format!("\nTodos:\n{list}"));
    }
    out.push_str(&format!(
        "\nModel: {model}\nQueue: {waiting} waiting in this conversation, {backlog} in the inbox"
    ));
    out
}
