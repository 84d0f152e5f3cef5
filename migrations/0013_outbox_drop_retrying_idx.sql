-- 0003's index of the subjects of rows that failed at least once is read by no statement any
-- more (the relay's schedule, 0005, parks subjects), and it indexes `subject` itself: a B-tree
-- entry holds at most 2,704 bytes, so a row with a longer subject (the column is text of any
-- length) could not have its `attempts` raised once it was in it, and its failed batch could
-- not be marked. Dropping it takes the table's lock for an instant (`migrate` waits 2 s at most
-- for it).
drop index if exists outbox_events_retrying_idx;
