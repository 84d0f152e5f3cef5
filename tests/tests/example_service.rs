//! The example service end to end over HTTP, against a real Postgres and a private
//! nats-server: the contract's sequence diagram (request, transaction, 201, relay, stream,
//! consumer), a request that rolls back publishing nothing, and bad requests answered 4xx;
//! and the operations files (ops/) use only metric names the running service exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use outbox_testkit::{connect_nats, eventually, read_stream, NatsServer, TestDb};
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

struct Service {
    db: TestDb,
    nats: NatsServer,
    js: async_nats::jetstream::Context,
    running: Option<subscriptions::Running>,
    base: String,
    http: reqwest::Client,
}

async fn start() -> Service {
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
        http: reqwest::Client::new(),
    }
}

impl Service {
    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = response.status();
        (status, response.json().await.expect("a JSON body"))
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("request");
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn outbox_rows(&self) -> i64 {
        sqlx::query_scalar("select count(*) from outbox_events")
            .fetch_one(&self.db.pool)
            .await
            .expect("count")
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
async fn the_sequence_diagram_end_to_end() {
    let s = start().await;
    let customer = Uuid::now_v7();
    let (status, created) = s
        .post("/v1/subscriptions", json!({ "customer_id": customer, "plan": "pro", "seats": 3, "trial_days": 14, "coupon": "WELCOME10" }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["subscription_id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let event_id = created["event_id"]
        .as_str()
        .expect("an event id")
        .to_owned();

    // The consumer records the welcome intent from the published event.
    eventually(
        Duration::from_secs(15),
        "the welcome intent is recorded",
        || async {
            s.get(&format!("/v1/subscriptions/{id}")).await.1["welcome_intent_event_id"]
                == json!(event_id)
        },
    )
    .await;

    let (status, changed) = s
        .post(
            &format!("/v1/subscriptions/{id}/plan"),
            json!({ "plan": "enterprise" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    let (status, cancelled) = s
        .post(
            &format!("/v1/subscriptions/{id}/cancel"),
            json!({ "reason": "customer_request", "comment": "moving" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    let (status, again) = s
        .post(
            &format!("/v1/subscriptions/{id}/cancel"),
            json!({ "reason": "fraud" }),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{again}");

    eventually(
        Duration::from_secs(15),
        "three events on the stream",
        || async { read_stream(&s.js, subscriptions::STREAM).await.len() == 3 },
    )
    .await;
    let events = read_stream(&s.js, subscriptions::STREAM).await;
    let types: Vec<&str> = events
        .iter()
        .map(|d| d.envelope.event_type.as_str())
        .collect();
    assert_eq!(
        types,
        [
            "billing.subscription.created",
            "billing.subscription.plan_changed",
            "billing.subscription.cancelled"
        ],
        "published in order for the subscription"
    );
    let first = &events[0];
    assert_eq!(first.envelope.id.to_string(), event_id);
    assert_eq!(first.msg_id, event_id);
    assert_eq!(first.content_type, "application/cloudevents+json");
    assert_eq!(first.envelope.source, "billing");
    assert_eq!(first.envelope.subject, id);
    assert_eq!(first.envelope.data["seats"], json!(3));
    assert_eq!(first.envelope.data["trial"]["coupon"], json!("WELCOME10"));
    assert_eq!(events[1].envelope.data["to_plan"], json!("enterprise"));
    assert_eq!(events[2].envelope.data["effective"], json!("immediately"));

    let metrics = s
        .http
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status(), StatusCode::OK);
    let text = metrics.text().await.expect("text");
    assert!(text.contains("outbox_events_published_total"), "{text}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_request_publishes_nothing() {
    let s = start().await;
    let customer = Uuid::now_v7();
    let (status, kept) = s
        .post(
            "/v1/subscriptions",
            json!({ "customer_id": customer, "plan": "enterprise", "seats": 9000 }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{kept}");
    // Past the customer's seat limit: the row and its event were written, then rolled back.
    let (status, refused) = s
        .post(
            "/v1/subscriptions",
            json!({ "customer_id": customer, "plan": "pro", "seats": 2000 }),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"], "seat_limit");

    eventually(
        Duration::from_secs(15),
        "the committed event is published",
        || async { read_stream(&s.js, subscriptions::STREAM).await.len() == 1 },
    )
    .await;
    // Give a wrongly published event every chance to show up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = read_stream(&s.js, subscriptions::STREAM).await;
    assert_eq!(events.len(), 1, "only the committed request's event");
    assert_eq!(
        events[0].envelope.id.to_string(),
        kept["event_id"].as_str().expect("id")
    );
    assert_eq!(s.outbox_rows().await, 1);
    let subs: i64 = sqlx::query_scalar("select count(*) from subscriptions")
        .fetch_one(&s.db.pool)
        .await
        .expect("count");
    assert_eq!(subs, 1);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_a_json_4xx_and_write_nothing() {
    let s = start().await;
    let customer = Uuid::now_v7().to_string();
    let cases: Vec<(Value, StatusCode, &str)> = vec![
        (
            json!({ "customer_id": "nope", "plan": "pro", "seats": 1 }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({ "customer_id": customer, "plan": "gold", "seats": 1 }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({ "customer_id": customer, "plan": "pro" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({ "customer_id": customer, "plan": "pro", "seats": 0 }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({ "customer_id": customer, "plan": "pro", "seats": 1, "extra": true }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            json!({ "customer_id": customer, "plan": "pro", "seats": 1, "trial_days": 3, "coupon": "lower" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        // The schema caps seats at 10,000: the emit refuses it, naming the JSON pointer.
        (
            json!({ "customer_id": customer, "plan": "pro", "seats": 20000 }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_event",
        ),
    ];
    for (body, want, code) in cases {
        let (status, answer) = s.post("/v1/subscriptions", body.clone()).await;
        assert_eq!(status, want, "{body} -> {answer}");
        assert_eq!(answer["error"], code, "{body} -> {answer}");
        assert!(
            answer["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{answer}"
        );
    }
    let (_, schema_error) = s
        .post(
            "/v1/subscriptions",
            json!({ "customer_id": customer, "plan": "pro", "seats": 20000 }),
        )
        .await;
    assert_eq!(schema_error["violations"][0]["pointer"], "/seats");
    assert_eq!(schema_error["violations"][0]["keyword"], "maximum");

    let raw = s
        .http
        .post(format!("{}/v1/subscriptions", s.base))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("request");
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    let untyped = s
        .http
        .post(format!("{}/v1/subscriptions", s.base))
        .body("{}")
        .send()
        .await
        .expect("request");
    assert_eq!(untyped.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, _) = s.get("/v1/subscriptions/not-a-uuid").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = s
        .get(&format!("/v1/subscriptions/{}", Uuid::now_v7()))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = s
        .post(
            &format!("/v1/subscriptions/{}/plan", Uuid::now_v7()),
            json!({ "plan": "pro" }),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    assert_eq!(
        s.outbox_rows().await,
        0,
        "no rejected request left an event behind"
    );
    s.stop().await;
}

/// The metric names the alerting rules (their `expr`s) and the dashboard (its queries) use, with
/// `_bucket`, `_sum` and `_count` stripped, each with the `le` bounds it names (`name_bucket{le=..}`).
fn ops_metric_names() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rules_path = root.join("ops/prometheus/outbox-rules.yml");
    let rules = std::fs::read_to_string(&rules_path).expect("read ops/prometheus/outbox-rules.yml");
    let mut exprs: Vec<String> = Vec::new();
    for line in rules.lines() {
        if let Some(expr) = line.trim_start().strip_prefix("expr:") {
            let expr = expr.trim();
            assert!(
                !expr.is_empty() && !expr.starts_with('|') && !expr.starts_with('>'),
                "{}: write each expr on one line, so that this check reads it: {line}",
                rules_path.display()
            );
            exprs.push(expr.to_owned());
        }
    }
    let rule_count = rules.matches("- alert:").count();
    assert_eq!(
        exprs.len(),
        rule_count,
        "one expr per alert in {}",
        rules_path.display()
    );
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("ops/grafana/outbox.json"))
            .expect("read ops/grafana/outbox.json"),
    )
    .expect("the dashboard is JSON");
    fn queries(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr", Value::String(e)) => out.push(e.clone()),
                        _ => queries(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| queries(v, out)),
            _ => {}
        }
    }
    let before = exprs.len();
    queries(&dashboard, &mut exprs);
    assert!(exprs.len() > before, "the dashboard has no queries");

    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for expr in &exprs {
        // label values are not metric names: blank what is between quotes, keeping offsets
        let mut quoted = false;
        let blanked: String = expr
            .chars()
            .map(|c| {
                if c == '"' {
                    quoted = !quoted;
                    c
                } else if quoted || !c.is_ascii() {
                    ' '
                } else {
                    c
                }
            })
            .collect();
        assert_eq!(blanked.len(), expr.len(), "{expr}");
        let mut from = 0;
        while let Some(at) = blanked[from..].find("outbox_") {
            let start = from + at;
            let end = blanked[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(blanked.len(), |e| start + e);
            let name = &expr[start..end];
            let after = &expr[end..];
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            let bounds = names.entry(base.to_owned()).or_default();
            if name.ends_with("_bucket") {
                if let Some(le) = after
                    .strip_prefix("{le=\"")
                    .and_then(|v| v.split('"').next())
                {
                    bounds.insert(le.to_owned());
                }
            }
            from = end;
        }
    }
    names
}

/// Metric families in Prometheus text: base name (as in `# TYPE`) to kind, plus every sample's
/// name (kind "sample"), and the bucket lines.
fn exported(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if let Some(ty) = line.strip_prefix("# TYPE ") {
            let mut parts = ty.split_whitespace();
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                out.insert(name.to_owned(), kind.to_owned());
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            out.entry(name.to_owned())
                .or_insert_with(|| "sample".to_owned());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ops_rules_and_dashboard_use_only_metrics_a_running_service_exports() {
    let used = ops_metric_names();
    assert!(
        used.len() >= 15,
        "the ops files name only {} metrics; the scan misreads them: {used:?}",
        used.len()
    );
    let s = start().await;
    // One event through the relay and the consumer.
    let (status, created) = s
        .post(
            "/v1/subscriptions",
            json!({ "customer_id": Uuid::now_v7(), "plan": "pro", "seats": 1 }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["subscription_id"]
        .as_str()
        .expect("an id")
        .to_owned();
    eventually(
        Duration::from_secs(15),
        "the welcome intent is recorded",
        || async {
            s.get(&format!("/v1/subscriptions/{id}")).await.1["welcome_intent_event_id"]
                == created["event_id"]
        },
    )
    .await;

    // Some metrics appear a moment after the event (the stream's check); give them 20 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let (missing, text, families) = loop {
        let text = s
            .http
            .get(format!("{}/metrics", s.base))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("the metrics text");
        let families = exported(&text);
        let missing: Vec<&String> = used.keys().filter(|n| !families.contains_key(*n)).collect();
        if missing.is_empty() || tokio::time::Instant::now() > deadline {
            break (missing, text, families);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        missing.is_empty(),
        "ops/ uses metrics the service does not export: {missing:?}\n/metrics:\n{text}"
    );
    for (name, bounds) in &used {
        if families.contains_key(&format!("{name}_bucket")) || !bounds.is_empty() {
            assert_eq!(
                families.get(name).map(String::as_str),
                Some("histogram"),
                "ops/ reads `{name}` as a histogram:\n{text}"
            );
        }
        for le in bounds {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{name}_bucket{{"))
                        && l.contains(&format!("le=\"{le}\""))),
                "ops/ reads the bucket le=\"{le}\" of `{name}`, which is not exported:\n{text}"
            );
        }
    }
    s.stop().await;
}
