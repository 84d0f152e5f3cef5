//! Names unique to a test, and ports nothing listens on.
//!
//! Tests share one Postgres server and one nats-server, and run in parallel: every database,
//! stream, subject and private server a test creates carries a name no other test uses.

use std::net::TcpListener;

/// `prefix` and 12 lowercase hex digits: with a prefix of lowercase letters, a valid database
/// name and NATS subject token.
pub fn unique_name(prefix: &str) -> String {
    // the last 12 hex digits of a UUIDv7 are random
    let id = uuid::Uuid::now_v7().simple().to_string();
    format!("{prefix}{}", &id[id.len() - 12..])
}

/// A name unique to this test: `t` and 12 lowercase hex digits (a valid subject token).
pub fn unique_token() -> String {
    unique_name("t")
}

/// A port nothing listens on right now (it may be taken before it is used: see
/// [`NatsServer::start`](crate::NatsServer::start) for how a server copes).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// A loopback port that refuses connections for as long as this value lives: a socket bound to
/// it that never listens, so that nothing else can take the port meanwhile (a port from
/// [`free_port`] may be taken by another test's listener before it is used, and then something
/// answers).
#[derive(Debug)]
pub struct RefusedPort {
    socket: tokio::net::TcpSocket,
}

impl RefusedPort {
    /// Binds an ephemeral loopback port, without listening on it.
    pub fn bind() -> RefusedPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket
            .bind("127.0.0.1:0".parse().expect("a loopback address"))
            .expect("bind an ephemeral port");
        RefusedPort { socket }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.socket.local_addr().expect("a bound socket").port()
    }
}
