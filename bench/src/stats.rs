//! Repetitions, medians, spreads and ratios.
//!
//! Every figure is a rate (units per second, higher is better). A figure is
//! the median over several repetitions; the spread is the minimum and
//! maximum rate seen. Ratios are spool's median over a peer's median, both
//! from the same run; the per-round ratios (spool's rate over the peer's in
//! the same interleaved round, see [`round_ratios`]) show how far the
//! machine's drift moves that ratio.

use std::time::{Duration, Instant};

/// The rates measured by the repetitions of one subject on one workload.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Samples {
    pub rates: Vec<f64>,
}

/// Median and spread of some samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Samples {
    /// The median and the min/max spread, or `None` when there are no
    /// finite samples.
    pub fn summary(&self) -> Option<Summary> {
        let mut v: Vec<f64> = self
            .rates
            .iter()
            .copied()
            .filter(|r| r.is_finite())
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }
}

/// `units / elapsed` in units per second; infinite work in zero time is
/// reported as `f64::INFINITY` and filtered out by [`Samples::summary`].
pub fn rate(units: f64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        units / secs
    } else {
        f64::INFINITY
    }
}

/// `spool / peer`, when both are positive finite figures.
pub fn ratio(spool: f64, peer: f64) -> Option<f64> {
    if spool.is_finite() && peer.is_finite() && peer > 0.0 {
        Some(spool / peer)
    } else {
        None
    }
}

/// The spread (`[min, max]`) of spool's rate over a peer's, round by
/// round: repetition `r` of every subject runs in the same interleaved
/// round, so a pair shares that stretch of the machine's speed. Rounds
/// where either rate is not a positive finite figure are left out; `None`
/// when no round pairs up.
pub fn round_ratios(spool: &Samples, peer: &Samples) -> Option<[f64; 2]> {
    let ratios = Samples {
        rates: spool
            .rates
            .iter()
            .zip(&peer.rates)
            .filter_map(|(&s, &p)| ratio(s, p))
            .collect(),
    };
    ratios.summary().map(|s| [s.min, s.max])
}

/// Runs `rep` `reps` times; each call returns one rate. Stops at the first
/// error.
pub fn repeat<E>(reps: usize, mut rep: impl FnMut(usize) -> Result<f64, E>) -> Result<Samples, E> {
    let mut rates = Vec::with_capacity(reps);
    for i in 0..reps {
        rates.push(rep(i)?);
    }
    Ok(Samples { rates })
}

/// Runs `op` repeatedly until at least `min_time` has passed or `max_iters`
/// calls were made (at least one call). Each call returns the units it
/// produced (1 for "one open", a byte count for throughput). Returns the
/// rate over the whole loop.
pub fn rate_loop<E>(
    min_time: Duration,
    max_iters: u64,
    mut op: impl FnMut() -> Result<u64, E>,
) -> Result<f64, E> {
    let start = Instant::now();
    let mut units: u64 = 0;
    let mut iters: u64 = 0;
    loop {
        units = units.saturating_add(op()?);
        iters += 1;
        if iters >= max_iters.max(1) || start.elapsed() >= min_time {
            break;
        }
    }
    Ok(rate(units as f64, start.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread() {
        let s = Samples {
            rates: vec![5.0, 1.0, 3.0],
        };
        let m = s.summary().unwrap();
        assert_eq!((m.median, m.min, m.max), (3.0, 1.0, 5.0));
        let s = Samples {
            rates: vec![4.0, 1.0, 3.0, 2.0, f64::INFINITY],
        };
        let m = s.summary().unwrap();
        assert_eq!((m.median, m.min, m.max), (2.5, 1.0, 4.0));
        assert_eq!(Samples::default().summary(), None);
    }

    #[test]
    fn ratios_need_a_positive_peer() {
        assert_eq!(ratio(10.0, 4.0), Some(2.5));
        assert_eq!(ratio(10.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
    }

    #[test]
    fn round_ratios_pair_rounds_by_index() {
        let spool = Samples {
            rates: vec![10.0, 30.0, 20.0, f64::INFINITY],
        };
        let peer = Samples {
            rates: vec![5.0, 10.0, 40.0, 1.0, 7.0],
        };
        // Rounds 0..=2 pair up (2, 3, 0.5); round 3's infinite spool rate
        // and the peer's unpaired fifth round are left out. The ratio of
        // the medians (20 over 7) is another figure: each side is sorted
        // on its own there.
        assert_eq!(round_ratios(&spool, &peer), Some([0.5, 3.0]));
        let zero = Samples { rates: vec![0.0] };
        assert_eq!(round_ratios(&spool, &zero), None);
        assert_eq!(round_ratios(&Samples::default(), &peer), None);
    }

    #[test]
    fn repeat_and_rate_loop_count_calls() {
        let mut calls = 0;
        let s = repeat::<()>(4, |i| {
            calls += 1;
            Ok(i as f64)
        })
        .unwrap();
        assert_eq!(calls, 4);
        assert_eq!(s.rates, vec![0.0, 1.0, 2.0, 3.0]);
        let mut n = 0;
        rate_loop::<()>(Duration::from_secs(3600), 7, || {
            n += 1;
            Ok(1)
        })
        .unwrap();
        assert_eq!(n, 7);
        let r = repeat(3, |i| if i == 1 { Err("boom") } else { Ok(1.0) });
        assert_eq!(r, Err("boom"));
    }
}
