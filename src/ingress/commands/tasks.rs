//! `/tasks`: the tasks the conversation's thread delegated to subagents, newest first, each
//! with its status, type and how long it ran (or has been running).

use crate::agent::subagents::{SubagentRecord, SubagentStatus};
use crate::memory::edit::escape_markdown;
use crate::store::SubagentStore;

use super::CommandInfo;

/// `/tasks` in `/help` and the command menus.
pub(crate) const INFO: CommandInfo = CommandInfo {
    name: "tasks",
    aliases: &[],
    help: "the tasks this conversation delegated, with their status",
    menu: "The tasks this conversation delegated, with their status",
};

/// Tasks listed at most.
const LISTED: usize = 10;

/// The answer to `/tasks` in thread `thread_id`.
pub(crate) async fn answer(store: &dyn SubagentStore, thread_id: &str) -> String {
    let records = match store.thread_subagents(thread_id, LISTED).await {
        Ok(records) => records,
        Err(e) => {
            tracing::warn!(thread = thread_id, error = %e, "cannot list the thread's tasks");
            return "⚠️ Sorry, antler could not read this conversation's tasks just now. Try \
                    again in a moment."
                .to_owned();
        }
    };
    if records.is_empty() {
        return "No tasks in this conversation yet. The assistant delegates parts of a request \
                to subagents on its own when they can run in parallel."
            .to_owned();
    }
    let now = crate::now_ms();
    let mut out = format!("Tasks of this conversation, newest first (at most {LISTED}):");
    for (number, record) in records.iter().enumerate() {
        out.push_str(&format!("\n{}. {}", number + 1, line(record, now)));
    }
    out
}

/// One task: mark, status, description, type, duration and id.
fn line(record: &SubagentRecord, now_ms: u64) -> String {
    let mark = match record.status {
        SubagentStatus::Pending => "🕓",
        SubagentStatus::Running => "⏳",
        SubagentStatus::Completed => "✅",
        SubagentStatus::Failed => "❌",
        SubagentStatus::Cancelled => "⏹",
        SubagentStatus::TimedOut => "⌛",
    };
    let duration = match record.duration_ms(now_ms) {
        Some(ms) if record.status.is_terminal() => format!(" · {}", seconds(ms)),
        Some(ms) => format!(" · {} so far", seconds(ms)),
        None => String::new(),
    };
    let capped = record
        .stop_reason
        .as_deref()
        .map(|reason| format!(" ({reason})"))
        .unwrap_or_default();
    format!(
        "{mark} {}{capped} · {} · {}{duration} · `{}`",
        record.status.as_str(),
        escape_markdown(&record.description, 80),
        escape_markdown(&record.subagent_type, 64),
        record.id
    )
}

fn seconds(ms: u64) -> String {
    let secs = ms.div_ceil(1000);
    if secs < 120 {
        format!("{secs} s")
    } else {
        format!("{} min {} s", secs / 60, secs % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::message::TokenUsage;
    use crate::agent::subagents::SubagentChange;
    use crate::store::{MemStore, SubagentStore};

    fn record(id: &str, description: &str) -> SubagentRecord {
        SubagentRecord {
            id: id.to_owned(),
            parent_thread_id: "t1".to_owned(),
            parent_turn: 1,
            parent_call_id: format!("call_{id}"),
            subagent_type: "general-purpose".to_owned(),
            description: description.to_owned(),
            prompt: "p".to_owned(),
            status: SubagentStatus::Pending,
            stop_reason: None,
            result: None,
            error: None,
            usage: TokenUsage::default(),
            trace_id: "tr".to_owned(),
            created_at_ms: 1,
            started_at_ms: None,
            finished_at_ms: None,
        }
    }

    #[tokio::test]
    async fn tasks_are_listed_newest_first_with_status_and_duration() {
        let store = MemStore::new();
        assert!(answer(&store, "t1").await.starts_with("No tasks"));
        store
            .create_subagent(&record("task_a", "read *the* logs"))
            .await
            .unwrap();
        store
            .create_subagent(&record("task_b", "build"))
            .await
            .unwrap();
        let now = crate::now_ms();
        for (id, status, at) in [
            ("task_a", SubagentStatus::Running, now - 65_000),
            ("task_a", SubagentStatus::Completed, now - 1_000),
            ("task_b", SubagentStatus::Running, now - 3_000),
        ] {
            store
                .transition_subagent(id, &SubagentChange::to(status, at))
                .await
                .unwrap();
        }
        let shown = answer(&store, "t1").await;
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 3, "{shown}");
        assert!(
            lines[1].starts_with("1. ⏳ RUNNING · build · general-purpose · ")
                && lines[1].ends_with(" so far · `task_b`"),
            "{shown}"
        );
        assert_eq!(
            lines[2],
            "2. ✅ COMPLETED · read \\*the\\* logs · general-purpose · 64 s · `task_a`"
        );
        assert!(answer(&store, "t2").await.starts_with("No tasks"));
    }
}
