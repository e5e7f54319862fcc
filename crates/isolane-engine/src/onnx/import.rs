//! ONNX graph → engine IR.
//!
//! Nodes are visited in file order (ONNX requires topological order). Each ONNX value becomes a
//! [`Val`]: either a runtime tensor in the IR ([`Val::Dyn`], f32) or a value known at import
//! (f32, integer or bool arrays). Ops whose inputs are all known are computed here (constant
//! propagation), which folds the shape subgraphs that exporters emit; integers that depend on the
//! batch size are carried symbolically as `a·B + c` ([`Sym`]), so the IR stays batch-agnostic.
//!
//! Shapes of runtime tensors are tracked by running the IR's own shape inference at two batch
//! sizes ([`SAMPLES`]); a dimension that differs between them is batch-dependent and its `a·B + c`
//! form is read off the two samples. All dims other than the batch are static.
//!
//! Every attribute a node carries must be understood: each handler reads the attributes it
//! implements and names those it may ignore (they do not change inference results); anything
//! left over is an error naming the op, the node and the opset, never a silently wrong result.

use super::error::{NodeRef, OnnxError, Result};
use super::fold::{self, Arr, Sym};
use super::model::{Dim as InDim, OnnxModel};
use super::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto};
use super::tensor::{self, Data};
use crate::ir::{self, Dim, Graph, Op, ValueId};
use crate::ops::OnnxOps;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

pub(crate) mod batch_uniform;
mod older;

use crate::ops::quant::import as quant;

/// Batch sizes at which runtime shapes are evaluated to tell batch-dependent dims apart.
pub(crate) const SAMPLES: [usize; 2] = [2, 3];

/// Reads `path` and imports it (see [`import`]). The weights move from the file's decoded form
/// into the graph, so a large model is not held twice more than needed.
pub fn import_file(path: impl AsRef<Path>) -> Result<Graph> {
    let mut model = OnnxModel::load(path)?;
    let initializers = std::mem::take(&mut model.initializers);
    import_with(&model, initializers)
}

/// [`import_file`] of a model whose input may have dynamic dimensions past the batch (what
/// `optimum-cli export onnx` writes: `[batch_size, num_channels, height, width]`), sized by
/// `given`, the shape of the array the caller will feed: one sample (`[C, H, W]`) or a batch
/// (`[B, C, H, W]`). Each dynamic dimension of the first graph input but the batch takes the
/// array's size there; fixed ones stay as the file says (a mismatch is refused when the array
/// is fed). Without `given`, or of another rank, this is [`import_file`].
pub fn import_file_sized(path: impl AsRef<Path>, given: Option<&[usize]>) -> Result<Graph> {
    let mut model = OnnxModel::load(path)?;
    if let (Some(given), Some(input)) = (given, model.inputs.first_mut()) {
        let rank = input.dims.len();
        let sample = match given.len() {
            n if n == rank => Some(&given[1..]),
            n if n + 1 == rank => Some(given),
            _ => None,
        };
        if let Some(sample) = sample {
            for (d, &size) in input.dims.iter_mut().skip(1).zip(sample) {
                if matches!(d, InDim::Dynamic(_)) && size > 0 {
                    *d = InDim::Fixed(size);
                }
            }
        }
    }
    let initializers = std::mem::take(&mut model.initializers);
    import_with(&model, initializers)
}

/// Imports a loaded model into a batch-agnostic IR graph.
///
/// The first dimension of a graph input may be dynamic (`dim_param`, e.g. from `dynamic_axes`);
/// it becomes [`Dim::Batch`]. Every other dimension must be fixed in the file. A model exported
/// with a fixed batch keeps it: its graph input is `Fixed(n)` and it only runs at batch n.
pub fn import(model: &OnnxModel) -> Result<Graph> {
    import_with(model, model.initializers.clone())
}

pub(crate) fn import_with(
    model: &OnnxModel,
    initializers: HashMap<String, tensor::Tensor>,
) -> Result<Graph> {
    import_with_ops(model, initializers, OnnxOps::standard())
}

/// [`import`] with the op types of `ops` (the standard table, or one a caller extended).
pub(crate) fn import_with_ops(
    model: &OnnxModel,
    initializers: HashMap<String, tensor::Tensor>,
    ops: OnnxOps,
) -> Result<Graph> {
    let weights: u128 = initializers.values().map(|t| val_bytes_of(&t.data)).sum();
    let budget = FOLD_BUDGET_BYTES.saturating_add(weights.saturating_mul(2));
    import_within(model, initializers, budget, ops)
}

/// [`import_with`] with at most `fold_budget` bytes of values computed at import.
pub(crate) fn import_within(
    model: &OnnxModel,
    initializers: HashMap<String, tensor::Tensor>,
    fold_budget: u128,
    ops: OnnxOps,
) -> Result<Graph> {
    let mut im = Importer::new(model, ops);
    im.check_single_assignment(&initializers)?;
    im.fold_budget = fold_budget;
    im.declare_inputs(initializers)?;
    for (i, n) in model.graph.node.iter().enumerate() {
        im.node(i, n)?;
    }
    im.finish()
}

/// The bytes that constants computed at import may hold in all, beyond twice the initializers'
/// (which folding may transpose or cast once each).
pub(crate) const FOLD_BUDGET_BYTES: u128 = 1 << 30;

/// The bytes an initializer takes once held as a [`Val`].
pub(crate) fn val_bytes_of(d: &Data) -> u128 {
    let (len, size) = match d {
        Data::F32(v) => (v.len(), std::mem::size_of::<f32>()),
        Data::I64(v) => (v.len(), std::mem::size_of::<Sym>()),
        Data::Bool(v) => (v.len(), std::mem::size_of::<bool>()),
    };
    (len as u128).saturating_mul(size as u128)
}

/// A value during import.
#[derive(Debug, Clone)]
pub(crate) enum Val {
    /// A runtime tensor in the IR, with its shapes at the [`SAMPLES`] batch sizes.
    Dyn(Dyn),
    F(Arr<f32>),
    I(Arr<Sym>),
    B(Arr<bool>),
    /// A QuantizeLinear of a runtime tensor, which only a DequantizeLinear may read.
    Q(Box<quant::Pending>),
    /// IsNaN of a runtime tensor, which only `Where(IsNaN(x), c, x)` may read (PyTorch's
    /// attention export zeroes the NaN of a fully masked row so; `Importer::where_op`).
    NanTest(Dyn),
}

#[derive(Debug, Clone)]
pub(crate) struct Dyn {
    pub(crate) id: ValueId,
    pub(crate) shapes: [Vec<usize>; 2],
}

impl Val {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Val::Dyn(_) => "a runtime tensor",
            Val::F(_) => "a float constant",
            Val::I(_) => "an integer constant",
            Val::B(_) => "a bool constant",
            Val::Q(_) => "a quantized runtime tensor (a QuantizeLinear output)",
            Val::NanTest(_) => "IsNaN of a runtime tensor (read only by Where(IsNaN(x), c, x))",
        }
    }

    pub(crate) fn is_dyn(&self) -> bool {
        matches!(self, Val::Dyn(_))
    }

    /// The bytes a value computed at import holds (a runtime tensor: none, it is a node).
    pub(crate) fn bytes(&self) -> u128 {
        let n = |len: usize, size: usize| (len as u128).saturating_mul(size as u128);
        match self {
            Val::Dyn(_) | Val::Q(_) | Val::NanTest(_) => 0,
            Val::F(a) => n(a.data.len(), std::mem::size_of::<f32>()),
            Val::I(a) => n(a.data.len(), std::mem::size_of::<Sym>()),
            Val::B(a) => n(a.data.len(), std::mem::size_of::<bool>()),
        }
    }

    /// The rank (same at every batch size).
    pub(crate) fn rank(&self) -> usize {
        match self {
            Val::Dyn(d) | Val::NanTest(d) => d.shapes[0].len(),
            Val::Q(q) => q.x.shapes[0].len(),
            Val::F(a) => a.shape.len(),
            Val::I(a) => a.shape.len(),
            Val::B(a) => a.shape.len(),
        }
    }

    /// The shape with batch-dependent dims as `a·B + c`.
    pub(crate) fn sym_shape(&self) -> Result<Vec<Sym>, String> {
        let st = |s: &[usize]| s.iter().map(|&d| Sym::k(d as i64)).collect();
        match self {
            Val::Dyn(d) => d.shapes[0]
                .iter()
                .zip(&d.shapes[1])
                .map(|(&x, &y)| {
                    let (b0, b1) = (SAMPLES[0] as i64, SAMPLES[1] as i64);
                    let a = (y as i64 - x as i64) / (b1 - b0);
                    let c = x as i64 - a * b0;
                    if a * (b1 - b0) != y as i64 - x as i64 || a < 0 {
                        return Err(format!(
                            "a dimension ({x} at batch {b0}, {y} at batch {b1}) is not a multiple of the batch"
                        ));
                    }
                    Ok(Sym { a, c })
                })
                .collect(),
            Val::F(a) => Ok(st(&a.shape)),
            Val::I(a) => Ok(st(&a.shape)),
            Val::B(a) => Ok(st(&a.shape)),
            Val::Q(q) => Val::Dyn(q.x.clone()).sym_shape(),
            Val::NanTest(d) => Val::Dyn(d.clone()).sym_shape(),
        }
    }
}

/// One ONNX node being imported: its identity for messages and which attributes were read.
pub(crate) struct Ctx<'a> {
    pub(crate) n: &'a NodeProto,
    pub(crate) r: NodeRef,
    pub(crate) path: &'a Path,
    pub(crate) read: RefCell<Vec<bool>>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn op(&self) -> &str {
        self.n.op_type()
    }

    pub(crate) fn bad(&self, what: impl Into<String>) -> OnnxError {
        OnnxError::BadNode {
            path: self.path.to_path_buf(),
            node: Box::new(self.r.clone()),
            what: what.into(),
        }
    }

    pub(crate) fn unsupported_attr(&self, attr: &str, why: impl Into<String>) -> OnnxError {
        OnnxError::UnsupportedAttribute {
            path: self.path.to_path_buf(),
            node: Box::new(self.r.clone()),
            attr: attr.to_string(),
            why: why.into(),
        }
    }

    pub(crate) fn unsupported_op(&self) -> OnnxError {
        OnnxError::UnsupportedOp {
            path: self.path.to_path_buf(),
            node: Box::new(self.r.clone()),
            domain: self.n.domain().to_string(),
        }
    }

    /// Finds an attribute and marks it as understood.
    pub(crate) fn attr(&self, name: &str) -> Option<&'a AttributeProto> {
        let i = self.n.attribute.iter().position(|a| a.name() == name)?;
        self.read.borrow_mut()[i] = true;
        Some(&self.n.attribute[i])
    }

    pub(crate) fn typed(
        &self,
        name: &str,
        want: AttributeType,
    ) -> Result<Option<&'a AttributeProto>> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) if a.ref_attr_name.is_some() => {
                Err(self.unsupported_attr(name, "references a function attribute"))
            }
            // Old files may lack the type field; trust the field that is set then.
            Some(a) if a.r#type.is_none() || a.r#type() == want => Ok(Some(a)),
            Some(a) => Err(self.bad(format!(
                "attribute {name} has type {}, expected {}",
                a.r#type().as_str_name(),
                want.as_str_name()
            ))),
        }
    }

    pub(crate) fn int(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self
            .typed(name, AttributeType::Int)?
            .map_or(default, |a| a.i()))
    }

    pub(crate) fn float(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self
            .typed(name, AttributeType::Float)?
            .map_or(default, |a| a.f()))
    }

    pub(crate) fn ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        Ok(self
            .typed(name, AttributeType::Ints)?
            .map(|a| a.ints.clone()))
    }

    pub(crate) fn string(&self, name: &str, default: &str) -> Result<String> {
        match self.typed(name, AttributeType::String)? {
            None => Ok(default.to_string()),
            Some(a) => String::from_utf8(a.s().to_vec())
                .map_err(|_| self.bad(format!("attribute {name} is not UTF-8"))),
        }
    }

    /// An int attribute's value, without marking it read (a look before the op's own reading).
    pub(crate) fn peek_int(&self, name: &str) -> Option<i64> {
        self.n
            .attribute
            .iter()
            .find(|a| a.name() == name)
            .map(|a| a.i())
    }

    /// An ints attribute's value, without marking it read.
    pub(crate) fn peek_ints(&self, name: &str) -> Option<Vec<i64>> {
        self.n
            .attribute
            .iter()
            .find(|a| a.name() == name)
            .map(|a| a.ints.clone())
    }

    /// Accepts an attribute that has no effect on inference (e.g. BatchNorm's momentum).
    pub(crate) fn ignore(&self, name: &str) {
        let _ = self.attr(name);
    }

    /// Requires an attribute to be absent or equal to `default` (as an int).
    pub(crate) fn int_default_only(&self, name: &str, default: i64) -> Result<()> {
        let v = self.int(name, default)?;
        if v != default {
            return Err(
                self.unsupported_attr(name, format!("value {v} is not supported (only {default})"))
            );
        }
        Ok(())
    }

    /// Every attribute of the node must have been read.
    pub(crate) fn check_all_read(&self) -> Result<()> {
        let read = self.read.borrow();
        if let Some(i) = read.iter().position(|r| !r) {
            let a = &self.n.attribute[i];
            return Err(self.unsupported_attr(
                a.name(),
                "isolane does not implement this attribute for this op",
            ));
        }
        Ok(())
    }
}

pub(crate) struct Importer<'m> {
    pub(crate) m: &'m OnnxModel,
    pub(crate) g: Graph,
    pub(crate) vals: HashMap<String, Val>,
    /// IR constants already created for ONNX values, so a weight used twice is stored once.
    pub(crate) ir_consts: HashMap<String, ValueId>,
    /// Every value name some node or the graph output reads.
    pub(crate) used: HashSet<&'m str>,
    /// The first node (index) that writes each value name: to say why a node's input is
    /// missing when it is written later (nodes out of order, or a cycle).
    pub(crate) writers: HashMap<&'m str, usize>,
    /// Bytes of the values computed at import so far, and the most they may reach: each
    /// folded constant is bounded ([`fold::MAX_FOLD_BYTES`]), and so is their sum.
    pub(crate) folded: u128,
    pub(crate) fold_budget: u128,
    pub(crate) fresh: usize,
    /// Values the size of the batch held once (a ConstantOfShape([B, ...]) and what is
    /// computed from it repeat by repeat), with the axis that holds the batch:
    /// [`batch_uniform`] says how.
    pub(crate) uniform: HashMap<String, batch_uniform::Tiled>,
    /// Element types of quantized constants, and the FakeQuants made (`quant`).
    pub(crate) quant: quant::State,
    /// The import function of each ONNX op type this importer knows.
    pub(crate) ops: OnnxOps,
}

/// How messages name node `index` of the file: its op, its name (`#index` when it has none) and
/// the opset.
pub(crate) fn node_ref(index: usize, n: &NodeProto, opset: i64) -> NodeRef {
    NodeRef {
        op: n.op_type().to_string(),
        node: if n.name().is_empty() {
            format!("#{index}")
        } else {
            n.name().to_string()
        },
        opset,
    }
}

/// An axis normalised against a rank, or an error naming the node.
pub(crate) fn node_axis(c: &Ctx, axis: i64, rank: usize) -> Result<usize> {
    ir::norm_axis(axis, rank)
        .ok_or_else(|| c.bad(format!("axis {axis} is out of range for rank {rank}")))
}

impl<'m> Importer<'m> {
    pub(crate) fn new(m: &'m OnnxModel, ops: OnnxOps) -> Self {
        let mut used = HashSet::new();
        for n in &m.graph.node {
            for i in &n.input {
                used.insert(i.as_str());
            }
        }
        for o in &m.outputs {
            used.insert(o.as_str());
        }
        let mut writers = HashMap::new();
        for (k, n) in m.graph.node.iter().enumerate() {
            for o in n.output.iter().filter(|o| !o.is_empty()) {
                writers.entry(o.as_str()).or_insert(k);
            }
        }
        let name = m
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "onnx".into());
        Importer {
            m,
            g: Graph::new(name),
            vals: HashMap::new(),
            ir_consts: HashMap::new(),
            used,
            writers,
            folded: 0,
            fold_budget: FOLD_BUDGET_BYTES,
            fresh: 0,
            uniform: HashMap::new(),
            quant: quant::State::default(),
            ops,
        }
    }

    pub(crate) fn invalid(&self, what: impl Into<String>) -> OnnxError {
        OnnxError::Invalid {
            path: self.m.path.clone(),
            what: what.into(),
        }
    }

    /// ONNX graphs are in single-assignment form: each tensor is written once, by a graph input,
    /// an initializer or one node. Importing a second write would silently replace the first
    /// (the nodes after it would read the later value), so it is refused, naming both writers.
    pub(crate) fn check_single_assignment(
        &self,
        initializers: &HashMap<String, tensor::Tensor>,
    ) -> Result<()> {
        let mut writer: HashMap<&str, String> = HashMap::new();
        for i in &self.m.inputs {
            writer.insert(i.name.as_str(), "the graph input".into());
        }
        for name in initializers.keys() {
            writer.insert(name.as_str(), "an initializer".into());
        }
        for (k, n) in self.m.graph.node.iter().enumerate() {
            let this = node_ref(k, n, self.m.opset);
            for o in n.output.iter().filter(|o| !o.is_empty()) {
                if let Some(first) = writer.get(o.as_str()) {
                    return Err(self.invalid(format!(
                        "tensor {o:?} is written twice, by {first} and by {this}; an ONNX graph \
                         writes each tensor once (rename one of the outputs)"
                    )));
                }
                writer.insert(o.as_str(), this.to_string());
            }
        }
        Ok(())
    }

    pub(crate) fn declare_inputs(
        &mut self,
        initializers: HashMap<String, tensor::Tensor>,
    ) -> Result<()> {
        for (name, t) in initializers {
            self.note_initializer_type(&name, t.onnx_type);
            let v = match t.data {
                Data::F32(v) => Val::F(Arr::new(t.shape, v)),
                Data::I64(v) => Val::I(Arr::new(t.shape, v.into_iter().map(Sym::k).collect())),
                Data::Bool(v) => Val::B(Arr::new(t.shape, v)),
            };
            self.vals.insert(name, v);
        }
        for input in &self.m.inputs {
            let mut dims = Vec::with_capacity(input.dims.len());
            for (i, d) in input.dims.iter().enumerate() {
                dims.push(match d {
                    // An empty input would run and give an empty output (min inf, max -inf).
                    InDim::Fixed(0) => {
                        return Err(self.invalid(format!(
                            "graph input {:?}: dimension {i} has size 0 (shape {}); every dimension of an input must be at least 1",
                            input.name,
                            in_dims_text(&input.dims)
                        )))
                    }
                    InDim::Fixed(n) => Dim::Fixed(*n),
                    InDim::Dynamic(_) if i == 0 => Dim::Batch,
                    InDim::Dynamic(p) => {
                        return Err(self.invalid(format!(
                            "graph input {:?}: dimension {i} is dynamic ({p:?}); isolane needs every dimension but the first (the batch) fixed — re-export with a fixed input size (`isolane infer --input x.npy` takes them from the array)",
                            input.name
                        )))
                    }
                });
            }
            check_dims_size(&dims)
                .map_err(|e| self.invalid(format!("graph input {:?}: shape {e}", input.name)))?;
            let id = self.g.add_input(input.name.clone(), dims.clone());
            let shapes = SAMPLES.map(|b| ir::resolve_dims(&dims, None, b).unwrap_or_default());
            self.vals
                .insert(input.name.clone(), Val::Dyn(Dyn { id, shapes }));
        }
        Ok(())
    }

    pub(crate) fn finish(mut self) -> Result<Graph> {
        let outputs = self.m.outputs.clone();
        self.unshift_outputs(&outputs)?;
        for (k, name) in outputs.iter().enumerate() {
            let v =
                self.vals.get(name).cloned().ok_or_else(|| {
                    self.invalid(format!("graph output {name:?} is never computed"))
                })?;
            if self.uniform.contains_key(name) {
                return Err(self.invalid(format!(
                    "graph output {name:?} is built from a ConstantOfShape the size of the batch \
                     without meeting the input: isolane holds such values once"
                )));
            }
            self.check_declared_output(k, &v)?;
            let id = match v {
                Val::Dyn(d) => d.id,
                Val::F(a) => {
                    // A constant output (the graph does not depend on its input there).
                    let c = self.g.add_constant(
                        format!("{name}/const"),
                        ir::Tensor {
                            shape: a.shape,
                            data: a.data,
                        },
                    );
                    self.g
                        .add_op(name.clone(), Op::Identity, &[c])
                        .map_err(|e| self.invalid(e.to_string()))?
                }
                other => {
                    return Err(self.invalid(format!(
                        "graph output {name:?} is {}; isolane's outputs are float tensors",
                        other.kind()
                    )))
                }
            };
            self.g
                .add_output(id)
                .map_err(|e| self.invalid(e.to_string()))?;
        }
        Ok(self.g)
    }

    /// A cheap safety net: the output shape the file declares (where fixed) must match ours.
    /// Batch-dependent dims of ours are not compared (the file may name or fix them).
    pub(crate) fn check_declared_output(&self, k: usize, v: &Val) -> Result<()> {
        use super::proto::tensor_shape_proto::dimension::Value as DV;
        use super::proto::type_proto::Value as TV;
        let Some(vi) = self.m.graph.output.get(k) else {
            return Ok(());
        };
        let Some(TV::TensorType(tt)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
            return Ok(());
        };
        let Some(shape) = tt.shape.as_ref() else {
            return Ok(());
        };
        let ours = v.sym_shape().map_err(|e| self.invalid(e))?;
        let show = fmt_syms(&ours);
        if shape.dim.len() != ours.len() {
            return Err(self.invalid(format!(
                "output {:?}: the file declares rank {}, the imported graph computes shape {show}",
                vi.name(),
                shape.dim.len()
            )));
        }
        for (i, (d, o)) in shape.dim.iter().zip(&ours).enumerate() {
            if let (Some(DV::DimValue(v)), true) = (&d.value, o.is_const()) {
                if *v != o.c {
                    return Err(self.invalid(format!(
                        "output {:?}: the file declares dimension {i} = {v}, the imported graph computes shape {show}; please report this as an isolane bug",
                        vi.name(),
                    )));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn get(&self, c: &Ctx, i: usize) -> Result<Option<Val>> {
        match c.n.input.get(i).map(String::as_str) {
            None | Some("") => Ok(None),
            Some(name) => {
                self.vals
                    .get(name)
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| match self.writers.get(name) {
                        Some(&k) if node_ref(k, &self.m.graph.node[k], self.m.opset) == c.r => c
                            .bad(format!(
                                "input {name:?} is this node's own output: the graph has a cycle"
                            )),
                        Some(&k) => c.bad(format!(
                        "input {name:?} is written only by a later node, {}: the nodes are not in \
                         topological order, or they form a cycle",
                        node_ref(k, &self.m.graph.node[k], self.m.opset)
                    )),
                        None => c.bad(format!(
                        "input {name:?} is not produced by any node, initializer or graph input"
                    )),
                    })
            }
        }
    }

    pub(crate) fn req(&self, c: &Ctx, i: usize) -> Result<Val> {
        self.get(c, i)?
            .ok_or_else(|| c.bad(format!("required input {i} is missing")))
    }

    /// An input that must be known at import as integers (shape, axes, indices...).
    pub(crate) fn ints_input(&self, c: &Ctx, i: usize, what: &str) -> Result<Option<Vec<i64>>> {
        match self.get(c, i)? {
            None => Ok(None),
            Some(v) => syms_static(c, &v, what).map(Some),
        }
    }

    /// The IR value for an input: runtime tensors as they are, float constants as IR constants
    /// (created once per ONNX name).
    pub(crate) fn ir_value(&mut self, c: &Ctx, name: &str, v: &Val) -> Result<ValueId> {
        match v {
            Val::Dyn(d) => Ok(d.id),
            Val::F(a) => {
                if let Some(&id) = self.ir_consts.get(name) {
                    return Ok(id);
                }
                let id = self.g.add_shared_constant(
                    name.to_string(),
                    Arc::new(ir::Tensor {
                        shape: a.shape.clone(),
                        data: a.data.clone(),
                    }),
                );
                self.ir_consts.insert(name.to_string(), id);
                Ok(id)
            }
            other => Err(c.bad(format!(
                "input {name:?} is {} used as a runtime tensor; isolane computes in float32 only",
                other.kind()
            ))),
        }
    }

    /// Adds `op` to the IR on the node's inputs `ins` (indices into the node's inputs, or
    /// extra values given with a synthetic name) and returns its outputs as runtime values.
    pub(crate) fn emit(
        &mut self,
        c: &Ctx,
        op: Op,
        ins: &[(String, Val)],
        out_names: Vec<String>,
    ) -> Result<Vec<Val>> {
        let mut ids = Vec::with_capacity(ins.len());
        for (name, v) in ins {
            ids.push(self.ir_value(c, name, v)?);
        }
        let node_name = if c.n.name().is_empty() {
            c.r.node.clone()
        } else {
            c.n.name().to_string()
        };
        let outs = self
            .g
            .add_node_with_outputs(node_name, op, &ids, out_names)
            .map_err(|e| c.bad(e.to_string()))?;
        let node = self.g.nodes.last().ok_or_else(|| c.bad("node not added"))?;
        let mut shapes: [Vec<Vec<usize>>; 2] = [Vec::new(), Vec::new()];
        for (k, &b) in SAMPLES.iter().enumerate() {
            let in_shapes: Vec<&[usize]> = ins
                .iter()
                .map(|(_, v)| match v {
                    Val::Dyn(d) => d.shapes[k].as_slice(),
                    Val::F(a) => a.shape.as_slice(),
                    _ => &[],
                })
                .collect();
            shapes[k] = ir::infer_node(node, &in_shapes, b).map_err(|e| c.bad(e.to_string()))?;
        }
        Ok(outs
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                Val::Dyn(Dyn {
                    id,
                    shapes: [shapes[0][i].clone(), shapes[1][i].clone()],
                })
            })
            .collect())
    }

    /// `emit` for the common case: the node's first `n_in` inputs (absent ones skipped), one output.
    pub(crate) fn emit1(&mut self, c: &Ctx, op: Op, n_in: usize) -> Result<Vec<Val>> {
        let mut ins = Vec::new();
        for i in 0..n_in {
            if let Some(v) = self.get(c, i)? {
                ins.push((c.n.input[i].clone(), v));
            }
        }
        let out = self.out_name(c, 0);
        self.emit(c, op, &ins, vec![out])
    }

    pub(crate) fn out_name(&mut self, c: &Ctx, i: usize) -> String {
        match c.n.output.get(i).map(String::as_str) {
            Some(s) if !s.is_empty() => s.to_string(),
            _ => {
                self.fresh += 1;
                format!("{}:unnamed{}", c.r.node, self.fresh)
            }
        }
    }

    pub(crate) fn node(&mut self, index: usize, n: &NodeProto) -> Result<()> {
        let r = node_ref(index, n, self.m.opset);
        let path = self.m.path.clone();
        let c = Ctx {
            n,
            r,
            path: &path,
            read: RefCell::new(vec![false; n.attribute.len()]),
        };
        let known_domain = matches!(n.domain(), "" | "ai.onnx")
            || (n.domain() == "com.microsoft" && quant::is_contrib(n.op_type()));
        if !known_domain {
            return Err(c.unsupported_op());
        }
        let reads_uniform = n.input.iter().any(|i| self.uniform.contains_key(i));
        let axis = if reads_uniform {
            batch_uniform::check(self, &c)?
        } else {
            None
        };
        let int_outputs = self.quantized_readers(&c)?;
        let (outs, tiled) = match batch_uniform::range(self, &c)? {
            Some((v, t)) => (vec![v], Some(t)),
            None => {
                let outs = self.dispatch(&c)?;
                let step = batch_uniform::step_of(self, &c)?;
                let axis = axis.or_else(|| batch_uniform::made_by(self, &c));
                (outs, axis.map(|axis| batch_uniform::Tiled { axis, step }))
            }
        };
        c.check_all_read()?;
        if let Some(t) = int_outputs {
            self.tag_int_outputs(n, &outs, t);
        }
        let made: u128 = outs.iter().map(Val::bytes).sum();
        self.folded = self.folded.saturating_add(made);
        if self.folded > self.fold_budget {
            return Err(c.bad(format!(
                "the values computed at import reach {} bytes here, more than the {} allowed \
                 (1 GiB plus twice the initializers): the model's shape subgraphs build \
                 constants far larger than any real model's",
                self.folded, self.fold_budget
            )));
        }
        for (i, name) in n.output.iter().enumerate() {
            // An op of a held value is held too unless it met a batched tensor (broadcast at
            // run time: its result is the real batch).
            match &tiled {
                Some(t) if outs.get(i).is_some_and(|v| !batch_uniform::batched(v)) => {
                    self.uniform.insert(name.clone(), t.clone());
                }
                _ => {}
            }
            if name.is_empty() {
                continue;
            }
            match outs.get(i) {
                Some(v) => {
                    self.vals.insert(name.clone(), v.clone());
                }
                None if self.used.contains(name.as_str()) => {
                    return Err(c.bad(format!(
                        "output {i} ({name:?}) is used, but isolane computes only the first {} output(s) of this op (training outputs are not supported)",
                        outs.len()
                    )))
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Imports node `c` by the function its op type has in the importer's table.
    pub(crate) fn dispatch(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        match self.ops.get(c.op()) {
            Some(import) => import(self, c),
            None => Err(c.unsupported_op()),
        }
    }

    /// Explicit pads `[top, left, bottom, right]` from ONNX `pads`/`auto_pad` for 2-D windows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn window_pads(
        &self,
        c: &Ctx,
        input_hw: [usize; 2],
        kernel: [usize; 2],
        strides: [usize; 2],
        dilations: [usize; 2],
    ) -> Result<[usize; 4]> {
        let auto = c.string("auto_pad", "NOTSET")?;
        let pads = c.ints("pads")?;
        match auto.as_str() {
            "NOTSET" | "" => {
                let p = pads.unwrap_or_else(|| vec![0; 4]);
                if p.len() != 4 || p.iter().any(|&v| v < 0) {
                    return Err(c.bad(format!("pads {p:?}: expected 4 non-negative values (2-D)")));
                }
                Ok([p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize])
            }
            "VALID" => Ok([0; 4]),
            "SAME_UPPER" | "SAME_LOWER" => {
                let mut out = [0usize; 4];
                for i in 0..2 {
                    let o = input_hw[i].div_ceil(strides[i]);
                    let eff = (kernel[i] - 1) * dilations[i] + 1;
                    let total = ((o - 1) * strides[i] + eff).saturating_sub(input_hw[i]);
                    let (small, big) = (total / 2, total - total / 2);
                    if auto == "SAME_UPPER" {
                        out[i] = small;
                        out[i + 2] = big;
                    } else {
                        out[i] = big;
                        out[i + 2] = small;
                    }
                }
                Ok(out)
            }
            other => Err(c.unsupported_attr("auto_pad", format!("value {other:?}"))),
        }
    }

    pub(crate) fn two(
        c: &Ctx,
        name: &str,
        v: Option<Vec<i64>>,
        default: usize,
    ) -> Result<[usize; 2]> {
        match v {
            None => Ok([default; 2]),
            Some(v) if v.len() == 2 && v.iter().all(|&x| x >= 1) => {
                Ok([v[0] as usize, v[1] as usize])
            }
            Some(v) => Err(c.bad(format!("{name} {v:?}: expected 2 positive values (2-D)"))),
        }
    }

    /// `x` (letters `from`) transposed to the letter order `to` (a permutation of `from`).
    pub(crate) fn permute_to(
        &mut self,
        c: &Ctx,
        x: (String, Val),
        from: &str,
        to: &str,
        what: &str,
    ) -> Result<(String, Val)> {
        if from == to {
            return Ok(x);
        }
        let perm: Vec<usize> = to.chars().filter_map(|l| from.find(l)).collect();
        let v = self.emit_tmp(c, Op::Transpose { perm }, &[x], what)?;
        Ok((format!("{}:{what}", c.r.node), v))
    }

    /// Adds one IR node whose output is an intermediate value of this ONNX node.
    pub(crate) fn emit_tmp(
        &mut self,
        c: &Ctx,
        op: Op,
        ins: &[(String, Val)],
        what: &str,
    ) -> Result<Val> {
        self.fresh += 1;
        let out = format!("{}:{what}{}", c.r.node, self.fresh);
        let mut v = self.emit(c, op, ins, vec![out])?;
        v.pop().ok_or_else(|| c.bad("internal: no output"))
    }
}

/// Integer values that must not depend on the batch.
pub(crate) fn syms_static(c: &Ctx, v: &Val, what: &str) -> Result<Vec<i64>> {
    match v {
        Val::I(a) => a
            .data
            .iter()
            .map(|s| {
                if s.is_const() {
                    Ok(s.c)
                } else {
                    Err(c.bad(format!(
                        "{what} {} depends on the batch size",
                        fmt_syms(&a.data)
                    )))
                }
            })
            .collect(),
        other => Err(c.bad(format!(
            "{what} is {}; expected integers known at import",
            other.kind()
        ))),
    }
}

pub(crate) fn fmt_syms(s: &[Sym]) -> String {
    format!(
        "[{}]",
        s.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Largest element count a runtime tensor may have (2^40): a shape beyond it comes from a
/// corrupt file, and is refused before any size arithmetic could overflow.
pub(crate) const MAX_ELEMS: u64 = 1 << 40;

/// A constant of ones of `shape`, no larger than folding allows (a corrupt shape must not
/// allocate without bound: the fuzzer found a GroupNorm over 2^34 elements).
pub(crate) fn ones(shape: &[usize]) -> Result<Val, String> {
    let n = fold::numel(shape)?;
    Ok(Val::F(Arr::new(shape.to_vec(), vec![1.0; n])))
}

/// Largest pad on one side of one axis. Real models pad by a few elements; a pad beyond this
/// comes from a corrupt file, and refusing it keeps edge/reflect index lists (one entry per padded
/// element) small.
pub(crate) const MAX_PAD: i64 = 1 << 20;

/// Checks Pad amounts before any index list or shape is built: each within ±[`MAX_PAD`], and the
/// padded shape under [`MAX_ELEMS`].
pub(crate) fn check_pads(shape: &[Sym], axes: &[usize], pads: &[i64]) -> Result<(), String> {
    if let Some(p) = pads.iter().find(|p| p.unsigned_abs() > MAX_PAD as u64) {
        return Err(format!(
            "pads {pads:?}: a pad of {p} is beyond the supported ±{MAX_PAD}"
        ));
    }
    let b = SAMPLES[1] as i64;
    let mut n: u64 = 1;
    for (ax, d) in shape.iter().enumerate() {
        let mut v = d.at(b);
        if let Some(k) = axes.iter().position(|&a| a == ax) {
            v = v
                .saturating_add(pads[k])
                .saturating_add(pads[k + axes.len()]);
        }
        n = n.saturating_mul(v.max(0) as u64);
    }
    if n > MAX_ELEMS {
        return Err(format!(
            "pads {pads:?} make a tensor far too large ({n} elements; at most {MAX_ELEMS})"
        ));
    }
    Ok(())
}

/// Checks that a shape with these dims (at the larger sample batch) stays under [`MAX_ELEMS`].
pub(crate) fn check_dims_size(dims: &[Dim]) -> Result<(), String> {
    let b = SAMPLES[1] as u64;
    let mut n: u64 = 1;
    for d in dims {
        let v = match *d {
            Dim::Fixed(v) => v as u64,
            Dim::Batch => b,
            Dim::BatchTimes(k) => (k as u64).saturating_mul(b),
            Dim::Copy | Dim::Infer => 1,
        };
        n = n.saturating_mul(v);
    }
    if n > MAX_ELEMS {
        return Err(format!(
            "{} is far too large ({n} elements; at most {MAX_ELEMS})",
            ir::dims_text(dims)
        ));
    }
    Ok(())
}

/// A declared input shape as the file states it: `1 × 3 × 224 × 224`, a named dimension by its
/// name (`batch × 3 × 224 × 224`).
pub(crate) fn in_dims_text(dims: &[InDim]) -> String {
    dims.iter()
        .map(|d| match d {
            InDim::Fixed(n) => n.to_string(),
            InDim::Dynamic(p) => p.clone(),
        })
        .collect::<Vec<_>>()
        .join(" × ")
}

/// An `a·B + c` shape entry as an IR dim. `reshape`: 0 means copy and -1 infer (ONNX Reshape).
pub(crate) fn sym_to_dim(s: Sym, reshape: bool) -> Result<Dim, String> {
    match (s.a, s.c) {
        (0, c) if c > 0 => Ok(Dim::Fixed(c as usize)),
        (0, 0) if reshape => Ok(Dim::Copy),
        (0, -1) if reshape => Ok(Dim::Infer),
        (1, 0) => Ok(Dim::Batch),
        (a, 0) if a > 1 => Ok(Dim::BatchTimes(a as usize)),
        _ => Err(format!("entry {s} is not supported")),
    }
}

/// The shape of a value known at import.
pub(crate) fn static_shape(v: &Val) -> Vec<usize> {
    match v {
        Val::Dyn(d) | Val::NanTest(d) => d.shapes[0].clone(),
        Val::Q(q) => q.x.shapes[0].clone(),
        Val::F(a) => a.shape.clone(),
        Val::I(a) => a.shape.clone(),
        Val::B(a) => a.shape.clone(),
    }
}

pub(crate) fn reshape_const(c: &Ctx, v: Val, shape: Vec<usize>) -> Result<Val> {
    map_arr(
        c,
        v,
        |a| a.reshape(shape.clone()),
        |a| a.reshape(shape.clone()),
        |a| a.reshape(shape.clone()),
    )
}

/// Applies a structural op to a value known at import, whatever its element type.
pub(crate) fn map_arr(
    c: &Ctx,
    v: Val,
    f: impl FnOnce(&Arr<f32>) -> Result<Arr<f32>, String>,
    i: impl FnOnce(&Arr<Sym>) -> Result<Arr<Sym>, String>,
    b: impl FnOnce(&Arr<bool>) -> Result<Arr<bool>, String>,
) -> Result<Val> {
    let r = match &v {
        Val::F(a) => f(a).map(Val::F),
        Val::I(a) => i(a).map(Val::I),
        Val::B(a) => b(a).map(Val::B),
        Val::Dyn(_) | Val::Q(_) | Val::NanTest(_) => {
            return Err(c.bad("internal: structural fold of a runtime tensor"))
        }
    };
    r.map_err(|e| c.bad(e))
}

/// The data of a `shape` input, which must be an integer constant.
pub(crate) fn known_shape(c: &Ctx, v: Val) -> Result<Vec<Sym>> {
    match v {
        Val::I(a) => Ok(a.data),
        v => Err(c.bad(format!(
            "the shape is {}; it must be known at import",
            v.kind()
        ))),
    }
}

/// The concatenation along `axis` of values known at import, each of the kind `pick` takes
/// out of a [`Val`] (a value of another kind is an error).
pub(crate) fn concat_known<T: Clone>(
    c: &Ctx,
    vals: &[(String, Val)],
    axis: usize,
    pick: fn(&Val) -> Option<&Arr<T>>,
) -> Result<Arr<T>> {
    let parts: Vec<&Arr<T>> = vals
        .iter()
        .map(|(_, v)| pick(v).ok_or_else(|| c.bad("inputs differ in type")))
        .collect::<Result<_>>()?;
    check_concat(c, parts.iter().map(|p| p.shape.as_slice()), axis)?;
    Arr::concat(&parts, axis).map_err(|e| c.bad(e))
}

pub(crate) fn check_concat<'a>(
    c: &Ctx,
    mut shapes: impl Iterator<Item = &'a [usize]>,
    axis: usize,
) -> Result<()> {
    let Some(first) = shapes.next() else {
        return Ok(());
    };
    for s in shapes {
        if s.len() != first.len()
            || s.iter()
                .zip(first)
                .enumerate()
                .any(|(i, (x, y))| i != axis && x != y)
        {
            return Err(c.bad(format!(
                "cannot concatenate {s:?} with {first:?} on axis {axis}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `optimum-cli export onnx` writes `pixel_values` as `[batch_size, num_channels, height,
    /// width]`: refused ("dimension 1 is dynamic") even when `isolane infer --input x.npy`
    /// gives every size, as onnxruntime takes them.
    #[test]
    fn dynamic_sizes_past_the_batch_are_taken_from_the_given_array() {
        use crate::onnx::proto::{
            tensor_proto::DataType, tensor_shape_proto, type_proto, GraphProto, ModelProto,
            NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
        };
        use prost::Message as _;
        let dim = |p: &str| tensor_shape_proto::Dimension {
            value: Some(tensor_shape_proto::dimension::Value::DimParam(p.into())),
            ..Default::default()
        };
        let x = ValueInfoProto {
            name: Some("x".into()),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(DataType::Float as i32),
                    shape: Some(TensorShapeProto {
                        dim: ["batch_size", "num_channels", "height", "width"]
                            .map(dim)
                            .to_vec(),
                    }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(GraphProto {
                name: Some("g".into()),
                node: vec![NodeProto {
                    op_type: Some("Relu".into()),
                    input: vec!["x".into()],
                    output: vec!["y".into()],
                    ..Default::default()
                }],
                input: vec![x],
                output: vec![ValueInfoProto {
                    name: Some("y".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.onnx");
        std::fs::write(&path, m.encode_to_vec()).unwrap();
        let e = import_file(&path).unwrap_err().to_string();
        assert!(
            e.contains("dimension 1 is dynamic") && e.contains("--input"),
            "{e}"
        );
        let fixed = |g: &Graph| {
            let id = g.inputs[0];
            match &g.values[id].kind {
                ir::ValueKind::Input(dims) => dims.clone(),
                other => panic!("{other:?}"),
            }
        };
        let f = Dim::Fixed;
        // One sample, or a batch: the batch stays the batch either way.
        for given in [&[3, 8, 6][..], &[2, 3, 8, 6][..]] {
            let g = import_file_sized(&path, Some(given)).unwrap();
            assert_eq!(fixed(&g), vec![Dim::Batch, f(3), f(8), f(6)], "{given:?}");
        }
        // An array of another rank sizes nothing: the file's refusal stands.
        let e = import_file_sized(&path, Some(&[8, 6]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("dimension 1 is dynamic"), "{e}");
    }

    #[test]
    fn pads_are_bounded_before_any_index_list_is_built() {
        let shape = [Sym::k(1), Sym::k(3), Sym::k(8), Sym::k(8)];
        assert!(check_pads(&shape, &[2, 3], &[1, 1, 1, 1]).is_ok());
        assert!(check_pads(&shape, &[2, 3], &[-2, 0, 0, -3]).is_ok());
        // An edge pad of 2^56 (what the fuzzer found) once allocated an index per element.
        let e = check_pads(&shape, &[2], &[1 << 56, 0]).unwrap_err();
        assert!(e.contains("beyond the supported"), "{e}");
        // Each pad within bounds, but the padded tensor far too large.
        let e = check_pads(&shape, &[0, 1, 2, 3], &[MAX_PAD; 8]).unwrap_err();
        assert!(e.contains("far too large"), "{e}");
    }

    /// Each folded constant within its bound, but many of them: their sum is bounded too, and
    /// the node that passes it is named.
    #[test]
    fn the_values_folded_at_import_are_bounded_in_all() {
        use super::super::proto::{
            tensor_proto::DataType, tensor_shape_proto, type_proto, GraphProto, ModelProto,
            OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
        };
        let dim = |d: i64| tensor_shape_proto::Dimension {
            value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
            ..Default::default()
        };
        let x = ValueInfoProto {
            name: Some("x".into()),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(DataType::Float as i32),
                    shape: Some(TensorShapeProto {
                        dim: vec![dim(1), dim(1024)],
                    }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        };
        // x + c0 + c1 + ...: each ci a ConstantOfShape([1024]) of zeros, 4 KiB.
        let mut node = Vec::new();
        let mut last = "x".to_string();
        for i in 0..8 {
            node.push(NodeProto {
                name: Some(format!("c{i}")),
                op_type: Some("ConstantOfShape".into()),
                input: vec!["shape".into()],
                output: vec![format!("c{i}")],
                ..Default::default()
            });
            node.push(NodeProto {
                name: Some(format!("add{i}")),
                op_type: Some("Add".into()),
                input: vec![last.clone(), format!("c{i}")],
                output: vec![format!("s{i}")],
                ..Default::default()
            });
            last = format!("s{i}");
        }
        let m = ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(GraphProto {
                name: Some("g".into()),
                node,
                initializer: vec![TensorProto {
                    name: Some("shape".into()),
                    dims: vec![1],
                    data_type: Some(DataType::Int64 as i32),
                    int64_data: vec![1024],
                    ..Default::default()
                }],
                input: vec![x],
                output: vec![ValueInfoProto {
                    name: Some(last),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = OnnxModel::from_proto(m, Path::new("many.onnx")).unwrap();
        // 8 × 4 KiB fit 40 KiB; the sixth passes 20 KiB (initializers are not counted).
        import_within(&m, m.initializers.clone(), 40 << 10, OnnxOps::standard()).unwrap();
        let e = import_within(&m, m.initializers.clone(), 20 << 10, OnnxOps::standard())
            .unwrap_err()
            .to_string();
        assert!(e.contains("many.onnx"), "{e}");
        assert!(e.contains("op ConstantOfShape (node \"c5\""), "{e}");
        assert!(
            e.contains("values computed at import reach 24576 bytes"),
            "{e}"
        );
        // The default budget leaves real models' shape subgraphs far below it.
        import(&m).unwrap();
    }
}
