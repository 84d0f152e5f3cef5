//! A TCP proxy in front of a server that a test can freeze, thaw and cut: a network path that
//! goes silent without a reset, comes back, or breaks.
//!
//! A frozen proxy stops carrying bytes either way and tells nobody: no close, no reset, the
//! bytes it had read are held until it thaws, and new connections are accepted but carry
//! nothing. That is what a dropped network path, a paused VM's link or a stuck middlebox looks
//! like to both ends, which only a timeout of their own can notice. A proxy can also go silent
//! one way only, in the middle of an answer ([`TcpProxy::freeze_answers_after`]): the server
//! has the request and blocks sending its answer. A cut closes every connection at once, as a
//! peer's crash does; new connections go through as before.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long the proxy waits for the upstream server to accept a connection before it closes
/// the client's (a stopped server refuses at once; this bounds a frozen one).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A TCP proxy on a free loopback port, forwarding to one upstream address; see the
/// [module docs](self). Dropping it closes its listener and every connection.
///
/// ```no_run
/// # async fn run() {
/// use outbox_testkit::{PgServer, TcpProxy};
///
/// let pg = PgServer::spawn();
/// let proxy = TcpProxy::start(format!("127.0.0.1:{}", pg.port)).await;
/// let url = format!("postgres://root@127.0.0.1:{}/postgres", proxy.port());
/// let pool = sqlx::PgPool::connect(&url).await.unwrap();
/// proxy.freeze(); // statements on `pool` now wait for an answer that does not come
/// proxy.thaw(); // and get it
/// proxy.cut(); // every connection closes; the pool opens new ones
/// # drop(pool);
/// # }
/// ```
#[derive(Debug)]
pub struct TcpProxy {
    port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

#[derive(Debug)]
struct Shared {
    upstream: String,
    /// Whether the proxy carries bytes: `true` while frozen.
    frozen: watch::Sender<bool>,
    /// Whether it carries bytes from the server: `false` once an answer budget ran out.
    answering: watch::Sender<bool>,
    /// The bytes it still carries from the server (all connections together) before it stops
    /// carrying them, if a budget is set.
    answer_budget: Mutex<Option<usize>>,
    /// Bumped by each cut: every connection opened before it closes.
    cuts: watch::Sender<u64>,
    /// The connections open now, by the local port the upstream server sees each come from.
    open: Mutex<Vec<u16>>,
}

impl TcpProxy {
    /// Starts a proxy on a free port of 127.0.0.1 forwarding to `upstream` (`host:port`).
    pub async fn start(upstream: impl Into<String>) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let shared = Arc::new(Shared {
            upstream: upstream.into(),
            frozen: watch::channel(false).0,
            answering: watch::channel(true).0,
            answer_budget: Mutex::new(None),
            cuts: watch::channel(0).0,
            open: Mutex::new(Vec::new()),
        });
        let accept = tokio::spawn(accept(listener, shared.clone()));
        TcpProxy {
            port,
            shared,
            accept,
        }
    }

    /// The port the proxy listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The upstream address.
    pub fn upstream(&self) -> &str {
        &self.shared.upstream
    }

    /// Stops carrying bytes, either way, on every connection (new ones included), without
    /// closing any.
    pub fn freeze(&self) {
        self.shared.frozen.send_replace(true);
    }

    /// Carries at most `bytes` more from the server to the clients (all connections together),
    /// then stops carrying that way, without closing anything; the clients' bytes still reach
    /// the server. A server sending a large answer then blocks once the sockets' buffers are
    /// full, as it does when the client's path goes silent mid-answer. [`TcpProxy::thaw`]
    /// carries answers again.
    pub fn freeze_answers_after(&self, bytes: usize) {
        *self.shared.answer_budget.lock().expect("the budget") = Some(bytes);
    }

    /// Carries bytes again, starting with those held since the freeze.
    pub fn thaw(&self) {
        *self.shared.answer_budget.lock().expect("the budget") = None;
        self.shared.answering.send_replace(true);
        self.shared.frozen.send_replace(false);
    }

    /// Whether the proxy is frozen.
    pub fn is_frozen(&self) -> bool {
        *self.shared.frozen.borrow()
    }

    /// Closes every open connection, both sides; the proxy goes on accepting new ones (frozen
    /// or not, as it was).
    pub fn cut(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    /// The local ports of the connections open to the upstream server now: what the server
    /// sees them come from (Postgres's `pg_stat_activity.client_port`), so that a test can
    /// tell which server sessions go through this proxy.
    pub fn upstream_ports(&self) -> Vec<u16> {
        self.shared.open.lock().expect("the proxy's list").clone()
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((client, _)) = listener.accept().await {
        tokio::spawn(connection(client, shared.clone()));
    }
}

/// One client connection: connects upstream (a refusal closes the client's connection, as the
/// server's own would be) and carries bytes both ways until either side closes or a cut.
async fn connection(client: TcpStream, shared: Arc<Shared>) {
    let mut cuts = shared.cuts.subscribe();
    cuts.borrow_and_update();
    let server = tokio::select! {
        s = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&shared.upstream)) => match s {
            Ok(Ok(server)) => server,
            _ => return,
        },
        _ = cuts.changed() => return,
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let seen_as = server.local_addr().map(|a| a.port()).unwrap_or(0);
    shared.open.lock().expect("the proxy's list").push(seen_as);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pipe(client_read, server_write, shared.frozen.subscribe(), None);
    let down = pipe(
        server_read,
        client_write,
        shared.frozen.subscribe(),
        Some(&shared),
    );
    // the connection ends when a side closes (its direction ends; the other follows, since
    // the peer closes too) or at a cut, which drops both sockets
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = cuts.changed() => {}
    }
    shared
        .open
        .lock()
        .expect("the proxy's list")
        .retain(|p| *p != seen_as);
}

/// Copies `from` to `to` while not frozen; a read in flight when a freeze begins is dropped
/// (a socket read is cancel-safe: nothing is lost), and bytes already read wait for the thaw.
/// The server's side (`answers`) also spends the answer budget, and stops when it runs out.
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
    answers: Option<&Shared>,
) {
    let mut answering = answers.map(|s| s.answering.subscribe());
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        if let Some(answering) = answering.as_mut() {
            if answering.wait_for(|a| *a).await.is_err() {
                return;
            }
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = frozen.wait_for(|f| *f) => continue,
        };
        let mut sent = 0;
        while sent < n {
            if frozen.wait_for(|f| !*f).await.is_err() {
                return;
            }
            let mut upto = n;
            if let (Some(shared), Some(answering)) = (answers, answering.as_mut()) {
                if answering.wait_for(|a| *a).await.is_err() {
                    return;
                }
                let mut budget = shared.answer_budget.lock().expect("the budget");
                if let Some(left) = budget.as_mut() {
                    upto = sent + (n - sent).min(*left);
                    *left -= upto - sent;
                    if *left == 0 {
                        shared.answering.send_replace(false);
                    }
                }
            }
            if to.write_all(&buf[sent..upto]).await.is_err() {
                return;
            }
            sent = upto;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8], within: Duration) -> Option<Vec<u8>> {
        s.write_all(msg).await.ok()?;
        let mut buf = vec![0u8; msg.len()];
        tokio::time::timeout(within, s.read_exact(&mut buf))
            .await
            .ok()?
            .ok()?;
        Some(buf)
    }

    #[tokio::test]
    async fn answers_stop_after_their_budget_while_requests_go_on() {
        let proxy = TcpProxy::start(echo_server().await).await;
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.freeze_answers_after(4);
        s.write_all(b"abcdef").await.unwrap();
        let mut first = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut first))
            .await
            .expect("four bytes of the answer")
            .unwrap();
        assert_eq!(&first, b"abcd");
        s.write_all(b"gh").await.unwrap();
        let mut more = [0u8; 1];
        assert!(
            tokio::time::timeout(Duration::from_millis(300), s.read(&mut more))
                .await
                .is_err(),
            "nothing more comes back"
        );
        assert!(!proxy.is_frozen(), "requests still reach the server");
        proxy.thaw();
        let mut buf = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
            .await
            .expect("the held answer arrives after the thaw")
            .unwrap();
        assert_eq!(
            &buf, b"efgh",
            "the rest of the first, and the request sent meanwhile"
        );
    }

    #[tokio::test]
    async fn a_frozen_proxy_holds_bytes_until_it_thaws_and_a_cut_closes_connections() {
        let proxy = TcpProxy::start(echo_server().await).await;
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let short = Duration::from_millis(300);
        assert_eq!(
            roundtrip(&mut s, b"one", short).await.as_deref(),
            Some(&b"one"[..])
        );
        assert_eq!(proxy.upstream_ports().len(), 1);

        proxy.freeze();
        assert!(proxy.is_frozen());
        assert_eq!(
            roundtrip(&mut s, b"two", short).await,
            None,
            "nothing comes back while frozen"
        );
        proxy.thaw();
        let mut buf = [0u8; 3];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
            .await
            .expect("the held bytes arrive after the thaw")
            .unwrap();
        assert_eq!(&buf, b"two");

        proxy.cut();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "a cut closes the connection"
        );
        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(
            roundtrip(&mut again, b"three", Duration::from_secs(5))
                .await
                .as_deref(),
            Some(&b"three"[..]),
            "new connections go through after a cut"
        );
    }
}
