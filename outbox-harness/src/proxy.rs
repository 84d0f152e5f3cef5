//! A relay slot's network paths, or a consumer replica's: a proxy to Postgres and one to each
//! broker node ([`outbox_testkit::TcpProxy`]), so that a fault can silence or cut one relay's
//! path, or every relay's path to one node, while the harness's own connections stay up.
//!
//! Faults may overlap on one proxy (a relay's freeze while its path to a frozen node is
//! silent): each proxy counts the faults that silence it and carries bytes again only when the
//! last of them ends.

use std::sync::Mutex;

use outbox_testkit::TcpProxy;

use crate::schedule::Path;

/// The proxies between one relay slot and the servers.
#[derive(Debug)]
pub struct RelayPaths {
    /// To Postgres.
    pub pg: TcpProxy,
    /// To each broker node, in node order.
    pub nats: Vec<TcpProxy>,
    /// Per proxy (Postgres first, then the nodes): the faults silencing it now.
    silenced: Mutex<Vec<u32>>,
}

impl RelayPaths {
    /// Every path.
    pub const ALL: [Path; 2] = [Path::Postgres, Path::Nats];

    /// Proxies to Postgres on `pg_port` and to each node's client port.
    pub async fn start(pg_port: u16, node_ports: &[u16]) -> RelayPaths {
        let pg = TcpProxy::start(format!("127.0.0.1:{pg_port}")).await;
        let mut nats = Vec::with_capacity(node_ports.len());
        for port in node_ports {
            nats.push(TcpProxy::start(format!("127.0.0.1:{port}")).await);
        }
        let silenced = Mutex::new(vec![0; 1 + nats.len()]);
        RelayPaths { pg, nats, silenced }
    }

    /// The relay's NATS URLs: every node, through its proxy.
    pub fn nats_url(&self) -> String {
        self.nats
            .iter()
            .map(|p| format!("nats://127.0.0.1:{}", p.port()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The proxies of `path`, by their index in the count.
    fn proxies(&self, path: Path) -> Vec<(usize, &TcpProxy)> {
        match path {
            Path::Postgres => vec![(0, &self.pg)],
            Path::Nats => self
                .nats
                .iter()
                .enumerate()
                .map(|(n, p)| (n + 1, p))
                .collect(),
        }
    }

    fn silence(&self, proxies: Vec<(usize, &TcpProxy)>, on: bool) {
        let mut silenced = self.silenced.lock().expect("the counts");
        for (n, proxy) in proxies {
            if on {
                silenced[n] += 1;
                proxy.freeze();
            } else {
                silenced[n] = silenced[n].saturating_sub(1);
                if silenced[n] == 0 {
                    proxy.thaw();
                }
            }
        }
    }

    /// Silences `path` (no close, no reset) until as many [`thaw`](Self::thaw)s.
    pub fn freeze(&self, path: Path) {
        self.silence(self.proxies(path), true);
    }

    /// Ends one silence of `path`.
    pub fn thaw(&self, path: Path) {
        self.silence(self.proxies(path), false);
    }

    /// Silences the path to node `n` (a frozen broker, as this relay sees it).
    pub fn freeze_node(&self, n: usize) {
        self.silence(vec![(n + 1, &self.nats[n])], true);
    }

    /// Ends one silence of the path to node `n`.
    pub fn thaw_node(&self, n: usize) {
        self.silence(vec![(n + 1, &self.nats[n])], false);
    }

    /// Ends every silence (the run's end).
    pub fn thaw_everything(&self) {
        let mut silenced = self.silenced.lock().expect("the counts");
        silenced.iter_mut().for_each(|n| *n = 0);
        self.pg.thaw();
        self.nats.iter().for_each(TcpProxy::thaw);
    }

    /// Closes every connection of `path`.
    pub fn cut(&self, path: Path) {
        self.proxies(path).into_iter().for_each(|(_, p)| p.cut());
    }

    /// The ports Postgres sees this slot's sessions come from (`pg_stat_activity.client_port`).
    pub fn pg_sessions(&self) -> Vec<u16> {
        self.pg.upstream_ports()
    }
}
