//! `current_time`: the date and time, optionally at a UTC offset. Harmless, and enough to
//! prove tool calling end to end.

use serde::Deserialize;
use serde_json::json;
use time::{OffsetDateTime, UtcOffset, format_description::well_known::Rfc3339};

use super::{Tool, ToolContext, ToolError, parse_arguments};
use crate::agent::model::ToolSpec;

/// The `current_time` tool.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CurrentTime;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    #[serde(default)]
    utc_offset_minutes: i32,
}

#[async_trait::async_trait]
impl Tool for CurrentTime {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "current_time".to_owned(),
            description:
                "Returns the current date and time (RFC 3339) and weekday, in UTC or at a \
                          given UTC offset."
                    .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "utc_offset_minutes": {
                        "type": "integer",
                        "description": "Offset from UTC in minutes, e.g. 60 for UTC+1. Default 0.",
                        "minimum": -1080,
                        "maximum": 1080
                    }
                },
                "additionalProperties": false
            }),
        }
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        _cx: &ToolContext,
    ) -> Result<String, ToolError> {
        let Arguments { utc_offset_minutes } = parse_arguments(arguments)?;
        let offset =
            UtcOffset::from_whole_seconds(utc_offset_minutes.saturating_mul(60)).map_err(|_| {
                ToolError::InvalidArguments("utc_offset_minutes is out of range".into())
            })?;
        let now = OffsetDateTime::now_utc().to_offset(offset);
        let stamp = now
            .format(&Rfc3339)
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        Ok(format!("{stamp} ({})", now.weekday()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_rfc3339_at_the_requested_offset() {
        let out = CurrentTime
            .call(
                json!({"utc_offset_minutes": 90}),
                &super::super::tests::context(),
            )
            .await
            .unwrap();
        let stamp = out.split(' ').next().unwrap();
        let parsed = OffsetDateTime::parse(stamp, &Rfc3339).unwrap();
        assert_eq!(parsed.offset().whole_minutes(), 90);
    }

    #[tokio::test]
    async fn rejects_offsets_beyond_eighteen_hours() {
        let err = CurrentTime
            .call(
                json!({"utc_offset_minutes": 5000}),
                &super::super::tests::context(),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::InvalidArguments(_)));
    }
}
