//! Where `outbox relay`'s metrics go: the runtime records them through the `metrics` facade,
//! and this recorder hands each one to the Prometheus exporter (scraped on `/metrics`), to
//! OpenTelemetry instruments (sent over OTLP), or to both.

use std::sync::Arc;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use metrics_exporter_prometheus::PrometheusRecorder;

/// The recorder of `outbox relay`: Prometheus, OTLP, or both.
#[derive(Debug)]
pub struct Recorders {
    pub prometheus: Option<PrometheusRecorder>,
    #[cfg(feature = "opentelemetry")]
    pub otel: Option<otel::OtelRecorder>,
}

impl Recorders {
    /// Installs it as the process's recorder (before the relay records anything).
    pub fn install(self) {
        // the only recorder the process sets, once
        let _ = metrics::set_global_recorder(self);
    }

    fn otel(&self) -> Option<&dyn Recorder> {
        #[cfg(feature = "opentelemetry")]
        if let Some(otel) = &self.otel {
            return Some(otel);
        }
        None
    }
}

impl Recorder for Recorders {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        if let Some(p) = &self.prometheus {
            p.describe_counter(key.clone(), unit, description.clone());
        }
        if let Some(o) = self.otel() {
            o.describe_counter(key, unit, description);
        }
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        if let Some(p) = &self.prometheus {
            p.describe_gauge(key.clone(), unit, description.clone());
        }
        if let Some(o) = self.otel() {
            o.describe_gauge(key, unit, description);
        }
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        if let Some(p) = &self.prometheus {
            p.describe_histogram(key.clone(), unit, description.clone());
        }
        if let Some(o) = self.otel() {
            o.describe_histogram(key, unit, description);
        }
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        let p = self
            .prometheus
            .as_ref()
            .map(|p| p.register_counter(key, metadata));
        let o = self.otel().map(|o| o.register_counter(key, metadata));
        match (p, o) {
            (Some(p), Some(o)) => Counter::from_arc(Arc::new(Both(p, o))),
            (Some(one), None) | (None, Some(one)) => one,
            (None, None) => Counter::noop(),
        }
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        let p = self
            .prometheus
            .as_ref()
            .map(|p| p.register_gauge(key, metadata));
        let o = self.otel().map(|o| o.register_gauge(key, metadata));
        match (p, o) {
            (Some(p), Some(o)) => Gauge::from_arc(Arc::new(Both(p, o))),
            (Some(one), None) | (None, Some(one)) => one,
            (None, None) => Gauge::noop(),
        }
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        let p = self
            .prometheus
            .as_ref()
            .map(|p| p.register_histogram(key, metadata));
        let o = self.otel().map(|o| o.register_histogram(key, metadata));
        match (p, o) {
            (Some(p), Some(o)) => Histogram::from_arc(Arc::new(Both(p, o))),
            (Some(one), None) | (None, Some(one)) => one,
            (None, None) => Histogram::noop(),
        }
    }
}

/// One metric's two handles.
struct Both<T>(T, T);

impl CounterFn for Both<Counter> {
    fn increment(&self, value: u64) {
        self.0.increment(value);
        self.1.increment(value);
    }

    fn absolute(&self, value: u64) {
        self.0.absolute(value);
        self.1.absolute(value);
    }
}

impl GaugeFn for Both<Gauge> {
    fn increment(&self, value: f64) {
        self.0.increment(value);
        self.1.increment(value);
    }

    fn decrement(&self, value: f64) {
        self.0.decrement(value);
        self.1.decrement(value);
    }

    fn set(&self, value: f64) {
        self.0.set(value);
        self.1.set(value);
    }
}

impl HistogramFn for Both<Histogram> {
    fn record(&self, value: f64) {
        self.0.record(value);
        self.1.record(value);
    }
}

#[cfg(feature = "opentelemetry")]
pub mod otel {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    use opentelemetry::metrics::Meter;
    use opentelemetry::KeyValue;

    use super::*;

    /// A value per metric key, shared by every handle registered for it (the `metrics` macros
    /// register again at every call).
    #[derive(Debug, Default)]
    struct Cells(Mutex<HashMap<Key, Arc<AtomicU64>>>);

    impl Cells {
        fn of(&self, key: &Key, initial: u64) -> Arc<AtomicU64> {
            let mut cells = self.0.lock().unwrap_or_else(|e| e.into_inner());
            cells
                .entry(key.clone())
                .or_insert_with(|| Arc::new(AtomicU64::new(initial)))
                .clone()
        }
    }

    /// The `metrics` facade over OpenTelemetry instruments of the same names: a counter is a
    /// `u64` counter, a gauge an `f64` gauge (its value kept per key, so that `increment` and
    /// `decrement` work), a histogram an `f64` histogram with the runtime's buckets
    /// (`outbox_runtime::metrics::histogram_buckets`). Labels become attributes.
    #[derive(Debug)]
    pub struct OtelRecorder {
        meter: Meter,
        instruments: Mutex<Instruments>,
        counters: Cells,
        gauges: Cells,
    }

    #[derive(Debug, Default)]
    struct Instruments {
        counters: HashMap<String, opentelemetry::metrics::Counter<u64>>,
        gauges: HashMap<String, opentelemetry::metrics::Gauge<f64>>,
        histograms: HashMap<String, opentelemetry::metrics::Histogram<f64>>,
        descriptions: HashMap<String, String>,
    }

    impl OtelRecorder {
        pub fn new(meter: Meter) -> OtelRecorder {
            OtelRecorder {
                meter,
                instruments: Mutex::default(),
                counters: Cells::default(),
                gauges: Cells::default(),
            }
        }

        fn instruments(&self) -> std::sync::MutexGuard<'_, Instruments> {
            self.instruments.lock().unwrap_or_else(|e| e.into_inner())
        }

        fn describe(&self, key: KeyName, description: SharedString) {
            self.instruments()
                .descriptions
                .insert(key.as_str().to_owned(), description.into_owned());
        }
    }

    fn attributes(key: &Key) -> Vec<KeyValue> {
        key.labels()
            .map(|l| KeyValue::new(l.key().to_owned(), l.value().to_owned()))
            .collect()
    }

    struct OtelCounter {
        counter: opentelemetry::metrics::Counter<u64>,
        attributes: Vec<KeyValue>,
        /// The total so far, for `absolute`.
        total: Arc<AtomicU64>,
    }

    impl CounterFn for OtelCounter {
        fn increment(&self, value: u64) {
            self.total.fetch_add(value, Ordering::Relaxed);
            self.counter.add(value, &self.attributes);
        }

        fn absolute(&self, value: u64) {
            let before = self.total.fetch_max(value, Ordering::Relaxed);
            if value > before {
                self.counter.add(value - before, &self.attributes);
            }
        }
    }

    struct OtelGauge {
        gauge: opentelemetry::metrics::Gauge<f64>,
        attributes: Vec<KeyValue>,
        /// The value's bits.
        value: Arc<AtomicU64>,
    }

    impl OtelGauge {
        fn change(&self, f: impl Fn(f64) -> f64) {
            let mut now = 0.0;
            let _ = self
                .value
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                    now = f(f64::from_bits(bits));
                    Some(now.to_bits())
                });
            self.gauge.record(now, &self.attributes);
        }
    }

    impl GaugeFn for OtelGauge {
        fn increment(&self, value: f64) {
            self.change(|v| v + value);
        }

        fn decrement(&self, value: f64) {
            self.change(|v| v - value);
        }

        fn set(&self, value: f64) {
            self.change(|_| value);
        }
    }

    struct OtelHistogram {
        histogram: opentelemetry::metrics::Histogram<f64>,
        attributes: Vec<KeyValue>,
    }

    impl HistogramFn for OtelHistogram {
        fn record(&self, value: f64) {
            self.histogram.record(value, &self.attributes);
        }
    }

    impl Recorder for OtelRecorder {
        fn describe_counter(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
            self.describe(key, description);
        }

        fn describe_gauge(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
            self.describe(key, description);
        }

        fn describe_histogram(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
            self.describe(key, description);
        }

        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            let name = key.name();
            let counter = {
                let mut i = self.instruments();
                let description = i.descriptions.get(name).cloned().unwrap_or_default();
                i.counters
                    .entry(name.to_owned())
                    .or_insert_with(|| {
                        self.meter
                            .u64_counter(name.to_owned())
                            .with_description(description)
                            .build()
                    })
                    .clone()
            };
            Counter::from_arc(Arc::new(OtelCounter {
                counter,
                attributes: attributes(key),
                total: self.counters.of(key, 0),
            }))
        }

        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            let name = key.name();
            let gauge = {
                let mut i = self.instruments();
                let description = i.descriptions.get(name).cloned().unwrap_or_default();
                i.gauges
                    .entry(name.to_owned())
                    .or_insert_with(|| {
                        self.meter
                            .f64_gauge(name.to_owned())
                            .with_description(description)
                            .build()
                    })
                    .clone()
            };
            Gauge::from_arc(Arc::new(OtelGauge {
                gauge,
                attributes: attributes(key),
                value: self.gauges.of(key, 0f64.to_bits()),
            }))
        }

        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            let name = key.name();
            let histogram = {
                let mut i = self.instruments();
                let description = i.descriptions.get(name).cloned().unwrap_or_default();
                i.histograms
                    .entry(name.to_owned())
                    .or_insert_with(|| {
                        let mut builder = self
                            .meter
                            .f64_histogram(name.to_owned())
                            .with_description(description);
                        if let Some((_, buckets)) = outbox_runtime::metrics::histogram_buckets()
                            .iter()
                            .find(|(n, _)| *n == name)
                        {
                            builder = builder.with_boundaries(buckets.to_vec());
                        }
                        builder.build()
                    })
                    .clone()
            };
            Histogram::from_arc(Arc::new(OtelHistogram {
                histogram,
                attributes: attributes(key),
            }))
        }
    }
}
