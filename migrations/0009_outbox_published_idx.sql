-- Retention's index: the published rows by `published_at`, so a prune statement reads its
-- 1,000 oldest expired rows through the index instead of scanning the table until it meets
-- them (expired rows lie scattered through a table months of deletes and reuse have shuffled).
-- Unpublished rows are not in it, so an emit does not write it; a mark writes one entry (the
-- mark is never a HOT update anyway: see 0004).
--
-- Built in the migration's transaction, which holds writes to the table while it builds:
-- instant on a small table, but on a large one (minutes at tens of millions of rows) build it
-- beforehand, without holding writes, and this finds it:
--
--   create index concurrently if not exists outbox_events_published_idx
--     on outbox_events (published_at) where published_at is not null;
--
-- (A concurrent build here would deadlock with a second process waiting for the migration
-- lock, whose waiting statement holds a snapshot the build must wait for.) A concurrent build
-- that failed leaves an invalid index behind; `outbox_runtime::migrate` drops it and builds
-- it again.
create index if not exists outbox_events_published_idx
  on outbox_events (published_at)
  where published_at is not null;
