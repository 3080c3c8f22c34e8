//! The Slack app manifest `antler setup slack` prints: what to paste into "Create an app →
//! From a manifest" so the app has the scopes, events and command antler needs.

/// The app manifest for an antler reachable at `public_url` (no trailing slash needed), with
/// the slash command `command` (`/antler`).
///
/// Events go to `<public_url>/webhooks/slack/events` and the command to
/// `<public_url>/webhooks/slack/commands`; Socket Mode stays off (antler takes webhooks).
pub fn manifest(public_url: &str, command: &str) -> serde_json::Value {
    let base = public_url.trim_end_matches('/');
    let command = if command.starts_with('/') {
        command.to_owned()
    } else {
        format!("/{command}")
    };
    serde_json::json!({
        "display_information": {
            "name": "antler",
            "description": "A chat-ops agent: mention it in a channel or write to it directly.",
        },
        "features": {
            "bot_user": {
                "display_name": "antler",
                "always_online": true,
            },
            "slash_commands": [{
                "command": command,
                "url": format!("{base}/webhooks/slack/commands"),
                "description": "Ask antler, or: new, help, status, stop",
                "usage_hint": "[question | new | help | status | stop]",
                "should_escape": false,
            }],
        },
        "oauth_config": {
            "scopes": {
                "bot": [
                    "app_mentions:read",
                    "chat:write",
                    "im:history",
                    "im:read",
                    "im:write",
                    "channels:history",
                    "groups:history",
                    "files:read",
                    "reactions:write",
                    "commands",
                ],
            },
        },
        "settings": {
            "event_subscriptions": {
                "request_url": format!("{base}/webhooks/slack/events"),
                "bot_events": [
                    "app_mention",
                    "message.im",
                    "message.channels",
                    "message.groups",
                ],
            },
            "org_deploy_enabled": false,
            "socket_mode_enabled": false,
            "token_rotation_enabled": false,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_points_slack_at_both_routes() {
        let m = manifest("https://bot.example.com/", "antler");
        assert_eq!(
            m["settings"]["event_subscriptions"]["request_url"],
            "https://bot.example.com/webhooks/slack/events"
        );
        assert_eq!(m["features"]["slash_commands"][0]["command"], "/antler");
        assert_eq!(
            m["features"]["slash_commands"][0]["url"],
            "https://bot.example.com/webhooks/slack/commands"
        );
        let scopes: Vec<&str> = m["oauth_config"]["scopes"]["bot"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        for scope in [
            "app_mentions:read",
            "chat:write",
            "im:history",
            "files:read",
            "commands",
        ] {
            assert!(scopes.contains(&scope), "{scope}");
        }
        assert_eq!(
            m["settings"]["event_subscriptions"]["bot_events"],
            serde_json::json!([
                "app_mention",
                "message.im",
                "message.channels",
                "message.groups"
            ])
        );
        assert_eq!(m["settings"]["socket_mode_enabled"], false);
        assert_eq!(m["settings"]["org_deploy_enabled"], false);
        assert_eq!(m["display_information"]["name"], "antler");
    }
}
