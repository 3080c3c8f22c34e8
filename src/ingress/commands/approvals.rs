//! `/approve ID`, `/deny ID [reason]` and `/approvals`: deciding on tool calls that wait for
//! a person (`[approvals]`), on every channel. Only approvers decide; anyone else is refused
//! and nothing changes. The first decision stands: a second one is told who decided before.
//! Also the chat's texts about approvals: the request, and the notice a resumed turn opens
//! with.
//!
//! Everything shown that a user or the model wrote (arguments, names, reasons, a typed id) is
//! bounded and escaped: arguments sit in a code block whose fence is longer than any run of
//! backticks in them; the rest is escaped for Markdown.

use antler_channel::{Button, ButtonStyle, Press, PressAnswer, Prompt};

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

/// An Approve button's action: this and the approval's id.
const APPROVE_ACTION: &str = "approve:";

/// A Deny button's action.
const DENY_ACTION: &str = "deny:";

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

/// The call as the chat is shown it: the tool, who asked, the arguments.
fn call(record: &ApprovalRecord) -> String {
    format!(
        "⏸ Approval needed: {tool} (asked by {who})\n{arguments}",
        tool = escape_markdown(&record.tool, 128),
        who = requester(record),
        arguments = code_block(&record.arguments),
    )
}

/// What the chat is shown when a call waits: the tool, its arguments, who asked, the id and
/// how to decide in words (where buttons cannot be shown, or were not pressed).
pub(crate) fn request(record: &ApprovalRecord, now_ms: u64) -> String {
    format!(
        "{call}\nApprove with /approve {id} or refuse with /deny {id} [reason]. Unanswered, it \
         is denied in {left}.",
        call = call(record),
        id = record.id,
        left = time_left(record.expires_at_ms, now_ms),
    )
}

/// The message a waiting call is shown in: [`request`] with Approve and Deny buttons.
pub(crate) fn prompt(record: &ApprovalRecord, now_ms: u64) -> Prompt {
    Prompt {
        text: request(record, now_ms),
        buttons: vec![
            Button {
                label: "✅ Approve".to_owned(),
                action: format!("{APPROVE_ACTION}{}", record.id),
                style: ButtonStyle::Primary,
            },
            Button {
                label: "❌ Deny".to_owned(),
                action: format!("{DENY_ACTION}{}", record.id),
                style: ButtonStyle::Danger,
            },
        ],
    }
}

/// Who decided, and `: why` when they said, escaped.
fn decided_by(record: &ApprovalRecord) -> (String, String) {
    let by = escape_markdown(record.decided_by.as_deref().unwrap_or("someone"), 120);
    let reason = record
        .reason
        .as_deref()
        .filter(|r| !r.trim().is_empty())
        .map(|r| format!(": {}", escape_markdown(r, MAX_REASON_CHARS)))
        .unwrap_or_default();
    (by, reason)
}

/// A decided call's message, its buttons gone: the call and who decided when.
pub(crate) fn settled(record: &ApprovalRecord) -> String {
    let when = record
        .decided_at_ms
        .and_then(|ms| jiff::Timestamp::from_millisecond(i64::try_from(ms).ok()?).ok())
        .map(|at| format!(" at {}", at.strftime("%Y-%m-%d %H:%M UTC")))
        .unwrap_or_default();
    let (by, reason) = decided_by(record);
    let decision = match record.state {
        ApprovalState::Approved => format!("✅ Approved by {by}{when}."),
        ApprovalState::Denied => format!("❌ Denied by {by}{when}{reason}."),
        ApprovalState::Expired => format!("⌛ Expired{when}: nobody decided in time; not run."),
        ApprovalState::Withdrawn => {
            format!("↩️ Withdrawn{when}: a new message came first; not run.")
        }
        ApprovalState::Pending => String::new(),
    };
    format!("{}\n{decision}", call(record))
}

/// The answer to a press of an approval's button by `presser`: decided once, as `/approve`
/// and `/deny` decide. The message is replaced with the decision whenever one stands (also a
/// decision taken before, which corrects a message still showing its buttons); a refusal
/// changes nothing and is shown to the presser alone.
pub(crate) async fn press(approvals: &Approvals, press: &Press) -> PressAnswer {
    let parsed = press
        .action
        .strip_prefix(APPROVE_ACTION)
        .map(|id| (true, id))
        .or_else(|| press.action.strip_prefix(DENY_ACTION).map(|id| (false, id)));
    let Some((approve, id)) = parsed else {
        return PressAnswer {
            notice: "This button does nothing any more.".to_owned(),
            update: None,
            decided_now: false,
        };
    };
    let decider = Decider {
        key: Some(format!("{}:{}", press.channel, press.user.id)),
        name: press.user.name.clone(),
        admin: press.user.admin,
    };
    let decided = approvals.decide(id, &decider, approve, None).await;
    let update = match &decided {
        Ok(Decided::Now(record) | Decided::Before(record)) => Some(settled(record)),
        Err(_) => None,
    };
    PressAnswer {
        decided_now: matches!(decided, Ok(Decided::Now(_))),
        notice: decision_answer(id, decided),
        update,
    }
}

/// The line a resumed turn opens with: how the approval was decided.
pub(crate) fn outcome(record: &ApprovalRecord) -> String {
    let tool = escape_markdown(&record.tool, 128);
    let (by, reason) = decided_by(record);
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
    let decided = approvals
        .decide(
            &decision.id,
            decider,
            decision.approve,
            decision.reason.as_deref(),
        )
        .await;
    decision_answer(&decision.id, decided)
}

/// What the decider is told about deciding approval `id`.
fn decision_answer(id: &str, decided: Result<Decided, DecideError>) -> String {
    let id = escape_markdown(id, MAX_SHOWN_ID);
    match decided {
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
    fn a_settled_call_says_who_decided_when_and_keeps_no_way_to_decide() {
        let mut approved = record();
        approved.state = ApprovalState::Approved;
        approved.decided_by = Some("bob (telegram:7)".into());
        approved.decided_at_ms = Some(1_796_461_200_000);
        let text = settled(&approved);
        assert!(
            text.starts_with("⏸ Approval needed: write\\_file"),
            "{text}"
        );
        assert!(
            text.ends_with("\n✅ Approved by bob (telegram:7) at 2026-12-05 09:00 UTC."),
            "{text}"
        );
        assert!(!text.contains("/approve"), "{text}");
        let mut expired = record();
        expired.state = ApprovalState::Expired;
        expired.decided_at_ms = Some(0);
        assert!(
            settled(&expired)
                .ends_with("⌛ Expired at 1970-01-01 00:00 UTC: nobody decided in time; not run.")
        );
    }

    #[tokio::test]
    async fn a_press_decides_once_and_a_refusal_changes_nothing() {
        use crate::agent::middleware::approval::{ApprovalsConfig, Approvers};
        use crate::store::{ApprovalStore, MemStore};
        use antler_channel::{ConversationKey, UserRef};

        let store = std::sync::Arc::new(MemStore::new());
        store.open_approval(&record(), 5).await.unwrap();
        let config = ApprovalsConfig {
            tools: vec!["write_file".into()],
            approvers: Approvers::Users(vec!["telegram:7".into()]),
            ..ApprovalsConfig::default()
        };
        let approvals = Approvals::new(store, config);
        let by = |id: &str, action: &str| Press {
            channel: "telegram".into(),
            conversation: ConversationKey::new("telegram", ["42"]),
            user: UserRef {
                id: id.into(),
                name: Some("Bob".into()),
                admin: false,
                aliases: Vec::new(),
            },
            chat: Some("42".into()),
            action: action.into(),
            message_id: "700".into(),
            answer_context: None,
        };
        let refused = press(&approvals, &by("42", "approve:k3x9p2ab")).await;
        assert_eq!(refused.update, None);
        assert!(!refused.decided_now);
        assert!(
            refused.notice.contains("only approvers"),
            "{}",
            refused.notice
        );
        let unknown = press(&approvals, &by("7", "launch:k3x9p2ab")).await;
        assert_eq!(unknown.update, None);

        let denied = press(&approvals, &by("7", "deny:k3x9p2ab")).await;
        assert!(
            denied.notice.starts_with("❌ Denied write\\_file"),
            "{}",
            denied.notice
        );
        assert!(denied.decided_now);
        let update = denied.update.unwrap();
        assert!(
            update.contains("❌ Denied by Bob (telegram:7) at "),
            "{update}"
        );
        let again = press(&approvals, &by("7", "approve:k3x9p2ab")).await;
        assert!(
            again
                .notice
                .contains("was denied by Bob (telegram:7) already"),
            "{}",
            again.notice
        );
        assert_eq!(
            again.update.as_deref(),
            Some(update.as_str()),
            "the message shows the decision"
        );
        assert!(!again.decided_now, "nothing changed");
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
