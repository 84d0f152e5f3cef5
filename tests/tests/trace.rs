//! Trace context from the request to the consumer, exported by OpenTelemetry's in-memory span
//! exporter, against a real Postgres and a real nats-server: the example service's HTTP request,
//! the emit in its transaction, the relay's publish span and the consumer's handler span are one
//! trace with the right parents; an event emitted outside any span gets a trace of its own; and a
//! relay on a table without the trace context columns (migration 0007 not applied) publishes and
//! says so once.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::{SpanId, SpanKind, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox_runtime::trace::TraceContext;
use outbox_runtime::{EmitExt, Relay, RelayConfig};
use outbox_testkit::suite::Ctx;
use outbox_testkit::{connect_nats, eventually, nats_url, unique_token, NatsServer, TestDb};
use outbox_tests::warnings::Warnings;
use serde_json::{json, Value};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::Layer as _;
use uuid::Uuid;

/// The process's exporter: every span of `outbox_runtime` and the example service, from every
/// test of this binary (each test finds its own by its event id).
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    &EXPORTER
        .get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let targets = tracing_subscriber::filter::Targets::new()
                .with_target("outbox_runtime", tracing::Level::TRACE)
                .with_target("subscriptions", tracing::Level::TRACE);
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("outbox-tests"))
                .with_filter(targets);
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
                .expect("the only global subscriber of this binary");
            (exporter, provider)
        })
        .0
}

fn finished() -> Vec<SpanData> {
    exporter().get_finished_spans().expect("the exported spans")
}

/// The value of attribute `key` of `span`, as a string.
fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

/// The one finished span named `name` whose attribute `key` is `value`, once it is exported.
async fn span_of(name: &str, key: &str, value: &str) -> SpanData {
    let find = || {
        let mut found: Vec<SpanData> = finished()
            .into_iter()
            .filter(|s| s.name == name && attr(s, key).as_deref() == Some(value))
            .collect();
        assert!(found.len() <= 1, "one {name} span of {value}: {found:#?}");
        found.pop()
    };
    eventually(
        Duration::from_secs(20),
        &format!("the {name} span of {value} ends"),
        || async { find().is_some() },
    )
    .await;
    find().expect("found above")
}

fn parse(traceparent: &str) -> (TraceId, SpanId) {
    let cx = TraceContext::parse(traceparent, None)
        .unwrap_or_else(|| panic!("`{traceparent}` is a W3C traceparent"));
    (
        TraceId::from_hex(cx.trace_id()).expect("a trace id"),
        SpanId::from_hex(cx.span_id()).expect("a span id"),
    )
}

/// The `traceparent` of `span`.
fn traceparent_of(span: &SpanData) -> String {
    TraceContext::of_span_context(&span.span_context)
        .expect("a valid span context")
        .traceparent()
        .to_owned()
}

/// The example service on a fresh database and a private nats-server.
struct Service {
    db: TestDb,
    nats: NatsServer,
    js: async_nats::jetstream::Context,
    running: Option<subscriptions::Running>,
    base: String,
}

impl Service {
    async fn start() -> Service {
        exporter();
        let db = TestDb::empty().await;
        let nats = NatsServer::spawn().await;
        let mut config = subscriptions::Config::from_env().expect("config");
        config.database_url = db.url();
        config.nats_url = nats.url();
        config.bind = "127.0.0.1:0".parse().expect("addr");
        let running = subscriptions::start(config)
            .await
            .expect("the service starts");
        let base = format!("http://{}", running.addr);
        let js = async_nats::jetstream::new(connect_nats(&nats.url()).await);
        Service {
            db,
            nats,
            js,
            running: Some(running),
            base,
        }
    }

    /// The stored trace context of event `id`.
    async fn stored(&self, id: Uuid) -> (Option<String>, Option<String>) {
        sqlx::query_as("select traceparent, tracestate from outbox_events where id = $1")
            .bind(id)
            .fetch_one(&self.db.pool)
            .await
            .expect("the event's row")
    }

    /// Waits for the welcome intent of `event_id`, the consumer's effect.
    async fn welcomed(&self, event_id: Uuid) {
        eventually(
            Duration::from_secs(20),
            "the consumer records the welcome intent",
            || async {
                sqlx::query_scalar::<_, i64>(
                    "select count(*) from welcome_intents where event_id = $1",
                )
                .bind(event_id)
                .fetch_one(&self.db.pool)
                .await
                .expect("count")
                    == 1
            },
        )
        .await;
    }

    /// The stored message of event `id`: its envelope and its `traceparent` header.
    async fn message(&self, id: Uuid) -> (outbox_runtime::Envelope, Option<String>) {
        let stream = self
            .js
            .get_stream(subscriptions::STREAM)
            .await
            .expect("the stream");
        let last = stream
            .get_info()
            .await
            .expect("stream info")
            .state
            .last_sequence;
        for seq in 1..=last {
            let message = stream.get_raw_message(seq).await.expect("a message");
            let envelope: outbox_runtime::Envelope =
                serde_json::from_slice(&message.payload).expect("an envelope");
            if envelope.id == id {
                let header = message
                    .headers
                    .get("traceparent")
                    .map(|v| v.as_str().to_owned());
                return (envelope, header);
            }
        }
        panic!("no message of {id} in the stream");
    }

    async fn stop(mut self) {
        let running = self.running.take().expect("running");
        tokio::time::timeout(Duration::from_secs(15), running.stop())
            .await
            .expect("graceful shutdown completes")
            .expect("clean shutdown");
        drop(self.nats);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_one_trace_from_http_through_emit_and_publish_to_the_handler() {
    let s = Service::start().await;
    // the caller's own span, as an instrumented HTTP client sends it
    let caller = format!(
        "00-{}-{:016x}-01",
        Uuid::new_v4().simple(),
        Uuid::new_v4().as_u64_pair().0 | 1
    );
    let (trace_id, caller_span) = parse(&caller);
    let response = reqwest::Client::new()
        .post(format!("{}/v1/subscriptions", s.base))
        .header("traceparent", &caller)
        .json(&json!({ "customer_id": Uuid::now_v7(), "plan": "pro", "seats": 2 }))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), reqwest::StatusCode::CREATED);
    let created: Value = response.json().await.expect("a JSON body");
    let event_id: Uuid = created["event_id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .expect("an event id");
    s.welcomed(event_id).await;
    let id = event_id.to_string();

    // the handler's span ends after its ack; the publish span ended at the broker's ack
    let consume = span_of("outbox.consume", "event_id", &id).await;
    let publish = span_of("outbox.publish", "messaging.message.id", &id).await;
    let emit = span_of("outbox.emit", "id", &id).await;
    let spans = finished();
    let http = spans
        .iter()
        .find(|s| s.name == "http.request" && s.span_context.span_id() == emit.parent_span_id)
        .expect("the emit ran in the request's span");

    // one trace: the caller's
    for span in [http, &emit, &publish, &consume] {
        assert_eq!(span.span_context.trace_id(), trace_id, "{}", span.name);
    }
    // request -> emit, request -> publish (the emit-time span), publish -> handler
    assert_eq!(http.parent_span_id, caller_span);
    assert!(http.parent_span_is_remote);
    assert_eq!(http.span_kind, SpanKind::Server);
    assert_eq!(attr(http, "url.path").as_deref(), Some("/v1/subscriptions"));
    assert_eq!(
        publish.parent_span_id,
        http.span_context.span_id(),
        "the publish span's parent is the span the event was emitted in"
    );
    assert!(publish.parent_span_is_remote, "it came through the table");
    assert_eq!(publish.span_kind, SpanKind::Producer);
    assert_eq!(
        attr(&publish, "messaging.destination.name").as_deref(),
        Some("billing.subscription.created")
    );
    assert_eq!(
        consume.parent_span_id,
        publish.span_context.span_id(),
        "the handler's span continues the message's publish span"
    );
    assert!(consume.parent_span_is_remote, "it came through NATS");
    assert_eq!(consume.span_kind, SpanKind::Consumer);
    assert!(consume.start_time >= publish.start_time);

    // the batch span links to the message's span
    let batch = spans
        .iter()
        .find(|s| {
            s.name == "outbox.batch"
                && s.links
                    .links
                    .iter()
                    .any(|l| l.span_context.span_id() == publish.span_context.span_id())
        })
        .expect("a batch span links to the publish span");
    assert_ne!(
        batch.span_context.trace_id(),
        trace_id,
        "linked, not parent"
    );

    // what carried it: the row, the envelope's extension attributes, the message's header
    let emitted = traceparent_of(http);
    assert_eq!(s.stored(event_id).await, (Some(emitted.clone()), None));
    let (envelope, header) = s.message(event_id).await;
    assert_eq!(envelope.traceparent.as_deref(), Some(emitted.as_str()));
    assert_eq!(envelope.tracestate, None);
    assert_eq!(header, Some(traceparent_of(&publish)));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_emitted_outside_any_span_gets_a_trace_of_its_own() {
    use subscriptions::events::{Plan, SubscriptionCreated};

    let s = Service::start().await;
    let mut tx = s.db.pool.begin().await.expect("begin");
    let event_id = tx
        .emit(SubscriptionCreated {
            subscription_id: Uuid::now_v7(),
            customer_id: Uuid::now_v7(),
            plan: Plan::Free,
            seats: std::num::NonZeroU64::new(1).expect("one"),
            started_at: chrono::Utc::now(),
            trial: None,
        })
        .await
        .expect("emit");
    tx.commit().await.expect("commit");
    s.welcomed(event_id).await;
    assert_eq!(s.stored(event_id).await, (None, None), "nothing to store");

    let id = event_id.to_string();
    let consume = span_of("outbox.consume", "event_id", &id).await;
    let publish = span_of("outbox.publish", "messaging.message.id", &id).await;
    assert_eq!(
        publish.parent_span_id,
        SpanId::INVALID,
        "the relay starts a new root"
    );
    let trace_id = publish.span_context.trace_id();
    assert_eq!(consume.span_context.trace_id(), trace_id);
    assert_eq!(consume.parent_span_id, publish.span_context.span_id());
    let mut in_trace: Vec<String> = finished()
        .iter()
        .filter(|s| s.span_context.trace_id() == trace_id)
        .map(|s| s.name.to_string())
        .collect();
    in_trace.sort_unstable();
    assert_eq!(
        in_trace,
        ["outbox.consume", "outbox.publish"],
        "a trace of its own"
    );

    let (envelope, header) = s.message(event_id).await;
    assert_eq!((envelope.traceparent, envelope.tracestate), (None, None));
    assert_eq!(header, Some(traceparent_of(&publish)));
    s.stop().await;
}

/// The warnings about trace context.
fn about_traces(warnings: &Warnings) -> Vec<String> {
    let mut all = warnings.messages();
    all.retain(|m| m.contains("trace context"));
    all
}

/// The seed's table and the rest of the outbox's migrations, without 0007.
const BEFORE_TRACES: [&str; 11] = [
    include_str!("../../migrations/0001_outbox_events.sql"),
    include_str!("../../migrations/0002_outbox_consumer.sql"),
    include_str!("../../migrations/0003_outbox_retrying_idx.sql"),
    include_str!("../../migrations/0004_outbox_events_fillfactor.sql"),
    include_str!("../../migrations/0005_outbox_retries.sql"),
    include_str!("../../migrations/0006_consumer_attempts.sql"),
    include_str!("../../migrations/0008_outbox_relays.sql"),
    include_str!("../../migrations/0009_outbox_published_idx.sql"),
    include_str!("../../migrations/0011_outbox_relay_lease.sql"),
    include_str!("../../migrations/0012_outbox_unpublished_subject_idx.sql"),
    include_str!("../../migrations/0013_outbox_drop_retrying_idx.sql"),
];

// A current-thread runtime: the relay, its pool and its NATS client run on the test's thread,
// where the warning-recording subscriber is the default.
#[tokio::test]
async fn a_relay_on_a_table_without_the_trace_columns_publishes_and_says_so_once() {
    let warnings = Warnings::default();
    let _recording = warnings.record();
    let client = connect_nats(&nats_url()).await;
    let s = Ctx {
        db: TestDb::empty().await,
        js: async_nats::jetstream::new(client.clone()),
        client,
        prefix: unique_token(),
    };
    for migration in BEFORE_TRACES {
        sqlx::raw_sql(migration)
            .execute(s.pool())
            .await
            .expect("migrate");
    }
    let columns: Vec<String> = sqlx::query_scalar(
        "select column_name::text from information_schema.columns where table_name = 'outbox_events' order by ordinal_position",
    )
    .fetch_all(s.pool())
    .await
    .expect("columns");
    assert_eq!(
        columns,
        [
            "id",
            "event_type",
            "source",
            "subject",
            "time",
            "data",
            "created_at",
            "published_at",
            "attempts"
        ],
        "the seed's columns only"
    );
    s.ensure_stream().await;
    let event_type = s.event_type("account.opened");

    // emitting with the feature needs the columns, and says which migration adds them
    let schemas = outbox_testkit::open_schemas(std::slice::from_ref(&event_type));
    let mut tx = s.pool().begin().await.expect("begin");
    let refused = tx
        .emit_raw(
            &schemas,
            outbox_testkit::raw_event(&event_type, "accounts", "a-1").build(),
        )
        .await
        .expect_err("no trace columns to write");
    assert!(
        matches!(
            refused,
            outbox_runtime::Error::MissingColumn {
                column: "traceparent",
                migration: "0007_outbox_trace_context.sql",
                ..
            }
        ),
        "{refused}"
    );
    drop(tx);

    // the contract's own insert, as a writer without the feature (or another language) sends it
    let id = Uuid::now_v7();
    sqlx::query(
        "insert into outbox_events (id, event_type, source, subject, time, data) values ($1, $2, 'accounts', 'a-1', now(), '{\"n\": 1}')",
    )
    .bind(id)
    .bind(&event_type)
    .execute(s.pool())
    .await
    .expect("insert");

    let config = RelayConfig {
        event_types: vec![event_type.clone()],
        ..RelayConfig::default()
    };
    let relay = Relay::new(s.db.new_pool(4).await, s.js.clone(), config.clone())
        .await
        .expect("the relay starts without the trace columns");
    assert!(!relay.carries_trace_context());
    let said = about_traces(&warnings);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("traces will not be carried") && said[0].contains("0007"),
        "{}",
        said[0]
    );

    let report = relay.run_once().await.expect("a batch");
    assert_eq!(report.published, 1, "{report:?}");
    assert_eq!(relay.run_once().await.expect("a batch").claimed, 0);
    let published: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("select published_at from outbox_events where id = $1")
            .bind(id)
            .fetch_one(s.pool())
            .await
            .expect("the row");
    assert!(published.is_some(), "marked published");
    let stored = s.read_stream().await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].envelope.id, id);
    assert_eq!(stored[0].envelope.traceparent, None);
    assert_eq!(about_traces(&warnings).len(), 1, "said once, at start");

    // with migration 0007 applied, a relay carries them and says nothing
    sqlx::raw_sql(include_str!(
        "../../migrations/0007_outbox_trace_context.sql"
    ))
    .execute(s.pool())
    .await
    .expect("migrate 0007");
    let relay = Relay::new(s.db.new_pool(4).await, s.js.clone(), config)
        .await
        .expect("the relay starts");
    assert!(relay.carries_trace_context());
    assert_eq!(about_traces(&warnings).len(), 1, "nothing more to say");
    s.delete_stream().await;
}
