-- The unpublished rows of each subject in the relay's order. Before a batch publishes a
-- subject's rows it looks up the subject's oldest unpublished row it does not hold: one probe
-- of this index per claimed subject, whatever the cursor's position, so that a row whose
-- `created_at` lies in the past (written by hand, by a writer whose clock is behind the
-- database's, or set unpublished again) still goes out before the newer rows of its subject
-- (docs/relay.md, *Order*). Unpublished rows only, like 0010's: a mark writes no entry. The
-- subject by its hash, as 0010 has it: a subject is text of any length, and a B-tree entry
-- holds at most 2,704 bytes (the probe compares the subjects themselves too).
--
-- Built in the migration's transaction, which holds writes to the table while it reads it:
-- instant on a small table, but on a large one build it beforehand, without holding writes,
-- and this finds it:
--
--   create index concurrently if not exists outbox_events_unpublished_subject_idx
--     on outbox_events ((hashtext(subject)), created_at, id)
--     where published_at is null;
create index if not exists outbox_events_unpublished_subject_idx
  on outbox_events ((hashtext(subject)), created_at, id)
  where published_at is null;
