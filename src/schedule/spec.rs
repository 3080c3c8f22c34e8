//! What a schedule is made of, checked: its name, its prompt, and when it fires (a cron
//! expression read in a time zone, or `every 15m`). The cron expression is croner's to parse
//! and to step through, in jiff's time zones (the tz database `agent.timezone` uses): no date
//! arithmetic here, so a daylight saving change neither skips nor doubles a firing (croner
//! runs a time the clocks jump over right after the jump, and a time they pass twice once).

use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::tz::{TimeZone, TimeZoneDatabase};
use serde::Deserialize;

/// The longest schedule name.
pub(crate) const MAX_NAME_CHARS: usize = 40;

/// The longest prompt.
pub(crate) const MAX_PROMPT_CHARS: usize = 4000;

/// The shortest `every` period: one minute.
pub(crate) const MIN_EVERY_MS: u64 = 60_000;

/// The longest `every` period: a year (longer is a cron expression's job).
const MAX_EVERY_MS: u64 = 366 * 24 * 3_600_000;

/// What to do after downtime with the firings that fell in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Missed {
    /// Run one catch-up: the latest firing missed.
    #[default]
    Once,
    /// Run none; wait for the next one.
    Skip,
}

/// When a schedule fires.
#[derive(Debug, Clone)]
pub(crate) enum When {
    /// A five-field cron expression (minute hour day-of-month month day-of-week), in a zone.
    Cron {
        cron: Box<croner::Cron>,
        zone: TimeZone,
    },
    /// A fixed period, at the multiples of it since the Unix epoch (`every 15m`: at :00, :15,
    /// :30 and :45), so the times do not move with restarts.
    Every { period_ms: u64 },
}

impl When {
    /// A cron expression read in `timezone`.
    pub(crate) fn cron(expression: &str, timezone: &str) -> Result<Self, String> {
        Ok(Self::Cron {
            cron: Box::new(parse_cron(expression)?),
            zone: parse_zone(timezone)?,
        })
    }

    /// An interval such as `15m`, `2h`, `1d`.
    pub(crate) fn every(period: &str) -> Result<Self, String> {
        Ok(Self::Every {
            period_ms: parse_period(period)?,
        })
    }

    /// What a chat command gives: `every 15m` or a cron expression, read in `timezone`.
    pub(crate) fn parse(text: &str, timezone: &str) -> Result<Self, String> {
        let text = text.trim();
        match text.strip_prefix("every ") {
            Some(period) => Self::every(period),
            None => Self::cron(text, timezone),
        }
    }

    /// The first firing after `after_ms` (exclusive), in ms since the Unix epoch; `None` when
    /// there is none (a date that never comes, such as 30 February).
    pub(crate) fn next_after(&self, after_ms: u64) -> Option<u64> {
        match self {
            Self::Every { period_ms } => (after_ms / period_ms)
                .checked_add(1)
                .and_then(|n| n.checked_mul(*period_ms)),
            Self::Cron { cron, zone } => {
                let after = i64::try_from(after_ms).ok()?;
                let start = Timestamp::from_millisecond(after)
                    .ok()?
                    .to_zoned(zone.clone());
                let next = cron.find_next_occurrence(&start, false).ok()?;
                u64::try_from(next.timestamp().as_millisecond()).ok()
            }
        }
    }

    /// The latest firing in `(after_ms, until_ms]`, if any: the one a catch-up runs.
    pub(crate) fn latest_in(&self, after_ms: u64, until_ms: u64) -> Option<u64> {
        match self {
            Self::Every { period_ms } => {
                let latest = until_ms / period_ms * period_ms;
                (latest > after_ms).then_some(latest)
            }
            Self::Cron { cron, zone } => {
                let until = i64::try_from(until_ms).ok()?;
                let until = Timestamp::from_millisecond(until)
                    .ok()?
                    .to_zoned(zone.clone());
                let latest = cron.find_previous_occurrence(&until, true).ok()?;
                let latest = u64::try_from(latest.timestamp().as_millisecond()).ok()?;
                (latest > after_ms).then_some(latest)
            }
        }
    }
}

/// A schedule name: `^[a-z0-9-]{1,40}$`.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let well_formed = (1..=MAX_NAME_CHARS).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if well_formed {
        Ok(())
    } else {
        Err(format!(
            "must be 1 to {MAX_NAME_CHARS} lowercase letters, digits or `-`"
        ))
    }
}

/// A prompt: not empty, at most [`MAX_PROMPT_CHARS`], and not a command (it goes to the
/// model).
pub(crate) fn check_prompt(prompt: &str) -> Result<(), String> {
    let prompt = prompt.trim();
    if prompt.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if prompt.chars().count() > MAX_PROMPT_CHARS {
        return Err(format!("must be at most {MAX_PROMPT_CHARS} characters"));
    }
    if prompt.starts_with('/') {
        return Err("must not start with `/`: a schedule's prompt goes to the model".to_owned());
    }
    Ok(())
}

/// A standard five-field cron expression (or a nickname such as `@daily`).
pub(crate) fn parse_cron(expression: &str) -> Result<croner::Cron, String> {
    let expression = expression.trim();
    if expression.len() > 200 {
        return Err("is longer than 200 characters".to_owned());
    }
    if !expression.starts_with('@') && expression.split_whitespace().count() != 5 {
        return Err(
            "must have five fields: minute hour day-of-month month day-of-week (`0 9 * * 1-5`)"
                .to_owned(),
        );
    }
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(expression)
        .map_err(|e| format!("is not a cron expression ({e})"))
}

/// An IANA time zone, from the system's tz database, else from the copy built into antler
/// (as `agent.timezone` is read).
pub(crate) fn parse_zone(name: &str) -> Result<TimeZone, String> {
    let name = name.trim();
    TimeZone::get(name)
        .or_else(|_| TimeZoneDatabase::bundled().get(name))
        .map_err(|_| {
            let shown: String = name.chars().take(64).collect();
            format!("`{shown}` is not a known IANA time zone (such as `UTC` or `Europe/Berlin`)")
        })
}

/// `15m`, `90s`, `2h`, `1d` (whole numbers), at least a minute.
pub(crate) fn parse_period(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let usage = || "must be a whole number with a unit: `90s`, `15m`, `2h` or `1d`".to_owned();
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(usage)?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| usage())?;
    let unit_ms = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(usage()),
    };
    let period = number.checked_mul(unit_ms).ok_or_else(usage)?;
    if period < MIN_EVERY_MS {
        return Err("must be at least a minute".to_owned());
    }
    if period > MAX_EVERY_MS {
        return Err("must be at most 366 days (use `cron` for longer)".to_owned());
    }
    Ok(period)
}
