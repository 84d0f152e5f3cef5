//! The command's logs (plain text or JSON lines on stderr) and, for `outbox relay`, its
//! OpenTelemetry export: spans and metrics over OTLP/HTTP with protobuf, configured by the
//! standard `OTEL_*` variables (docs/operations.md, *Deploying the relay process*).
//!
//! Export is on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or a signal's own
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`) is set, and
//! `OTEL_SDK_DISABLED` is not `true`; `OTEL_TRACES_EXPORTER=none` or
//! `OTEL_METRICS_EXPORTER=none` turns one signal off. The SDK and the exporter read the rest
//! (`OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`,
//! `OTEL_METRIC_EXPORT_INTERVAL`). A setting this build cannot honour (another protocol, an
//! `https` endpoint, another exporter) stops the command at start with what to change, rather
//! than exporting nothing in silence.

use std::io::IsTerminal;
use std::time::Duration;

use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer;

use crate::args::LogFormat;
use crate::error::{CliError, Result};

/// The longest the process waits, at exit, for the exporters to send what they hold.
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The service name of the relay's spans and metrics when `OTEL_SERVICE_NAME` (or
/// `service.name` in `OTEL_RESOURCE_ATTRIBUTES`) does not give one.
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
pub const SERVICE_NAME: &str = "outbox-relay";

/// What was set up; [`shutdown`](Telemetry::shutdown) sends what the exporters still hold.
#[derive(Debug, Default)]
pub struct Telemetry {
    #[cfg(feature = "opentelemetry")]
    tracer_provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
    #[cfg(feature = "opentelemetry")]
    meter_provider: Option<opentelemetry_sdk::metrics::SdkMeterProvider>,
}

type BoxedLayer = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;
/// The layer [`init`] puts over the logs' layer: the OTLP span exporter's.
type SpansLayer = Box<
    dyn Layer<tracing_subscriber::layer::Layered<BoxedLayer, tracing_subscriber::Registry>>
        + Send
        + Sync,
>;

/// Installs the logs in `format` and, when `export` and the `OTEL_*` variables say so, the
/// OpenTelemetry exporters.
pub fn init(format: LogFormat, export: bool) -> Result<Telemetry> {
    let filter = EnvFilter::try_from_env("OUTBOX_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,typify_impl=warn,typify=warn"));
    let logs: BoxedLayer = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            // colour codes only on a terminal: a log file or a journal gets plain lines
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter)
            .boxed(),
        // one JSON object a line: timestamp, level, target, fields (with `message`), span
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(filter)
            .boxed(),
    };
    // the OTLP span exporter's layer, when spans are exported; layered beside the logs rather
    // than collected with them in a `Vec`: in a `Vec`, the logs' filter lost events once it
    // enabled a target below the default level (`OUTBOX_LOG=info,outbox_runtime=debug` showed
    // none of the relay's lines)
    let mut spans: Option<SpansLayer> = None;
    let mut telemetry = Telemetry::default();
    if export {
        let signals = Signals::from_env()?;
        if signals.any() {
            telemetry = otlp::start(&signals, &mut spans)?;
        }
    }
    tracing_subscriber::registry().with(logs).with(spans).init();
    Ok(telemetry)
}

impl Telemetry {
    /// The meter the relay's metrics go to over OTLP, when metrics are exported.
    #[cfg(feature = "opentelemetry")]
    pub fn meter(&self) -> Option<opentelemetry::metrics::Meter> {
        use opentelemetry::metrics::MeterProvider as _;
        self.meter_provider
            .as_ref()
            .map(|provider| provider.meter("outbox"))
    }

    /// Whether spans are exported.
    pub fn exports_traces(&self) -> bool {
        #[cfg(feature = "opentelemetry")]
        return self.tracer_provider.is_some();
        #[cfg(not(feature = "opentelemetry"))]
        false
    }

    /// Sends what the exporters hold, waiting at most [`FLUSH_TIMEOUT`] (an unreachable
    /// collector does not hold the exit up). Call it outside the async runtime.
    pub fn shutdown(self) {
        #[cfg(feature = "opentelemetry")]
        {
            if self.tracer_provider.is_none() && self.meter_provider.is_none() {
                return;
            }
            let (done, finished) = std::sync::mpsc::channel();
            let Telemetry {
                tracer_provider,
                meter_provider,
            } = self;
            // on a thread of its own: the metrics provider's shutdown waits for its exporter
            // without a deadline of its own
            std::thread::spawn(move || {
                let mut errors = Vec::new();
                if let Some(provider) = tracer_provider {
                    if let Err(e) = provider.shutdown_with_timeout(FLUSH_TIMEOUT) {
                        errors.push(format!("spans: {e}"));
                    }
                }
                if let Some(provider) = meter_provider {
                    if let Err(e) = provider.shutdown_with_timeout(FLUSH_TIMEOUT) {
                        errors.push(format!("metrics: {e}"));
                    }
                }
                let _ = done.send(errors);
            });
            match finished.recv_timeout(FLUSH_TIMEOUT) {
                Ok(errors) if errors.is_empty() => {}
                Ok(errors) => tracing::warn!(
                    errors = %errors.join("; "),
                    "the OTLP exporters could not send everything at exit"
                ),
                Err(_) => tracing::warn!(
                    timeout = ?FLUSH_TIMEOUT,
                    "the OTLP exporters did not finish sending at exit; the rest is dropped"
                ),
            }
        }
    }
}

/// Which signals the `OTEL_*` variables ask to export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Signals {
    traces: bool,
    metrics: bool,
}

impl Signals {
    fn any(&self) -> bool {
        self.traces || self.metrics
    }

    fn from_env() -> Result<Signals> {
        Signals::from(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    /// The signals `var` (a variable's non-empty value) asks for; an error for a setting this
    /// build cannot honour.
    fn from(var: impl Fn(&str) -> Option<String>) -> Result<Signals> {
        let refuse = |name: &str, value: &str, why: &str| {
            Err(CliError::Telemetry(format!(
                "{name}={value}: {why} (docs/operations.md, Deploying the relay process)"
            )))
        };
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(Signals {
                traces: false,
                metrics: false,
            });
        }
        let generic = var("OTEL_EXPORTER_OTLP_ENDPOINT");
        let mut signals = Signals {
            traces: false,
            metrics: false,
        };
        for (signal, on) in [
            ("TRACES", &mut signals.traces),
            ("METRICS", &mut signals.metrics),
        ] {
            let exporter_var = format!("OTEL_{signal}_EXPORTER");
            let exporter = var(&exporter_var).map(|v| v.trim().to_ascii_lowercase());
            match exporter.as_deref() {
                None | Some("otlp") => {}
                Some("none") => continue,
                Some(other) => {
                    return refuse(
                        &exporter_var,
                        other,
                        "this build exports over OTLP only; use `otlp` or `none`",
                    )
                }
            }
            let endpoint_var = format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT");
            let Some((name, endpoint)) = var(&endpoint_var)
                .map(|e| (endpoint_var.as_str(), e))
                .or_else(|| generic.clone().map(|e| ("OTEL_EXPORTER_OTLP_ENDPOINT", e)))
            else {
                continue;
            };
            if !endpoint.trim().to_ascii_lowercase().starts_with("http://") {
                return refuse(
                    name,
                    &endpoint,
                    "give an http:// URL (OTLP/HTTP, a collector's port 4318); this build sends \
                     no TLS, so reach a collector beside the relay, which forwards over TLS",
                );
            }
            for protocol_var in [
                format!("OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"),
                "OTEL_EXPORTER_OTLP_PROTOCOL".to_owned(),
            ] {
                if let Some(protocol) = var(&protocol_var) {
                    if protocol.trim() != "http/protobuf" {
                        return refuse(
                            &protocol_var,
                            &protocol,
                            "this build exports OTLP over http/protobuf only; unset it or set \
                             it to http/protobuf",
                        );
                    }
                    break;
                }
            }
            *on = true;
        }
        Ok(signals)
    }
}

#[cfg(feature = "opentelemetry")]
mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{MetricExporter, Protocol, SpanExporter, WithExportConfig as _};
    use opentelemetry_sdk::metrics::SdkMeterProvider;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use opentelemetry_sdk::Resource;
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::Layer as _;

    use super::{Signals, SpansLayer, Telemetry, SERVICE_NAME};
    use crate::error::{CliError, Result};

    pub(super) fn start(signals: &Signals, spans: &mut Option<SpansLayer>) -> Result<Telemetry> {
        let failed = |signal: &str, e: &dyn std::fmt::Display| {
            CliError::Telemetry(format!("cannot set up the OTLP {signal} exporter: {e}"))
        };
        let resource = resource();
        let mut telemetry = Telemetry::default();
        if signals.traces {
            let exporter = SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .build()
                .map_err(|e| failed("span", &e))?;
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource.clone())
                .build();
            // the relay's spans only (`outbox.publish` at info; `outbox.batch` is at debug):
            // no other crate's spans or events reach the exporter
            let targets = Targets::new().with_target("outbox_runtime", LevelFilter::INFO);
            *spans = Some(
                tracing_opentelemetry::layer()
                    .with_tracer(provider.tracer("outbox"))
                    .with_filter(targets)
                    .boxed(),
            );
            telemetry.tracer_provider = Some(provider);
        }
        if signals.metrics {
            let exporter = MetricExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .build()
                .map_err(|e| failed("metric", &e))?;
            telemetry.meter_provider = Some(
                SdkMeterProvider::builder()
                    .with_periodic_exporter(exporter)
                    .with_resource(resource)
                    .build(),
            );
        }
        Ok(telemetry)
    }

    /// The SDK's resource (the `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` variables
    /// included), named [`SERVICE_NAME`] unless those name it.
    fn resource() -> Resource {
        let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
            || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| {
                v.split(',')
                    .any(|kv| kv.trim().starts_with("service.name="))
            });
        let builder = Resource::builder();
        if named {
            builder.build()
        } else {
            builder.with_service_name(SERVICE_NAME).build()
        }
    }
}

#[cfg(not(feature = "opentelemetry"))]
mod otlp {
    use super::{Signals, SpansLayer, Telemetry};
    use crate::error::Result;

    pub(super) fn start(_: &Signals, _: &mut Option<SpansLayer>) -> Result<Telemetry> {
        eprintln!(
            "warning: OTEL_EXPORTER_OTLP_ENDPOINT is set, but this outbox command was built without its `opentelemetry` feature: nothing is exported"
        );
        Ok(Telemetry::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signals(vars: &[(&str, &str)]) -> Result<Signals> {
        Signals::from(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    const ENDPOINT: (&str, &str) = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");

    #[test]
    fn the_endpoint_turns_both_signals_on_and_none_turns_one_off() {
        let both = Signals {
            traces: true,
            metrics: true,
        };
        assert_eq!(
            signals(&[]).unwrap(),
            Signals {
                traces: false,
                metrics: false
            }
        );
        assert_eq!(signals(&[ENDPOINT]).unwrap(), both);
        assert_eq!(
            signals(&[ENDPOINT, ("OTEL_METRICS_EXPORTER", "none")]).unwrap(),
            Signals {
                traces: true,
                metrics: false
            }
        );
        assert_eq!(
            signals(&[(
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                "http://c:4318/v1/metrics"
            )])
            .unwrap(),
            Signals {
                traces: false,
                metrics: true
            }
        );
        assert!(!signals(&[ENDPOINT, ("OTEL_SDK_DISABLED", "true")])
            .unwrap()
            .any());
        assert_eq!(
            signals(&[ENDPOINT, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]).unwrap(),
            both
        );
    }

    #[test]
    fn settings_this_build_cannot_honour_are_refused_by_name() {
        for (vars, named) in [
            (
                vec![ENDPOINT, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
            ),
            (
                vec![
                    ENDPOINT,
                    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
                ],
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT=https://collector:4318",
            ),
            (
                vec![ENDPOINT, ("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTEL_TRACES_EXPORTER=zipkin",
            ),
        ] {
            let err = signals(&vars).unwrap_err().to_string();
            assert!(err.contains(named), "{named} not in: {err}");
        }
    }
}
