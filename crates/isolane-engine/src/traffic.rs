//! What one job of a model asks of the memory system, computed from the graph alone: bytes of
//! weights, bytes of activations read and written, FLOPs, and which nodes' working sets fit in
//! a given L2. The interference prediction (`isolane_core::predict`, docs/interference.md)
//! turns it into the DRAM bandwidth and L2 share a workload takes from its neighbours.
//!
//! Shape arithmetic on the optimised graph (the one the backends compile), as
//! [`crate::footprint`] does: nothing is allocated. It counts what the IR's nodes read and
//! write; a backend that fuses nodes (the CUDA engine's conv + bias + activation epilogues)
//! moves fewer activation bytes, never more weight bytes.

use std::collections::HashSet;

use crate::error::Result;
use crate::ir::{Graph, Op, ValueKind};
use crate::passes;

/// One job's memory-system demand (a batch of `batch` at `element_bytes` per element).
#[derive(Debug, Clone, PartialEq)]
pub struct Traffic {
    pub batch: usize,
    pub element_bytes: u64,
    /// The L2 the fit below was judged against (bytes).
    pub l2_bytes: u64,
    /// Every weight (constant) a node reads, each counted once.
    pub weight_bytes: u64,
    /// Bytes of activations the nodes read and write, summed over nodes (graph inputs and
    /// outputs included; views, which alias their input, move nothing).
    pub activation_bytes: u64,
    /// 2 × multiply-accumulates of convolutions and matrix products.
    pub flops: f64,
    /// Nodes that move data (views excluded).
    pub nodes: usize,
    /// Of those, the nodes whose working set (inputs, weights and outputs together) exceeds
    /// the L2: their bytes go to DRAM whatever else runs.
    pub nodes_over_l2: usize,
    /// The bytes those nodes read and write.
    pub bytes_over_l2: u64,
    /// The largest working set of one node (bytes).
    pub largest_working_set: u64,
    /// The busiest node's activations (bytes): the least of the L2 a job holds at once beside
    /// its weights.
    pub peak_activation_bytes: u64,
}

impl Traffic {
    /// Whether the weights and the busiest node's activations fit in the L2 together: then,
    /// alone, the weights stay there from one job to the next, and a job reads from DRAM only
    /// what the nodes too large for the L2 move.
    pub fn resident(&self) -> bool {
        self.weight_bytes.saturating_add(self.peak_activation_bytes) <= self.l2_bytes
    }

    /// The bytes a job reads from and writes to DRAM, alone: the nodes too large for the L2,
    /// plus the weights when they do not stay in it ([`Traffic::resident`]).
    pub fn dram_bytes(&self) -> u64 {
        let weights = if self.resident() {
            0
        } else {
            self.weight_bytes
        };
        weights.saturating_add(self.bytes_over_l2)
    }

    /// What a job keeps in (resident) or pushes through (streaming) the L2 (bytes).
    pub fn l2_footprint(&self) -> u64 {
        if self.resident() {
            self.weight_bytes + self.peak_activation_bytes
        } else {
            self.dram_bytes().max(self.l2_bytes)
        }
    }
}

/// The traffic of `g` compiled for `batch` at `element_bytes` per element (2 for fp16 and bf16,
/// 4 for fp32 and tf32), judged against an L2 of `l2_bytes`.
pub fn traffic(g: &Graph, batch: usize, element_bytes: u64, l2_bytes: u64) -> Result<Traffic> {
    let opt = passes::optimize(g, batch)?;
    let shapes = opt.infer_shapes(batch)?;
    let bytes = |v: usize| -> u64 {
        shapes[v]
            .iter()
            .fold(1u64, |n, &d| n.saturating_mul(d as u64))
            .saturating_mul(element_bytes)
    };
    let is_constant = |v: usize| matches!(opt.values[v].kind, ValueKind::Constant(_));
    let mut t = Traffic {
        batch,
        element_bytes,
        l2_bytes,
        weight_bytes: 0,
        activation_bytes: 0,
        flops: 0.0,
        nodes: 0,
        nodes_over_l2: 0,
        bytes_over_l2: 0,
        largest_working_set: 0,
        peak_activation_bytes: 0,
    };
    let mut weights_seen = HashSet::new();
    for n in opt.nodes.iter().filter(|n| !n.op.is_view()) {
        let (mut weights, mut activations) = (0u64, 0u64);
        for &v in &n.inputs {
            if is_constant(v) {
                weights = weights.saturating_add(bytes(v));
                if weights_seen.insert(v) {
                    t.weight_bytes = t.weight_bytes.saturating_add(bytes(v));
                }
            } else {
                activations = activations.saturating_add(bytes(v));
            }
        }
        for &v in &n.outputs {
            activations = activations.saturating_add(bytes(v));
        }
        let working_set = weights.saturating_add(activations);
        t.nodes += 1;
        t.activation_bytes = t.activation_bytes.saturating_add(activations);
        t.largest_working_set = t.largest_working_set.max(working_set);
        t.peak_activation_bytes = t.peak_activation_bytes.max(activations);
        if working_set > l2_bytes {
            t.nodes_over_l2 += 1;
            t.bytes_over_l2 = t.bytes_over_l2.saturating_add(working_set);
        }
        t.flops += node_flops(n, &shapes);
    }
    Ok(t)
}

/// 2 × MACs of a convolution or matrix product (as `arch::graph_flops`, at any batch).
fn node_flops(n: &crate::ir::Node, shapes: &[Vec<usize>]) -> f64 {
    let out: f64 = shapes[n.outputs[0]].iter().product::<usize>() as f64;
    let macs = match &n.op {
        Op::Conv(_) => {
            let w = &shapes[n.inputs[1]];
            out * w.iter().skip(1).product::<usize>() as f64
        }
        Op::Linear { .. } => out * shapes[n.inputs[1]].last().copied().unwrap_or(0) as f64,
        Op::MatMul | Op::Gemm { .. } => {
            let a = &shapes[n.inputs[0]];
            let k = if matches!(n.op, Op::Gemm { trans_a: true, .. }) {
                a.first()
            } else {
                a.last()
            };
            out * k.copied().unwrap_or(0) as f64
        }
        _ => 0.0,
    };
    2.0 * macs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{build_model, graph_flops, model_info};
    use crate::ir::{Dim, Tensor};
    use crate::Weights;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_linear_layer_by_hand() {
        // x [B, 256] · w [128, 256]ᵀ + b [128]: weights 256·128 + 128 elements, activations
        // in and out per job, 2·B·256·128 FLOPs.
        let mut g = Graph::new("lin");
        let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(256)]);
        let w = g.add_constant("w", Tensor::zeros(vec![128, 256]));
        let b = g.add_constant("b", Tensor::zeros(vec![128]));
        let y = g
            .add_op("fc", Op::Linear { activation: None }, &[x, w, b])
            .unwrap();
        g.add_output(y).unwrap();
        let t = traffic(&g, 4, 2, 128 * 1024).unwrap();
        assert_eq!(t.weight_bytes, (256 * 128 + 128) * 2);
        assert_eq!(t.activation_bytes, (4 * 256 + 4 * 128) * 2);
        assert_eq!(t.flops, 2.0 * 4.0 * 256.0 * 128.0);
        assert_eq!((t.nodes, t.nodes_over_l2), (1, 0));
        assert!(
            t.resident(),
            "66 KiB of weights and 6 KiB of activations in 128 KiB: {t:?}"
        );
        assert_eq!(t.dram_bytes(), 0);
        // In an L2 of 32 KiB the node does not fit: every byte it moves goes to DRAM.
        let small = traffic(&g, 4, 2, 32 * 1024).unwrap();
        assert!(!small.resident());
        assert_eq!(small.nodes_over_l2, 1);
        assert_eq!(
            small.bytes_over_l2,
            small.weight_bytes + small.activation_bytes
        );
    }

    #[test]
    fn built_in_models_in_the_h200s_l2() {
        // The H200's L2 is 60 MB (50 MiB on the H100).
        let l2 = 60 * 1000 * 1000;
        let r18 = build_model("resnet18", Weights::Zeros).unwrap();
        let t = traffic(&r18, 1, 2, l2).unwrap();
        // BatchNorm folds into the convolutions: the weights are the parameters at fp16.
        let params = model_info("resnet18").unwrap().params;
        let weights = t.weight_bytes / 2;
        assert!(
            weights.abs_diff(params) < params / 50,
            "{weights} vs {params}"
        );
        assert!((t.flops - graph_flops(&r18).unwrap()).abs() < 1.0);
        // 23 MB of fp16 weights: resnet18 stays in the H200's L2 and reads nothing from DRAM
        // alone at batch 1.
        assert!(t.resident() && t.dram_bytes() == 0, "{t:?}");
        // At batch 64 its first activations (64 × 64 × 112 × 112 at fp16, 98 MiB) do not fit.
        let t64 = traffic(&r18, 64, 2, l2).unwrap();
        assert!(
            t64.nodes_over_l2 > 0 && t64.dram_bytes() > 98 * MIB,
            "{t64:?}"
        );
        assert!((t64.flops / t.flops - 64.0).abs() < 1e-6);

        let vit = build_model("vit_b_16", Weights::Zeros).unwrap();
        let v = traffic(&vit, 1, 2, l2).unwrap();
        // 86.6 M parameters at fp16, 173 MB: streamed from DRAM on every job.
        assert!(!v.resident());
        assert!(
            (170_000_000..176_000_000).contains(&v.dram_bytes()),
            "{v:?}"
        );
        assert_eq!(v.l2_footprint(), v.dram_bytes());
        // At fp32 twice the bytes.
        let v32 = traffic(&vit, 1, 4, l2).unwrap();
        assert_eq!(v32.weight_bytes, 2 * v.weight_bytes);
    }

    /// The model profiles the interference prediction is fitted with
    /// (isolane-core's `predict/h200-models.csv`) are this module's numbers, not typed in: a
    /// change to the graphs or to this arithmetic fails here until the file (and the fit,
    /// `cargo test -p isolane-core --lib predict`) is made again.
    #[test]
    fn the_committed_model_profiles_are_the_engines() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../isolane-core/src/predict/h200-models.csv"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let mut lines = text.lines();
        let header = lines.next().unwrap();
        assert_eq!(header, HEADER);
        let mut expected = vec![HEADER.to_string()];
        for line in lines {
            let f: Vec<&str> = line.split(',').collect();
            let (model, element_bytes, batch, l2) = (
                f[0],
                match f[1] {
                    "fp16" | "bf16" => 2,
                    _ => 4,
                },
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            );
            let g = build_model(model, Weights::Zeros).unwrap();
            let t = traffic(&g, batch, element_bytes, l2).unwrap();
            expected.push(row(model, f[1], &t));
        }
        assert_eq!(text.trim_end(), expected.join("\n"), "{path}");
    }

    const HEADER: &str = "model,precision,batch,l2_bytes,weight_bytes,activation_bytes,gflops,dram_bytes,l2_footprint_bytes,resident";

    fn row(model: &str, precision: &str, t: &Traffic) -> String {
        format!(
            "{model},{precision},{},{},{},{},{:.3},{},{},{}",
            t.batch,
            t.l2_bytes,
            t.weight_bytes,
            t.activation_bytes,
            t.flops / 1e9,
            t.dram_bytes(),
            t.l2_footprint(),
            t.resident()
        )
    }
}
