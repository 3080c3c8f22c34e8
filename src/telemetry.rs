//! OpenTelemetry traces: one trace per message, from the webhook to the delivery.
//!
//! Every accepted message gets a [`TraceContext`] (the 32-hex OpenTelemetry trace id and the
//! id of its `accept` span), stored with its inbox item and carried into its replies' outbox
//! items: the turn runs later in another task (perhaps after a restart) and the delivery later
//! still, so their spans find their parent through the store, not through memory. The trace id
//! is in every log line of the turn (the `turn` span's `trace` field), in `/status`, and in the
//! thread's metadata.
//!
//! Exporting is off unless `[telemetry] otlp_endpoint` or `OTEL_EXPORTER_OTLP_ENDPOINT` names a
//! collector. The tracing layer is installed with the log subscriber (before the configuration
//! is read) behind a per-layer filter that lets no span through while exporting is off, so it
//! costs one atomic load per span then; the ids are still made and logged. On, spans go to
//! `<endpoint>/v1/traces` as OTLP over HTTP (protobuf), batched on the tokio runtime.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{SdkTracerProvider, Span as SdkSpan, SpanData, SpanProcessor};
use serde::Deserialize;
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context as LayerContext, Filter};
use tracing_subscriber::registry::LookupSpan;

/// The standard variable naming the collector's base URL, used when the config names none.
pub const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// The service name spans carry unless `OTEL_SERVICE_NAME` says otherwise.
const SERVICE_NAME: &str = "antler";

/// How long the shutdown waits for the last spans to reach the collector.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// How long one export request may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// `[telemetry]`: where traces go and how people find them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP collector's base URL (`http://127.0.0.1:4318`): spans are posted to
    /// `<otlp_endpoint>/v1/traces`. Unset: `OTEL_EXPORTER_OTLP_ENDPOINT`, else no export.
    pub otlp_endpoint: Option<String>,
    /// A link to one trace in a trace viewer, `{trace_id}` standing for the 32-hex id.
    pub trace_url: Option<String>,
}

impl TelemetryConfig {
    /// The collector's base URL: the config's, else the environment's; `None`: no export.
    pub(crate) fn endpoint(&self) -> Option<String> {
        self.otlp_endpoint
            .clone()
            .or_else(|| std::env::var(ENDPOINT_VAR).ok())
            .map(|url| url.trim().trim_end_matches('/').to_owned())
            .filter(|url| !url.is_empty())
    }
}

/// `template` (`telemetry.trace_url`) with `{trace_id}` replaced by `trace_id`; `None`
/// without a template. For the admin page and `/status`:
/// `trace_link(config.telemetry.trace_url.as_deref(), &id)`.
pub(crate) fn trace_link(template: Option<&str>, trace_id: &str) -> Option<String> {
    let template = template.map(str::trim).filter(|t| !t.is_empty())?;
    Some(template.replace("{trace_id}", trace_id))
}

/// Whether `template` is a usable `telemetry.trace_url`: an http(s) URL holding `{trace_id}`.
pub(crate) fn check_trace_url(template: &str) -> Result<(), String> {
    if !template.contains("{trace_id}") {
        return Err("must contain `{trace_id}`, where the trace id goes".to_owned());
    }
    check_endpoint(&template.replace("{trace_id}", "0"))
}

/// Whether `url` is a usable collector URL: absolute http(s) with a host.
pub(crate) fn check_endpoint(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("not a valid URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "must be an http or https URL (got scheme {:?})",
            parsed.scheme()
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("must have a host".to_owned());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The trace context of one message
// ---------------------------------------------------------------------------------------------

/// The trace of one message: its trace id and the id of the span that accepted it, the parent
/// of its turn and of its replies' delivery attempts.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct TraceContext {
    pub(crate) trace_id: [u8; 16],
    pub(crate) span_id: [u8; 8],
}

impl std::fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.trace_hex(), hex::encode(self.span_id))
    }
}

impl TraceContext {
    /// A new trace: random ids (never all zero, which OpenTelemetry reads as "none").
    pub(crate) fn fresh() -> Self {
        let trace_id = fastrand::u128(1..).to_be_bytes();
        let span_id = fastrand::u64(1..).to_be_bytes();
        Self { trace_id, span_id }
    }

    /// The context `span` starts: OpenTelemetry's ids when the span is exported, else fresh
    /// ones.
    pub(crate) fn of_span(span: &tracing::Span) -> Self {
        if !exporting() {
            return Self::fresh();
        }
        let context = span.context();
        let span_context = context.span().span_context().clone();
        if span_context.is_valid() {
            Self {
                trace_id: span_context.trace_id().to_bytes(),
                span_id: span_context.span_id().to_bytes(),
            }
        } else {
            Self::fresh()
        }
    }

    /// The trace id as OpenTelemetry writes it: 32 lowercase hex digits.
    pub(crate) fn trace_hex(&self) -> String {
        hex::encode(self.trace_id)
    }

    /// `<trace id>-<span id>` in hex, as serde writes it.
    fn to_text(self) -> String {
        format!("{}-{}", self.trace_hex(), hex::encode(self.span_id))
    }

    /// The context [`Self::to_text`] wrote.
    pub(crate) fn from_text(text: &str) -> Option<Self> {
        let (trace, span) = text.split_once('-')?;
        let mut context = Self {
            trace_id: [0; 16],
            span_id: [0; 8],
        };
        hex::decode_to_slice(trace, &mut context.trace_id).ok()?;
        hex::decode_to_slice(span, &mut context.span_id).ok()?;
        Some(context)
    }

    /// Makes `span` (not yet entered) a child of this context's span, when exporting.
    pub(crate) fn adopt(&self, span: &tracing::Span) {
        if !exporting() {
            return;
        }
        let remote = SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        // A span the layer does not see (filtered out) has nothing to adopt.
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
}

impl serde::Serialize for TraceContext {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_text())
    }
}

impl<'de> Deserialize<'de> for TraceContext {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Self::from_text(&text)
            .ok_or_else(|| serde::de::Error::custom("not a trace context (<32 hex>-<16 hex>)"))
    }
}

// ---------------------------------------------------------------------------------------------
// The layer and the exporter
// ---------------------------------------------------------------------------------------------

/// Whether spans are exported (set once, by [`start`]).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// The provider behind the layer: its processor is [`Deferred`] until [`start`].
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The batch processor [`start`] made.
static BATCH: OnceLock<BatchSpanProcessor<Tokio>> = OnceLock::new();

/// Whether spans are exported now.
pub(crate) fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The tracing layer that turns spans into OpenTelemetry spans, for the log subscriber. It
/// lets nothing through until [`start`] found a collector.
pub fn layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let provider = PROVIDER.get_or_init(|| {
        SdkTracerProvider::builder()
            .with_span_processor(Deferred)
            .with_resource(resource())
            .build()
    });
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("antler"))
        // Log events stay in the log; spans carry the attributes.
        .with_location(false)
        .with_threads(false)
        .with_filter(WhenExporting)
}

/// The service's resource: `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` as the SDK reads
/// them, the name `antler` when the environment gives none.
fn resource() -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|name| !name.trim().is_empty());
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name(SERVICE_NAME).build()
    }
}

/// Why exporting could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The endpoint is not an http(s) URL.
    #[error("{0}: {1}")]
    Endpoint(&'static str, String),
    /// The exporter could not be built.
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
}

/// Starts exporting to the configured collector, if any: `Ok(Some(endpoint))` when on (the
/// endpoint without credentials, for the log), `Ok(None)` when no collector is named. Needs a
/// tokio runtime. A second call changes nothing (a new endpoint needs a restart).
pub fn start(config: &TelemetryConfig) -> Result<Option<String>, TelemetryError> {
    let Some(endpoint) = config.endpoint() else {
        return Ok(None);
    };
    let from = if config.otlp_endpoint.is_some() {
        "telemetry.otlp_endpoint"
    } else {
        ENDPOINT_VAR
    };
    check_endpoint(&endpoint).map_err(|e| TelemetryError::Endpoint(from, e))?;
    let shown = crate::secret::mask_url(&endpoint);
    if BATCH.get().is_some() {
        return Ok(Some(shown));
    }
    use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
    let client = reqwest::Client::builder()
        .timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{endpoint}/v1/traces"))
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let mut batch = BatchSpanProcessor::builder(exporter, Tokio).build();
    batch.set_resource(&resource());
    if BATCH.set(batch).is_ok() {
        EXPORTING.store(true, Ordering::Relaxed);
        // Span callsites decided before may change their interest now.
        tracing::callsite::rebuild_interest_cache();
    }
    Ok(Some(shown))
}

/// Sends the spans still waiting and stops exporting (waiting [`FLUSH_WAIT`] at most). For the
/// end of the process: later spans are not exported.
pub async fn shutdown() {
    if !EXPORTING.swap(false, Ordering::Relaxed) {
        return;
    }
    // The processor's flush blocks its caller until the runtime's export task answers.
    let flushed = tokio::task::spawn_blocking(|| {
        BATCH
            .get()
            .map(|batch| batch.shutdown_with_timeout(FLUSH_WAIT))
    });
    match tokio::time::timeout(FLUSH_WAIT + Duration::from_secs(1), flushed).await {
        Ok(Ok(Some(Err(e)))) => tracing::warn!(error = %e, "cannot send the last spans"),
        Ok(Ok(_)) => {}
        Ok(Err(_)) | Err(_) => tracing::warn!("sending the last spans did not finish"),
    }
}

/// The provider's processor: hands spans to the batch processor once [`start`] made one.
#[derive(Debug)]
struct Deferred;

impl SpanProcessor for Deferred {
    fn on_start(&self, span: &mut SdkSpan, cx: &opentelemetry::Context) {
        if let Some(batch) = BATCH.get() {
            batch.on_start(span, cx);
        }
    }

    fn on_end(&self, span: SpanData) {
        if let Some(batch) = BATCH.get() {
            if exporting() {
                batch.on_end(span);
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        BATCH.get().map_or(Ok(()), SpanProcessor::force_flush)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        BATCH
            .get()
            .map_or(Ok(()), |batch| batch.shutdown_with_timeout(timeout))
    }
}

/// The per-layer filter of [`layer`]: antler's own spans only, and only while exporting.
/// Libraries' spans stay out, the HTTP client's among them: the exporter's own requests must
/// not make spans to export.
struct WhenExporting;

/// Whether `meta` is one of antler's spans.
fn ours(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.target().split("::").next() == Some("antler")
}

impl<S> Filter<S> for WhenExporting {
    fn enabled(&self, meta: &Metadata<'_>, _: &LayerContext<'_, S>) -> bool {
        ours(meta) && exporting()
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if ours(meta) {
            // Decided per span: exporting starts after the callsites registered.
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }
}

#[cfg(test)]
mod tests;
