//! The seeded inputs that real models run on: `infer`, `bench` and the runtime's engine
//! executors all fill a model's input from here, so the same seed gives the same tensor
//! everywhere.

/// Seeded standard normal values (splitmix64 + Box–Muller): reproducible across platforms.
pub fn random_normal(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64 // in (0, 1)
    };
    let mut v = Vec::with_capacity(n + 1);
    while v.len() < n {
        let (u1, u2) = (next(), next());
        let r = (-2.0 * u1.ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * u2;
        v.push((r * t.cos()) as f32);
        v.push((r * t.sin()) as f32);
    }
    v.truncate(n);
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_is_seeded_and_normal() {
        let a = super::random_normal(10_001, 3);
        assert_eq!(a, super::random_normal(10_001, 3));
        assert_ne!(a, super::random_normal(10_001, 4));
        let mean = a.iter().map(|&x| x as f64).sum::<f64>() / a.len() as f64;
        let var = a.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / a.len() as f64;
        assert!(
            mean.abs() < 0.05 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
    }
}
