#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn a_fresh_trace_has_a_32_hex_id_and_non_zero_ids() {
    let trace = TraceContext::fresh();
    let hex = trace.trace_hex();
    assert_eq!(hex.len(), 32);
    assert!(
        hex.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    assert_ne!(trace.trace_id, [0; 16]);
    assert_ne!(trace.span_id, [0; 8]);
    assert_ne!(
        trace,
        TraceContext::fresh(),
        "each message gets its own trace"
    );
}

#[test]
fn a_trace_context_reads_back_from_its_text_and_json() {
    let trace = TraceContext::fresh();
    assert_eq!(TraceContext::from_text(&trace.to_text()), Some(trace));
    let json = serde_json::to_string(&trace).unwrap();
    assert_eq!(serde_json::from_str::<TraceContext>(&json).unwrap(), trace);
    assert!(TraceContext::from_text("not-hex").is_none());
    assert!(TraceContext::from_text("abcd-ef").is_none(), "too short");
}

#[test]
fn the_trace_link_fills_in_the_template() {
    let id = "4bf92f3577b34da6a3ce929d0e0e4736";
    assert_eq!(
        trace_link(Some("https://tempo.example/trace/{trace_id}"), id).as_deref(),
        Some("https://tempo.example/trace/4bf92f3577b34da6a3ce929d0e0e4736")
    );
    assert_eq!(trace_link(None, id), None);
    assert_eq!(trace_link(Some("  "), id), None);
    let config = TelemetryConfig {
        otlp_endpoint: None,
        trace_url: Some("http://jaeger:16686/trace/{trace_id}".to_owned()),
    };
    assert_eq!(
        trace_link(config.trace_url.as_deref(), id).as_deref(),
        Some("http://jaeger:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736")
    );
}

#[test]
fn trace_urls_and_endpoints_are_checked() {
    assert!(check_trace_url("https://tempo.example/trace/{trace_id}").is_ok());
    assert!(check_trace_url("https://tempo.example/trace/").is_err());
    assert!(check_trace_url("ftp://x/{trace_id}").is_err());
    assert!(check_endpoint("http://127.0.0.1:4318").is_ok());
    assert!(check_endpoint("grpc://127.0.0.1:4317").is_err());
    assert!(check_endpoint("127.0.0.1:4318").is_err());
}

#[test]
fn the_endpoint_is_the_configs_without_a_trailing_slash() {
    let config = TelemetryConfig {
        otlp_endpoint: Some("http://collector:4318/".to_owned()),
        trace_url: None,
    };
    assert_eq!(config.endpoint().as_deref(), Some("http://collector:4318"));
}

#[test]
fn while_not_exporting_a_span_gets_a_fresh_context() {
    // No collector in unit tests: the ids are made here, and adopting one is harmless.
    let span = tracing::info_span!("accept");
    let trace = TraceContext::of_span(&span);
    assert_eq!(trace.trace_hex().len(), 32);
    trace.adopt(&span);
}
