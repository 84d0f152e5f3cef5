//! The relay's statements. Each says in three lines or less what it relies on; the reasoning
//! behind their shapes is in docs/relay.md and the measurements in docs/performance.md.
//!
//! Parameters shared by several statements: a lane is `$lanes`/`$lane` over `$partitions`;
//! positions are a `timestamptz` bound in Postgres's own binary form (infinities included) and
//! a `uuid` ([`Position`](super::position::Position)).

/// `(hashtext(subject) & 0x7fffffff) % partitions`: the subject's partition.
macro_rules! partition {
    ($p:literal) => {
        concat!("(hashtext(o.subject) & 2147483647) % ", $p)
    };
}

/// The lane's partitions (`$p` of them, lane `$i` of `$c`): the contiguous range
/// `[i * p / c, (i + 1) * p / c)`, checked on the row.
macro_rules! in_lane {
    ($p:literal, $c:literal, $i:literal) => {
        concat!(
            partition!($p),
            " >= ",
            $i,
            "::int8 * ",
            $p,
            " / ",
            $c,
            " and ",
            partition!($p),
            " < (",
            $i,
            "::int8 + 1) * ",
            $p,
            " / ",
            $c
        )
    };
}

/// The same range as bounds of the unpublished index's third column (migration 0010: the
/// partition of 1024), so the index skips the other lanes' rows without reading the table.
/// Vacuous when the relay does not run 1024 partitions; [`in_lane!`] decides then.
macro_rules! lane_bounds {
    ($p:literal, $c:literal, $i:literal) => {
        concat!(
            partition!("1024"),
            " >= case when ",
            $p,
            " = 1024 then ",
            $i,
            " * 1024 / ",
            $c,
            " else 0 end and ",
            partition!("1024"),
            " < case when ",
            $p,
            " = 1024 then (",
            $i,
            " + 1) * 1024 / ",
            $c,
            " else 1024 end"
        )
    };
}

/// Whether the subject of row `$o` has a retry schedule ([`outbox_retries`](../../migrations)):
/// a scalar subquery, so that it is one primary-key probe per candidate row whatever the
/// planner thinks of the table's size (an anti-join would hash the whole table).
macro_rules! parked {
    ($o:literal) => {
        concat!(
            "(select true from outbox_retries r where r.subject = ",
            $o,
            ".subject limit 1) is not null"
        )
    };
}

/// Rows at or after `($at, $id)`, in the relay's order `(created_at, id)`; the first
/// comparison lets the unpublished index bound the range.
macro_rules! from {
    ($at:literal, $id:literal) => {
        concat!(
            "o.created_at >= ",
            $at,
            " and (o.created_at, o.id) >= (",
            $at,
            ", ",
            $id,
            ")"
        )
    };
}

/// The unpublished rows of the lane (`$p` partitions, lane `$i` of `$c`) from `($at, $id)`
/// on, up to `($to_at, $to_id)` by `$cmp` when `$to_at` is not null: the predicate of the
/// ranges ([`RANGE`], whose bound is excluded: `<`) and of the claim ([`CLAIM`], whose bound
/// is included: `<=`), written once so that they cannot drift apart.
macro_rules! unpublished_in_lane {
    (($p:literal, $c:literal, $i:literal), ($at:literal, $id:literal), $cmp:literal, ($to_at:literal, $to_id:literal)) => {
        concat!(
            "o.published_at is null",
            " and ",
            from!($at, $id),
            " and o.created_at <= coalesce(",
            $to_at,
            "::timestamptz, 'infinity')",
            " and (",
            $to_at,
            "::timestamptz is null or (o.created_at, o.id) ",
            $cmp,
            " (",
            $to_at,
            "::timestamptz, ",
            $to_id,
            "::uuid))",
            " and ",
            lane_bounds!($p, $c, $i),
            " and ",
            in_lane!($p, $c, $i)
        )
    };
}

/// The batch transaction's start and its own settings, in one round trip (the simple query
/// protocol: the text is parsed at every batch, so it holds nothing to plan):
/// `statement_ms`: statement and lock timeout, `idle_ms`: idle-in-transaction timeout, and how
/// long what the server sends may stay unacknowledged (`tcp_user_timeout`: a server blocked
/// sending a claim's rows to a relay whose path went silent, or whose process froze, is busy,
/// not idle, and would hold the claimed rows until TCP gives up).
pub(super) fn begin_settings(statement_ms: u128, idle_ms: u128) -> String {
    format!(
        "begin; \
select set_config('synchronous_commit', 'off', true),
       set_config('enable_seqscan', 'off', true),
       set_config('enable_bitmapscan', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('statement_timeout', '{statement_ms}', true),
       set_config('lock_timeout', '{statement_ms}', true),
       set_config('idle_in_transaction_session_timeout', '{idle_ms}', true),
       set_config('tcp_user_timeout', '{idle_ms}', true)"
    )
}

/// A sample of the transactions running on the database, for the horizon
/// ([`Horizon`](super::horizon::Horizon)): the statement's instant in microseconds from
/// 2000-01-01 (taken before the locks are read), each running transaction as
/// `pid:virtual id:transaction id` (the last empty while it has none; one read of the locks,
/// so that each id stays with its transaction), comma-separated, and the prepared
/// transactions' ids. `pg_locks`, `pg_stat_activity`'s `datname` and `backend_xid` and
/// `pg_prepared_xacts` are readable by every role.
pub(super) const SAMPLE: &str = "\
select (extract(epoch from statement_timestamp()) operator(pg_catalog.*) 1000000)::int8 - 946684800000000 as sampled_at,
       (select coalesce(string_agg(l.pid::text || ':' || l.virtualtransaction || ':' || coalesce(a.backend_xid::text, ''), ','), '')
          from pg_locks l join pg_stat_activity a on a.pid = l.pid
         where l.locktype = 'virtualxid' and l.granted and l.virtualxid = l.virtualtransaction
           and a.datname = current_database()) as running,
       (select coalesce(string_agg(p.transaction::text, ','), '') from pg_prepared_xacts p
         where p.database = current_database()) as prepared";

/// The columns of a claimed row, in [`Row::decode`](super::row::Row::decode)'s order; `traced`
/// adds the trace context of migration 0007 (a table without it is claimed without them).
macro_rules! columns {
    () => {
        "o.id, o.event_type, o.source, o.subject, o.time, o.data, o.created_at, o.attempts, pg_catalog.tidsend(o.ctid)"
    };
    (traced) => {
        concat!(columns!(), ", o.traceparent, o.tracestate")
    };
}

/// Whether the outbox table has the trace context columns (migration 0007): fails with
/// `undefined_column` when it has not.
pub(super) const TRACE_COLUMNS: &str = "select traceparent, tracestate from outbox_events limit 0";

/// Up to `$8` unpublished rows of the lane (`$1`-`$3`) from `($4, $5)` on, and before `($6,
/// $7)` when `$6` is not null, in the relay's order: how many, the first whose subject is not
/// parked (locked or not), and the last. A sweep's step below the cursor, or the scan's read
/// ahead ([`Cursor`](super::cursor::Cursor)); `$extra` adds columns.
macro_rules! range {
    ($($extra:expr)?) => {
        concat!(
            "with w as (",
            "  select o.created_at, o.id, o.subject from outbox_events o",
            "   where ",
            unpublished_in_lane!(("$1", "$2", "$3"), ("$4", "$5"), "<", ("$6", "$7")),
            "   order by o.created_at, o.id",
            "   limit $8)",
            "select (select count(*) from w) as rows,",
            "       f.created_at as first_at, f.id as first_id,",
            "       l.created_at as last_at, l.id as last_id",
            $($extra,)?
            "  from (select 1) as one",
            "  left join lateral (select w.created_at, w.id from w where not ",
            parked!("w"),
            "       order by w.created_at, w.id limit 1) as f on true",
            "  left join lateral (select w.created_at, w.id from w",
            "       order by w.created_at desc, w.id desc limit 1) as l on true"
        )
    };
}
pub(super) const RANGE: &str = range!();

/// What a batch needs to know of the retry schedule before its claim: whether a retry is due
/// now, and when the next one comes due (seconds from now, on the database's clock). Two
/// probes of the schedule's index; in the window's statement, which is planned once (in the
/// batch's first statement, parsed and planned at every batch, they cost about 0.1 ms of the
/// server's time).
macro_rules! retries {
    () => {
        concat!(
            ", exists (select 1 from outbox_retries where retry_at <= now()) as due,",
            " extract(epoch from (select min(retry_at) from outbox_retries where retry_at > now()) - now())::float8 as next_retry"
        )
    };
}

/// [`RANGE`] for the cursor's window (`$6` null), with the retry schedule's columns.
pub(super) const WINDOW: &str = range!(retries!());

/// The heads of the subjects whose retry is due, in the lane (`$2`-`$4`); `$1` limits them. A
/// due subject's head is its oldest unpublished row (one probe of the subject index, migration
/// 0012), which is the schedule's row unless an older one appeared since (written by hand, or
/// set unpublished again): no older row of the subject can then be left behind. The due
/// schedules come first (the schedule's index on `retry_at`), then each head by primary key,
/// whatever the planner thinks of the schedule's size.
macro_rules! claim_due {
    ($($traced:ident)?) => {
        concat!(
            "select ",
            columns!($($traced)?),
            "  from outbox_events o",
            " where o.id = any(array(",
            "         select (select e.id from outbox_events e",
            "                  where hashtext(e.subject) = hashtext(r.subject) and e.subject = r.subject",
            "                    and e.published_at is null",
            "                  order by e.created_at, e.id limit 1)",
            "           from outbox_retries r",
            "          where r.retry_at <= now() order by r.retry_at limit $1 * 4))",
            "   and o.published_at is null",
            "   and ",
            in_lane!("$2", "$3", "$4"),
            " order by o.created_at, o.id",
            " limit $1",
            "   for update of o skip locked"
        )
    };
}
pub(super) const CLAIM_DUE: &str = claim_due!();
/// [`CLAIM_DUE`] with the trace context columns.
pub(super) const CLAIM_DUE_TRACED: &str = claim_due!(traced);

/// The claim: unpublished rows of the lane (`$2`-`$4`) from the cursor (`$5`, `$6`) up to and
/// including `($7, $8)` when `$7` is not null, in the relay's order, whose subject is neither
/// parked nor paused by this relay (`$9`); `skip locked` passes others' rows.
macro_rules! claim {
    ($($traced:ident)?) => {
        concat!(
            "select ",
            columns!($($traced)?),
            "  from outbox_events o",
            " where ",
            unpublished_in_lane!(("$2", "$3", "$4"), ("$5", "$6"), "<=", ("$7", "$8")),
            "   and not ",
            parked!("o"),
            "   and o.subject not in (select pg_catalog.unnest($9::text[]))",
            " order by o.created_at, o.id",
            " limit $1",
            "   for update of o skip locked"
        )
    };
}
/// The claim alone (the relay runs it as part of [`CLAIM_CUT`]; the tests read its plan).
pub(super) const CLAIM: &str = claim!();

/// [`CLAIM`] and its cut in one statement: each claimed row with `cut`, whether it lies after
/// a hole of its subject, in the same snapshot as the claim. A hole is the subject's first
/// unpublished row before its last claimed one that the claim does not hold (another
/// transaction locks it, the claim passed it, or it lies before the cursor): one probe of the
/// subject index (migration 0012) per claimed subject, wherever the cursor is.
macro_rules! claim_cut {
    ($($traced:ident)?) => {
        concat!(
            "with c as materialized (",
            claim!($($traced)?),
            "),",
            " last as (select distinct on (c.subject) c.subject, c.created_at, c.id from c",
            "           order by c.subject, c.created_at desc, c.id desc),",
            " holes as materialized (",
            "   select h.subject, h.created_at, h.id from last cross join lateral (",
            "     select o.subject, o.created_at, o.id from outbox_events o",
            "      where hashtext(o.subject) = hashtext(last.subject) and o.subject = last.subject",
            "        and o.published_at is null",
            "        and o.created_at <= last.created_at",
            "        and (o.created_at, o.id) < (last.created_at, last.id)",
            "        and o.id not in (select c.id from c)",
            "      order by o.created_at, o.id limit 1) h)",
            "select c.*, coalesce((c.created_at, c.id) > (h.created_at, h.id), false) as cut",
            "  from c left join holes h on h.subject = c.subject",
            " order by c.created_at, c.id"
        )
    };
}
pub(super) const CLAIM_CUT: &str = claim_cut!();
/// [`CLAIM_CUT`] with the trace context columns.
pub(super) const CLAIM_CUT_TRACED: &str = claim_cut!(traced);

/// The marks address the claimed rows by `ctid`, which their row locks keep stable until this
/// transaction updates them (a plain table: in a partitioned one a `ctid` is not unique). The
/// claim reads each as `tidsend`'s bytes and the marks send them as text: sqlx does not know the
/// `tid` type, and would look it up in the catalog with a statement of its own, whose
/// unqualified calls another role could overload (`relay_foreign::functions_and_operators_...`).
pub(super) const MARK_PUBLISHED: &str =
    "update outbox_events set published_at = clock_timestamp() where ctid = any($1::text[]::tid[])";

/// See [`MARK_PUBLISHED`]: one more attempt on each row that failed.
pub(super) const MARK_FAILED: &str =
    "update outbox_events set attempts = attempts + 1 where ctid = any($1::text[]::tid[])";

/// Parks the subjects of the given rows (`$1`): retry after `$2` milliseconds, on the
/// database's clock, or held when that is null; `$3` says why, `$4` is the hold's cause (its
/// label; null while it backs off). One row per subject.
pub(super) const PARK: &str = "\
insert into outbox_retries as r (subject, event_id, retry_at, reason, cause)
select o.subject, o.id,
       case when u.delay_ms is null then null else now() + u.delay_ms * interval '1 millisecond' end,
       u.reason, u.cause
  from unnest($1::uuid[], $2::float8[], $3::text[], $4::text[]) as u(id, delay_ms, reason, cause)
  join outbox_events o on o.id = u.id
    on conflict (subject) do update
   set event_id = excluded.event_id, retry_at = excluded.retry_at, reason = excluded.reason,
       cause = excluded.cause";

/// Releases the subjects whose parked head (`$1`, ids) was published.
pub(super) const UNPARK: &str = "delete from outbox_retries where event_id = any($1)";

/// Retry schedules whose head is no longer an unpublished row (published or deleted by hand):
/// their subjects, which stay parked until the relay moves the schedule on ([`REPOINT`]). One
/// primary-key probe per schedule (a scalar subquery: an anti-join would read the whole table),
/// so that the statement stays short however large the table is: a long statement of the
/// relay's own would hold its horizon back too.
pub(super) const STALE: &str = "\
select r.subject from outbox_retries r
 where (select e.published_at is null from outbox_events e where e.id = r.event_id) is not true
 limit 100";

/// Moves the stale schedule of subject `$1` on to the subject's oldest unpublished row, due
/// now, so that the lane whose partition it is publishes it and releases the subject in order
/// (its later rows lie behind the cursor); or drops the schedule when the subject has no
/// unpublished row. Rare (a head written by hand), so the subject's rows are found by the
/// unpublished index, however long.
pub(super) const REPOINT: &str = "\
with head as (select o.id from outbox_events o
               where o.subject = $1 and o.published_at is null
               order by o.created_at, o.id limit 1),
     moved as (update outbox_retries r
                  set event_id = head.id, retry_at = now(),
                      reason = 'its event was published or deleted by hand; the next one goes now'
                 from head
                where r.subject = $1
                  and not exists (select 1 from outbox_events e
                                   where e.id = r.event_id and e.published_at is null)
               returning 1),
     dropped as (delete from outbox_retries r
                  where r.subject = $1 and not exists (select 1 from head)
                    and not exists (select 1 from outbox_events e
                                     where e.id = r.event_id and e.published_at is null)
                 returning 1)
select (select count(*) from moved) + (select count(*) from dropped)";

/// The held rows, oldest first, with their schedules' reasons (`created_at` as text: it may be
/// infinite in a hand-written row).
pub(super) const HELD: &str = "\
select e.id, e.event_type, e.subject, e.attempts, r.reason, r.since,
       case when isfinite(e.created_at) then e.created_at end as created_at
  from outbox_retries r
  join outbox_events e on e.id = r.event_id
 where r.retry_at is null and e.published_at is null
 order by r.since, e.id";

/// The event types of the rows held for one of the causes `$1` (labels), up to 1,000.
pub(super) const HELD_TYPES: &str = "\
select distinct e.event_type
  from outbox_retries r
  join outbox_events e on e.id = r.event_id
 where r.retry_at is null and r.cause = any($1)
 limit 1000";

/// Releases the holds of type `$1` whose cause is one of `$2`: due now, so that the lane whose
/// partition it is publishes the held head, and releases the subject in order once it is
/// published; `$3` says why. Wakes every relay when it released any. Returns how many.
pub(super) const RELEASE_HELD: &str = "\
with released as (update outbox_retries r
                     set retry_at = now(), cause = null, reason = $3
                    from outbox_events e
                   where e.id = r.event_id and e.event_type = $1
                     and r.retry_at is null and r.cause = any($2)
                  returning 1),
     wake as (select pg_notify($4, '') from (select 1 from released limit 1) x)
select (select count(*) from released) + 0 * (select count(*) from wake)";

/// The event types of the unpublished rows (up to `$1`), for the relay's first check of the
/// streams that capture them.
pub(super) const BACKLOG_TYPES: &str =
    "select distinct event_type from outbox_events where published_at is null limit $1";

/// The relay lease (migration 0011): holder `$1` takes it or keeps it for `$2` milliseconds,
/// when it holds it or the holder's has run out, on the database's clock. Returns how long it
/// is held from now, in seconds; no row when another relay holds it.
pub(super) const LEASE: &str = "\
insert into outbox_relay_lease as l (name, holder, acquired_at, expires_at)
values ('relay', $1, now(), now() + $2 * interval '1 millisecond')
    on conflict (name) do update
   set holder = excluded.holder,
       acquired_at = case when l.holder = excluded.holder then l.acquired_at else now() end,
       expires_at = excluded.expires_at
 where l.holder = excluded.holder or l.expires_at < now()
returning extract(epoch from (l.expires_at - now()))::float8";

/// Holder `$1` gives the lease up: another relay may take it at once.
pub(super) const RESIGN: &str = "\
update outbox_relay_lease set expires_at = now() - interval '1 millisecond'
 where name = 'relay' and holder = $1";

#[cfg(test)]
mod tests {
    use super::*;

    fn squash(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn the_claim_tests_the_lane_the_schedules_and_the_pauses_and_takes_no_advisory_lock() {
        let claim = squash(CLAIM);
        for condition in [
            in_lane!("$2", "$3", "$4"),
            "from outbox_retries r where r.subject = o.subject",
            "not in (select pg_catalog.unnest($9::text[]))",
        ] {
            assert!(claim.contains(condition), "{condition} in {claim}");
        }
        assert!(!claim.contains("advisory"), "{claim}");
        assert!(claim.ends_with("order by o.created_at, o.id limit $1 for update of o skip locked"));
    }

    #[test]
    fn the_traced_claims_read_the_trace_columns_after_the_others_and_nothing_else() {
        for (plain, traced) in [(CLAIM_CUT, CLAIM_CUT_TRACED), (CLAIM_DUE, CLAIM_DUE_TRACED)] {
            assert!(!plain.contains("traceparent"), "{plain}");
            let columns = concat!(columns!(), ", o.traceparent, o.tracestate");
            assert_eq!(traced.replacen(columns, columns!(), 1), plain);
        }
    }

    #[test]
    fn the_statements_over_the_backlog_start_at_a_position_the_index_can_bound() {
        for (name, sql) in [("CLAIM", CLAIM), ("RANGE", RANGE), ("WINDOW", WINDOW)] {
            let sql = squash(sql);
            assert!(
                sql.contains("o.created_at >= $") && sql.contains("(o.created_at, o.id) >= ($"),
                "{name}: {sql}"
            );
        }
    }

    #[test]
    fn a_window_judges_parked_subjects_as_the_claim_does() {
        assert!(squash(RANGE).contains(&squash(parked!("w"))));
        assert_eq!(
            squash(parked!("w")).replace("w.subject", "o.subject"),
            squash(parked!("o"))
        );
        assert!(squash(RANGE).contains(lane_bounds!("$1", "$2", "$3")));
        assert!(squash(RANGE).contains(in_lane!("$1", "$2", "$3")));
        assert_eq!(WINDOW.replacen(retries!(), "", 1), RANGE);
    }

    #[test]
    fn the_claim_finds_its_holes_in_its_own_statement_over_the_whole_subject() {
        let claim_cut = squash(CLAIM_CUT);
        assert!(claim_cut.starts_with(&format!("with c as materialized ({}", squash(CLAIM))));
        assert!(claim_cut.contains("o.id not in (select c.id from c)"));
        assert!(claim_cut.contains(
            "where hashtext(o.subject) = hashtext(last.subject) and o.subject = last.subject and o.published_at is null"
        ));
        // no lower bound: a hole before the cursor counts
        assert!(!claim_cut.contains("$10"), "{claim_cut}");
        assert!(claim_cut.ends_with(
            "as cut from c left join holes h on h.subject = c.subject order by c.created_at, c.id"
        ));
    }

    #[test]
    fn a_due_subjects_head_is_its_oldest_unpublished_row() {
        let due = squash(CLAIM_DUE);
        assert!(due.contains(
            "where hashtext(e.subject) = hashtext(r.subject) and e.subject = r.subject and e.published_at is null order by e.created_at, e.id limit 1"
        ));
    }
}
