//! Where the coordinator's spans and events go: the log (text or JSON
//! lines, filtered by `RUST_LOG`) and, in a build with the `otlp` cargo
//! feature, an OpenTelemetry collector over OTLP (HTTP/protobuf) when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set. The standard `OTEL_*` variables configure the exporter
//! (`OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`,
//! `OTEL_SERVICE_NAME`, ...).
//!
//! Trace context: a request carrying a W3C `traceparent` gets `trace_id`
//! and `traceparent` fields on its span; with the exporter, the span is also
//! made a child of the producer's span, so the backend shows the
//! coordinator's part inside the producer's trace.

use runlease_protocol::TraceParent;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keeps the exporter running; dropping it sends the spans still buffered.
#[must_use = "dropping the guard stops the span exporter"]
pub struct Telemetry {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        #[cfg(feature = "otlp")]
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("runlease-coordinator: flushing spans to the OTLP collector failed: {e}");
        }
    }
}

/// Whether an OTLP endpoint is configured in the environment.
pub fn otlp_endpoint() -> Option<String> {
    [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
}

/// Starts tracing: `RUST_LOG` filters (default `info`), JSON lines when
/// `json`; spans exported over OTLP when built with `otlp` and an endpoint
/// is set. Call once, at start-up; keep the answer until exit.
pub fn init(json: bool) -> Telemetry {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Standard error, as documented; colours only for a person at a
    // terminal (escape codes cost a tenth of the coordinator's CPU at high
    // job rates, and are noise in a collected log).
    let fmt = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .boxed()
    };
    let registry = tracing_subscriber::registry().with(filter).with(fmt);
    #[cfg(feature = "otlp")]
    {
        let (layer, provider, error) = match otlp_endpoint() {
            None => (None, None, None),
            Some(endpoint) => match otlp::layer() {
                Ok((layer, provider)) => (Some(layer), Some(provider), Some(Ok(endpoint))),
                Err(e) => (None, None, Some(Err(e))),
            },
        };
        let _ = registry.with(layer).try_init();
        match error {
            Some(Ok(endpoint)) => tracing::info!(%endpoint, "exporting spans over OTLP (HTTP/protobuf)"),
            Some(Err(e)) => {
                tracing::error!(error = %e, "cannot start the OTLP span exporter; spans go to the log only")
            }
            None => {}
        }
        Telemetry { provider }
    }
    #[cfg(not(feature = "otlp"))]
    {
        let _ = registry.try_init();
        if let Some(endpoint) = otlp_endpoint() {
            tracing::warn!(
                %endpoint,
                "OTEL_EXPORTER_OTLP_ENDPOINT is set, but this coordinator was built without the `otlp` cargo feature: spans go to the log only"
            );
        }
        Telemetry {}
    }
}

/// Makes `span` part of the producer's trace: records `trace_id` and
/// `traceparent` on it (fields it must declare) and, with the OTLP
/// exporter, sets the producer's span as its parent.
pub fn join_trace(span: &tracing::Span, traceparent: &TraceParent) {
    span.record("trace_id", traceparent.trace_id());
    span.record("traceparent", traceparent.as_str());
    #[cfg(feature = "otlp")]
    otlp::set_parent(span, traceparent);
}

#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider,
    };
    use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use runlease_protocol::TraceParent;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    /// The tracing layer that exports spans, and its provider (to flush at exit).
    pub fn layer<S>() -> Result<
        (
            tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>,
            SdkTracerProvider,
        ),
        String,
    >
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        let exporter = SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build()
            .map_err(|e| e.to_string())?;
        // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override the name.
        let resource = Resource::builder()
            .with_service_name("runlease-coordinator")
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("runlease-coordinator");
        Ok((tracing_opentelemetry::layer().with_tracer(tracer), provider))
    }

    /// Sets the producer's span (remote) as the parent of `span`.
    pub fn set_parent(span: &tracing::Span, traceparent: &TraceParent) {
        let (Ok(trace_id), Ok(span_id)) = (
            TraceId::from_hex(traceparent.trace_id()),
            SpanId::from_hex(traceparent.parent_id()),
        ) else {
            return;
        };
        let flags = if traceparent.sampled() {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let remote = SpanContext::new(trace_id, span_id, flags, true, TraceState::default());
        let cx = opentelemetry::Context::new().with_remote_span_context(remote);
        // Fails only when the span is disabled or already started a trace of
        // its own; the fields above still carry the trace id.
        let _ = span.set_parent(cx);
    }
}
