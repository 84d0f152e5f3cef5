-- Consumer state beyond the dedupe rows of 0002: the handler's real attempts, the consumer
-- names in use, and per-subject positions in stream order.

-- Handler failures per (consumer, event): the give-up budget. JetStream's delivery count is
-- not used for it, because it also counts the consumer's own outages (redeliveries while the
-- database is down) and the events held behind an earlier failing event of their subject.
-- A row is deleted when its event is applied or given up.
create table if not exists outbox_consumer_attempts (
  consumer   text        not null,
  event_id   uuid        not null,
  attempts   int         not null,
  last_error text        not null,
  updated_at timestamptz not null default now(),
  primary key (consumer, event_id)
);

-- One row per consumer name: the event type it decodes (a second type under the same name is
-- refused at start, as the two would share dedupe rows and a durable), and when this consumer
-- first created its durable (a durable created again later is a re-creation: it starts at the
-- dedupe retention instead of replaying the whole stream).
create table if not exists outbox_consumer_names (
  consumer           text        primary key,
  event_type         text        not null,
  stream             text        not null,
  durable_created_at timestamptz null,
  registered_at      timestamptz not null default now()
);

-- The newest stream position each consumer has applied per subject (the stream's creation
-- time, then the message's stream sequence): an order that does not depend on the clocks of
-- the hosts that emitted the events. See `outbox_runtime::order`.
create table if not exists outbox_subject_sequences (
  consumer         text        not null,
  subject          text        not null,
  stream_created   timestamptz not null,
  applied_sequence bigint      not null,
  primary key (consumer, subject)
);

-- The newest `consumed_at` cutoff retention pruned dedupe rows below (one row). Recorded before
-- the rows are deleted; a durable created again starts at messages stored since then, so no
-- event whose dedupe row is gone is delivered to it again.
create table if not exists outbox_dedupe_horizon (
  id            boolean     primary key default true check (id),
  pruned_before timestamptz not null
);
