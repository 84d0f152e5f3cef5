//! How the relay tells an ack lost to an election from a refused one: a leader that stepped
//! down and was elected again between two of the relay's readings of the stream still counts
//! as an election (a server before 2.12 does not say since when it leads, so only JetStream's
//! election advisories show it), and a stream that kept its leader does not.

use std::time::{Duration, Instant};

use outbox_runtime::{Relay, RelayConfig, StorageType, StreamSpec};
use outbox_testkit::{unique_token, NatsCluster, TestDb};

/// The window the relay is asked about: longer than a step-down takes, shorter than the wait
/// that makes its first reading old.
const WINDOW: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_elected_again_between_two_readings_is_an_election() {
    let cluster = NatsCluster::spawn(3).await;
    let client = cluster.connect().await;
    let js = async_nats::jetstream::new(client.clone());
    let prefix = unique_token();
    let stream = prefix.to_uppercase();
    let spec = StreamSpec {
        name: stream.clone(),
        subjects: vec![format!("{prefix}.>")],
        storage: StorageType::File,
        replicas: 3,
        ..StreamSpec::default()
    };
    cluster.create_stream(&js, spec.to_config()).await;
    let db = TestDb::new().await;
    let config = RelayConfig {
        event_types: vec![format!("{prefix}.billing.invoice.paid")],
        ..RelayConfig::default()
    };
    let pool = db.new_pool(config.pool_size()).await;
    let relay = Relay::new(
        pool,
        async_nats::jetstream::new(cluster.connect().await),
        config,
    )
    .await
    .expect("the relay starts on the cluster");

    // the first reading, then one after the window: the leader kept its place
    let first = cluster.stream_leader(&js, &stream).await;
    relay.stream_elected_within(&stream, WINDOW).await;
    tokio::time::sleep(WINDOW + Duration::from_millis(500)).await;
    assert!(
        !relay.stream_elected_within(&stream, WINDOW).await,
        "a stream that kept its leader for longer than the window had no election in it"
    );
    assert_eq!(cluster.stream_leader(&js, &stream).await, first);

    // step down until the first leader leads again, without the relay looking; a step-down
    // counts once the leader is seen to change (one refused, or slow to take effect, is
    // asked for again)
    let stepping = Instant::now();
    let mut leader = first.clone();
    let (mut step_downs, mut changes) = (0, 0);
    while changes == 0 || leader != first {
        assert!(
            step_downs < 30,
            "{first} never led {stream} again in 30 step-downs ({changes} leader changes seen)"
        );
        let answer = cluster
            .step_down(&client, &stream)
            .await
            .expect("an answer to the step-down");
        step_downs += 1;
        if !answer.contains("\"success\":true") {
            eprintln!("step-down refused: {answer}");
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let before = leader.clone();
        for _ in 0..50 {
            leader = cluster.stream_leader(&js, &stream).await;
            if leader != before {
                changes += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // every election of the loop is inside this window, the first readings are not
    let window = stepping.elapsed() + Duration::from_millis(500);
    assert!(
        relay.stream_elected_within(&stream, window).await,
        "{first} led {stream} again after {changes} leader changes: an ack lost meanwhile is lost to an election"
    );
}
