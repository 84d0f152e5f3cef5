-- Each outbox role's rights on the outbox's tables (the roles: roles.sql; why each right:
-- docs/operations.md, *Roles*): exactly what its component's statements need, tested by
-- tests/tests/e2e/roles.rs, which runs each component as its role and takes each right away in
-- turn. Run it as the migration role (the tables' owner) after every `outbox migrate`:
--
--   psql "$MIGRATOR_URL" -v ON_ERROR_STOP=1 -f ops/postgres/grants.sql
--
-- with the same -v names as roles.sql. In one transaction: every right these roles hold on the
-- tables named outbox_* is revoked, then granted as below, so that a right a new version no
-- longer needs goes, and no component sees its rights missing meanwhile.
--
-- One `grant` a line, each naming one table and one role: a new table of a component is one
-- line (the test reads the file line by line).

\if :{?relay_role} \else \set relay_role outbox_relay \endif
\if :{?emitter_role} \else \set emitter_role outbox_emitter \endif
\if :{?consumer_role} \else \set consumer_role outbox_consumer \endif
\if :{?retention_role} \else \set retention_role outbox_retention \endif
\if :{?operator_role} \else \set operator_role outbox_operator \endif

begin;

-- (every call named in pg_catalog: an overload another role created in `public` would run as
-- this role, and `\gexec` runs the text it returns)
select pg_catalog.format('revoke all on %s from %I, %I, %I, %I, %I', c.oid::regclass,
              :'relay_role', :'emitter_role', :'consumer_role', :'retention_role',
              :'operator_role')
  from pg_class c
 where c.relnamespace = 'public'::regnamespace::oid and c.relkind in ('r', 'p')
   and c.relname::text like 'outbox\_%'
\gexec

-- The relay: claims unpublished rows (`for update`), marks them published or counts a failed
-- attempt; keeps the retry schedule of failing and held subjects; holds or waits for the
-- relay lease. It needs nothing else: no superuser, no pg_read_all_stats (its horizon comes
-- from pg_locks and pg_prepared_xacts, which every role reads).
grant select, update (published_at, attempts) on outbox_events to :"relay_role";
grant select, insert, update, delete on outbox_retries to :"relay_role";
grant select, insert, update on outbox_relay_lease to :"relay_role";

-- An emitting service: inserts events, and nothing else: no `published_at`, no `attempts`, no
-- reading other services' events, nothing of the relay's state. (The trace columns are written
-- with outbox-runtime's `opentelemetry` feature; emit's wake-up, an advisory lock and a
-- notification, needs no right.)
grant insert (id, event_type, source, subject, time, data, created_at, traceparent, tracestate) on outbox_events to :"emitter_role";

-- A consumer: its dedupe rows (inserted; the primary key refuses a second; deleted by its key in
-- the transaction that inserted it when the handler fails, as the failure is counted), its
-- handler attempts, its name, the dedupe horizon a re-created durable starts at, and the
-- per-subject positions of `Delivery::freshness` and `order::advance`.
grant select (consumer, event_id), insert, delete on outbox_consumed to :"consumer_role";
grant select, insert, update, delete on outbox_consumer_attempts to :"consumer_role";
grant select, insert, update on outbox_consumer_names to :"consumer_role";
grant select on outbox_dedupe_horizon to :"consumer_role";
grant select, insert, update on outbox_subject_positions to :"consumer_role";
grant select, insert, update on outbox_subject_sequences to :"consumer_role";

-- Retention: deletes spent rows, locked `for update skip locked`, which Postgres allows only
-- with an update right on some column of the table: the one whose change matters least
-- (`tracestate`, vendor trace data; a dedupe row's `consumed_at`, which only retention reads).
-- It records the dedupe horizon before pruning dedupe rows.
grant select, delete, update (tracestate) on outbox_events to :"retention_role";
grant select, delete, update (consumed_at) on outbox_consumed to :"retention_role";
grant select, insert, update on outbox_dedupe_horizon to :"retention_role";

-- The operator: `outbox status` reads the backlog and the schedule, `outbox unblock` resets
-- the attempts of held rows and makes their subjects' retries due (the relay then publishes
-- each held row and releases its subject), `outbox verify` reads published rows (its
-- --republish sets rows unpublished: run that as the migration role).
grant select, update (attempts) on outbox_events to :"operator_role";
grant select, insert (subject, event_id, retry_at, reason), update (retry_at, reason, cause) on outbox_retries to :"operator_role";

commit;
