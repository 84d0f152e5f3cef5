//! The listener of `outbox relay --metrics-addr`: `/metrics` (Prometheus), `/healthz`
//! (liveness) and `/readyz` (readiness), over HTTP/1.1.
//!
//! - `/healthz` answers 200 while the process and its relay loop are alive: starting (before
//!   the relay has connected), running, or finishing its batches after SIGTERM. It does not
//!   depend on Postgres or NATS, so an outage never gets the process restarted. The relay loop
//!   ends only after the signal, and the process with it, so the answer is the runtime's: a
//!   process whose runtime no longer serves requests fails the probe by not answering.
//! - `/readyz` answers 200 when [`RelayHealth::is_ready`]: running, Postgres and NATS
//!   reachable, no lane stalled. A relay standing by (another holds the lease) that could take
//!   over is ready. 503 while starting, after SIGTERM, and otherwise when not ready.
//!
//! Both bodies are one JSON object: `status`, and the relay's health when it has one.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;
use outbox_runtime::{Relay, RelayHealth};
use serde_json::json;

use crate::error::{CliError, Result};

/// How often the Prometheus exporter's histograms are drained when nobody scrapes.
const UPKEEP: Duration = Duration::from_secs(5);

/// What the probes read: the relay once it has connected, and whether it is stopping.
#[derive(Debug, Default)]
pub struct Probes {
    relay: OnceLock<Arc<Relay>>,
    stopping: AtomicBool,
}

impl Probes {
    /// The relay has connected: the probes follow its health from now on.
    pub fn started(&self, relay: Arc<Relay>) {
        let _ = self.relay.set(relay);
    }

    /// SIGTERM (or SIGINT) arrived: not ready any more, alive while it finishes.
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    fn health(&self) -> Option<RelayHealth> {
        self.relay.get().map(|r| r.health())
    }

    /// `/healthz`: its status code and body.
    fn liveness(&self) -> (StatusCode, serde_json::Value) {
        let stopping = self.stopping.load(Ordering::Relaxed);
        // `Relay::run` returns only after the signal, and the process exits then: a relay that
        // has connected but is not running yet is starting
        match self.health() {
            None => (StatusCode::OK, json!({ "status": "starting" })),
            Some(_) if stopping => (StatusCode::OK, json!({ "status": "stopping" })),
            Some(h) if h.running => (StatusCode::OK, body("alive", &h)),
            Some(h) => (StatusCode::OK, body("starting", &h)),
        }
    }

    /// `/readyz`: its status code and body.
    fn readiness(&self) -> (StatusCode, serde_json::Value) {
        let stopping = self.stopping.load(Ordering::Relaxed);
        match self.health() {
            None => (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "status": "starting" }),
            ),
            Some(h) if stopping => (StatusCode::SERVICE_UNAVAILABLE, body("stopping", &h)),
            Some(h) if h.is_ready() => (StatusCode::OK, body("ready", &h)),
            Some(h) => (StatusCode::SERVICE_UNAVAILABLE, body("not ready", &h)),
        }
    }
}

fn body(status: &str, h: &RelayHealth) -> serde_json::Value {
    json!({
        "status": status,
        "running": h.running,
        "holds_lease": h.holds_lease,
        "postgres_reachable": h.postgres_reachable,
        "nats_reachable": h.nats_reachable,
        "stalled_lanes": h.stalled_lanes,
    })
}

/// Listens on `addr` and serves the three paths until the process ends. Binding happens
/// here, so an address in use is an error before the relay starts.
pub async fn serve(addr: SocketAddr, metrics: PrometheusHandle, probes: Arc<Probes>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| CliError::Listen { addr, source })?;
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP).await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // out of file descriptors, say: try again shortly
                    tracing::warn!(error = %e, "the metrics listener could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (metrics, probes) = (metrics.clone(), probes.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let response = respond(&request, &metrics, &probes);
                    async move { Ok::<_, Infallible>(response) }
                });
                // a client that goes away is no concern of the relay's
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(())
}

fn respond(
    request: &Request<Incoming>,
    metrics: &PrometheusHandle,
    probes: &Probes,
) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match request.uri().path() {
        "/metrics" => {
            metrics.run_upkeep();
            let mut response = text(StatusCode::OK, metrics.render());
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            response
        }
        "/healthz" => as_json(probes.liveness()),
        "/readyz" => as_json(probes.readiness()),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: /metrics, /healthz or /readyz\n".into(),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

fn as_json((status, body): (StatusCode, serde_json::Value)) -> Response<Full<Bytes>> {
    let mut response = text(status, format!("{body}\n"));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}
