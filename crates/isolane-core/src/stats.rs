//! Statistics: the two-sided Mann–Whitney U test of `isolane compare`, and the binomial
//! confidence rule of the statistical max-rate acceptance (MLPerf LoadGen style early stopping).
//!
//! The special functions (log-gamma, regularized incomplete gamma and beta) are the classic
//! Lanczos / series / continued-fraction forms; tests pin them against SciPy.

use serde::{Deserialize, Serialize};

/// How the p-value of the U test is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MwMethod {
    /// Exact when both samples have ≤ 20 values and there are no ties, else asymptotic.
    Auto,
    /// The exact distribution of U (no ties allowed; falls back to asymptotic with ties).
    Exact,
    /// Normal approximation with tie and continuity correction.
    Asymptotic,
}

/// Result of a two-sided Mann–Whitney U test.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MannWhitney {
    /// U of the first sample: `R₁ − n₁(n₁+1)/2` (SciPy's statistic).
    pub u: f64,
    /// Normal score with tie and continuity correction, signed like `U − n₁n₂/2`.
    pub z: f64,
    /// Two-sided p-value.
    pub p_value: f64,
    /// The method actually used (never `Auto`).
    pub method: MwMethod,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StatsError {
    #[error("the {0} sample is empty; the U test needs at least one value in each")]
    EmptySample(&'static str),
    #[error("the {0} sample contains NaN")]
    NaN(&'static str),
    #[error("{0}")]
    BadArgument(String),
}

/// Largest sample size (each) for which the exact distribution is used by `Auto`.
const EXACT_MAX_N: usize = 20;

/// Two-sided Mann–Whitney U test of `x` against `y`.
pub fn mann_whitney_u(x: &[f64], y: &[f64], method: MwMethod) -> Result<MannWhitney, StatsError> {
    if x.is_empty() {
        return Err(StatsError::EmptySample("first"));
    }
    if y.is_empty() {
        return Err(StatsError::EmptySample("second"));
    }
    if x.iter().any(|v| v.is_nan()) {
        return Err(StatsError::NaN("first"));
    }
    if y.iter().any(|v| v.is_nan()) {
        return Err(StatsError::NaN("second"));
    }
    let (n1, n2) = (x.len(), y.len());
    let n = n1 + n2;
    let mut all: Vec<(f64, bool)> = x
        .iter()
        .map(|&v| (v, true))
        .chain(y.iter().map(|&v| (v, false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));

    // Average ranks over ties; Σ(t³ − t) for the variance correction.
    let mut r1 = 0.0;
    let mut tie_term = 0.0;
    let mut i = 0;
    while i < n {
        let mut j = i + 1;
        while j < n && all[j].0 == all[i].0 {
            j += 1;
        }
        let avg_rank = (i + 1 + j) as f64 / 2.0; // ranks i+1 ..= j
        let t = (j - i) as f64;
        tie_term += t * t * t - t;
        r1 += avg_rank * all[i..j].iter().filter(|e| e.1).count() as f64;
        i = j;
    }
    let (n1f, n2f, nf) = (n1 as f64, n2 as f64, n as f64);
    let u = r1 - n1f * (n1f + 1.0) / 2.0;
    let mu = n1f * n2f / 2.0;
    let var = n1f * n2f / 12.0 * ((nf + 1.0) - tie_term / (nf * (nf - 1.0)));
    let d = u - mu;
    let z = if var > 0.0 {
        d.signum() * (d.abs() - 0.5).max(0.0) / var.sqrt()
    } else {
        0.0 // every value equal: no evidence of a difference
    };
    let has_ties = tie_term > 0.0;
    let use_exact = match method {
        MwMethod::Asymptotic => false,
        MwMethod::Exact => !has_ties,
        MwMethod::Auto => !has_ties && n1 <= EXACT_MAX_N && n2 <= EXACT_MAX_N,
    };
    if use_exact {
        let p = exact_two_sided_p(u, n1, n2);
        return Ok(MannWhitney {
            u,
            z,
            p_value: p,
            method: MwMethod::Exact,
        });
    }
    let p = if var > 0.0 {
        (2.0 * normal_sf(z.abs())).min(1.0)
    } else {
        1.0
    };
    Ok(MannWhitney {
        u,
        z,
        p_value: p,
        method: MwMethod::Asymptotic,
    })
}

/// Exact two-sided p-value: `2·min(P(U ≤ u), P(U ≥ u))` under H0, from the count of
/// arrangements with each U (recurrence over the last element's sample), capped at 1.
fn exact_two_sided_p(u: f64, n1: usize, n2: usize) -> f64 {
    let max_u = n1 * n2;
    // counts[i][j][k]: arrangements of i x-values and j y-values with U = k. Only two layers
    // of i are kept.
    let mut prev: Vec<Vec<f64>> = vec![vec![0.0; max_u + 1]; n2 + 1];
    for row in prev.iter_mut() {
        row[0] = 1.0; // i = 0: U = 0 whatever j
    }
    for i in 1..=n1 {
        let mut cur: Vec<Vec<f64>> = vec![vec![0.0; max_u + 1]; n2 + 1];
        cur[0][0] = 1.0; // j = 0
        for j in 1..=n2 {
            for k in 0..=i * j {
                // Largest value is an x: it beats all j y-values (adds j to U).
                let a = if k >= j { prev[j][k - j] } else { 0.0 };
                // Largest value is a y: U unchanged.
                let b = cur[j - 1][k];
                cur[j][k] = a + b;
            }
        }
        prev = cur;
    }
    let counts = &prev[n2];
    let total: f64 = counts.iter().sum();
    let uk = u.round() as usize;
    let le: f64 = counts[..=uk.min(max_u)].iter().sum();
    let ge: f64 = counts[uk.min(max_u)..].iter().sum();
    (2.0 * le.min(ge) / total).min(1.0)
}

/// Upper tail of the standard normal distribution, `P(Z > z)`.
pub fn normal_sf(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// Complementary error function via the regularized incomplete gamma function:
/// `erfc(x) = Q(1/2, x²)` for x ≥ 0, which keeps full relative accuracy far into the tail.
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 0.0 {
        2.0 - erfc(-x)
    } else {
        gamma_q(0.5, x * x)
    }
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, n = 9; relative error ~1e-15).
pub fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1−x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + G + 0.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Regularized upper incomplete gamma `Q(a, x)`.
pub fn gamma_q(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    if x < a + 1.0 {
        1.0 - gamma_p_series(a, x)
    } else {
        gamma_q_cf(a, x)
    }
}

fn gamma_p_series(a: f64, x: f64) -> f64 {
    let mut ap = a;
    let mut sum = 1.0 / a;
    let mut del = sum;
    for _ in 0..10_000 {
        ap += 1.0;
        del *= x / ap;
        sum += del;
        if del.abs() < sum.abs() * 1e-16 {
            break;
        }
    }
    sum * (-x + a * x.ln() - ln_gamma(a)).exp()
}

fn gamma_q_cf(a: f64, x: f64) -> f64 {
    // Modified Lentz for the continued fraction of Q.
    const TINY: f64 = 1e-300;
    let mut b = x + 1.0 - a;
    let mut c = 1.0 / TINY;
    let mut d = 1.0 / b;
    let mut h = d;
    for i in 1..10_000 {
        let an = -(i as f64) * (i as f64 - a);
        b += 2.0;
        d = an * d + b;
        if d.abs() < TINY {
            d = TINY;
        }
        c = b + an / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < 1e-16 {
            break;
        }
    }
    (-x + a * x.ln() - ln_gamma(a)).exp() * h
}

/// Regularized incomplete beta `I_x(a, b)` for a, b > 0 and 0 ≤ x ≤ 1.
pub fn beta_reg(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    // The continued fraction converges fast for x < (a+1)/(a+b+2); use symmetry otherwise.
    if x < (a + 1.0) / (a + b + 2.0) {
        ln_front.exp() * beta_cf(a, b, x) / a
    } else {
        1.0 - ln_front.exp() * beta_cf(b, a, 1.0 - x) / b
    }
}

fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 / lentz_nonzero(1.0 - qab * x / qap);
    let mut h = d;
    for m in 1..100_000 {
        let m = m as f64;
        let m2 = 2.0 * m;
        let even = m * (b - m) * x / ((qam + m2) * (a + m2));
        h *= lentz_step(even, &mut c, &mut d);
        let odd = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        let del = lentz_step(odd, &mut c, &mut d);
        h *= del;
        if (del - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

/// One step of the modified Lentz method with the fraction's coefficient `aa`: updates
/// `c` and `d` and returns the factor the fraction's value takes.
fn lentz_step(aa: f64, c: &mut f64, d: &mut f64) -> f64 {
    *d = 1.0 / lentz_nonzero(1.0 + aa * *d);
    *c = lentz_nonzero(1.0 + aa / *c);
    *d * *c
}

/// `v`, or a tiny number in its place where it is (nearly) zero: Lentz's method divides by it.
fn lentz_nonzero(v: f64) -> f64 {
    const TINY: f64 = 1e-300;
    if v.abs() < TINY {
        TINY
    } else {
        v
    }
}

fn check_confidence(confidence: f64) -> Result<(), StatsError> {
    if confidence > 0.0 && confidence < 1.0 {
        Ok(())
    } else {
        Err(StatsError::BadArgument(format!(
            "confidence {confidence} is not strictly between 0 and 1"
        )))
    }
}

/// One-sided Clopper–Pearson lower bound on a success probability at `confidence`: the p with
/// `P(X ≥ successes | p) = 1 − confidence`, i.e. the `1 − confidence` quantile of
/// Beta(successes, trials − successes + 1). 0 when there are no successes.
pub fn clopper_pearson_lower(
    successes: u64,
    trials: u64,
    confidence: f64,
) -> Result<f64, StatsError> {
    check_confidence(confidence)?;
    if successes > trials {
        return Err(StatsError::BadArgument(format!(
            "{successes} successes in only {trials} trials"
        )));
    }
    if successes == 0 {
        return Ok(0.0);
    }
    let alpha = 1.0 - confidence;
    let (a, b) = (successes as f64, (trials - successes) as f64 + 1.0);
    // I_p(a, b) rises monotonically in p: bisection to full precision is robust and cheap.
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if beta_reg(a, b, mid) < alpha {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo < 1e-15 {
            break;
        }
    }
    Ok(0.5 * (lo + hi))
}

/// Whether `trials` jobs with `misses` deadline misses allow claiming an on-time fraction
/// ≥ `target` at `confidence`: under p = target, seeing this many on-time jobs or more would have
/// probability ≤ 1 − confidence. Equivalent to `clopper_pearson_lower(..) ≥ target`, but
/// computed directly (no root finding) so the boundary case is exact.
pub fn claims_on_time_fraction(
    trials: u64,
    misses: u64,
    target: f64,
    confidence: f64,
) -> Result<bool, StatsError> {
    check_confidence(confidence)?;
    if !(target > 0.0 && target < 1.0) {
        return Err(StatsError::BadArgument(format!(
            "target {target} is not strictly between 0 and 1"
        )));
    }
    if misses > trials {
        return Err(StatsError::BadArgument(format!(
            "{misses} misses in only {trials} trials"
        )));
    }
    let successes = trials - misses;
    if successes == 0 {
        return Ok(false);
    }
    // P(X ≥ s | p) = I_p(s, n − s + 1).
    let tail = beta_reg(successes as f64, (trials - successes) as f64 + 1.0, target);
    Ok(tail <= 1.0 - confidence)
}

/// Most misses in `trials` that still allow the claim (`None`: not even zero misses do, the
/// batch is too small for this target and confidence).
pub fn max_misses_allowed(
    trials: u64,
    target: f64,
    confidence: f64,
) -> Result<Option<u64>, StatsError> {
    // The claim gets harder with every miss, so the allowed misses are 0..=k.
    let mut best = None;
    let (mut lo, mut hi) = (0u64, trials);
    if !claims_on_time_fraction(trials, 0, target, confidence)? {
        return Ok(None);
    }
    while lo <= hi {
        let mid = lo + (hi - lo) / 2;
        if claims_on_time_fraction(trials, mid, target, confidence)? {
            best = Some(mid);
            lo = mid + 1;
        } else {
            if mid == 0 {
                break;
            }
            hi = mid - 1;
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    //! Expected values computed with SciPy 1.17.1 (`scipy.stats.mannwhitneyu`,
    //! `scipy.special`, `scipy.stats.beta.ppf`).
    use super::*;

    fn rel(a: f64, b: f64) -> f64 {
        if b == 0.0 {
            a.abs()
        } else {
            ((a - b) / b).abs()
        }
    }

    const X: [f64; 9] = [1.83, 0.50, 1.62, 2.48, 1.68, 1.88, 1.55, 3.06, 1.30];
    const Y: [f64; 9] = [0.878, 0.647, 0.598, 2.05, 1.06, 1.29, 1.06, 3.15, 1.29];

    #[test]
    fn mann_whitney_matches_scipy_asymptotic_and_exact() {
        // Y has ties (1.06, 1.29): asymptotic with tie correction.
        let r = mann_whitney_u(&X, &Y, MwMethod::Asymptotic).unwrap();
        assert_eq!(r.u, 58.0);
        assert!(rel(r.p_value, 0.13291945818531892) < 1e-10, "{}", r.p_value);
        assert!(r.z > 0.0);
        // SciPy's exact ignores ties; ours refuses exact with ties and says so.
        let r = mann_whitney_u(&X, &Y, MwMethod::Exact).unwrap();
        assert_eq!(r.method, MwMethod::Asymptotic);

        let r = mann_whitney_u(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0, 7.0], MwMethod::Auto).unwrap();
        assert_eq!((r.u, r.method), (0.0, MwMethod::Exact));
        assert!(rel(r.p_value, 0.05714285714285714) < 1e-12);
        let r = mann_whitney_u(&[4.0, 5.0, 6.0, 7.0], &[1.0, 2.0, 3.0], MwMethod::Exact).unwrap();
        assert_eq!(r.u, 12.0);
        assert!(rel(r.p_value, 0.05714285714285714) < 1e-12);
        assert!(r.z > 0.0);
    }

    #[test]
    fn mann_whitney_exact_without_ties_matches_scipy() {
        // X and Y with the ties of Y broken: SciPy exact gives U = 58, p = 0.1359… for the
        // tied data; without ties (1.06 → 1.061, 1.29 → 1.291) U stays 58.
        let y = [0.878, 0.647, 0.598, 2.05, 1.06, 1.29, 1.061, 3.15, 1.291];
        let r = mann_whitney_u(&X, &y, MwMethod::Auto).unwrap();
        assert_eq!((r.u, r.method), (58.0, MwMethod::Exact));
        assert!(rel(r.p_value, 0.13591114767585355) < 1e-12, "{}", r.p_value);
    }

    #[test]
    fn mann_whitney_ties_and_large_samples() {
        let a = [1.0, 2.0, 2.0, 3.0, 3.0, 3.0, 4.0, 5.0, 6.0, 6.0];
        let b = [2.0, 3.0, 4.0, 4.0, 5.0, 5.0, 7.0, 8.0, 8.0, 9.0, 9.0];
        let r = mann_whitney_u(&a, &b, MwMethod::Auto).unwrap();
        assert_eq!((r.u, r.method), (25.5, MwMethod::Asymptotic));
        assert!(rel(r.p_value, 0.03950394250595884) < 1e-10, "{}", r.p_value);

        let big_a = [
            10.346, 10.822, 10.33, 8.697, 10.905, 10.446, 9.463, 10.581, 10.365, 10.294, 10.028,
            10.547, 9.264, 9.837, 9.518, 10.599, 10.04, 9.708, 9.218, 9.743, 10.008, 9.724, 11.294,
            11.007, 7.289, 8.111, 9.825, 9.578, 10.214, 10.217, 12.118, 8.888, 9.622, 12.043,
            10.647, 10.663, 9.486, 8.352, 10.167, 10.109, 8.773, 9.317, 9.928, 9.055, 9.902,
            10.095, 10.036, 9.494, 10.594, 10.891, 10.321, 9.182, 10.732, 9.499, 10.879, 8.928,
            10.914, 9.98, 8.751, 9.686,
        ];
        let big_b = [
            10.554, 10.773, 9.518, 9.393, 10.7, 10.033, 10.736, 11.26, 8.851, 10.754, 11.725,
            10.202, 9.689, 11.252, 10.753, 11.396, 10.155, 9.018, 10.39, 10.054, 11.275, 10.694,
            8.869, 9.305, 11.384, 11.18, 9.86, 10.499, 10.946, 10.968, 11.376, 10.756, 10.405,
            10.241, 11.556, 8.249, 10.361, 10.533, 9.075, 10.833, 9.849, 11.362, 10.374, 11.169,
            11.719, 10.883, 9.624, 8.986, 12.253, 10.389,
        ];
        let r = mann_whitney_u(&big_a, &big_b, MwMethod::Auto).unwrap();
        assert_eq!(r.u, 982.5);
        assert!(rel(r.p_value, 0.00191208002757594) < 1e-9, "{}", r.p_value);
        assert!(r.z < -1.96);
    }

    #[test]
    fn mann_whitney_edge_cases() {
        assert_eq!(
            mann_whitney_u(&[], &[1.0], MwMethod::Auto),
            Err(StatsError::EmptySample("first"))
        );
        assert_eq!(
            mann_whitney_u(&[1.0], &[], MwMethod::Auto),
            Err(StatsError::EmptySample("second"))
        );
        assert_eq!(
            mann_whitney_u(&[f64::NAN], &[1.0], MwMethod::Auto),
            Err(StatsError::NaN("first"))
        );
        // All equal: no evidence of a difference.
        let r = mann_whitney_u(&[2.0; 5], &[2.0; 7], MwMethod::Auto).unwrap();
        assert_eq!((r.u, r.z, r.p_value), (17.5, 0.0, 1.0));
        // Identical samples: p = 1.
        let r = mann_whitney_u(&X, &X, MwMethod::Asymptotic).unwrap();
        assert_eq!(r.p_value, 1.0);
    }

    #[test]
    fn special_functions_match_scipy() {
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.4795001221869535),
            (1.0, 0.15729920705028516),
            (3.0, 2.2090496998585445e-05),
            (6.0, 2.1519736712498913e-17),
            (-1.0, 1.8427007929497148),
        ] {
            assert!(rel(erfc(x), want) < 1e-13, "erfc({x}) = {}", erfc(x));
        }
        for (x, want) in [
            (0.5, 0.5723649429247),
            (1.0, 0.0),
            (3.7, 1.428072326665388),
            (100.0, 359.1342053695754),
            (1e5, 1051287.7089736569),
        ] {
            assert!(
                (ln_gamma(x) - want).abs() < 1e-12 * want.abs().max(1.0),
                "lgamma({x}) = {}",
                ln_gamma(x)
            );
        }
        for (a, b, x, want) in [
            (2.0, 3.0, 0.4, 0.5247999999999999),
            (998.0, 3.0, 0.99, 0.0026794319937915143),
            (0.5, 0.5, 0.2, 0.2951672353008665),
            (1000.0, 1.0, 0.995, 0.006653968578831964),
            (50.0, 60.0, 0.45, 0.4642352914306031),
        ] {
            assert!(
                rel(beta_reg(a, b, x), want) < 1e-10,
                "I({a},{b},{x}) = {}",
                beta_reg(a, b, x)
            );
        }
    }

    #[test]
    fn clopper_pearson_matches_scipy() {
        for (s, n, c, want) in [
            (998, 1000, 0.95, 0.9937177154532766),
            (1000, 1000, 0.95, 0.9970087504549047),
            (990, 1000, 0.99, 0.9799573940991211),
            (1, 1, 0.9, 0.09999999999999998),
            (5, 10, 0.95, 0.22244110100812942),
        ] {
            let got = clopper_pearson_lower(s, n, c).unwrap();
            assert!((got - want).abs() < 1e-12, "CP({s},{n},{c}) = {got}");
        }
        assert_eq!(clopper_pearson_lower(0, 10, 0.95), Ok(0.0));
        assert!(clopper_pearson_lower(11, 10, 0.95).is_err());
        assert!(clopper_pearson_lower(5, 10, 1.0).is_err());
    }

    #[test]
    fn binomial_claim_rule() {
        // 1000 jobs, 99 % on time at 95 % confidence: up to 4 misses.
        assert_eq!(max_misses_allowed(1000, 0.99, 0.95), Ok(Some(4)));
        assert!(claims_on_time_fraction(1000, 4, 0.99, 0.95).unwrap());
        assert!(!claims_on_time_fraction(1000, 5, 0.99, 0.95).unwrap());
        // Too few jobs to claim 99.9 % (or 99 % from 100 jobs) at all.
        assert_eq!(max_misses_allowed(1000, 0.999, 0.95), Ok(None));
        assert_eq!(max_misses_allowed(100, 0.99, 0.95), Ok(None));
        assert_eq!(max_misses_allowed(10_000, 0.99, 0.99), Ok(Some(77)));
        // Consistent with the Clopper–Pearson bound.
        for k in 0..10 {
            let claim = claims_on_time_fraction(1000, k, 0.99, 0.95).unwrap();
            let lower = clopper_pearson_lower(1000 - k, 1000, 0.95).unwrap();
            assert_eq!(claim, lower >= 0.99, "k = {k}");
        }
        assert!(claims_on_time_fraction(10, 11, 0.9, 0.95).is_err());
        assert!(claims_on_time_fraction(10, 0, 1.0, 0.95).is_err());
    }
}
