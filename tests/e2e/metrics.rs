//! `/metrics` of a fresh `antler serve` process (its own recorder, unlike the in-process apps
//! that share one): every metric the source writes is described, the series known at start are
//! there at zero, and histograms are histograms.

use crate::support::source_metrics::metrics_in_the_source;
use crate::support::{Behaviour, ChildRig, MockModel, metric_value, wait_until};
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_antler_describes_every_metric_and_shows_the_known_series_at_zero() {
    let (names, errors) = metrics_in_the_source();
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(names.len() > 50, "the scan finds the metrics: {names:?}");
    let mock = MockModel::start(Behaviour::Echo).await;
    let rig = ChildRig::new(&mock, "");
    let app = rig.serve().await;

    let scrape = app.get("/metrics").await;
    assert_eq!(scrape.status, StatusCode::OK, "{}", scrape.text);
    let text = scrape.text;
    for (name, kind) in &names {
        assert!(
            text.lines().any(|l| l
                .strip_prefix(&format!("# HELP {name} "))
                .is_some_and(|help| !help.trim().is_empty())),
            "no # HELP for {name}:\n{text}"
        );
        assert!(
            text.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} is not typed {kind}:\n{text}"
        );
        if *kind == "histogram" {
            // Some are written to at start already (the store's flushes).
            assert!(
                metric_value(&text, &format!("{name}_bucket{{le=\"+Inf\"}}")).is_some(),
                "{name} renders buckets:\n{text}"
            );
        }
    }
    assert!(!text.contains("quantile="), "no summaries:\n{text}");
    assert!(
        !text.contains("\nantler_channel_healthy"),
        "no platform channel here, so no health series (none at 0 saying unhealthy):\n{text}"
    );
    for series in [
        r#"antler_turns_total{outcome="ok"}"#,
        r#"antler_turns_total{outcome="failed"}"#,
        r#"antler_turns_total{outcome="timed_out"}"#,
        r#"antler_runs_total{ending="answered"}"#,
        r#"antler_webhooks_received_total{channel="api"}"#,
        r#"antler_delivery_failures_total{channel="api"}"#,
        r#"antler_store_errors_total{retryable="true"}"#,
        "antler_turn_panics_total",
        "antler_turn_duration_seconds_count",
        r#"antler_turn_duration_seconds_bucket{le="1"}"#,
        "antler_subagents_active",
    ] {
        assert_eq!(
            metric_value(&text, series),
            Some(0.0),
            "{series} at zero:\n{text}"
        );
    }

    // Counted from there, and the turn's duration lands in the buckets.
    let answer = app.ask("metrics", "count me").await;
    assert_eq!(answer.json["reply"], "echo: count me", "{}", answer.text);
    let text = wait_until("the turn is counted", || async {
        let text = app.get("/metrics").await.text;
        (metric_value(&text, "antler_turn_duration_seconds_count") == Some(1.0)).then_some(text)
    })
    .await;
    for (series, value) in [
        (r#"antler_turns_total{outcome="ok"}"#, 1.0),
        (r#"antler_turns_total{outcome="failed"}"#, 0.0),
        (r#"antler_webhooks_received_total{channel="api"}"#, 1.0),
        (r#"antler_turn_duration_seconds_bucket{le="+Inf"}"#, 1.0),
    ] {
        assert_eq!(
            metric_value(&text, series),
            Some(value),
            "{series}:\n{text}"
        );
    }
}
