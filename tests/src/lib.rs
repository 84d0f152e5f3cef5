//! Shared code of the end-to-end suites.

/// The code generator's golden outputs (`golden/<case>/expected.rs`, checked in), compiled with
/// this crate so `cargo build -p outbox-tests` proves they compile. `tests/codegen/golden.rs`
/// checks they are what the generator produces today.
pub mod golden {
    /// `golden/kitchen_sink`: references, enums, formats, patterns, a consumed type.
    pub mod kitchen_sink {
        include!("../golden/kitchen_sink/expected.rs");
    }

    /// `golden/minimal`: one event without a subject property.
    pub mod minimal {
        include!("../golden/minimal/expected.rs");
    }
}

/// The process's metrics, as the suites assert on them: a debugging recorder installed once
/// per test binary, and counter totals kept across its snapshots (a snapshot drains the
/// counters, so each is folded into totals every caller shares). Each test labels its own
/// counters apart (its own consumer name or event type), so tests running side by side do not
/// mix.
pub mod recorded {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::{Mutex, OnceLock};

    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

    /// A counter: its name and labels, sorted.
    type Key = (String, Vec<(String, String)>);

    /// Installs the recorder (the first call in the process does).
    pub fn install() {
        snapshotter();
    }

    fn snapshotter() -> &'static Snapshotter {
        static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
        SNAPSHOTTER.get_or_init(|| {
            let recorder = DebuggingRecorder::new();
            let snapshotter = recorder.snapshotter();
            recorder.install().expect("install the debugging recorder");
            snapshotter
        })
    }

    /// Every counter's total so far, `f` applied to the totals.
    fn with_totals<T>(f: impl FnOnce(&HashMap<Key, u64>) -> T) -> T {
        static TOTALS: OnceLock<Mutex<HashMap<Key, u64>>> = OnceLock::new();
        let mut totals = TOTALS.get_or_init(Default::default).lock().expect("totals");
        for (key, _, _, value) in snapshotter().snapshot().into_vec() {
            let DebugValue::Counter(n) = value else {
                continue;
            };
            let mut labels: Vec<(String, String)> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            *totals
                .entry((key.key().name().to_owned(), labels))
                .or_default() += n;
        }
        f(&totals)
    }

    fn matches(labels: &[(String, String)], with: &[(&str, &str)]) -> bool {
        with.iter()
            .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
    }

    /// The total of counter `name` over the series whose labels include all of `with`.
    pub fn counter(name: &str, with: &[(&str, &str)]) -> u64 {
        with_totals(|totals| {
            totals
                .iter()
                .filter(|((n, labels), _)| n == name && matches(labels, with))
                .map(|(_, v)| v)
                .sum()
        })
    }

    /// [`counter`], by the value of label `by`.
    pub fn counter_by(name: &str, with: &[(&str, &str)], by: &str) -> BTreeMap<String, u64> {
        with_totals(|totals| {
            let mut out = BTreeMap::new();
            for ((n, labels), v) in totals {
                if n != name || !matches(labels, with) {
                    continue;
                }
                if let Some((_, value)) = labels.iter().find(|(k, _)| k == by) {
                    *out.entry(value.clone()).or_default() += v;
                }
            }
            out
        })
    }
}

/// The WARN events a test's code logs: a `tracing` layer that keeps each one's message. Set as
/// the thread's default subscriber in a current-thread runtime, it hears the test's relays and
/// pools too (they run on the test's thread).
pub mod warnings {
    use std::fmt::Write as _;
    use std::sync::{Arc, Mutex};

    /// Every WARN event's message, from the subscriber it is installed in.
    #[derive(Debug, Clone, Default)]
    pub struct Warnings(Arc<Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            if *event.metadata().level() != tracing::Level::WARN {
                return;
            }
            let mut message = String::new();
            event.record(
                &mut |field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
                    if field.name() == "message" {
                        let _ = write!(message, "{value:?}");
                    }
                },
            );
            self.0.lock().expect("not poisoned").push(message);
        }
    }

    impl Warnings {
        /// The messages so far, in order.
        pub fn messages(&self) -> Vec<String> {
            self.0.lock().expect("not poisoned").clone()
        }

        /// Records the warnings of this thread until the guard is dropped.
        pub fn record(&self) -> tracing::subscriber::DefaultGuard {
            use tracing_subscriber::layer::SubscriberExt as _;
            tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()))
        }
    }
}
