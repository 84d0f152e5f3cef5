-- The relays running on this table, one row each, so that they share the subject partitions
-- out between them instead of competing for the same rows (docs/relay.md, *Several relays*).
--
--   id          the relay's id, fresh for each `Relay::run`
--   partitions  its RelayConfig::partitions (every relay of a table must use the same value)
--   lanes       its RelayConfig::lanes: the number of partition slots it takes
--   started_at  when it joined
--   seen_at     its last heartbeat (every second), on the database's clock; a relay not seen
--               for 5 s is taken as gone and its slots go to the others
--
-- A relay inserts its row when it starts, refreshes it every second and deletes it when it
-- stops; rows not seen for an hour are deleted by the others. Unlogged: after a crash or a
-- failover the table starts empty and the relays' next heartbeats fill it again.
create unlogged table if not exists outbox_relays (
  id          uuid        primary key,
  partitions  int         not null,
  lanes       int         not null,
  started_at  timestamptz not null default now(),
  seen_at     timestamptz not null default now()
);
