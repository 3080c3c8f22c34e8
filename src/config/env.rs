//! `${VAR}` / `${VAR:-default}` substitution over the parsed TOML tree.
//!
//! Substitution runs on values before deserialization so that errors name the key. Substituted
//! text is not scanned again. A value that was exactly one `${...}` and expands to a TOML
//! integer, float or boolean becomes that typed value.

use toml::Value;

use super::ConfigIssue;

/// Expands every string value in `table`, returning one issue per failed expansion.
pub(crate) fn substitute(
    table: &mut toml::Table,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<ConfigIssue> {
    let mut issues = Vec::new();
    for (key, value) in table.iter_mut() {
        walk(value, key, env, &mut issues);
    }
    issues
}

fn walk(
    value: &mut Value,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Vec<ConfigIssue>,
) {
    match value {
        Value::String(text) => match expand(text, env) {
            Ok(expanded) => {
                let typed = if expanded.whole {
                    coerce(&expanded.text)
                } else {
                    None
                };
                *value = typed.unwrap_or(Value::String(expanded.text));
            }
            Err(problems) => issues.extend(
                problems
                    .into_iter()
                    .map(|problem| ConfigIssue::new(path, problem)),
            ),
        },
        Value::Array(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                walk(item, &format!("{path}[{index}]"), env, issues);
            }
        }
        Value::Table(table) => {
            for (key, item) in table.iter_mut() {
                walk(item, &format!("{path}.{key}"), env, issues);
            }
        }
        Value::Integer(_) | Value::Float(_) | Value::Boolean(_) | Value::Datetime(_) => {}
    }
}

/// The result of expanding one string.
#[derive(Debug, PartialEq)]
pub(crate) struct Expanded {
    /// The text after substitution.
    pub(crate) text: String,
    /// Whether the original was exactly one `${...}` expression and nothing else.
    pub(crate) whole: bool,
}

/// Expands every `${VAR}` and `${VAR:-default}` in `text`; collects every problem.
pub(crate) fn expand(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Expanded, Vec<String>> {
    let mut out = String::with_capacity(text.len());
    let mut problems = Vec::new();
    let mut rest = text;
    let mut expressions = 0usize;
    let mut starts_with_expression = false;
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
        let (name, default) = match expression.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (expression, None),
        };
        if !is_var_name(name) {
            problems.push(format!(
                "invalid environment variable name {name:?} in `${{...}}`"
            ));
            continue;
        }
        match (env(name), default) {
            (Some(found), Some(default)) if found.is_empty() => out.push_str(default),
            (Some(found), _) => out.push_str(&found),
            (None, Some(default)) => out.push_str(default),
            (None, None) => problems.push(format!("environment variable {name} is not set")),
        }
    }
    out.push_str(rest);
    if problems.is_empty() {
        Ok(Expanded {
            text: out,
            whole: expressions == 1 && starts_with_expression && rest.is_empty(),
        })
    } else {
        Err(problems)
    }
}

fn is_var_name(name: &str) -> bool {
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
