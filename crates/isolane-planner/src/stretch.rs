//! Per-workload interference from a measured matrix (`isolane interference`,
//! interference.json): so that a plan holds beside the workloads it will actually run with,
//! not only alone.

use isolane_core::results::{CellKind, InterferenceIndex};

/// The worst p99 stretch the matrix measured for `model` at `precision` as a victim beside any
/// of `neighbours` (the other models of the scenario); beside any neighbour when none of them
/// was measured with it; `None` when the model is not a victim of the matrix.
pub fn stretch_from(
    m: &InterferenceIndex,
    model: &str,
    precision: &str,
    neighbours: &[&str],
) -> Option<f64> {
    let pairs: Vec<(&str, f64)> = m
        .cells
        .iter()
        .filter(|c| c.kind == CellKind::Pair && c.victim == model && c.precision == precision)
        .filter_map(|c| Some((c.neighbour.as_deref()?, c.stretch_p99?)))
        .collect();
    let worst = |it: &mut dyn Iterator<Item = f64>| {
        it.fold(None, |a: Option<f64>, s| Some(a.map_or(s, |a| a.max(s))))
    };
    let actual = worst(
        &mut pairs
            .iter()
            .filter(|(n, _)| neighbours.contains(n))
            .map(|p| p.1),
    );
    actual
        .or_else(|| worst(&mut pairs.iter().map(|p| p.1)))
        .map(|s| s.max(1.0))
}

/// The worst p99 stretch the matrix measured for any victim at `precision`: the stand-in for a
/// model it never measured as a victim (a stretch of 1 would plan as if alone; the worst
/// measured one errs on the side of the deadline). `None` when it measured nothing there.
pub fn worst_stretch(m: &InterferenceIndex, precision: &str) -> Option<f64> {
    m.cells
        .iter()
        .filter(|c| c.kind == CellKind::Pair && c.precision == precision)
        .filter_map(|c| c.stretch_p99)
        .fold(None, |a: Option<f64>, s| Some(a.map_or(s, |a| a.max(s))))
        .map(|s| s.max(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_core::results::InterferenceCell;

    fn pair(victim: &str, neighbour: &str, s: f64) -> InterferenceCell {
        let mut c = InterferenceCell::pending(String::new(), CellKind::Pair, victim, "fp16");
        c.neighbour = Some(neighbour.into());
        c.stretch_p99 = Some(s);
        c
    }

    #[test]
    fn the_worst_stretch_beside_the_actual_neighbours_else_beside_any() {
        let m: InterferenceIndex = serde_json::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../results/h100-interference/green-fp16/interference.json"
            ))
            .unwrap(),
        )
        .unwrap();
        // Measured on the H100: vit_b_16 beside vit_l_32 in 48 and 80 SMs, ×1.23 and ×1.24.
        let s = stretch_from(&m, "vit_b_16", "fp16", &["vit_l_32"]).unwrap();
        assert!((1.2..1.3).contains(&s), "{s}");
        // Beside a model the matrix never ran with it: its worst over all neighbours.
        let any = stretch_from(&m, "vit_b_16", "fp16", &["mobilenet_v2"]).unwrap();
        assert!(any >= s);
        assert_eq!(stretch_from(&m, "convnext_large", "fp16", &[]), None);
        // A model it never measured as a victim: the worst of all victims (resnet18 beside
        // resnet18 in 80 SMs, ×1.39 at p99 on the H100), at least vit_b_16's worst.
        let worst = worst_stretch(&m, "fp16").unwrap();
        assert!(worst >= any && (1.3..1.5).contains(&worst), "{worst}");
        assert_eq!(worst_stretch(&m, "fp32"), None);
        assert_eq!(stretch_from(&m, "vit_b_16", "fp32", &["vit_l_32"]), None);

        let mut small = m.clone();
        small.cells = vec![pair("a", "b", 0.97)];
        assert_eq!(
            stretch_from(&small, "a", "fp16", &["b"]),
            Some(1.0),
            "never below 1"
        );
    }
}
