//! The durable consumer: registered under its name, checked against the configuration when it
//! exists, created from it when it does not (again after an operator or a stream deletion
//! removed it).

use std::time::SystemTime;

use async_nats::jetstream::consumer::{
    self as js_consumer, pull, AckPolicy, DeliverPolicy, PullConsumer,
};
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use chrono::{DateTime, Utc};

use super::{Consumer, Handler};
use crate::error::{Error, Result};
use crate::table::{CONSUMER_NAMES, DEDUPE_HORIZON};
use crate::OutboxEvent;

/// What the registry says about this consumer's name.
struct Registration {
    /// This consumer created its durable before: a missing durable was deleted.
    created_before: bool,
}

impl<E: OutboxEvent, H: Handler<E>> Consumer<E, H> {
    /// Opens the durable consumer, creating it if it does not exist, and returns it.
    ///
    /// - The name is registered to `E`'s event type in `outbox_consumer_names` (migration
    ///   `0006`): a name registered to another type is an [`Error::Config`] (two types under
    ///   one name would share dedupe rows and terminate each other's messages). A role without
    ///   the rights a failed attempt needs (deleting its dedupe row by key, counting itself in
    ///   `outbox_consumer_attempts`: `ops/postgres/grants.sql`) is an [`Error::Config`] too.
    /// - An existing durable must match: filter subject `E::EVENT_TYPE`, explicit acks,
    ///   [`ack_wait`](super::ConsumerConfig::ack_wait), unlimited `max_deliver` (this consumer
    ///   counts attempts itself), pull mode. Otherwise an [`Error::Config`] names every
    ///   difference; nothing is changed on the server.
    /// - A durable created for the first time delivers the whole stream. One created again
    ///   (this consumer had one before) starts at messages stored since the dedupe horizon:
    ///   the newest cutoff below which `retention::prune_dedupe` deleted dedupe rows, or
    ///   `now - keep_dedupe` when [`ConsumerConfig::keep_dedupe`](super::ConsumerConfig::keep_dedupe)
    ///   is set and later; the whole stream when neither exists.
    pub async fn durable(&self) -> Result<PullConsumer> {
        let registration = self.register().await?;
        let stream = self
            .js
            .get_stream(&self.config.stream)
            .await
            .map_err(|e| Error::Stream {
                stream: self.config.stream.clone(),
                reason: format!("cannot open it ({e}); create it first (`outbox stream ensure`)"),
            })?;
        self.set_stream_created(stream.cached_info().created.unix_timestamp_nanos());
        match stream.consumer_info(&self.config.name).await {
            Ok(info) => {
                self.check(&info.config)?;
                let durable = self.get(&stream).await?;
                // A durable made before the registry existed counts as this consumer's too.
                if !registration.created_before {
                    self.mark_created().await?;
                }
                Ok(durable)
            }
            Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {
                self.create(&stream, registration).await
            }
            Err(e) => Err(self.nats_error("reading the durable consumer", e)),
        }
    }

    fn nats_error(&self, action: &str, e: impl Into<crate::BoxError>) -> Error {
        Error::nats(
            format!(
                "{action} `{}` on stream `{}`",
                self.config.name, self.config.stream
            ),
            e,
        )
    }

    async fn get(&self, stream: &async_nats::jetstream::stream::Stream) -> Result<PullConsumer> {
        stream
            .get_consumer(&self.config.name)
            .await
            .map_err(|e| self.nats_error("opening the durable consumer", e))
    }

    /// Creates the durable; if a replica created it meanwhile, uses that one once it matches.
    async fn create(
        &self,
        stream: &async_nats::jetstream::stream::Stream,
        registration: Registration,
    ) -> Result<PullConsumer> {
        let start = if registration.created_before {
            self.dedupe_horizon().await?
        } else {
            None
        };
        let deliver_policy = match start {
            Some(start) => DeliverPolicy::ByStartTime {
                start_time: SystemTime::from(start).into(),
            },
            None => DeliverPolicy::All,
        };
        if registration.created_before {
            let since =
                start.map_or_else(|| "the start of the stream".to_owned(), |t| t.to_rfc3339());
            tracing::warn!(consumer = %self.name, stream = %self.config.stream, %since,
                "the durable consumer is gone (deleted, or its stream was); creating it again, \
                 from messages stored since the dedupe horizon");
        }
        self.holds.clear();
        let config = pull::Config {
            durable_name: Some(self.config.name.clone()),
            description: Some(format!("outbox consumer of {}", E::EVENT_TYPE)),
            filter_subject: E::EVENT_TYPE.to_owned(),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.config.ack_wait,
            // Attempts are counted and capped by the consumer (in its database), not by the
            // server, which would count outages and held events and stop silently.
            max_deliver: -1,
            deliver_policy,
            ..Default::default()
        };
        match stream.create_consumer(config).await {
            Ok(consumer) => {
                self.mark_created().await?;
                Ok(consumer)
            }
            Err(create_error) => match stream.consumer_info(&self.config.name).await {
                Ok(info) => {
                    self.check(&info.config)?;
                    self.get(stream).await
                }
                Err(_) => Err(self.nats_error("creating the durable consumer", create_error)),
            },
        }
    }

    /// Where a durable created again starts: after the newest cutoff below which dedupe rows
    /// were pruned (recorded by `retention::prune_dedupe`) and after `now - keep_dedupe` when
    /// that is set; `None` when neither is (no dedupe row was ever pruned: replay it all).
    async fn dedupe_horizon(&self) -> Result<Option<DateTime<Utc>>> {
        let recorded: Option<DateTime<Utc>> =
            sqlx::query_scalar("select pruned_before from outbox_dedupe_horizon")
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| DEDUPE_HORIZON.error(e))?;
        let configured = self
            .config
            .keep_dedupe
            .and_then(|keep| chrono::TimeDelta::from_std(keep).ok())
            .and_then(|keep| Utc::now().checked_sub_signed(keep));
        Ok(recorded.max(configured))
    }

    /// Every way `existing` differs from what this consumer needs, as one [`Error::Config`].
    fn check(&self, existing: &js_consumer::Config) -> Result<()> {
        let mut differences = Vec::new();
        let filters: Vec<&str> = if existing.filter_subjects.is_empty() {
            vec![existing.filter_subject.as_str()]
        } else {
            existing
                .filter_subjects
                .iter()
                .map(String::as_str)
                .collect()
        };
        if filters != [E::EVENT_TYPE] {
            differences.push(format!(
                "its filter subject is `{}` where this consumer of `{}` needs `{}` (is another \
                 consumer type using this name?)",
                filters.join(", "),
                E::EVENT_TYPE,
                E::EVENT_TYPE
            ));
        }
        if existing.deliver_subject.is_some() {
            differences.push("it is a push consumer; this consumer pulls".to_owned());
        }
        if existing.ack_policy != AckPolicy::Explicit {
            differences.push(format!(
                "its ack policy is {:?}; this consumer needs explicit acks",
                existing.ack_policy
            ));
        }
        if existing.ack_wait != self.config.ack_wait {
            differences.push(format!(
                "its ack_wait is {:?}; ConsumerConfig::ack_wait is {:?}",
                existing.ack_wait, self.config.ack_wait
            ));
        }
        if existing.max_deliver != -1 {
            differences.push(format!(
                "its max_deliver is {}; this consumer needs -1 (unlimited: it counts handler \
                 attempts itself, ConsumerConfig::max_attempts)",
                existing.max_deliver
            ));
        }
        if differences.is_empty() {
            return Ok(());
        }
        Err(Error::Config(format!(
            "the durable consumer `{name}` on stream `{stream}` differs from this consumer's \
             configuration: {}. Delete it to have it created again from the configuration \
             (`nats consumer rm {stream} {name}`; see docs/consumers.md, \"Resetting a \
             consumer\"), or change the configuration to match",
            differences.join("; "),
            name = self.config.name,
            stream = self.config.stream,
        )))
    }

    /// Registers the name to `E`'s event type (refusing another type's name) and says whether
    /// this consumer created its durable before.
    async fn register(&self) -> Result<Registration> {
        sqlx::query(
            "insert into outbox_consumer_names (consumer, event_type, stream) \
             values ($1, $2, $3) on conflict (consumer) do nothing",
        )
        .bind(&*self.name)
        .bind(E::EVENT_TYPE)
        .bind(&self.config.stream)
        .execute(&self.pool)
        .await
        .map_err(|e| CONSUMER_NAMES.error(e))?;
        let (event_type, created, may_count_failures): (String, Option<DateTime<Utc>>, bool) =
            sqlx::query_as(
                "select event_type, durable_created_at, \
                        has_table_privilege('outbox_consumed', 'delete') \
                        and has_column_privilege('outbox_consumed', 'consumer', 'select') \
                        and has_column_privilege('outbox_consumed', 'event_id', 'select') \
                        and has_table_privilege('outbox_consumer_attempts', 'select') \
                        and has_table_privilege('outbox_consumer_attempts', 'insert') \
                        and has_table_privilege('outbox_consumer_attempts', 'update') \
                        and has_table_privilege('outbox_consumer_attempts', 'delete') \
                   from outbox_consumer_names where consumer = $1",
            )
            .bind(&*self.name)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| CONSUMER_NAMES.error(e))?;
        if !may_count_failures {
            return Err(Error::Config(
                "permission denied to the consumer's role for a failed attempt: it deletes its \
                 dedupe row by key (`delete`, and `select` on `consumer` and `event_id` of \
                 outbox_consumed) and counts the failure (`select`, `insert`, `update` and \
                 `delete` on outbox_consumer_attempts). Run ops/postgres/grants.sql again \
                 (after every upgrade)"
                    .into(),
            ));
        }
        if event_type != E::EVENT_TYPE {
            return Err(Error::Config(format!(
                "the consumer name `{}` is registered to event type `{event_type}` (table \
                 outbox_consumer_names) and this consumer decodes `{}`: two consumer types \
                 under one name would share its dedupe rows and durable and terminate each \
                 other's messages; give each type its own ConsumerConfig::name",
                self.name,
                E::EVENT_TYPE
            )));
        }
        Ok(Registration {
            created_before: created.is_some(),
        })
    }

    async fn mark_created(&self) -> Result<()> {
        sqlx::query(
            "update outbox_consumer_names set durable_created_at = coalesce(durable_created_at, now()), \
             stream = $2 where consumer = $1",
        )
        .bind(&*self.name)
        .bind(&self.config.stream)
        .execute(&self.pool)
        .await
        .map_err(|e| CONSUMER_NAMES.error(e))?;
        Ok(())
    }
}
