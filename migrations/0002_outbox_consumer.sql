-- Consumer side of the outbox: a delivery is handled at most once per consumer, because the
-- handler's transaction inserts (consumer, event_id) here and the primary key refuses a second.
create table if not exists outbox_consumed (
  consumer    text        not null,
  event_id    uuid        not null,
  consumed_at timestamptz not null default now(),
  primary key (consumer, event_id)
);

-- Retention prunes dedupe rows past their window, oldest first.
create index if not exists outbox_consumed_consumed_at_idx
  on outbox_consumed (consumed_at);

-- The newest event time each consumer has applied per subject, for handlers whose effect
-- depends on order (a late redelivery must not overwrite newer state).
create table if not exists outbox_subject_positions (
  consumer     text        not null,
  subject      text        not null,
  applied_time timestamptz not null,
  primary key (consumer, subject)
);
