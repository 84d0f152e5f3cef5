//! The relay's statements. Each says in three lines or less what it relies on; the reasoning
//! behind their shapes is in docs/relay.md and the measurements in docs/performance.md.

/// `(hashtext(subject) & 0x7fffffff) % partitions`: the subject's partition. `$p` is the
/// partition count; lanes of one relay take `partition % lanes = lane`.
macro_rules! partition {
    ($p:literal) => {
        concat!("(hashtext(subject) & 2147483647) % ", $p)
    };
}

/// The subjects held by a row at the attempt cap (`$cap` is `max_attempts`): an uncorrelated
/// subquery, run once per statement, reading the small index of migration 0003
/// (`attempts > 0` is its predicate).
macro_rules! not_held {
    ($cap:literal) => {
        concat!(
            "subject not in (select h.subject from outbox_events h",
            " where h.published_at is null and h.attempts > 0 and h.attempts >= ",
            $cap,
            ")"
        )
    };
}

/// The batch transaction's own settings, for it alone: an asynchronous commit of the marks;
/// the unpublished index in `created_at` order (no sequential or bitmap scans); hash joins
/// for the gap query (no nested loops); one generic plan per statement.
pub(super) const SETTINGS: &str = "select set_config('synchronous_commit', 'off', true), \
        set_config('enable_seqscan', 'off', true), \
        set_config('enable_bitmapscan', 'off', true), \
        set_config('enable_nestloop', 'off', true), \
        set_config('plan_cache_mode', 'force_generic_plan', true)";

/// The claim: unpublished rows below the cap, in `created_at` order, outside the backed-off
/// (`$3`) and held subjects, in the lane's partitions (`$5`-`$7`) whose advisory lock
/// (`$4`, partition) this transaction gets; `skip locked` skips other transactions' rows.
pub(super) const CLAIM: &str = concat!(
    "select id, event_type, source, subject, time, data, created_at, attempts, ctid",
    "  from outbox_events o",
    " where published_at is null",
    "   and attempts < $2",
    "   and subject <> all($3)",
    "   and ",
    not_held!("$2"),
    "   and case when ",
    partition!("$5"),
    " % $6 = $7",
    "            then pg_try_advisory_xact_lock($4, ",
    partition!("$5"),
    ")",
    "       end",
    " order by created_at",
    " limit $1",
    "   for update skip locked"
);

/// Whether a row of the lane that [`CLAIM`] could take, emitted before the batch began
/// (`now()` is the transaction's start), is waiting: [`CLAIM`]'s predicate without its locks,
/// so other transactions' locks and the batch's own cut rows count.
pub(super) const WAITING: &str = concat!(
    "select 1",
    "  from outbox_events",
    " where published_at is null",
    "   and created_at < now()",
    "   and attempts < $1",
    "   and subject <> all($2)",
    "   and ",
    not_held!("$1"),
    "   and ",
    partition!("$3"),
    " % $4 = $5",
    " order by created_at",
    " limit 1"
);

/// The unpublished rows up to the claim's newest (`$1`), outside the backed-off subjects, in
/// the claim's lane. The claimed rows are among them: when they are all of them, no claimed
/// subject can have a hole and [`GAPS`] need not run.
pub(super) const UNCLAIMED: &str = concat!(
    "select count(*)",
    "  from outbox_events",
    " where published_at is null",
    "   and created_at <= $1",
    "   and subject <> all($2)",
    "   and ",
    partition!("$3"),
    " % $4 = $5"
);

/// Per claimed subject (`$1`, with its newest claimed `created_at` in `$2`), the oldest
/// unpublished row not newer than that which the claim (`$4`, ids) does not hold: the hole
/// the subject's claimed rows are cut at. `$3` bounds the index range.
pub(super) const GAPS: &str = "\
select o.subject, min(o.created_at)
  from outbox_events o
  join unnest($1::text[], $2::timestamptz[]) as f(subject, last_created)
    on o.subject = f.subject
 where o.published_at is null
   and o.created_at <= $3
   and o.created_at <= f.last_created
   and not exists (select 1 from unnest($4::uuid[]) as c(id) where c.id = o.id)
 group by o.subject";

/// The marks address the claimed rows by `ctid`, which their row locks keep stable until this
/// transaction updates them (a plain table: in a partitioned one a `ctid` is not unique).
pub(super) const MARK_PUBLISHED: &str =
    "update outbox_events set published_at = clock_timestamp() where ctid = any($1)";

/// See [`MARK_PUBLISHED`].
pub(super) const MARK_FAILED: &str =
    "update outbox_events set attempts = attempts + 1 where ctid = any($1)";

/// The unpublished rows at the attempt cap (`$1`), oldest first.
pub(super) const CAPPED: &str = "select id, event_type, subject, attempts, created_at \
     from outbox_events where published_at is null and attempts >= $1 order by created_at";

#[cfg(test)]
mod tests {
    use super::*;

    /// The statements built from fragments are the ones written out by hand before: same
    /// text modulo whitespace.
    fn squash(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn the_claim_reads_as_written() {
        assert_eq!(
            squash(CLAIM),
            squash(
                "select id, event_type, source, subject, time, data, created_at, attempts, ctid \
                   from outbox_events o where published_at is null and attempts < $2 \
                    and subject <> all($3) \
                    and subject not in (select h.subject from outbox_events h where h.published_at is null and h.attempts > 0 and h.attempts >= $2) \
                    and case when (hashtext(subject) & 2147483647) % $5 % $6 = $7 \
                             then pg_try_advisory_xact_lock($4, (hashtext(subject) & 2147483647) % $5) end \
                  order by created_at limit $1 for update skip locked"
            )
        );
    }

    #[test]
    fn waiting_and_unclaimed_share_the_claims_predicates() {
        assert!(squash(WAITING).contains(&squash(not_held!("$1"))));
        assert!(squash(WAITING).contains("(hashtext(subject) & 2147483647) % $3 % $4 = $5"));
        assert!(squash(UNCLAIMED).contains("(hashtext(subject) & 2147483647) % $3 % $4 = $5"));
    }
}
