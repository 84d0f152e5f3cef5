-- no-transaction
--
-- Retention's index: the published rows by `published_at`, so a prune statement reads its
-- 1,000 oldest expired rows through the index instead of scanning the table until it meets
-- them (expired rows lie scattered through a table months of deletes and reuse have shuffled,
-- and every statement would scan again past the dead rows the previous one left).
-- Unpublished rows are not in it, so an emit does not write it; a mark writes one entry (the
-- mark is never a HOT update anyway: see 0004).
--
-- Built concurrently, outside a transaction (the line above), so that emits and marks go on
-- while it builds; on a large table apply it ahead of a rollout with `outbox migrate`. A build
-- that fails leaves an invalid index behind, which `outbox_runtime::migrate` drops and builds
-- again.
create index concurrently if not exists outbox_events_published_idx
  on outbox_events (published_at)
  where published_at is not null
