//! The Slack app manifest `antler setup slack` prints: what to paste into "Create an app →
//! From a manifest" so the app has the scopes, events, command and interactivity antler needs.

/// The app manifest for an antler reachable at `public_url` (no trailing slash needed), or in
/// Socket Mode without one (`None`), with the slash command `command` (`/antler`).
///
/// With a URL, events go to `<public_url>/webhooks/slack/events`, the command to
/// `<public_url>/webhooks/slack/commands` and button presses to
/// `<public_url>/webhooks/slack/interactions` (`settings.interactivity`), and Socket Mode is
/// off. Without one, `socket_mode_enabled` is on and the manifest names no request URL:
/// Slack's manifest reference makes `event_subscriptions.request_url`, a slash command's `url`
/// and `interactivity.request_url` optional ("If set, you'll need to manually verify the
/// Request URL"), and in Socket Mode all of them arrive over the app's connection instead.
pub fn manifest(public_url: Option<&str>, command: &str) -> serde_json::Value {
    let command = if command.starts_with('/') {
        command.to_owned()
    } else {
        format!("/{command}")
    };
    let mut manifest = serde_json::json!({
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
                "bot_events": [
                    "app_mention",
                    "message.im",
                    "message.channels",
                    "message.groups",
                ],
            },
            // Approve and Deny buttons: presses are interactions.
            "interactivity": {
                "is_enabled": true,
            },
            "org_deploy_enabled": false,
            "socket_mode_enabled": public_url.is_none(),
            "token_rotation_enabled": false,
        },
    });
    if let Some(public_url) = public_url {
        let base = public_url.trim_end_matches('/');
        manifest["features"]["slash_commands"][0]["url"] =
            format!("{base}/webhooks/slack/commands").into();
        manifest["settings"]["event_subscriptions"]["request_url"] =
            format!("{base}/webhooks/slack/events").into();
        manifest["settings"]["interactivity"]["request_url"] =
            format!("{base}/webhooks/slack/interactions").into();
    }
    manifest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_points_slack_at_both_routes() {
        let m = manifest(Some("https://bot.example.com/"), "antler");
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
        assert_eq!(
            m["settings"]["interactivity"],
            serde_json::json!({
                "is_enabled": true,
                "request_url": "https://bot.example.com/webhooks/slack/interactions"
            })
        );
        assert_eq!(m["settings"]["socket_mode_enabled"], false);
        assert_eq!(m["settings"]["org_deploy_enabled"], false);
        assert_eq!(m["display_information"]["name"], "antler");
    }

    #[test]
    fn the_socket_mode_manifest_enables_it_and_names_no_request_url() {
        let webhooks = manifest(Some("https://bot.example.com"), "/antler");
        let m = manifest(None, "/antler");
        assert_eq!(m["settings"]["socket_mode_enabled"], true);
        assert_eq!(
            m["settings"]["event_subscriptions"].get("request_url"),
            None
        );
        assert_eq!(m["features"]["slash_commands"][0].get("url"), None);
        assert_eq!(
            m["settings"]["interactivity"],
            serde_json::json!({"is_enabled": true}),
            "presses come over the connection"
        );
        assert_eq!(m["features"]["slash_commands"][0]["command"], "/antler");
        // Everything else is the webhooks' manifest: the same events, scopes and command.
        let mut expected = webhooks;
        expected["settings"]["socket_mode_enabled"] = true.into();
        expected["settings"]["event_subscriptions"]
            .as_object_mut()
            .unwrap()
            .remove("request_url");
        expected["features"]["slash_commands"][0]
            .as_object_mut()
            .unwrap()
            .remove("url");
        expected["settings"]["interactivity"]
            .as_object_mut()
            .unwrap()
            .remove("request_url");
        assert_eq!(m, expected);
    }
}
