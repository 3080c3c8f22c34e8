//! `${VAR}`, `${VAR:-default}` and `${VAR:+word}` substitution over the parsed TOML tree.
//!
//! Substitution runs on values before deserialization so that errors name the key. Substituted
//! text is not scanned again. A value that was exactly one `${...}` and expands to a TOML
//! integer, float or boolean becomes that typed value; a value that was exactly one
//! `${VAR:+word}` with `VAR` unset or empty is left out, so the key keeps its default (this is
//! how `enabled = "${ANTLER_TELEGRAM_BOT_TOKEN:+true}"` turns a platform on from a token alone).

use std::collections::HashMap;

use toml::Value;

use super::ConfigIssue;

/// What substitution did to a tree.
#[derive(Debug, Default)]
pub(crate) struct Substitution {
    /// One issue per failed expansion.
    pub(crate) issues: Vec<ConfigIssue>,
    /// The environment variables each substituted key's value came from, by dotted key, so that
    /// an error about the value can name where it came from.
    pub(crate) sources: HashMap<String, Vec<String>>,
}

/// Expands every string value in `table`.
pub(crate) fn substitute(
    table: &mut toml::Table,
    env: &dyn Fn(&str) -> Option<String>,
) -> Substitution {
    let mut done = Substitution::default();
    walk_table(table, None, env, &mut done);
    done
}

fn walk_table(
    table: &mut toml::Table,
    path: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    done: &mut Substitution,
) {
    let mut vacant = Vec::new();
    for (key, item) in table.iter_mut() {
        let path = match path {
            Some(path) => format!("{path}.{key}"),
            None => key.clone(),
        };
        if walk(item, &path, env, done) == Outcome::Vacant {
            vacant.push(key.clone());
        }
    }
    for key in vacant {
        table.remove(&key);
    }
}

/// Whether a value stays in its table.
#[derive(Debug, PartialEq)]
enum Outcome {
    Kept,
    /// A whole `${VAR:+word}` with `VAR` unset: the key is left out.
    Vacant,
}

fn walk(
    value: &mut Value,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
    done: &mut Substitution,
) -> Outcome {
    match value {
        Value::String(text) => match expand(text, env) {
            Ok(expanded) => {
                if !expanded.variables.is_empty() {
                    done.sources.insert(path.to_owned(), expanded.variables);
                }
                if expanded.vacant {
                    return Outcome::Vacant;
                }
                let typed = if expanded.whole {
                    coerce(&expanded.text)
                } else {
                    None
                };
                *value = typed.unwrap_or(Value::String(expanded.text));
            }
            Err(problems) => done.issues.extend(
                problems
                    .into_iter()
                    .map(|problem| ConfigIssue::new(path, problem)),
            ),
        },
        Value::Array(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                // An element cannot be left out without renumbering the rest: it stays, empty.
                let _ = walk(item, &format!("{path}[{index}]"), env, done);
            }
        }
        Value::Table(table) => walk_table(table, Some(path), env, done),
        Value::Integer(_) | Value::Float(_) | Value::Boolean(_) | Value::Datetime(_) => {}
    }
    Outcome::Kept
}

/// The result of expanding one string.
#[derive(Debug, PartialEq)]
pub(crate) struct Expanded {
    /// The text after substitution.
    pub(crate) text: String,
    /// Whether the original was exactly one `${...}` expression and nothing else.
    pub(crate) whole: bool,
    /// Whether the original was exactly one `${VAR:+word}` whose `VAR` is unset or empty.
    pub(crate) vacant: bool,
    /// The variables referenced, in order.
    pub(crate) variables: Vec<String>,
}

/// Expands every `${VAR}`, `${VAR:-default}` and `${VAR:+word}` in `text`; collects every
/// problem.
pub(crate) fn expand(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Expanded, Vec<String>> {
    let mut out = String::with_capacity(text.len());
    let mut problems = Vec::new();
    let mut rest = text;
    let mut expressions = 0usize;
    let mut starts_with_expression = false;
    let mut variables = Vec::new();
    let mut alternative_unset = false;
    while let Some(start) = rest.find("${") {
        if expressions == 0 && start == 0 {
            starts_with_expression = true;
        }
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            problems.push("unterminated `${` (missing `}`)".to_owned());
            rest = "";
            break;
        };
        let expression = &after[..end];
        rest = &after[end + 1..];
        expressions += 1;
        let (name, operator) = match (expression.split_once(":-"), expression.split_once(":+")) {
            (Some((name, default)), None) => (name, Operator::Default(default)),
            (None, Some((name, word))) => (name, Operator::Alternative(word)),
            (Some(minus), Some(plus)) if minus.0.len() < plus.0.len() => {
                (minus.0, Operator::Default(minus.1))
            }
            (Some(_), Some((name, word))) => (name, Operator::Alternative(word)),
            (None, None) => (expression, Operator::None),
        };
        if !is_var_name(name) {
            problems.push(format!(
                "invalid environment variable name {name:?} in `${{...}}`"
            ));
            continue;
        }
        variables.push(name.to_owned());
        let default = match operator {
            Operator::Alternative(word) => {
                match env(name).filter(|found| !found.is_empty()) {
                    Some(_) => out.push_str(word),
                    None => alternative_unset = true,
                }
                continue;
            }
            Operator::Default(default) => Some(default),
            Operator::None => None,
        };
        match (env(name), default) {
            (Some(found), Some(default)) if found.is_empty() => out.push_str(default),
            (Some(found), _) => out.push_str(&found),
            (None, Some(default)) => out.push_str(default),
            (None, None) => problems.push(format!("environment variable {name} is not set")),
        }
    }
    out.push_str(rest);
    if problems.is_empty() {
        let whole = expressions == 1 && starts_with_expression && rest.is_empty();
        Ok(Expanded {
            text: out,
            whole,
            vacant: whole && alternative_unset,
            variables,
        })
    } else {
        Err(problems)
    }
}

/// What follows a variable's name in `${...}`.
enum Operator<'a> {
    /// `${VAR}`
    None,
    /// `${VAR:-default}`: `default` when `VAR` is unset or empty.
    Default(&'a str),
    /// `${VAR:+word}`: `word` when `VAR` is set and not empty, else nothing.
    Alternative(&'a str),
}

/// Whether `name` is a valid environment variable name.
pub(crate) fn is_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The typed value of an expanded whole-`${...}` string, when it is a plain TOML integer, float
/// or boolean; integers must round-trip exactly so tokens like `0x1F` or `1_000` stay text.
fn coerce(text: &str) -> Option<Value> {
    match text.parse::<Value>().ok()? {
        Value::Integer(n) if n.to_string() == text => Some(Value::Integer(n)),
        Value::Boolean(b) => Some(Value::Boolean(b)),
        Value::Float(f)
            if f.is_finite()
                && text.bytes().all(|b| {
                    b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-')
                }) =>
        {
            Some(Value::Float(f))
        }
        _ => None,
    }
}
