//! `/approve ID`, `/deny ID [reason]` and `/approvals`: deciding on tool calls that wait for
//! a person (`[approvals]`), on every channel. Only approvers decide; anyone else is refused
//! and nothing changes. The first decision stands: a second one is told who decided before.
//! Also the chat's texts about approvals: the request, and the notice a resumed turn opens
//! with.
//!
//! Everything shown that a user or the model wrote (arguments, names, reasons, a typed id) is
//! bounded and escaped: arguments sit in a code block whose fence is longer than any run of
//! backticks in them; the rest is escaped for Markdown.

use crate::agent::approvals::{ApprovalRecord, ApprovalState};
use crate::agent::middleware::approval::MAX_REASON_CHARS;
use crate::ingress::approvals::{Approvals, DecideError, Decider};
use crate::memory::edit::escape_markdown;
use crate::store::Decided;

use super::CommandInfo;

/// `/approve` in `/help` and the command menus.
pub(crate) const APPROVE: CommandInfo = CommandInfo {
    name: "approve",
    aliases: &[],
    help: "run a tool call that waits for approval (/approve <id>)",
    menu: "Approve a tool call that waits for approval",
};

/// `/deny` in `/help` and the command menus.
pub(crate) const DENY: CommandInfo = CommandInfo {
    name: "deny",
    aliases: &[],
    help: "refuse a tool call that waits for approval (/deny <id> [reason])",
    menu: "Refuse a tool call that waits for approval",
};

/// `/approvals` in `/help` and the command menus.
pub(crate) const LIST: CommandInfo = CommandInfo {
    name: "approvals",
    aliases: &[],
    help: "the tool calls waiting for approval here (admins: everywhere)",
    menu: "The tool calls waiting for approval",
};

/// The longest id echoed back.
const MAX_SHOWN_ID: usize = 16;

/// Approvals listed at most.
const LISTED: usize = 20;

/// A decision as typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    /// The approval's id; empty when none was given.
    pub(crate) id: String,
    pub(crate) approve: bool,
    /// `/deny`'s words after the id.
    pub(crate) reason: Option<String>,
}

/// The words after `/approve` (`approve`) or `/deny`.
pub(super) fn parse<'a>(approve: bool, words: &mut impl Iterator<Item = &'a str>) -> Decision {
    let id = words.next().unwrap_or_default().to_ascii_lowercase();
    let rest: Vec<&str> = words.collect();
    Decision {
        id,
        approve,
        reason: (!approve && !rest.is_empty()).then(|| rest.join(" ")),
    }
}

/// How long until `at_ms`, in words (`14 min`).
fn time_left(at_ms: u64, now_ms: u64) -> String {
    let secs = at_ms.saturating_sub(now_ms) / 1000;
    if secs >= 120 {
        format!("{} min", secs.div_ceil(60))
    } else {
        format!("{secs} s")
    }
}

/// Who asked, as shown.
fn requester(record: &ApprovalRecord) -> String {
    let key = escape_markdown(&record.requester_key(), 80);
    match &record.requester.name {
        Some(name) => format!("{} ({key})", escape_markdown(name, 64)),
        None => key,
    }
}

/// `text` in a fenced code block no backtick run in it can close.
fn code_block(text: &str) -> String {
    let longest = text
        .split(|c| c != '`')
        .map(str::len)
        .max()
        .unwrap_or_default();
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}\n{text}\n{fence}")
}

/// What the chat is shown when a call waits: the tool, its arguments, who asked, the id and
/// how to decide.
pub(crate) fn request(record: &ApprovalRecord, now_ms: u64) -> String {
    format!(
        "⏸ Approval needed: {tool} (asked by {who})\n{arguments}\nApprove with /approve {id} \
         or refuse with /deny {id} [reason]. Unanswered, it is denied in {left}.",
        tool = escape_markdown(&record.tool, 128),
        who = requester(record),
        arguments = code_block(&record.arguments),
        id = record.id,
        left = time_left(record.expires_at_ms, now_ms),
    )
}

/// The line a resumed turn opens with: how the approval was decided.
pub(crate) fn outcome(record: &ApprovalRecord) -> String {
    let tool = escape_markdown(&record.tool, 128);
    let by = escape_markdown(record.decided_by.as_deref().unwrap_or("someone"), 120);
    let reason = record
        .reason
        .as_deref()
        .filter(|r| !r.trim().is_empty())
        .map(|r| format!(": {}", escape_markdown(r, MAX_REASON_CHARS)))
        .unwrap_or_default();
    match record.state {
        ApprovalState::Approved => format!("✅ {tool} ({}) approved by {by}.", record.id),
        ApprovalState::Denied => format!("❌ {tool} ({}) denied by {by}{reason}.", record.id),
        ApprovalState::Expired => format!(
            "⌛ {tool} ({}) expired: nobody decided in time, so it was not run.",
            record.id
        ),
        ApprovalState::Withdrawn | ApprovalState::Pending => String::new(),
    }
}

/// The answer to `/approve` or `/deny` from `decider`.
pub(crate) async fn decide(approvals: &Approvals, decider: &Decider, decision: Decision) -> String {
    let verb = if decision.approve { "approve" } else { "deny" };
    if decision.id.is_empty() {
        return format!("Use /{verb} <id>: the id is in the message that asked for approval.");
    }
    let id = escape_markdown(&decision.id, MAX_SHOWN_ID);
    match approvals
        .decide(
            &decision.id,
            decider,
            decision.approve,
            decision.reason.as_deref(),
        )
        .await
    {
        Ok(Decided::Now(record)) if record.state == ApprovalState::Approved => format!(
            "✅ Approved {} ({id}); it runs now and the answer follows.",
            escape_markdown(&record.tool, 128)
        ),
        Ok(Decided::Now(record)) => format!(
            "❌ Denied {} ({id}); the assistant is told.",
            escape_markdown(&record.tool, 128)
        ),
        Ok(Decided::Before(record)) => {
            let by = record
                .decided_by
                .as_deref()
                .map(|by| format!(" by {}", escape_markdown(by, 120)))
                .unwrap_or_default();
            format!(
                "Approval {id} was {}{by} already; nothing changed.",
                record.state.as_str()
            )
        }
        Err(DecideError::NotApprover) => {
            "Sorry, only approvers can decide on tool calls; nothing changed.".to_owned()
        }
        Err(DecideError::NotFound(_)) => format!("There is no approval {id}."),
        Err(DecideError::SelfApproval) => "Sorry, you asked for this call, and approving your \
            own calls is off here: another approver must approve it. Nothing changed."
            .to_owned(),
        Err(DecideError::Store(e)) => {
            tracing::warn!(error = %e, "cannot decide an approval");
            "⚠️ Sorry, antler could not record the decision just now; nothing changed. Try \
             again in a moment."
                .to_owned()
        }
    }
}

/// The answer to `/approvals` in `conversation`: its pending approvals, or, for an admin,
/// every pending one.
pub(crate) async fn list(approvals: &Approvals, conversation: &str, admin: bool) -> String {
    let pending = match approvals.pending((!admin).then_some(conversation)).await {
        Ok(pending) => pending,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list approvals");
            return "⚠️ Sorry, antler could not read the approvals just now. Try again in a \
                    moment."
                .to_owned();
        }
    };
    if pending.is_empty() {
        return "No tool calls are waiting for approval.".to_owned();
    }
    let now = crate::now_ms();
    let mut out = format!(
        "Waiting for approval ({}{}):",
        pending.len(),
        if pending.len() > LISTED {
            format!(", the oldest {LISTED} shown")
        } else {
            String::new()
        }
    );
    for record in pending.iter().take(LISTED) {
        let place = if record.conversation == conversation {
            String::new()
        } else {
            format!(" · in {}", escape_markdown(&record.conversation, 120))
        };
        out.push_str(&format!(
            "\n• {} · {} · asked by {} · {} left{place}",
            record.id,
            escape_markdown(&record.tool, 128),
            requester(record),
            time_left(record.expires_at_ms, now),
        ));
    }
    out.push_str("\nDecide with /approve <id> or /deny <id> [reason].");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::approvals::Requester;

    fn record() -> ApprovalRecord {
        ApprovalRecord {
            id: "k3x9p2ab".into(),
            conversation: "api:ops".into(),
            channel: "telegram".into(),
            thread_id: "t".into(),
            message: 1,
            call_id: "c".into(),
            tool: "write_file".into(),
            arguments: "{\n  \"text\": \"```\\n*bold* <b>\"\n}".into(),
            requester: Requester {
                user_id: "42".into(),
                name: Some("a*da_".into()),
                admin: false,
                group: false,
            },
            created_at_ms: 0,
            expires_at_ms: 900_000,
            state: ApprovalState::Pending,
            decided_by: None,
            reason: None,
            decided_at_ms: None,
            queued: false,
        }
    }

    #[test]
    fn the_request_shows_the_call_escaped_with_how_to_decide() {
        let text = request(&record(), 0);
        assert!(
            text.starts_with("⏸ Approval needed: write\\_file (asked by a\\*da\\_ (telegram:42))"),
            "{text}"
        );
        // The arguments' own ``` cannot close the block.
        assert!(text.contains("\n````\n{\n  \"text\": \"```"), "{text}");
        assert!(text.contains("/approve k3x9p2ab"));
        assert!(text.contains("/deny k3x9p2ab [reason]"));
        assert!(text.ends_with("denied in 15 min."), "{text}");
    }

    #[test]
    fn decisions_are_parsed_with_the_reason_for_deny_only() {
        let words = |text: &'static str| text.split_whitespace();
        assert_eq!(
            parse(false, &mut words("K3X9P2AB not on a  friday")),
            Decision {
                id: "k3x9p2ab".into(),
                approve: false,
                reason: Some("not on a friday".into())
            }
        );
        assert_eq!(parse(true, &mut words("k3x9p2ab extra")).reason, None);
        assert_eq!(parse(true, &mut words("")).id, "");
    }

    #[test]
    fn the_outcome_names_who_decided_and_why() {
        let mut denied = record();
        denied.state = ApprovalState::Denied;
        denied.decided_by = Some("bob (telegram:7)".into());
        denied.reason = Some("not <now>".into());
        assert_eq!(
            outcome(&denied),
            "❌ write\\_file (k3x9p2ab) denied by bob (telegram:7): not \\<now\\>."
        );
    }
}
