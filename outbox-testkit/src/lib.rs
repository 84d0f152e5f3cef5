#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
pub mod cluster;
pub mod db;
pub mod drain;
pub mod emitted;
pub mod env;
pub mod event;
pub mod handled;
pub mod nats;
pub mod proxy;
pub mod relay;
pub mod stream;
#[doc(hidden)]
pub mod suite;
pub mod tls;
pub mod unique;
pub mod wait;

pub use cluster::NatsCluster;
pub use db::{PgServer, PgServerConfig, TestDb, TestDbBuilder};
pub use drain::{drain, Drained, DRAIN_LIMIT};
pub use emitted::{emitted, Emitted};
pub use env::{database_url, nats_url};
pub use event::{emit_committed, open_schemas, raw_event, RawEventBuilder};
pub use handled::wait_handled;
pub use nats::{connect_nats, nats_server_binary, NatsServer, NatsServerConfig};
pub use proxy::TcpProxy;
pub use relay::run_relay;
pub use stream::{read_stream, stream_len, Delivered};
pub use tls::{Issued, TestCa};
pub use unique::{free_port, unique_name, unique_token, RefusedPort};
pub use wait::eventually;
