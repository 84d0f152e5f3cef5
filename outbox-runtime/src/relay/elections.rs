//! Stream leader elections as JetStream announces them (docs/relay.md, *Streams*).
//!
//! A stream's info says who leads it, and since 2.12 since when; a server before 2.12 does not
//! say since when, so a leader that stepped down and was elected again between two of the
//! relay's readings looks unchanged, and an ack it lost would spend an attempt. JetStream also
//! announces every election, and every lost quorum, on advisory subjects in the stream's
//! account (every server since 2.2): the relay listens to them from its start, and an
//! announcement within the window counts as an election whatever the readings say.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use super::listen::AbortOnDrop;

/// The advisories of a stream's leader election and of its lost quorum; the last token is the
/// stream's name.
const ELECTED: &str = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.*";
const QUORUM_LOST: &str = "$JS.EVENT.ADVISORY.STREAM.QUORUM_LOST.*";
/// The most streams remembered; past it, announcements older than [`FORGET_AFTER`] go, and
/// if none is that old, the oldest one: a new announcement is always kept.
const STREAMS_MAX: usize = 10_000;
const FORGET_AFTER: Duration = Duration::from_secs(600);

type Announced = Arc<Mutex<HashMap<String, Instant>>>;

/// When each stream last announced an election (or a lost quorum), by this host's clock.
#[derive(Debug, Default)]
pub(super) struct Elections {
    announced: Announced,
    /// The task that listens; none when the relay could not subscribe (it then relies on the
    /// streams' info alone).
    _listening: Option<AbortOnDrop>,
}

impl Elections {
    /// Listens to the election advisories on `client` until dropped. A subscription the server
    /// refuses (no permission on `$JS.EVENT.>`) hears nothing, which leaves the streams' info
    /// as the only signal.
    pub(super) async fn listen(client: &async_nats::Client) -> Elections {
        let announced = Announced::default();
        let subscribed = async {
            let elected = client.subscribe(ELECTED).await?;
            let lost = client.subscribe(QUORUM_LOST).await?;
            Ok::<_, async_nats::SubscribeError>(futures::stream::select(elected, lost))
        };
        let listening = match subscribed.await {
            Ok(mut advisories) => {
                let announced = announced.clone();
                Some(AbortOnDrop(tokio::spawn(async move {
                    while let Some(advisory) = advisories.next().await {
                        if let Some((_, stream)) = advisory.subject.rsplit_once('.') {
                            note(&announced, stream, Instant::now());
                        }
                    }
                })))
            }
            Err(e) => {
                tracing::debug!(error = %e, "outbox relay could not subscribe to JetStream's election advisories");
                None
            }
        };
        Elections {
            announced,
            _listening: listening,
        }
    }

    /// Whether stream `name` announced an election (or a lost quorum) within `window`.
    pub(super) fn within(&self, name: &str, window: Duration) -> bool {
        let announced = self.announced.lock().unwrap_or_else(|p| p.into_inner());
        announced.get(name).is_some_and(|at| at.elapsed() < window)
    }
}

fn note(announced: &Announced, stream: &str, at: Instant) {
    let mut announced = announced.lock().unwrap_or_else(|p| p.into_inner());
    if announced.len() >= STREAMS_MAX && !announced.contains_key(stream) {
        announced.retain(|_, then| at.saturating_duration_since(*then) < FORGET_AFTER);
        if announced.len() >= STREAMS_MAX {
            let oldest = announced
                .iter()
                .min_by_key(|(_, then)| **then)
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                announced.remove(&oldest);
            }
        }
    }
    announced.insert(stream.to_owned(), at);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_announcement_counts_within_its_window_only() {
        let elections = Elections::default();
        note(&elections.announced, "ORDERS", Instant::now());
        assert!(elections.within("ORDERS", Duration::from_secs(10)));
        assert!(!elections.within("ORDERS", Duration::ZERO));
        assert!(!elections.within("PAYMENTS", Duration::from_secs(10)));
    }

    #[tokio::test]
    async fn a_full_map_forgets_old_announcements_for_new_streams() {
        let elections = Elections::default();
        let then = Instant::now();
        for n in 0..STREAMS_MAX {
            note(&elections.announced, &format!("S{n}"), then);
        }
        let later = then + FORGET_AFTER + Duration::from_secs(1);
        note(&elections.announced, "NEW", later);
        assert!(elections.within("NEW", Duration::from_secs(1)));
        let len = elections.announced.lock().unwrap().len();
        assert_eq!(len, 1, "the old ones went");
    }

    #[tokio::test]
    async fn a_full_map_of_recent_announcements_forgets_the_oldest_and_keeps_the_new_one() {
        let elections = Elections::default();
        let then = Instant::now();
        for n in 0..STREAMS_MAX {
            let at = then + Duration::from_millis(n as u64);
            note(&elections.announced, &format!("S{n}"), at);
        }
        let now = then + Duration::from_secs(11);
        note(&elections.announced, "ORDERS", now);
        let announced = elections.announced.lock().unwrap();
        assert_eq!(announced.len(), STREAMS_MAX);
        assert!(
            announced.contains_key("ORDERS"),
            "the new announcement is kept"
        );
        assert!(!announced.contains_key("S0"), "the oldest went");
        assert!(announced.contains_key("S1"));
    }
}
