//! Backoff curves for spawn retries, task retries and rate limits.

use std::time::Duration;

use crate::config::BackoffStrategy;

/// A backoff policy: a curve, a base and a cap, with ±10 % jitter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// How the delay grows.
    pub strategy: BackoffStrategy,
    /// Base delay.
    pub base: Duration,
    /// Upper bound before jitter.
    pub max: Duration,
}

impl Backoff {
    /// The delay before retry number `attempt` (1 for the first retry), without jitter.
    ///
    /// Exponential is `base·2^attempt` as the seed specifies, linear `base·attempt`, fixed `base`;
    /// all are capped at `max`.
    pub fn nominal(&self, attempt: u32) -> Duration {
        let base = self.base.as_secs_f64();
        let v = match self.strategy {
            BackoffStrategy::Exponential => base * 2f64.powi(attempt.min(62) as i32),
            BackoffStrategy::Linear => base * f64::from(attempt.max(1)),
            BackoffStrategy::Fixed => base,
        };
        Duration::from_secs_f64(v.min(self.max.as_secs_f64()).max(0.0))
    }

    /// The delay with jitter applied. `unit` is a uniform sample in `[0, 1)`; jitter is ±10 %,
    /// so that workers that failed together do not retry in lockstep.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let n = self.nominal(attempt).as_secs_f64();
        let factor = 0.9 + 0.2 * unit.clamp(0.0, 1.0);
        Duration::from_secs_f64(n * factor)
    }

    /// [`Backoff::delay`] with a random sample.
    pub fn jittered(&self, attempt: u32) -> Duration {
        self.delay(attempt, fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(strategy: BackoffStrategy) -> Backoff {
        Backoff {
            strategy,
            base: Duration::from_secs(2),
            max: Duration::from_secs(30),
        }
    }

    #[test]
    fn exponential_curve_is_base_times_two_to_the_attempt_capped() {
        let e = b(BackoffStrategy::Exponential);
        let secs: Vec<u64> = (0..6).map(|a| e.nominal(a).as_secs()).collect();
        assert_eq!(secs, vec![2, 4, 8, 16, 30, 30]);
        // No overflow on absurd attempt numbers.
        assert_eq!(e.nominal(10_000).as_secs(), 30);
    }

    #[test]
    fn linear_and_fixed_curves() {
        let l = b(BackoffStrategy::Linear);
        assert_eq!(
            (1..5).map(|a| l.nominal(a).as_secs()).collect::<Vec<_>>(),
            vec![2, 4, 6, 8]
        );
        assert_eq!(l.nominal(100).as_secs(), 30);
        let f = b(BackoffStrategy::Fixed);
        assert_eq!(f.nominal(7).as_secs(), 2);
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        let e = b(BackoffStrategy::Exponential);
        assert_eq!(e.delay(1, 0.0), Duration::from_secs_f64(3.6));
        assert_eq!(e.delay(1, 1.0), Duration::from_secs_f64(4.4));
        for _ in 0..100 {
            let d = e.jittered(2).as_secs_f64();
            assert!((7.2..=8.8).contains(&d), "{d}");
        }
    }

    #[test]
    fn jitter_spreads_the_delays_over_the_window() {
        // Workers that failed together draw different delays: 200 draws of an 8 s nominal land
        // in at least 8 of the 10 equal slices of [7.2 s, 8.8 s], on both sides of 8 s.
        let e = b(BackoffStrategy::Exponential);
        let draws: Vec<f64> = (0..200).map(|_| e.jittered(2).as_secs_f64()).collect();
        let mut slices = std::collections::BTreeSet::new();
        for d in &draws {
            slices.insert((((d - 7.2) / 0.16).floor() as i64).clamp(0, 9));
        }
        assert!(slices.len() >= 8, "{slices:?}");
        assert!(draws.iter().any(|&d| d < 7.9) && draws.iter().any(|&d| d > 8.1));
    }
}
