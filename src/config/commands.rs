//! `[[commands]]` checks; every issue names its key (`commands[0].args[1].pattern`).

use std::collections::HashSet;
use std::path::Component;

use super::settings::{at, entry, key};
use crate::opcommands::{BUILTIN_NAMES, CommandConfig, anchored, placeholder};

/// The longest command name: Telegram's and Discord's limit.
const MAX_NAME_CHARS: usize = 32;

/// The longest description: Discord's limit for a command's.
const MAX_DESCRIPTION_CHARS: usize = 100;

/// The longest `timeout_secs`: a day.
const MAX_TIMEOUT_SECS: u64 = 86_400;

/// Every problem of `commands`, as (key, problem).
pub(crate) fn issues(commands: &[CommandConfig]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for (index, command) in commands.iter().enumerate() {
        let mut push = |key: String, problem: String| out.push((key, problem));
        let name = &command.name;
        if name.is_empty()
            || name.chars().count() > MAX_NAME_CHARS
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            push(
                at(key!("commands[].name"), index),
                format!("must be 1 to {MAX_NAME_CHARS} lowercase letters, digits, `_` or `-`"),
            );
        } else if BUILTIN_NAMES.contains(&name.as_str()) {
            push(
                at(key!("commands[].name"), index),
                format!("/{name} is a built-in command"),
            );
        } else if !seen.insert(name.as_str()) {
            push(
                at(key!("commands[].name"), index),
                "is used by an earlier command".to_owned(),
            );
        }
        let description = command.description.trim();
        if description.is_empty() || description.chars().count() > MAX_DESCRIPTION_CHARS {
            push(
                at(key!("commands[].description"), index),
                format!("must be 1 to {MAX_DESCRIPTION_CHARS} characters"),
            );
        }
        match command.run.first() {
            None => push(
                at(key!("commands[].run"), index),
                "must name the program to run".to_owned(),
            ),
            Some(program) if !program.starts_with('/') || placeholder(program).is_some() => push(
                at(key!("commands[].run"), index),
                "its first item must be the program's absolute path (no placeholder)".to_owned(),
            ),
            Some(_) => {}
        }
        for (item_index, item) in command.run.iter().enumerate() {
            if item.contains('\0') {
                push(
                    at(key!("commands[].run"), index),
                    format!("item {item_index} contains a NUL byte"),
                );
            }
            let mut rest = item.as_str();
            while let Some((_, name, after)) = placeholder(rest) {
                if !command.args.iter().any(|arg| arg.name == name) {
                    push(
                        at(key!("commands[].run"), index),
                        format!("item {item_index}: {{{name}}} is not one of the command's args"),
                    );
                }
                rest = after;
            }
        }
        let mut arg_names = HashSet::new();
        let mut optional_seen = false;
        for (arg_index, arg) in command.args.iter().enumerate() {
            let arg_key = |field: &str| {
                format!(
                    "{}[{arg_index}].{field}",
                    at(key!("commands[].args"), index)
                )
            };
            let valid = !arg.name.is_empty()
                && arg.name.len() <= MAX_NAME_CHARS
                && arg.name.starts_with(|c: char| c.is_ascii_lowercase())
                && arg
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !valid {
                push(
                    arg_key("name"),
                    format!(
                        "must be 1 to {MAX_NAME_CHARS} lowercase letters, digits or `_`, starting with a letter"
                    ),
                );
            } else if !arg_names.insert(arg.name.as_str()) {
                push(arg_key("name"), "is used by an earlier arg".to_owned());
            }
            if let Err(e) = anchored(&arg.pattern) {
                let problem = e.to_string();
                let line = problem.lines().last().unwrap_or_default();
                push(
                    arg_key("pattern"),
                    format!("is not a valid regular expression: {line}"),
                );
            }
            if arg.optional {
                optional_seen = true;
            } else if optional_seen {
                push(
                    arg_key("optional"),
                    "a required arg cannot follow an optional one".to_owned(),
                );
            }
        }
        if command.roles.is_empty() {
            push(
                at(key!("commands[].roles"), index),
                "must name who may run it: \"admin\", \"user\"".to_owned(),
            );
        }
        if !(1..=MAX_TIMEOUT_SECS).contains(&command.timeout_secs) {
            push(
                at(key!("commands[].timeout_secs"), index),
                format!(
                    "must be 1 to {MAX_TIMEOUT_SECS} (got {})",
                    command.timeout_secs
                ),
            );
        }
        if let Some(cwd) = &command.cwd
            && (!cwd.is_absolute() || cwd.components().any(|c| c == Component::ParentDir))
        {
            push(
                at(key!("commands[].cwd"), index),
                "must be an absolute path without `..`".to_owned(),
            );
        }
        for name in command.env.keys() {
            let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                push(
                    entry(&at(key!("commands[].env"), index), name),
                    "is not a variable name (letters, digits, `_`)".to_owned(),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy() -> CommandConfig {
        toml::from_str(
            r#"
            name = "deploy"
            description = "Deploy a service"
            run = ["/opt/ops/deploy.sh", "{service}"]
            args = [ { name = "service", pattern = "[a-z]+" } ]
            "#,
        )
        .unwrap()
    }

    #[test]
    fn validation_names_the_key_and_the_problem() {
        let config: CommandConfig = toml::from_str(
            r#"
            name = "help"
            description = ""
            run = ["deploy.sh", "{servce}"]
            args = [ { name = "service", pattern = "([a-z" , optional = true },
                     { name = "Bad", pattern = "x" } ]
            roles = []
            timeout_secs = 0
            cwd = "relative"
            env = { "A-B" = "x" }
            "#,
        )
        .unwrap();
        let mut second = deploy();
        second.name = "Deploy!".into();
        let issues = issues(&[config, deploy(), deploy(), second]);
        let keys: Vec<&str> = issues.iter().map(|(key, _)| key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "commands[0].name",
                "commands[0].description",
                "commands[0].run",
                "commands[0].run",
                "commands[0].args[0].pattern",
                "commands[0].args[1].name",
                "commands[0].args[1].optional",
                "commands[0].roles",
                "commands[0].timeout_secs",
                "commands[0].cwd",
                "commands[0].env.A-B",
                "commands[2].name",
                "commands[3].name",
            ],
            "{issues:#?}"
        );
        assert!(issues[0].1.contains("built-in"), "{issues:?}");
        assert!(issues[3].1.contains("{servce}"), "{issues:?}");
        assert!(issues[11].1.contains("earlier"), "{issues:?}");
        assert!(super::issues(&[deploy()]).is_empty());
    }
}
