use std::collections::{BTreeMap, BTreeSet};

use super::*;

// The scan is shared with the end-to-end test of a fresh process's `/metrics`.
#[path = "../../tests/e2e/support/source_metrics.rs"]
#[allow(
    unreachable_pub,
    reason = "public for the end-to-end tests that share the file"
)]
mod source_metrics;
use source_metrics::metrics_in_the_source;

#[test]
fn every_metric_in_the_source_is_in_the_catalogue_as_what_it_is() {
    let (names, errors) = metrics_in_the_source();
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(
        names.len() > 50,
        "the scan finds antler's metrics: {names:?}"
    );
    let catalogued: BTreeMap<&str, &str> = METRICS
        .iter()
        .map(|m| (m.name, m.kind.type_name()))
        .collect();
    let missing: Vec<_> = names
        .iter()
        .filter(|(name, kind)| catalogued.get(name.as_str()) != Some(*kind))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics written in the source but not in src/metrics_catalog.rs METRICS (or as \
         another kind): {missing:?}"
    );
    let stale: Vec<_> = catalogued
        .keys()
        .filter(|name| !names.contains_key(**name))
        .collect();
    assert!(stale.is_empty(), "catalogued but never written: {stale:?}");
}

#[test]
fn the_catalogue_follows_the_prometheus_conventions() {
    let mut seen = BTreeSet::new();
    for m in METRICS {
        assert!(seen.insert(m.name), "{} is listed twice", m.name);
        assert!(
            m.name.starts_with("antler_")
                && m.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{}",
            m.name
        );
        assert_eq!(
            m.kind == Kind::Counter,
            m.name.ends_with("_total"),
            "{}: counters, and only counters, end in _total",
            m.name
        );
        let seconds = m.name.ends_with("_seconds") || m.name.contains("_seconds_");
        assert_eq!(
            seconds,
            m.unit == Some(Unit::Seconds),
            "{}: a duration is in seconds, named so",
            m.name
        );
        assert!(
            !m.help.is_empty()
                && m.help.ends_with('.')
                && !m.help.contains(['\n', '\\'])
                && m.help.len() < 120,
            "{}: one short line of help: {:?}",
            m.name,
            m.help
        );
        if let Kind::Histogram(buckets) = m.kind {
            assert!(
                !buckets.is_empty() && buckets.windows(2).all(|w| w[0] < w[1]),
                "{}: increasing buckets",
                m.name
            );
        }
        if let Series::Each(_, values) | Series::PerMcpServerAnd(_, values) = m.series {
            assert!(!values.is_empty(), "{}", m.name);
        }
    }
}

/// The line of series `series` in `text`, and its value.
fn value_of(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

#[test]
fn a_fresh_recorder_renders_every_metric_described_and_the_known_series_at_zero() {
    let recorder = builder().unwrap().build_recorder();
    describe(&recorder);
    let handle = recorder.handle();
    let known = Known {
        channels: vec!["api", "telegram"],
        mcp_servers: vec!["github"],
        middlewares: vec!["title"],
    };
    metrics::with_local_recorder(&recorder, || register_at_zero(&known));
    let text = render(&handle);

    for m in METRICS {
        assert!(
            text.contains(&format!("# HELP {} {}\n", m.name, m.help)),
            "no help for {}:\n{text}",
            m.name
        );
        let type_line = format!("# TYPE {} {}\n", m.name, m.kind.type_name());
        assert_eq!(text.matches(&type_line).count(), 1, "{type_line}\n{text}");
    }
    for series in [
        "antler_turns_total{outcome=\"ok\"}",
        "antler_turns_total{outcome=\"timed_out\"}",
        "antler_runs_total{ending=\"answered\"}",
        "antler_turn_panics_total",
        "antler_webhooks_received_total{channel=\"api\"}",
        "antler_webhooks_received_total{channel=\"telegram\"}",
        "antler_delivery_failures_total{channel=\"telegram\"}",
        "antler_mcp_restarts_total{server=\"github\",outcome=\"failed\"}",
        "antler_mcp_results_too_large_total{server=\"github\"}",
        "antler_middleware_errors_total{middleware=\"title\"}",
        "antler_inbox_depth",
        "antler_turn_duration_seconds_bucket{le=\"0.05\"}",
        "antler_turn_duration_seconds_bucket{le=\"+Inf\"}",
        "antler_turn_duration_seconds_count",
        "antler_store_flush_batch_size_bucket{le=\"1024\"}",
    ] {
        assert_eq!(value_of(&text, series), Some(0.0), "{series} in\n{text}");
    }
    assert!(
        !text.contains("quantile="),
        "histograms are not summaries:\n{text}"
    );
    for made_up in ["antler_webhooks_rejected_total", "antler_channel_healthy"] {
        assert!(
            !text.lines().any(|l| l.starts_with(made_up)),
            "no series is made up for labels known only on use:\n{text}"
        );
    }
}

#[test]
fn registering_again_keeps_what_was_counted_and_histograms_fill_their_buckets() {
    let recorder = builder().unwrap().build_recorder();
    describe(&recorder);
    let handle = recorder.handle();
    let known = Known {
        channels: vec!["api"],
        ..Known::default()
    };
    metrics::with_local_recorder(&recorder, || {
        register_at_zero(&known);
        metrics::counter!("antler_turns_total", "outcome" => "ok").increment(2);
        metrics::histogram!("antler_turn_duration_seconds").record(3.0);
        register_at_zero(&known);
    });
    let text = render(&handle);
    assert_eq!(
        value_of(&text, "antler_turns_total{outcome=\"ok\"}"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        value_of(&text, "antler_turn_duration_seconds_bucket{le=\"2.5\"}"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        value_of(&text, "antler_turn_duration_seconds_bucket{le=\"5\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value_of(&text, "antler_turn_duration_seconds_sum"),
        Some(3.0),
        "{text}"
    );
}
