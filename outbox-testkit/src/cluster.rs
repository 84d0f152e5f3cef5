//! A private JetStream cluster: three (or more) `nats-server` processes on loopback ports,
//! joined by routes, that a test may step down, kill, freeze and restart node by node.
//!
//! Each node has its own name, client port, cluster port, monitoring port and store directory.
//! [`NatsCluster::spawn`] returns when every node answers `/healthz?js-enabled-only=true`;
//! streams are created with [`NatsCluster::create_stream`], which waits out the first meta
//! leader election. Clients get every node's URL ([`NatsCluster::urls`]), so they fail over.

use std::time::Duration;

use async_nats::jetstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::nats::{NatsServer, NatsServerConfig};
use crate::unique::{free_port, unique_token};

/// One node of a [`NatsCluster`].
#[derive(Debug)]
pub struct Node {
    /// The node's server (stop, start, signal it).
    pub server: NatsServer,
    /// Its HTTP monitoring port (`-m`).
    pub monitor_port: u16,
}

/// A private JetStream cluster on loopback; dropping it kills every node.
#[derive(Debug)]
pub struct NatsCluster {
    /// The nodes, in the order they were started.
    pub nodes: Vec<Node>,
}

impl NatsCluster {
    /// Starts a cluster of `size` nodes (3 or 5 in practice) and waits until every node's
    /// JetStream answers.
    pub async fn spawn(size: usize) -> NatsCluster {
        NatsCluster::spawn_with(size, &[]).await
    }

    /// Starts a cluster of `size` nodes with further command-line arguments for every node
    /// (for example `--no_advertise`, so that clients reach the nodes only at the addresses
    /// they were given, such as a [`TcpProxy`](crate::TcpProxy) each, and not at the ones the
    /// cluster would announce), and waits until every node's JetStream answers.
    pub async fn spawn_with(size: usize, extra: &[&str]) -> NatsCluster {
        assert!(size >= 1, "a cluster has at least one node");
        let cluster_name = format!("outbox-{}", unique_token());
        let route_ports: Vec<u16> = (0..size).map(|_| free_port()).collect();
        let routes = route_ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::with_capacity(size);
        for (i, route_port) in route_ports.iter().enumerate() {
            let monitor_port = free_port();
            let mut args = vec![
                "--cluster_name".to_owned(),
                cluster_name.clone(),
                "--cluster".to_owned(),
                format!("nats://127.0.0.1:{route_port}"),
                "--routes".to_owned(),
                routes.clone(),
                "-m".to_owned(),
                monitor_port.to_string(),
            ];
            args.extend(extra.iter().map(|a| (*a).to_owned()));
            let server = NatsServer::spawn_config(NatsServerConfig {
                name: Some(format!("{cluster_name}-n{i}")),
                args,
                ..NatsServerConfig::default()
            })
            .await;
            nodes.push(Node {
                server,
                monitor_port,
            });
        }
        let cluster = NatsCluster { nodes };
        cluster.wait_healthy(Duration::from_secs(30)).await;
        cluster
    }

    /// Every running node's client URL, comma-separated (what `NATS_URL` and the CLI accept).
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.server.url())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A client given every node's URL, so it reconnects to another node when its own goes.
    pub async fn connect(&self) -> async_nats::Client {
        let urls: Vec<String> = self.nodes.iter().map(|n| n.server.url()).collect();
        async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .retry_on_initial_connect()
            .connect(urls.as_slice())
            .await
            .expect("connect to the cluster")
    }

    /// The node whose server is named `name`.
    pub fn node(&mut self, name: &str) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.server.name() == name)
            .unwrap_or_else(|| panic!("no node is named {name}"))
    }

    /// Waits until every running node answers `/healthz?js-enabled-only=true` with 200.
    pub async fn wait_healthy(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        for node in &self.nodes {
            if node.server.pid().is_none() {
                continue;
            }
            loop {
                let answer = http_get(node.monitor_port, "/healthz?js-enabled-only=true").await;
                if matches!(&answer, Some((200, _))) {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "node {} is not healthy within {within:?}: {answer:?}; its log: {}",
                    node.server.name(),
                    node.server.log_tail()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Creates `config`'s stream (its replicas as given), retrying while the cluster elects
    /// its first meta leader.
    pub async fn create_stream(
        &self,
        js: &jetstream::Context,
        config: jetstream::stream::Config,
    ) -> jetstream::stream::Stream {
        let mut last = String::new();
        for _ in 0..100 {
            match js.get_or_create_stream(config.clone()).await {
                Ok(stream) => return stream,
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("stream {} not created within 20 s: {last}", config.name)
    }

    /// The name of the server leading `stream`, once it has a leader (within 20 s).
    pub async fn stream_leader(&self, js: &jetstream::Context, stream: &str) -> String {
        for _ in 0..100 {
            if let Ok(mut s) = js.get_stream(stream).await {
                if let Ok(info) = s.info().await {
                    if let Some(leader) = info.cluster.as_ref().and_then(|c| c.leader.clone()) {
                        return leader;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("stream {stream} has no leader within 20 s")
    }

    /// The name of the meta leader, as the first running node that knows reports it (`/jsz`).
    pub async fn meta_leader(&self) -> String {
        for _ in 0..100 {
            for node in self.nodes.iter().filter(|n| n.server.pid().is_some()) {
                let Some((200, body)) = http_get(node.monitor_port, "/jsz").await else {
                    continue;
                };
                let leader = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["meta_cluster"]["leader"].as_str().map(str::to_owned));
                if let Some(leader) = leader.filter(|l| !l.is_empty()) {
                    return leader;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("no meta leader within 20 s")
    }

    /// Asks `stream`'s leader to step down (`$JS.API.STREAM.LEADER.STEPDOWN.<stream>`);
    /// returns the API's answer, or why there was none.
    pub async fn step_down(
        &self,
        client: &async_nats::Client,
        stream: &str,
    ) -> Result<String, String> {
        let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}");
        let answer =
            tokio::time::timeout(Duration::from_secs(5), client.request(subject, "".into()))
                .await
                .map_err(|_| "no answer within 5 s".to_owned())?
                .map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&answer.payload).into_owned())
    }
}

/// `GET path` on the monitoring port: the status code and the body, or `None` when nothing
/// answers within two seconds.
async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let text = String::from_utf8_lossy(&response).into_owned();
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Some((status, body))
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
}
