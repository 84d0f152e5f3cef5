//! Reading a stream back: what the relay stored, in stream order, with its headers.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull::OrderedConfig};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use outbox_runtime::Envelope;

/// How long reading a stream may wait for its next message.
const PATIENCE: Duration = Duration::from_secs(30);

/// One message read back from a stream.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// The stream sequence.
    pub seq: u64,
    /// The NATS subject it was published on.
    pub subject: String,
    /// Its `Nats-Msg-Id` header.
    pub msg_id: String,
    /// Its `Content-Type` header.
    pub content_type: String,
    /// The decoded body.
    pub envelope: Envelope,
    /// When the stream stored it (the message's JetStream timestamp, on the server's clock).
    pub stored_at: DateTime<Utc>,
}

/// Messages in stream `name`.
pub async fn stream_len(js: &jetstream::Context, name: &str) -> u64 {
    let mut stream = js.get_stream(name).await.expect("the stream exists");
    stream.info().await.expect("stream info").state.messages
}

/// Every message of stream `name`, in stream order, read by an ordered consumer.
pub async fn read_stream(js: &jetstream::Context, name: &str) -> Vec<Delivered> {
    let mut stream = js.get_stream(name).await.expect("the stream exists");
    let total = stream.info().await.expect("stream info").state.messages as usize;
    if total == 0 {
        return Vec::new();
    }
    // a cluster that has just elected a stream leader may time out the first requests
    let mut tries = 0;
    let consumer = loop {
        match stream.create_consumer(OrderedConfig::default()).await {
            Ok(consumer) => break consumer,
            Err(e) if tries < 20 => {
                tries += 1;
                eprintln!("creating an ordered consumer on {name}: {e}; again in 500 ms");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) => panic!("create an ordered consumer on {name}: {e}"),
        }
    };
    let mut messages = consumer.messages().await.expect("consume");
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let msg = tokio::time::timeout(PATIENCE, messages.next())
            .await
            .expect("the stream delivers its messages")
            .expect("the consumer does not end")
            .expect("a message");
        let info = msg.info().expect("jetstream metadata");
        let seq = info.stream_sequence;
        let stored_at = to_chrono(info.published);
        let header = |name: &str| {
            msg.headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default()
        };
        out.push(Delivered {
            seq,
            subject: msg.subject.to_string(),
            msg_id: header("Nats-Msg-Id"),
            content_type: header("Content-Type"),
            envelope: serde_json::from_slice(&msg.payload).expect("a CloudEvents envelope"),
            stored_at,
        });
    }
    out
}

/// An async-nats time as chrono's. The type of async-nats's times depends on a feature of that
/// crate (`chrono` or `time`) that any crate of a build may switch on, so this uses only what
/// both offer, `from_nanos` and ordering: a binary search over nanoseconds (1970 to 2262), exact.
fn to_chrono(t: async_nats::datetime::DateTime) -> DateTime<Utc> {
    let at = |n: i64| async_nats::datetime::from_nanos(i128::from(n)).ok();
    let (mut lo, mut hi) = (0i64, i64::MAX);
    if at(lo).is_none_or(|lo| t <= lo) {
        return DateTime::<Utc>::UNIX_EPOCH;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match at(mid) {
            Some(m) if m < t => lo = mid,
            _ => hi = mid,
        }
    }
    DateTime::from_timestamp_nanos(hi)
}
