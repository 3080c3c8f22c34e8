//! `/skills`: the skills antler found, on or off; `/skills enable NAME` and `/skills disable
//! NAME` switch one, for admins only. The switch is the deployment's (kept in the store,
//! [`SkillStore`]) and applies from the next request on, in every conversation.
//!
//! Names and descriptions are the operator's files, still escaped for the chat's Markdown and
//! bounded; a name typed by the user is echoed only once it is a well-formed skill name.

use crate::agent::skills::{self, Catalogue};
use crate::memory::edit::escape_markdown;
use crate::store::{SkillStore, StoreError};

use super::CommandInfo;

/// `/skills` in `/help` and the command menus.
pub(crate) const INFO: CommandInfo = CommandInfo {
    name: "skills",
    aliases: &[],
    help: "the assistant's skills (admins: /skills enable <name>, /skills disable <name>)",
    menu: "The assistant's skills; admins can switch them on or off",
};

/// What `/skills` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SkillsAction {
    /// `/skills`: list them.
    List,
    /// `/skills enable NAME` or `/skills disable NAME`.
    Switch {
        /// The name as typed (checked before it is echoed).
        name: String,
        /// On or off.
        on: bool,
    },
    /// Anything else: answered with how to use it.
    Invalid,
}

/// How `/skills` is used, for a form it does not know.
const USAGE: &str = "Use /skills to list the skills; admins can use /skills enable <name> and \
/skills disable <name>.";

/// The answer to a store failure; the cause goes to the log.
const UNAVAILABLE: &str =
    "Sorry, I can't reach the skill settings right now; try again in a moment.";

/// The longest description shown in the list.
const MAX_SHOWN_DESCRIPTION: usize = 200;

/// The words after `/skills`.
pub(super) fn parse<'a>(words: &mut impl Iterator<Item = &'a str>) -> SkillsAction {
    let first = words.next().map(str::to_ascii_lowercase);
    let second = words.next();
    if words.next().is_some() {
        return SkillsAction::Invalid;
    }
    match (first.as_deref(), second) {
        (None | Some("list"), None) => SkillsAction::List,
        (Some("enable" | "on"), Some(name)) => SkillsAction::Switch {
            name: name.to_owned(),
            on: true,
        },
        (Some("disable" | "off"), Some(name)) => SkillsAction::Switch {
            name: name.to_owned(),
            on: false,
        },
        _ => SkillsAction::Invalid,
    }
}

/// The reply to `/skills ...`, from an admin or not.
pub(crate) async fn answer(
    store: &dyn SkillStore,
    catalogue: &Catalogue,
    admin: bool,
    action: SkillsAction,
) -> String {
    let reply = match action {
        SkillsAction::List => list(store, catalogue).await,
        SkillsAction::Switch { .. } if !admin => {
            Ok("Only admins can switch skills on or off.".to_owned())
        }
        SkillsAction::Switch { name, on } => switch(store, catalogue, &name, on).await,
        SkillsAction::Invalid => Ok(USAGE.to_owned()),
    };
    reply.unwrap_or_else(|e| {
        tracing::error!(error = %e, "/skills failed");
        UNAVAILABLE.to_owned()
    })
}

async fn list(store: &dyn SkillStore, catalogue: &Catalogue) -> Result<String, StoreError> {
    if catalogue.skills.is_empty() {
        return Ok("No skills are installed.".to_owned());
    }
    let switches = store.skill_switches().await?;
    let on = |name: &str| switches.get(name).copied().unwrap_or(true);
    let enabled = catalogue.skills.keys().filter(|name| on(name)).count();
    let mut out = format!("Skills ({enabled} of {} on):\n", catalogue.skills.len());
    for skill in catalogue.skills.values() {
        out.push_str(&format!(
            "{} {}{} — {}\n",
            if on(&skill.name) { "✅" } else { "⛔" },
            escape_markdown(&skill.name, skills::MAX_NAME_CHARS),
            if on(&skill.name) { "" } else { " (off)" },
            escape_markdown(&skill.description, MAX_SHOWN_DESCRIPTION)
        ));
    }
    out.push_str("Admins: /skills enable <name>, /skills disable <name>.");
    Ok(out)
}

async fn switch(
    store: &dyn SkillStore,
    catalogue: &Catalogue,
    name: &str,
    on: bool,
) -> Result<String, StoreError> {
    if !skills::is_name(name) {
        return Ok(format!("That is not a skill name. {USAGE}"));
    }
    let Some(skill) = catalogue.get(name) else {
        return Ok(format!(
            "There is no skill named {}; /skills lists them.",
            escape_markdown(name, skills::MAX_NAME_CHARS)
        ));
    };
    store.set_skill_switch(&skill.name, on).await?;
    tracing::info!(skill = %skill.name, on, "skill switched");
    let shown = escape_markdown(&skill.name, skills::MAX_NAME_CHARS);
    Ok(if on {
        format!("Skill {shown} is on, from the next message on.")
    } else {
        format!("Skill {shown} is off, from the next message on.")
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::agent::skills::Skill;
    use crate::store::MemStore;

    fn catalogue() -> Catalogue {
        let mut catalogue = Catalogue::default();
        for (name, description) in [
            ("incident-summary", "Summarise an *incident* <now>"),
            ("postmortem", "Write a postmortem"),
        ] {
            catalogue.skills.insert(
                name.to_owned(),
                Skill {
                    name: name.to_owned(),
                    description: description.to_owned(),
                    allowed_tools: None,
                    license: None,
                    folder: PathBuf::from("/skills").join(name),
                },
            );
        }
        catalogue
    }

    fn parsed(text: &str) -> SkillsAction {
        parse(&mut text.split_whitespace())
    }

    #[test]
    fn the_words_are_read_strictly() {
        assert_eq!(parsed(""), SkillsAction::List);
        assert_eq!(
            parsed("Enable postmortem"),
            SkillsAction::Switch {
                name: "postmortem".into(),
                on: true
            }
        );
        assert_eq!(
            parsed("disable postmortem"),
            SkillsAction::Switch {
                name: "postmortem".into(),
                on: false
            }
        );
        for invalid in ["enable", "disable a b", "wipe", "list all"] {
            assert_eq!(parsed(invalid), SkillsAction::Invalid, "{invalid}");
        }
    }

    #[tokio::test]
    async fn admins_switch_skills_and_the_list_shows_it_escaped() {
        let store = MemStore::new();
        let catalogue = catalogue();
        let list = answer(&store, &catalogue, false, SkillsAction::List).await;
        assert!(list.starts_with("Skills (2 of 2 on):"), "{list}");
        assert!(
            list.contains("✅ incident-summary — Summarise an \\*incident\\* \\<now\\>"),
            "{list}"
        );
        let off = |name: &str| SkillsAction::Switch {
            name: name.to_owned(),
            on: false,
        };
        let refused = answer(&store, &catalogue, false, off("postmortem")).await;
        assert!(refused.starts_with("Only admins"), "{refused}");
        assert!(store.skill_switches().await.unwrap().is_empty());
        let done = answer(&store, &catalogue, true, off("postmortem")).await;
        assert!(done.contains("is off"), "{done}");
        assert_eq!(
            store.skill_switches().await.unwrap().get("postmortem"),
            Some(&false)
        );
        let list = answer(&store, &catalogue, false, SkillsAction::List).await;
        assert!(list.contains("⛔ postmortem (off)"), "{list}");
        assert!(list.starts_with("Skills (1 of 2 on):"), "{list}");
        // Unknown and malformed names change nothing and are not echoed raw.
        let unknown = answer(&store, &catalogue, true, off("nope")).await;
        assert!(unknown.contains("no skill named nope"), "{unknown}");
        let bad = answer(&store, &catalogue, true, off("<b>x</b>")).await;
        assert!(!bad.contains("<b>"), "{bad}");
        assert_eq!(store.skill_switches().await.unwrap().len(), 1);
    }
}
