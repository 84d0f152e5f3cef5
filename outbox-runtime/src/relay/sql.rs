//! The relay's statements. Each says in three lines or less what it relies on; the reasoning
//! behind their shapes is in docs/relay.md and the measurements in docs/performance.md.
//!
//! Parameters shared by several statements: a lane is `$lanes`/`$lane` over `$partitions`;
//! the lane's floor (every unpublished row at or before it is parked) is `$floor_at`
//! (timestamptz as text, infinities included) and `$floor_id`.

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

/// Whether the row's subject has a retry schedule ([`outbox_retries`](../../migrations)): a
/// scalar subquery, so that it is one primary-key probe per candidate row whatever the planner
/// thinks of the table's size (an anti-join would hash the whole table).
macro_rules! parked {
    () => {
        "(select true from outbox_retries r where r.subject = o.subject limit 1) is not null"
    };
}

/// Rows after the lane's floor, in the relay's order `(created_at, id)`; the first comparison
/// lets the unpublished index bound the range.
macro_rules! after_floor {
    ($at:literal, $id:literal) => {
        concat!(
            "o.created_at >= ",
            $at,
            "::timestamptz and (o.created_at, o.id) > (",
            $at,
            "::timestamptz, ",
            $id,
            ")"
        )
    };
}

/// The batch transaction's own settings and what the batch needs to know first: whether any
/// subject is parked, whether a retry is due now, when the next one comes due (seconds from now, on the database's
/// clock), the snapshot's bounds (for the floor), and, when `$3`, when the oldest transaction
/// running on the database began, if this session can see every other one (no `<insufficient
/// privilege>` row, no session with `track_activities` off): a row a running or later
/// transaction commits has a `created_at` at or after it (reading `pg_stat_activity` costs
/// a few microseconds per session, so a lane reads it now and then). `$1`: statement and lock
/// timeout, `$2`: idle-in-transaction timeout, both in milliseconds.
pub(super) const SETTINGS: &str = "\
select set_config('synchronous_commit', 'off', true),
       set_config('enable_seqscan', 'off', true),
       set_config('enable_bitmapscan', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('statement_timeout', $1, true),
       set_config('lock_timeout', $1, true),
       set_config('idle_in_transaction_session_timeout', $2, true),
       exists (select 1 from outbox_retries) as parked,
       exists (select 1 from outbox_retries where retry_at <= now()) as due,
       extract(epoch from (select min(retry_at) from outbox_retries where retry_at > now()) - now())::float8 as next_retry,
       pg_snapshot_xmin(pg_current_snapshot())::text as xmin,
       pg_snapshot_xmax(pg_current_snapshot())::text as xmax,
       case when $3 then
         (select case when bool_and(a.backend_type is not null and a.state is distinct from 'disabled')
                      then min(a.xact_start) end
            from pg_stat_activity a where a.datname = current_database()) end as oldest";

/// The columns of a claimed row, in [`Row::decode`](super::row::Row::decode)'s order; `traced`
/// adds the trace context of migration 0007 (a table without it is claimed without them).
macro_rules! columns {
    () => {
        "o.id, o.event_type, o.source, o.subject, o.time, o.data, o.created_at, o.attempts, o.ctid"
    };
    (traced) => {
        concat!(columns!(), ", o.traceparent, o.tracestate")
    };
}

/// Whether the outbox table has the trace context columns (migration 0007): fails with
/// `undefined_column` when it has not.
pub(super) const TRACE_COLUMNS: &str = "select traceparent, tracestate from outbox_events limit 0";

/// The heads of the subjects whose retry is due, in the lane (`$2`-`$4`), with their
/// partition's advisory lock (`$5`); `$1` limits them. The schedule names each head by id: the
/// due ids come first (the schedule's index on `retry_at`), then each head by primary key,
/// whatever the planner thinks of the schedule's size.
macro_rules! claim_due {
    ($($traced:ident)?) => {
        concat!(
            "select ",
            columns!($($traced)?),
            "  from outbox_events o",
            " where o.id = any(array(select r.event_id from outbox_retries r",
            "                         where r.retry_at <= now() order by r.retry_at limit $1 * 4))",
            "   and o.published_at is null",
            "   and case when ",
            in_lane!("$2", "$3", "$4"),
            " then pg_try_advisory_xact_lock($5, ",
            partition!("$2"),
            ") end",
            " order by o.created_at, o.id",
            " limit $1",
            "   for update of o skip locked"
        )
    };
}
pub(super) const CLAIM_DUE: &str = claim_due!();
/// [`CLAIM_DUE`] with the trace context columns.
pub(super) const CLAIM_DUE_TRACED: &str = claim_due!(traced);

/// The claim: unpublished rows after the floor (`$6`, `$7`), in the relay's order, of the
/// lane's partitions (`$2`-`$4`), whose subject is neither parked nor paused by this relay
/// (`$8`), with the partition's advisory lock (`$5`); `skip locked` skips others' rows.
macro_rules! claim {
    ($($traced:ident)?) => {
        concat!(
            "select ",
            columns!($($traced)?),
            "  from outbox_events o",
            " where o.published_at is null",
            "   and ",
            after_floor!("$6", "$7"),
            "   and ",
            lane_bounds!("$2", "$3", "$4"),
            "   and case when ",
            in_lane!("$2", "$3", "$4"),
            "             and not ",
            parked!(),
            "             and o.subject not in (select unnest($8::text[]))",
            "            then pg_try_advisory_xact_lock($5, ",
            partition!("$2"),
            ") end",
            " order by o.created_at, o.id",
            " limit $1",
            "   for update of o skip locked"
        )
    };
}
pub(super) const CLAIM: &str = claim!();
/// [`CLAIM`] with the trace context columns.
pub(super) const CLAIM_TRACED: &str = claim!(traced);

/// [`UNCLAIMED`]'s range: the lane's (`$1`-`$3`) unpublished rows from the floor (`$4`,
/// `$5`) to the claim's last (`$6`, `$7`).
macro_rules! in_claim_range {
    () => {
        concat!(
            "o.published_at is null and ",
            after_floor!("$4", "$5"),
            " and o.created_at <= $6::timestamptz",
            " and (o.created_at, o.id) <= ($6::timestamptz, $7)",
            " and ",
            lane_bounds!("$1", "$2", "$3"),
            " and ",
            in_lane!("$1", "$2", "$3")
        )
    };
}

/// The lane's unpublished rows from the floor (`$4`, `$5`) to the claim's last (`$6`, `$7`),
/// second; first, those of them [`CLAIM`] could take (without its locks), read only when the
/// second is not the claim's size (`$9`: the claim holds them all, and all are claimable).
/// When the first is the claim's size, no claimed subject can have a hole and [`GAPS`] need
/// not run; when the second is more than the first, the claim read rows it had to pass (parked
/// or paused), which a look ahead of the floor may skip. `$1`-`$3`: the lane; `$8`: paused
/// subjects.
pub(super) const UNCLAIMED: &str = concat!(
    "select case when u.n = $9 then u.n else (",
    "         select count(*) from outbox_events o where ",
    in_claim_range!(),
    "            and not ",
    parked!(),
    "            and o.subject not in (select unnest($8::text[]))) end,",
    "       u.n",
    "  from (select count(*) as n from outbox_events o where ",
    in_claim_range!(),
    ") as u"
);

/// Per claimed subject (`$1`, with its last claimed position in `$2`, `$3`), its first
/// unpublished row after the floor (`$4`, `$5`) and not after that position that the claim
/// (`$6`, ids) does not hold: the hole the subject's claimed rows are cut at.
pub(super) const GAPS: &str = concat!(
    "select distinct on (o.subject) o.subject, o.created_at, o.id",
    "  from outbox_events o",
    "  join unnest($1::text[], $2::timestamptz[], $3::uuid[]) as f(subject, last_at, last_id)",
    "    on o.subject = f.subject",
    " where o.published_at is null",
    "   and ",
    after_floor!("$4", "$5"),
    "   and (o.created_at, o.id) <= (f.last_at, f.last_id)",
    "   and not exists (select 1 from unnest($6::uuid[]) as c(id) where c.id = o.id)",
    " order by o.subject, o.created_at, o.id"
);

/// Around [`GAPS`]: its anti-join against the claimed ids must be a hash join (a generic
/// plan takes the id array for 10 elements and would loop over it per candidate row).
pub(super) const NESTLOOP_OFF: &str = "select set_config('enable_nestloop', 'off', true)";
/// See [`NESTLOOP_OFF`].
pub(super) const NESTLOOP_ON: &str = "select set_config('enable_nestloop', 'on', true)";

/// Whether a row [`CLAIM`] could take, emitted before the batch began, is waiting: its
/// predicate without its locks (`$1`-`$3` the lane, `$4`, `$5` the floor, `$6` paused), so
/// other transactions' locks and the batch's own cut rows count.
pub(super) const WAITING: &str = concat!(
    "select 1",
    "  from outbox_events o",
    " where o.published_at is null",
    "   and o.created_at < now()",
    "   and ",
    after_floor!("$4", "$5"),
    "   and ",
    lane_bounds!("$1", "$2", "$3"),
    "   and ",
    in_lane!("$1", "$2", "$3"),
    "   and not ",
    parked!(),
    "   and o.subject not in (select unnest($6::text[]))",
    " order by o.created_at",
    " limit 1"
);

/// Where the lane's floor (`$4`, `$5`) may move: its first claimable row after the floor
/// (neither parked nor paused, `$6`), if any, and the instant a second before this statement
/// (the floor stays behind both). One range of the unpublished index, read once (docs/relay.md,
/// *Parked subjects, and the floor*). `$1`-`$3`: the lane.
pub(super) const ADVANCE: &str = concat!(
    "select f.created_at, f.id, statement_timestamp() - interval '1 second' as settled",
    "  from (select 1) as one",
    "  left join lateral (",
    "       select o.created_at, o.id from outbox_events o",
    "        where o.published_at is null and ",
    after_floor!("$4", "$5"),
    "          and ",
    lane_bounds!("$1", "$2", "$3"),
    "          and ",
    in_lane!("$1", "$2", "$3"),
    "          and not ",
    parked!(),
    "          and o.subject not in (select unnest($6::text[]))",
    "        order by o.created_at, o.id limit 1) as f on true"
);

/// The lane's first claimable row at or before its floor (`$4`, `$5`), if one appeared there
/// (a row inserted by hand with an old `created_at`): the floor moves back before it.
/// `$1`-`$3`: the lane; `$6`: paused subjects.
pub(super) const BELOW_FLOOR: &str = concat!(
    "select o.created_at, o.id",
    "  from outbox_events o",
    " where o.published_at is null",
    "   and o.created_at <= $4::timestamptz and (o.created_at, o.id) <= ($4::timestamptz, $5)",
    "   and ",
    lane_bounds!("$1", "$2", "$3"),
    "   and ",
    in_lane!("$1", "$2", "$3"),
    "   and not ",
    parked!(),
    "   and o.subject not in (select unnest($6::text[]))",
    " order by o.created_at, o.id",
    " limit 1"
);

/// The marks address the claimed rows by `ctid`, which their row locks keep stable until this
/// transaction updates them (a plain table: in a partitioned one a `ctid` is not unique).
pub(super) const MARK_PUBLISHED: &str =
    "update outbox_events set published_at = clock_timestamp() where ctid = any($1)";

/// See [`MARK_PUBLISHED`]: one more attempt on each row that failed.
pub(super) const MARK_FAILED: &str =
    "update outbox_events set attempts = attempts + 1 where ctid = any($1)";

/// Parks the subjects of the given rows (`$1`): retry after `$2` milliseconds, on the
/// database's clock, or held when that is null; `$3` says why. One row per subject.
pub(super) const PARK: &str = "\
insert into outbox_retries as r (subject, event_id, retry_at, reason)
select o.subject, o.id,
       case when u.delay_ms is null then null else now() + u.delay_ms * interval '1 millisecond' end,
       u.reason
  from unnest($1::uuid[], $2::float8[], $3::text[]) as u(id, delay_ms, reason)
  join outbox_events o on o.id = u.id
    on conflict (subject) do update
   set event_id = excluded.event_id, retry_at = excluded.retry_at, reason = excluded.reason";

/// Releases the subjects whose parked head (`$1`, ids) was published.
pub(super) const UNPARK: &str = "delete from outbox_retries where event_id = any($1)";

/// Retry schedules whose head is no longer an unpublished row (published or deleted by hand):
/// they would hold their subject for nothing.
pub(super) const SWEEP: &str = "\
delete from outbox_retries r
 where not exists (select 1 from outbox_events e where e.id = r.event_id and e.published_at is null)";

/// The held rows, oldest first, with their schedules' reasons (`created_at` as text: it may be
/// infinite in a hand-written row).
pub(super) const HELD: &str = "\
select e.id, e.event_type, e.subject, e.attempts, r.reason, r.since,
       case when isfinite(e.created_at) then e.created_at end as created_at
  from outbox_retries r
  join outbox_events e on e.id = r.event_id
 where r.retry_at is null and e.published_at is null
 order by r.since, e.id";

/// The event types of the unpublished rows (up to `$1`), for the relay's first check of the
/// streams that capture them.
pub(super) const BACKLOG_TYPES: &str =
    "select distinct event_type from outbox_events where published_at is null limit $1";

/// A relay's heartbeat (`$1` its id, `$2` its partitions, `$3` its lanes): its row refreshed
/// on the database's clock, rows not seen for an hour deleted, and the running relays (seen
/// within `$4` seconds) read, this one among them whatever the snapshot shows.
macro_rules! beat {
    ($notify:expr) => {
        concat!(
            "with beat as (
  insert into outbox_relays as r (id, partitions, lanes) values ($1, $2, $3)
      on conflict (id) do update
     set seen_at = now(), partitions = excluded.partitions, lanes = excluded.lanes
  returning r.id, r.partitions, r.lanes),
gone as (delete from outbox_relays where seen_at < now() - interval '1 hour')
select id, partitions, lanes from outbox_relays
 where id <> $1 and seen_at > now() - $4 * interval '1 second'
union all
select id, partitions, lanes from beat",
            $notify
        )
    };
}

/// See [`beat!`].
pub(super) const BEAT: &str = beat!("");

/// The first heartbeat, which also tells the other relays (`NOTIFY_CHANNEL`, `'relays'`).
pub(super) const JOIN: &str = beat!(concat!(
    ", (select pg_notify('",
    crate::emit::notify_channel!(),
    "', 'relays')) as told"
));

/// A relay leaving: its row deleted, and the others told.
pub(super) const LEAVE: &str = concat!(
    "\
with gone as (delete from outbox_relays where id = $1 returning id)
select pg_notify('",
    crate::emit::notify_channel!(),
    "', 'relays') from gone"
);

#[cfg(test)]
mod tests {
    use super::*;

    fn squash(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn the_claim_tests_the_lane_and_the_schedules_before_it_takes_a_lock() {
        let claim = squash(CLAIM);
        let lock = claim.find("pg_try_advisory_xact_lock").unwrap();
        for condition in [
            in_lane!("$2", "$3", "$4"),
            "from outbox_retries r where r.subject = o.subject",
            "not in (select unnest($8::text[]))",
        ] {
            let at = claim
                .find(condition)
                .unwrap_or_else(|| panic!("{condition} in {claim}"));
            assert!(at < lock, "{condition} comes before the lock");
        }
        assert!(claim.ends_with("order by o.created_at, o.id limit $1 for update of o skip locked"));
    }

    #[test]
    fn the_traced_claims_read_the_trace_columns_after_the_others_and_nothing_else() {
        for (plain, traced) in [(CLAIM, CLAIM_TRACED), (CLAIM_DUE, CLAIM_DUE_TRACED)] {
            assert!(!plain.contains("traceparent"), "{plain}");
            let columns = concat!(columns!(), ", o.traceparent, o.tracestate");
            assert_eq!(traced.replacen(columns, columns!(), 1), plain);
        }
    }

    #[test]
    fn every_statement_over_the_backlog_starts_at_the_floor() {
        for (name, sql) in [
            ("CLAIM", CLAIM),
            ("UNCLAIMED", UNCLAIMED),
            ("GAPS", GAPS),
            ("WAITING", WAITING),
            ("ADVANCE", ADVANCE),
        ] {
            let sql = squash(sql);
            assert!(
                sql.contains("o.created_at >= $") && sql.contains("(o.created_at, o.id) > ($"),
                "{name}: {sql}"
            );
        }
    }

    #[test]
    fn the_claimable_predicate_is_the_same_everywhere() {
        for sql in [UNCLAIMED, WAITING] {
            assert!(squash(sql).contains(&squash(concat!("not ", parked!()))));
            assert!(squash(sql).contains(in_lane!("$1", "$2", "$3")));
            assert!(squash(sql).contains(lane_bounds!("$1", "$2", "$3")));
        }
    }

    #[test]
    fn joining_and_leaving_tell_the_other_relays() {
        let told = format!(
            "'{}', '{}'",
            crate::NOTIFY_CHANNEL,
            super::super::listen::MEMBERS
        );
        for sql in [JOIN, LEAVE] {
            assert!(sql.contains(&told), "{sql}");
        }
        assert!(!BEAT.contains("pg_notify"));
    }
}
