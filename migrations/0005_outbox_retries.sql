-- The relay's retry schedule, one row per subject whose oldest unpublished event failed or
-- cannot be published. It is shared by every relay of the table, so a failing event is retried
-- on one schedule however many relays run, and it keeps the relay's own state out of
-- outbox_events, whose columns are the contract.
--
--   subject   the held or backing-off subject: its events wait, in order, behind event_id
--   event_id  the subject's oldest unpublished event, the one that failed
--   retry_at  when the relay may try event_id again; null: held until an operator releases it
--             (`outbox unblock`), for a row at the attempt cap or one the broker or the relay
--             refuses for good (no stream captures its type, over max_payload, a broken row)
--   reason    why, in words: the broker's answer or the relay's check
--   since     when the subject was first parked
--
-- A relay inserts a row in the batch that sees the failure and deletes it in the batch that
-- publishes event_id; `outbox unblock` deletes it. Rows only exist while something fails, so the
-- table stays small, and the claim reads it by primary key, once per candidate row.
create table if not exists outbox_retries (
  subject   text        primary key,
  event_id  uuid        not null,
  retry_at  timestamptz null,
  reason    text        not null,
  since     timestamptz not null default now()
);

-- The due retries, for the claim of due heads and the relay's next wake-up: the held subjects
-- (null retry_at) are left out, so the index stays as small as the failures backing off.
create index if not exists outbox_retries_due_idx
  on outbox_retries (retry_at)
  where retry_at is not null;
