-- Retention's index: the published rows by `published_at`, so a prune statement reads its
-- 1,000 oldest expired rows through the index instead of scanning the table until it meets
-- them (expired rows lie scattered through a table months of deletes and reuse have shuffled).
-- Unpublished rows are not in it, so an emit does not write it; a mark writes one entry (the
-- mark is never a HOT update anyway: see 0004).
--
-- This statement holds writes to the table while it builds: instant on an empty table, minutes
-- on tens of millions of rows. `outbox_runtime::migrate` (and `outbox migrate`) never runs it on
-- a table with rows: it records the migration once the index exists (valid, or being built by
-- another session), builds it only on an empty table, and otherwise stops with an error that
-- names this statement, to run beforehand without holding writes:
--
--   create index concurrently if not exists outbox_events_published_idx
--     on outbox_events (published_at) where published_at is not null;
--
-- A concurrent build that failed leaves an invalid index behind; `migrate` then names
-- `drop index concurrently` and the statement above, and drops nothing a session may still be
-- building. A copy of this file in a service's own migrations runs the statement as it is:
-- build the index first on a table with rows.
create index if not exists outbox_events_published_idx
  on outbox_events (published_at)
  where published_at is not null;
