//! Trace context from the request that emitted an event to the consumer that handles it
//! (the repository's `docs/tracing.md`).
//!
//! With the `opentelemetry` feature, [`EmitExt::emit`](crate::EmitExt::emit) stores the W3C
//! trace context of the current span (through the `tracing` to OpenTelemetry bridge,
//! `tracing-opentelemetry`) in the row's `traceparent` and `tracestate` columns (migration
//! `0007_outbox_trace_context.sql`), in the insert it already sends. The relay then:
//!
//! - puts the stored context in the envelope as the CloudEvents distributed-tracing extension
//!   attributes `traceparent` and `tracestate` (the trace the event started in);
//! - publishes each message under a span of its own, `outbox.publish` (kind producer), whose
//!   parent is the stored context, and sends that span's context as the message's
//!   `traceparent` (and `tracestate`) NATS headers; a row with no stored context gets a new
//!   root trace there. The batch span, `outbox.batch`, links to each message's span.
//!
//! The consumer's `outbox.consume` span (kind consumer), in which the handler runs, takes the
//! message's `traceparent` header as its parent.
//!
//! Without the feature no OpenTelemetry crate is compiled, emit writes no trace context, and
//! the relay still carries what the table holds: the stored context in the envelope and, with
//! no publish span of its own, as the headers; a row without one gets a new random
//! `traceparent`, so that every message has one to correlate logs by.

use uuid::Uuid;

/// The W3C header (and CloudEvents extension attribute) naming a span: `00-<trace id>-<parent
/// id>-<flags>`.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header (and CloudEvents extension attribute) with the vendors' trace state.
pub const TRACESTATE: &str = "tracestate";

/// The longest `tracestate` carried (the W3C limit a propagator must accept); a longer one is
/// dropped, and the `traceparent` carried alone.
const TRACESTATE_MAX: usize = 512;

/// A W3C trace context: a span's `traceparent`, and the `tracestate` that goes with it.
///
/// ```
/// use outbox_runtime::trace::TraceContext;
///
/// let cx = TraceContext::parse(
///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
///     Some("vendor=opaque"),
/// )
/// .unwrap();
/// assert_eq!(cx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert_eq!(cx.span_id(), "00f067aa0ba902b7");
/// assert!(cx.sampled());
/// assert_eq!(cx.tracestate(), Some("vendor=opaque"));
/// assert!(TraceContext::parse("not a traceparent", None).is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// The context of `traceparent` (version `00`: lowercase hex, neither id all zeros) and
    /// `tracestate`, or `None` when `traceparent` is not one. A `tracestate` that is empty,
    /// longer than 512 characters or not printable ASCII is left out.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        if !valid_traceparent(traceparent) {
            return None;
        }
        Some(TraceContext {
            traceparent: traceparent.to_owned(),
            tracestate: tracestate
                .filter(|s| valid_tracestate(s))
                .map(str::to_owned),
        })
    }

    /// A new root: a random trace id and span id, sampled.
    #[cfg(test)]
    pub(crate) fn new_root() -> TraceContext {
        Roots::new().next()
    }

    /// The `traceparent` value.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` value, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id: 32 hex digits.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The span id (the parent of whatever continues this context): 16 hex digits.
    pub fn span_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// Whether the sampled flag is set.
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.traceparent[53..55], 16).is_ok_and(|flags| flags & 1 == 1)
    }
}

/// New root contexts, each with a trace id of its own: a random seed per generator (one
/// system random number per relay batch, not two per message), stepped with SplitMix64.
#[derive(Debug)]
pub(crate) struct Roots {
    state: u64,
}

impl Roots {
    pub(crate) fn new() -> Roots {
        Roots {
            state: Uuid::new_v4().as_u64_pair().0,
        }
    }

    fn step(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next root: sampled, neither id zero.
    pub(crate) fn next(&mut self) -> TraceContext {
        let (high, low, span) = (self.step(), self.step().max(1), self.step().max(1));
        TraceContext {
            traceparent: format!("00-{high:016x}{low:016x}-{span:016x}-01"),
            tracestate: None,
        }
    }
}

fn valid_traceparent(value: &str) -> bool {
    let b = value.as_bytes();
    let hex = |range: std::ops::Range<usize>| {
        b[range]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    let zeros = |range: std::ops::Range<usize>| b[range].iter().all(|&c| c == b'0');
    b.len() == 55
        && b[..3] == *b"00-"
        && b[35] == b'-'
        && b[52] == b'-'
        && hex(3..35)
        && hex(36..52)
        && hex(53..55)
        && !zeros(3..35)
        && !zeros(36..52)
}

fn valid_tracestate(value: &str) -> bool {
    !value.trim().is_empty()
        && value.len() <= TRACESTATE_MAX
        && value.bytes().all(|c| (0x20..=0x7e).contains(&c))
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::TraceContext;

    impl TraceContext {
        /// The context of `span` as the OpenTelemetry layer sees it (this starts its
        /// OpenTelemetry span), or `None` when it has none: the span is disabled, or no
        /// `tracing_opentelemetry` layer is installed.
        pub fn of_span(span: &tracing::Span) -> Option<TraceContext> {
            TraceContext::of_span_context(span.context().span().span_context())
        }

        /// [`of_span`](Self::of_span) of the current span: what emit stores.
        ///
        /// ```
        /// use outbox_runtime::trace::TraceContext;
        ///
        /// // without a `tracing_opentelemetry` layer, a span has no context to store
        /// let span = tracing::info_span!("work");
        /// let _in_it = span.enter();
        /// assert_eq!(TraceContext::current(), None);
        /// ```
        pub fn current() -> Option<TraceContext> {
            TraceContext::of_span(&tracing::Span::current())
        }

        /// The W3C form of a valid OpenTelemetry span context.
        pub fn of_span_context(cx: &SpanContext) -> Option<TraceContext> {
            if !cx.is_valid() {
                return None;
            }
            let flags = cx.trace_flags().to_u8() & TraceFlags::SAMPLED.to_u8();
            let traceparent = format!(
                "00-{:032x}-{:016x}-{flags:02x}",
                cx.trace_id(),
                cx.span_id()
            );
            let tracestate = cx.trace_state().header();
            TraceContext::parse(&traceparent, Some(&tracestate))
        }

        /// This context as the remote parent of an OpenTelemetry span.
        pub fn span_context(&self) -> SpanContext {
            let flags = u8::from_str_radix(&self.traceparent[53..55], 16).unwrap_or(0);
            let state = self
                .tracestate()
                .and_then(|s| s.parse::<TraceState>().ok())
                .unwrap_or_default();
            SpanContext::new(
                TraceId::from_hex(self.trace_id()).unwrap_or(TraceId::INVALID),
                SpanId::from_hex(self.span_id()).unwrap_or(SpanId::INVALID),
                TraceFlags::new(flags),
                true,
                state,
            )
        }

        /// Makes this context the OpenTelemetry parent of `span`, which must not have started
        /// yet (set it right after creating the span). Returns whether it took: not when the
        /// span is disabled, no OpenTelemetry layer is installed, or the span already started.
        ///
        /// ```
        /// use outbox_runtime::trace::TraceContext;
        ///
        /// // e.g. in an HTTP middleware, from the request's `traceparent` header
        /// let span = tracing::info_span!("http.request");
        /// if let Some(cx) = TraceContext::parse(
        ///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ///     None,
        /// ) {
        ///     let _continued = cx.continue_in(&span);
        /// }
        /// ```
        pub fn continue_in(&self, span: &tracing::Span) -> bool {
            let parent =
                opentelemetry::Context::new().with_remote_span_context(self.span_context());
            span.set_parent(parent).is_ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_w3c_traceparent_parses_and_anything_else_does_not() {
        let cx = TraceContext::parse(TP, None).unwrap();
        assert_eq!(cx.traceparent(), TP);
        assert_eq!(cx.tracestate(), None);
        assert!(!TraceContext::parse(&TP.replace("-01", "-00"), None)
            .unwrap()
            .sampled());
        for bad in [
            "",
            "00",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nX: y",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert!(TraceContext::parse(bad, None).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_tracestate_that_cannot_travel_is_left_out() {
        let with = |s: &str| TraceContext::parse(TP, Some(s)).unwrap().tracestate;
        assert_eq!(with("a=1,b=2").as_deref(), Some("a=1,b=2"));
        assert_eq!(with(""), None);
        assert_eq!(with("a=1\nb=2"), None);
        assert_eq!(with(&"a".repeat(513)), None);
    }

    #[test]
    fn a_new_root_is_a_valid_sampled_traceparent_of_its_own() {
        let mut roots = Roots::new();
        let all: Vec<TraceContext> = (0..1000).map(|_| roots.next()).collect();
        for cx in &all {
            assert!(
                TraceContext::parse(cx.traceparent(), None).is_some(),
                "{cx:?}"
            );
            assert!(cx.sampled());
        }
        let traces: std::collections::HashSet<&str> = all.iter().map(|c| c.trace_id()).collect();
        assert_eq!(traces.len(), all.len(), "a trace id each");
        assert_ne!(
            TraceContext::new_root().trace_id(),
            TraceContext::new_root().trace_id(),
            "generators are seeded apart"
        );
    }

    #[cfg(feature = "opentelemetry")]
    #[test]
    fn the_w3c_form_round_trips_through_an_opentelemetry_span_context() {
        let cx = TraceContext::parse(TP, Some("vendor=opaque")).unwrap();
        let otel = cx.span_context();
        assert!(otel.is_valid() && otel.is_remote() && otel.is_sampled());
        assert_eq!(TraceContext::of_span_context(&otel), Some(cx));
    }

    #[cfg(feature = "opentelemetry")]
    #[test]
    fn a_span_without_an_opentelemetry_layer_has_no_context() {
        let span = tracing::info_span!("no layer");
        assert_eq!(TraceContext::of_span(&span), None);
        assert!(!TraceContext::parse(TP, None).unwrap().continue_in(&span));
    }
}
