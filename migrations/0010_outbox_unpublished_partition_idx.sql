-- The relay's lanes read the unpublished rows of their own partitions only. A lane owns a
-- contiguous range of the subject partitions, and with the partition (of 1024, the relay's
-- default) as the index's third column, the claim bounds that range in the index: the other
-- lanes' rows, which lie between its own in `(created_at, id)` order, are skipped without
-- reading the table. `outbox_events_unpublished_idx` (0001) stays, as the contract's; this one
-- holds the same rows (unpublished ones only, so a mark writes neither).
--
-- Built like 0009: `outbox_runtime::migrate` runs this statement only on an empty table, and on
-- one with rows names the statement to run beforehand without holding writes:
--
--   create index concurrently if not exists outbox_events_unpublished_partition_idx
--     on outbox_events (created_at, id, ((hashtext(subject) & 2147483647) % 1024))
--     where published_at is null;
create index if not exists outbox_events_unpublished_partition_idx
  on outbox_events (created_at, id, ((hashtext(subject) & 2147483647) % 1024))
  where published_at is null;
