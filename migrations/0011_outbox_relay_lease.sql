-- The relay lease: of the relays running on this table, one publishes at a time, the one that
-- holds the lease (docs/relay.md, *Several relays*). The others stand by and take it over
-- when it runs out.
--
--   name         the lease ('relay': one per outbox table)
--   holder       the holding relay's id, fresh for each `Relay::run`
--   acquired_at  when the holder took it
--   expires_at   when it runs out unless renewed: the holder renews it every second, for 5 s,
--                while it reaches both Postgres and NATS, on the database's clock
--
-- Only the relay's role writes it (the role set in docs/operations.md): no other role can
-- take the lease, and the relay takes no advisory lock another role could hold.
create table if not exists outbox_relay_lease (
  name         text        primary key,
  holder       uuid        not null,
  acquired_at  timestamptz not null default now(),
  expires_at   timestamptz not null
);

-- Relays share no partitions any more: the table of migration 0008 is not read.
drop table if exists outbox_relays;

-- Why a subject is held, as a label (the `cause` of `outbox_events_held_total`: `no_stream`,
-- `unsafe_stream`, `subject_mapping`, `attempt_cap`, ...); null while it backs off. `reason`
-- keeps the words. A hold whose cause is a stream's (`no_stream`, `unsafe_stream`) is released
-- by the relay itself once a stream captures the type again and is safe (docs/relay.md, *Held
-- rows*); the others wait for `outbox unblock`.
alter table outbox_retries add column if not exists cause text;
