//! Block Kit for messages with buttons (api.slack.com/reference/block-kit): the text in
//! `section` blocks of mrkdwn, the buttons in an `actions` block under it.

use antler_channel::{Button, ButtonStyle};
use slack_morphism::prelude::{
    SlackActionBlockElement, SlackActionId, SlackActionsBlock, SlackBlock, SlackBlockButtonElement,
    SlackBlockButtonStyle, SlackBlockId, SlackBlockMarkDownText, SlackBlockPlainText,
    SlackBlockText, SlackSectionBlock,
};

/// A section's text: "Maximum length for the text in this field is 3000 characters" (Block
/// Kit, section block).
const SECTION_CHARS: usize = 3000;

/// A button's text: "Maximum length for the text in this field is 75 characters".
const BUTTON_TEXT_CHARS: usize = 75;

/// An actions block: "An array of interactive element objects … There is a maximum of 25
/// elements in each action block."
const ACTIONS_PER_BLOCK: usize = 25;

/// The `block_id` of the (first) actions block; ids are unique within a message.
const ACTIONS_BLOCK_ID: &str = "antler_buttons";

/// `text` (mrkdwn) in sections, with `buttons` under it in one row (a new row every 25).
pub(crate) fn with_buttons(text: &str, buttons: &[Button]) -> Vec<SlackBlock> {
    let mut blocks = sections(text);
    let mut seen: Vec<&str> = Vec::new();
    // "action_id … should be unique among all other action_ids in the containing block":
    // a repeated action is shown once.
    let unique: Vec<&Button> = buttons
        .iter()
        .filter(|button| {
            let new = !seen.contains(&button.action.as_str());
            seen.push(&button.action);
            new
        })
        .collect();
    for (row, chunk) in unique.chunks(ACTIONS_PER_BLOCK).enumerate() {
        let block_id = if row == 0 {
            ACTIONS_BLOCK_ID.to_owned()
        } else {
            format!("{ACTIONS_BLOCK_ID}_{row}")
        };
        let elements: Vec<SlackActionBlockElement> =
            chunk.iter().map(|button| element(button).into()).collect();
        blocks.push(
            SlackActionsBlock::new(elements)
                .with_block_id(SlackBlockId(block_id))
                .into(),
        );
    }
    blocks
}

/// `text` (mrkdwn) as sections of at most 3000 characters each, cut at a line end where one
/// is near; none for empty text (a section's text may not be empty).
pub(crate) fn sections(text: &str) -> Vec<SlackBlock> {
    chunks(text, SECTION_CHARS)
        .into_iter()
        .filter(|chunk| !chunk.trim().is_empty())
        .map(|chunk| {
            SlackSectionBlock::new()
                .with_text(SlackBlockText::MarkDown(SlackBlockMarkDownText::new(
                    chunk.to_owned(),
                )))
                .into()
        })
        .collect()
}

fn element(button: &Button) -> SlackBlockButtonElement {
    let label: String = button.label.chars().take(BUTTON_TEXT_CHARS).collect();
    let style = match button.style {
        ButtonStyle::Primary => SlackBlockButtonStyle::Primary,
        ButtonStyle::Danger => SlackBlockButtonStyle::Danger,
    };
    // The action is both the id and the value: a press names it either way.
    SlackBlockButtonElement::new(SlackBlockPlainText::new(label).with_emoji(true).into())
        .with_action_id(SlackActionId(button.action.clone()))
        .with_value(button.action.clone())
        .with_style(style)
}

/// `text` in pieces of at most `max` characters, each ending at the last line end in its
/// second half when there is one.
fn chunks(text: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.chars().count() > max {
        let limit = rest.char_indices().nth(max).map_or(rest.len(), |(i, _)| i);
        let half = rest.char_indices().nth(max / 2).map_or(0, |(i, _)| i);
        let cut = rest[..limit]
            .rfind('\n')
            .filter(|&i| i >= half)
            .map_or(limit, |i| i + 1);
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    out.push(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn button(label: &str, action: &str, style: ButtonStyle) -> Button {
        Button {
            label: label.into(),
            action: action.into(),
            style,
        }
    }

    #[test]
    fn the_text_is_a_section_and_the_buttons_an_actions_block_under_it() {
        let blocks = with_buttons(
            "*Approval needed*",
            &[
                button("✅ Approve", "approve:k3x9p2ab", ButtonStyle::Primary),
                button("❌ Deny", "deny:k3x9p2ab", ButtonStyle::Danger),
            ],
        );
        assert_eq!(
            serde_json::to_value(&blocks).unwrap(),
            serde_json::json!([
                {"type": "section", "text": {"type": "mrkdwn", "text": "*Approval needed*"}},
                {"type": "actions", "block_id": "antler_buttons", "elements": [
                    {"type": "button", "action_id": "approve:k3x9p2ab",
                     "text": {"type": "plain_text", "text": "✅ Approve", "emoji": true},
                     "value": "approve:k3x9p2ab", "style": "primary"},
                    {"type": "button", "action_id": "deny:k3x9p2ab",
                     "text": {"type": "plain_text", "text": "❌ Deny", "emoji": true},
                     "value": "deny:k3x9p2ab", "style": "danger"}
                ]}
            ])
        );
    }

    #[test]
    fn long_labels_repeated_actions_and_many_buttons_keep_to_block_kits_limits() {
        let mut buttons = vec![button(&"é".repeat(100), "a:0", ButtonStyle::Primary)];
        buttons.push(button("again", "a:0", ButtonStyle::Danger));
        buttons.extend((1..30).map(|i| button("b", &format!("a:{i}"), ButtonStyle::Primary)));
        let json = serde_json::to_value(with_buttons("x", &buttons)).unwrap();
        let rows = json.as_array().unwrap();
        assert_eq!(rows.len(), 3, "a section and two rows: {json}");
        assert_eq!(rows[1]["elements"].as_array().unwrap().len(), 25);
        assert_eq!(rows[2]["elements"].as_array().unwrap().len(), 5);
        assert_eq!(rows[2]["block_id"], "antler_buttons_1");
        let label = rows[1]["elements"][0]["text"]["text"].as_str().unwrap();
        assert_eq!(label.chars().count(), 75);
        assert_eq!(rows[1]["elements"][1]["action_id"], "a:1", "a:0 shown once");
    }

    #[test]
    fn long_text_is_cut_into_sections_at_line_ends() {
        let line = format!("{}\n", "x".repeat(99));
        let text = line.repeat(45);
        let json = serde_json::to_value(sections(&text)).unwrap();
        let texts: Vec<&str> = json
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["text"]["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts.len(), 2);
        assert_eq!(texts[0].chars().count(), 3000);
        assert!(texts[0].ends_with('\n'));
        assert_eq!(texts.concat(), text);
        // Without line ends, at the limit, on a character boundary.
        let wide = "é".repeat(6500);
        let parts = chunks(&wide, SECTION_CHARS);
        assert_eq!(
            parts.iter().map(|p| p.chars().count()).collect::<Vec<_>>(),
            [3000, 3000, 500]
        );
        assert!(sections("").is_empty() && sections(" \n").is_empty());
    }
}
