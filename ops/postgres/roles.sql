-- The outbox's roles (docs/operations.md, *Roles*), one per component, none of them a superuser:
--
--   migrator_role   runs `outbox migrate` and owns the outbox's tables; runs grants.sql
--   relay_role      the relay (`outbox relay`, `Relay::run`)
--   emitter_role    a service that emits events (`tx.emit(..)`)
--   consumer_role   a service's consumers (`Consumer::run`)
--   retention_role  retention (`Retention::run`, `outbox prune`)
--   operator_role   `outbox status`, `outbox unblock`, `outbox verify` (without --republish)
--
-- This file creates them (without LOGIN: grant each to the login role of the process that runs
-- the component, or `alter role ... login password ...`; the migration role logs in as itself,
-- so that it owns what it creates) and gives them the database and the schema; grants.sql gives
-- each its rights on the tables, once they exist. Run it once, as a role that may create roles,
-- in the service's database:
--
--   psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -f ops/postgres/roles.sql
--
-- then `outbox migrate` as the migration role, then grants.sql as the migration role. Other
-- names than the defaults below: -v relay_role=billing_relay (and so on; the same for both
-- files). It is idempotent.

\if :{?migrator_role} \else \set migrator_role outbox_migrator \endif
\if :{?relay_role} \else \set relay_role outbox_relay \endif
\if :{?emitter_role} \else \set emitter_role outbox_emitter \endif
\if :{?consumer_role} \else \set consumer_role outbox_consumer \endif
\if :{?retention_role} \else \set retention_role outbox_retention \endif
\if :{?operator_role} \else \set operator_role outbox_operator \endif

-- (every call named in pg_catalog: an overload another role created in `public` would run as
-- this role, and `\gexec` runs the text it returns)
select pg_catalog.format('create role %I nologin', r)
  from pg_catalog.unnest(array[:'migrator_role', :'relay_role', :'emitter_role', :'consumer_role',
                    :'retention_role', :'operator_role']) as r
 where not exists (select from pg_roles where rolname = r)
\gexec

-- Each connects to this database and finds the tables in `public` (granted to PUBLIC by
-- default; a hardened database revokes that).
select pg_catalog.format('grant connect on database %I to %I, %I, %I, %I, %I, %I', current_database(),
              :'migrator_role', :'relay_role', :'emitter_role', :'consumer_role',
              :'retention_role', :'operator_role')
\gexec
grant usage on schema public to :"migrator_role", :"relay_role", :"emitter_role",
  :"consumer_role", :"retention_role", :"operator_role";
-- The migration role creates the tables (and sqlx's `_sqlx_migrations`). Let no other role
-- create in `public`: Postgres 13 and 14 let every role, so there run, as the schema's owner,
-- `revoke create on schema public from public` (not done here: other roles of the database may
-- rely on it; docs/operations.md, *Who may create where the tables are*).
grant create on schema public to :"migrator_role";
