//! Latency summaries: nearest-rank percentiles over recorded samples.

use std::time::Duration;

use serde_json::{json, Value};

/// Percentiles of one set of samples, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    /// Summarise `samples`; `None` when there are none.
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        Self::of_micros(&mut us)
    }

    /// Summarise samples already in microseconds (sorts them in place).
    pub fn of_micros(us: &mut [f64]) -> Option<Summary> {
        if us.is_empty() {
            return None;
        }
        us.sort_by(f64::total_cmp);
        Some(Summary {
            n: us.len(),
            p50: percentile(us, 50.0),
            p95: percentile(us, 95.0),
            p99: percentile(us, 99.0),
            min: us[0],
            max: us[us.len() - 1],
            mean: us.iter().sum::<f64>() / us.len() as f64,
        })
    }

    /// Read the `{n, p50, p95, p99, min, max, mean}` object the Python side
    /// prints (any unit; the caller knows which).
    pub fn from_json(v: &Value) -> Option<Summary> {
        let f = |k: &str| v.get(k).and_then(Value::as_f64);
        Some(Summary {
            n: v.get("n")?.as_u64()? as usize,
            p50: f("p50")?,
            p95: f("p95")?,
            p99: f("p99")?,
            min: f("min")?,
            max: f("max")?,
            mean: f("mean")?,
        })
    }

    /// The same figures scaled by `factor` (e.g. 1e-3 for µs → ms).
    pub fn scaled(self, factor: f64) -> Summary {
        Summary {
            p50: self.p50 * factor,
            p95: self.p95 * factor,
            p99: self.p99 * factor,
            min: self.min * factor,
            max: self.max * factor,
            mean: self.mean * factor,
            ..self
        }
    }

    pub fn to_json(self) -> Value {
        let r = |x: f64| (x * 10.0).round() / 10.0;
        json!({
            "n": self.n,
            "p50": r(self.p50),
            "p95": r(self.p95),
            "p99": r(self.p99),
            "min": r(self.min),
            "max": r(self.max),
            "mean": r(self.mean),
        })
    }
}

/// Nearest-rank percentile of an ascending, non-empty slice.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of_micros(&mut v).unwrap();
        assert_eq!((s.p50, s.p95, s.p99), (50.0, 95.0, 99.0));
        assert_eq!((s.min, s.max, s.n), (1.0, 100.0, 100));
        let mut one = [7.0];
        let s = Summary::of_micros(&mut one).unwrap();
        assert_eq!((s.p50, s.p99), (7.0, 7.0));
        assert!(Summary::of_micros(&mut []).is_none());
    }

    #[test]
    fn json_round_trip() {
        let s = Summary::of(&[Duration::from_micros(10), Duration::from_micros(30)]).unwrap();
        assert_eq!(Summary::from_json(&s.to_json()), Some(s));
    }
}
