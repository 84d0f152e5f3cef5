//! `outbox relay`'s OpenTelemetry export: its spans and metrics reach an OTLP/HTTP receiver
//! (one in the test, decoding the protobuf it gets), the trace an event was emitted in
//! continued by its publish span; and its JSON log lines parse.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, Span};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{emit_committed, eventually, open_schemas, raw_event};
use prost::Message as _;
use uuid::Uuid;

use crate::support::{db_url, nats_url, relay_args, Running, PATIENCE};

/// What the OTLP receiver got, decoded.
#[derive(Debug, Default)]
struct Received {
    traces: Vec<ExportTraceServiceRequest>,
    metrics: Vec<ExportMetricsServiceRequest>,
    /// `path content-type` of every request.
    requests: Vec<String>,
}

impl Received {
    fn spans(&self) -> Vec<(&Span, Vec<&KeyValue>)> {
        let mut out = Vec::new();
        for request in &self.traces {
            for resource_spans in &request.resource_spans {
                let resource: Vec<&KeyValue> = resource_spans
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .collect();
                for scope in &resource_spans.scope_spans {
                    for span in &scope.spans {
                        out.push((span, resource.clone()));
                    }
                }
            }
        }
        out
    }

    /// The latest value of counter `name` per value of its attribute `label`.
    fn counter(&self, name: &str, label: &str) -> HashMap<String, i64> {
        let mut out = HashMap::new();
        for request in &self.metrics {
            for resource in &request.resource_metrics {
                for scope in &resource.scope_metrics {
                    for m in scope.metrics.iter().filter(|m| m.name == name) {
                        let Some(metric::Data::Sum(sum)) = &m.data else {
                            continue;
                        };
                        for point in &sum.data_points {
                            let value = match point.value {
                                Some(number_data_point::Value::AsInt(v)) => v,
                                Some(number_data_point::Value::AsDouble(v)) => v as i64,
                                None => continue,
                            };
                            if let Some(key) = attribute(&point.attributes, label) {
                                out.insert(key, value);
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

fn attribute<'a>(attributes: impl IntoIterator<Item = &'a KeyValue>, key: &str) -> Option<String> {
    attributes
        .into_iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .map(|v| match v {
            any_value::Value::StringValue(s) => s.clone(),
            other => format!("{other:?}"),
        })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A tiny OTLP/HTTP receiver on a free loopback port: decodes what is POSTed to `/v1/traces`
/// and `/v1/metrics` and answers with an empty (successful) export response.
async fn otlp_receiver() -> (String, Arc<Mutex<Received>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the receiver");
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let received = Arc::new(Mutex::new(Received::default()));
    let store = received.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let store = store.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        let store = store.clone();
                        async move {
                            let path = request.uri().path().to_owned();
                            let content_type = request
                                .headers()
                                .get("content-type")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_owned();
                            let body: Bytes = request.into_body().collect().await?.to_bytes();
                            let mut r = store.lock().unwrap();
                            r.requests.push(format!("{path} {content_type}"));
                            match path.as_str() {
                                "/v1/traces" => r.traces.push(
                                    ExportTraceServiceRequest::decode(body).expect("OTLP spans"),
                                ),
                                "/v1/metrics" => r.metrics.push(
                                    ExportMetricsServiceRequest::decode(body)
                                        .expect("OTLP metrics"),
                                ),
                                other => panic!("the relay posted to {other}"),
                            }
                            let mut response = hyper::Response::new(Full::new(Bytes::new()));
                            response.headers_mut().insert(
                                "content-type",
                                hyper::header::HeaderValue::from_static("application/x-protobuf"),
                            );
                            Ok::<_, hyper::Error>(response)
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (endpoint, received)
}

#[tokio::test]
async fn relay_sends_publish_spans_in_the_emits_trace_and_metrics_over_otlp_and_logs_json() {
    use opentelemetry::trace::TracerProvider as _;
    use tracing::Instrument as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    let ctx = Ctx::new().await;
    ctx.ensure_stream().await;
    let event_type = ctx.event_type("traced.row.changed");
    let schemas = open_schemas(std::slice::from_ref(&event_type));

    // The emitting service: a span of its own (an OpenTelemetry layer in this process), and
    // an emit inside it, which stores the span's context with the row.
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test-service")));
    let (traced, emit_span) = {
        let _default = tracing::subscriber::set_default(subscriber);
        let span = tracing::info_span!("checkout");
        let cx = outbox_runtime::trace::TraceContext::of_span(&span).expect("an OTel context");
        let event = raw_event(&event_type, "cli-test", "order-1").numbered(1);
        let id = emit_committed(ctx.pool(), &schemas, event)
            .instrument(span)
            .await;
        (id, cx)
    };
    // and one emitted outside any trace
    let untraced = emit_committed(
        ctx.pool(),
        &schemas,
        raw_event(&event_type, "cli-test", "order-2").numbered(2),
    )
    .await;

    let (endpoint, received) = otlp_receiver().await;
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
    ];
    let (url, nats) = (db_url(&ctx.db), nats_url());
    // with Prometheus too: each metric goes to both
    let addr = format!("127.0.0.1:{}", outbox_testkit::free_port());
    let args = relay_args(
        &url,
        &nats,
        &["--log-format", "json", "--metrics-addr", &addr],
    );
    let mut relay = Running::spawn_with_env(args, &env);
    eventually(PATIENCE, "the relay to publish both events", || async {
        ctx.db.unpublished().await == 0
    })
    .await;
    eventually(
        PATIENCE,
        "the published counter to reach the receiver",
        || {
            let counts = received
                .lock()
                .unwrap()
                .counter("outbox_events_published_total", "event_type");
            std::future::ready(counts.get(&event_type) == Some(&2))
        },
    )
    .await;
    let scraped = tokio::process::Command::new("curl")
        .args(["-s", "-m", "5", &format!("http://{addr}/metrics")])
        .output()
        .await
        .expect("run curl");
    let scraped = String::from_utf8_lossy(&scraped.stdout);
    assert!(
        scraped.contains(&format!(
            "outbox_events_published_total{{event_type=\"{event_type}\"}} 2"
        )),
        "Prometheus has the counter too:\n{scraped}"
    );
    relay.terminate();
    assert_eq!(relay.wait().await, Some(0), "{}", relay.stderr());

    // Spans: sent before the exit at the latest (the exporter is flushed on SIGTERM).
    let received = std::mem::take(&mut *received.lock().unwrap());
    for request in &received.requests {
        assert!(
            request.ends_with(" application/x-protobuf"),
            "OTLP/HTTP with protobuf: {request}"
        );
    }
    let spans = received.spans();
    let publish: HashMap<String, (&Span, &Vec<&KeyValue>)> = spans
        .iter()
        .filter(|(s, _)| s.name == "outbox.publish")
        .filter_map(|(s, r)| Some((attribute(&s.attributes, "messaging.message.id")?, (*s, r))))
        .collect();
    let (span, resource) = publish
        .get(&traced.to_string())
        .unwrap_or_else(|| panic!("no publish span of {traced}: {spans:#?}"));
    assert_eq!(span.kind, SpanKind::Producer as i32);
    assert_eq!(
        attribute(&span.attributes, "messaging.destination.name").as_deref(),
        Some(event_type.as_str())
    );
    assert_eq!(
        attribute(resource.iter().copied(), "service.name").as_deref(),
        Some("outbox-relay")
    );
    // the trace begun at the emit goes on: same trace, the emit's span its parent
    assert_eq!(hex(&span.trace_id), emit_span.trace_id());
    assert_eq!(hex(&span.parent_span_id), emit_span.span_id());
    let (root, _) = publish
        .get(&untraced.to_string())
        .unwrap_or_else(|| panic!("no publish span of {untraced}: {spans:#?}"));
    assert!(
        root.parent_span_id.is_empty(),
        "an event emitted outside a trace starts one: {root:?}"
    );
    assert_ne!(hex(&root.trace_id), emit_span.trace_id());
    // the message carries the publish span's context to the consumer
    let messages = ctx.read_stream().await;
    let header_of = |id: Uuid| {
        messages
            .iter()
            .find(|m| m.envelope.id == id)
            .and_then(|m| m.envelope.traceparent.clone())
    };
    assert_eq!(
        header_of(traced).as_deref(),
        Some(emit_span.traceparent()),
        "the envelope keeps the emit's context"
    );

    // JSON log lines, every one of them.
    let log = relay.stderr();
    let mut messages = Vec::new();
    for line in log.lines() {
        let entry: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}\n{log}"));
        for key in ["timestamp", "level", "target"] {
            assert!(entry[key].is_string(), "no `{key}` in {line}");
        }
        messages.push(
            entry["fields"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    for expected in [
        "relay stopped cleanly",
        "sending the publish spans over OTLP",
    ] {
        assert!(
            messages.iter().any(|m| m == expected),
            "no `{expected}` line:\n{log}"
        );
    }
    ctx.delete_stream().await;
}
