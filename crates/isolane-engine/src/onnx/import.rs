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
use super::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto, TensorProto};
use super::tensor::{self, Data};
use crate::ir::{self, Binary, Dim, Graph, Op, ReduceKind, Unary, ValueId};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

mod extra;
mod older;
mod volume;

#[path = "quant.rs"]
mod quant;

/// Batch sizes at which runtime shapes are evaluated to tell batch-dependent dims apart.
const SAMPLES: [usize; 2] = [2, 3];

/// Reads `path` and imports it (see [`import`]). The weights move from the file's decoded form
/// into the graph, so a large model is not held twice more than needed.
pub fn import_file(path: impl AsRef<Path>) -> Result<Graph> {
    let mut model = OnnxModel::load(path)?;
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

fn import_with(model: &OnnxModel, initializers: HashMap<String, tensor::Tensor>) -> Result<Graph> {
    let weights: u128 = initializers.values().map(|t| val_bytes_of(&t.data)).sum();
    let budget = FOLD_BUDGET_BYTES.saturating_add(weights.saturating_mul(2));
    import_within(model, initializers, budget)
}

/// [`import_with`] with at most `fold_budget` bytes of values computed at import.
fn import_within(
    model: &OnnxModel,
    initializers: HashMap<String, tensor::Tensor>,
    fold_budget: u128,
) -> Result<Graph> {
    let mut im = Importer::new(model);
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
const FOLD_BUDGET_BYTES: u128 = 1 << 30;

/// The bytes an initializer takes once held as a [`Val`].
fn val_bytes_of(d: &Data) -> u128 {
    let (len, size) = match d {
        Data::F32(v) => (v.len(), std::mem::size_of::<f32>()),
        Data::I64(v) => (v.len(), std::mem::size_of::<Sym>()),
        Data::Bool(v) => (v.len(), std::mem::size_of::<bool>()),
    };
    (len as u128).saturating_mul(size as u128)
}

/// A value during import.
#[derive(Debug, Clone)]
enum Val {
    /// A runtime tensor in the IR, with its shapes at the [`SAMPLES`] batch sizes.
    Dyn(Dyn),
    F(Arr<f32>),
    I(Arr<Sym>),
    B(Arr<bool>),
    /// A QuantizeLinear of a runtime tensor, which only a DequantizeLinear may read.
    Q(Box<quant::Pending>),
}

#[derive(Debug, Clone)]
struct Dyn {
    id: ValueId,
    shapes: [Vec<usize>; 2],
}

impl Val {
    fn kind(&self) -> &'static str {
        match self {
            Val::Dyn(_) => "a runtime tensor",
            Val::F(_) => "a float constant",
            Val::I(_) => "an integer constant",
            Val::B(_) => "a bool constant",
            Val::Q(_) => "a quantized runtime tensor (a QuantizeLinear output)",
        }
    }

    fn is_dyn(&self) -> bool {
        matches!(self, Val::Dyn(_))
    }

    /// The bytes a value computed at import holds (a runtime tensor: none, it is a node).
    fn bytes(&self) -> u128 {
        let n = |len: usize, size: usize| (len as u128).saturating_mul(size as u128);
        match self {
            Val::Dyn(_) | Val::Q(_) => 0,
            Val::F(a) => n(a.data.len(), std::mem::size_of::<f32>()),
            Val::I(a) => n(a.data.len(), std::mem::size_of::<Sym>()),
            Val::B(a) => n(a.data.len(), std::mem::size_of::<bool>()),
        }
    }

    /// The rank (same at every batch size).
    fn rank(&self) -> usize {
        match self {
            Val::Dyn(d) => d.shapes[0].len(),
            Val::Q(q) => q.x.shapes[0].len(),
            Val::F(a) => a.shape.len(),
            Val::I(a) => a.shape.len(),
            Val::B(a) => a.shape.len(),
        }
    }

    /// The shape with batch-dependent dims as `a·B + c`.
    fn sym_shape(&self) -> Result<Vec<Sym>, String> {
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
        }
    }
}

/// One ONNX node being imported: its identity for messages and which attributes were read.
struct Ctx<'a> {
    n: &'a NodeProto,
    r: NodeRef,
    path: &'a Path,
    read: RefCell<Vec<bool>>,
}

impl<'a> Ctx<'a> {
    fn op(&self) -> &str {
        self.n.op_type()
    }

    fn bad(&self, what: impl Into<String>) -> OnnxError {
        OnnxError::BadNode {
            path: self.path.to_path_buf(),
            node: Box::new(self.r.clone()),
            what: what.into(),
        }
    }

    fn unsupported_attr(&self, attr: &str, why: impl Into<String>) -> OnnxError {
        OnnxError::UnsupportedAttribute {
            path: self.path.to_path_buf(),
            node: Box::new(self.r.clone()),
            attr: attr.to_string(),
            why: why.into(),
        }
    }

    fn unsupported_op(&self) -> OnnxError {
        OnnxError::UnsupportedOp {
            path: self.path.to_path_buf(),
            node: Box::new(self.r.clone()),
            domain: self.n.domain().to_string(),
        }
    }

    /// Finds an attribute and marks it as understood.
    fn attr(&self, name: &str) -> Option<&'a AttributeProto> {
        let i = self.n.attribute.iter().position(|a| a.name() == name)?;
        self.read.borrow_mut()[i] = true;
        Some(&self.n.attribute[i])
    }

    fn typed(&self, name: &str, want: AttributeType) -> Result<Option<&'a AttributeProto>> {
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

    fn int(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self
            .typed(name, AttributeType::Int)?
            .map_or(default, |a| a.i()))
    }

    fn float(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self
            .typed(name, AttributeType::Float)?
            .map_or(default, |a| a.f()))
    }

    fn ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        Ok(self
            .typed(name, AttributeType::Ints)?
            .map(|a| a.ints.clone()))
    }

    fn string(&self, name: &str, default: &str) -> Result<String> {
        match self.typed(name, AttributeType::String)? {
            None => Ok(default.to_string()),
            Some(a) => String::from_utf8(a.s().to_vec())
                .map_err(|_| self.bad(format!("attribute {name} is not UTF-8"))),
        }
    }

    /// An int attribute's value, without marking it read (a look before the op's own reading).
    fn peek_int(&self, name: &str) -> Option<i64> {
        self.n
            .attribute
            .iter()
            .find(|a| a.name() == name)
            .map(|a| a.i())
    }

    /// An ints attribute's value, without marking it read.
    fn peek_ints(&self, name: &str) -> Option<Vec<i64>> {
        self.n
            .attribute
            .iter()
            .find(|a| a.name() == name)
            .map(|a| a.ints.clone())
    }

    /// Accepts an attribute that has no effect on inference (e.g. BatchNorm's momentum).
    fn ignore(&self, name: &str) {
        let _ = self.attr(name);
    }

    /// Requires an attribute to be absent or equal to `default` (as an int).
    fn int_default_only(&self, name: &str, default: i64) -> Result<()> {
        let v = self.int(name, default)?;
        if v != default {
            return Err(
                self.unsupported_attr(name, format!("value {v} is not supported (only {default})"))
            );
        }
        Ok(())
    }

    /// Every attribute of the node must have been read.
    fn check_all_read(&self) -> Result<()> {
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

struct Importer<'m> {
    m: &'m OnnxModel,
    g: Graph,
    vals: HashMap<String, Val>,
    /// IR constants already created for ONNX values, so a weight used twice is stored once.
    ir_consts: HashMap<String, ValueId>,
    /// Every value name some node or the graph output reads.
    used: HashSet<&'m str>,
    /// The first node (index) that writes each value name: to say why a node's input is
    /// missing when it is written later (nodes out of order, or a cycle).
    writers: HashMap<&'m str, usize>,
    /// Bytes of the values computed at import so far, and the most they may reach: each
    /// folded constant is bounded ([`fold::MAX_FOLD_BYTES`]), and so is their sum.
    folded: u128,
    fold_budget: u128,
    fresh: usize,
    /// Values the size of the batch whose rows are all equal (a ConstantOfShape([B, ...]) and
    /// what is computed from it row by row), held with one row: [`batch_uniform`] says how.
    uniform: HashSet<String>,
    /// Element types of quantized constants, and the FakeQuants made (`quant`).
    quant: quant::State,
}

/// How messages name node `index` of the file: its op, its name (`#index` when it has none) and
/// the opset.
fn node_ref(index: usize, n: &NodeProto, opset: i64) -> NodeRef {
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
fn norm_axis(c: &Ctx, axis: i64, rank: usize) -> Result<usize> {
    ir::norm_axis(axis, rank)
        .ok_or_else(|| c.bad(format!("axis {axis} is out of range for rank {rank}")))
}

impl<'m> Importer<'m> {
    fn new(m: &'m OnnxModel) -> Self {
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
            uniform: HashSet::new(),
            quant: quant::State::default(),
        }
    }

    fn invalid(&self, what: impl Into<String>) -> OnnxError {
        OnnxError::Invalid {
            path: self.m.path.clone(),
            what: what.into(),
        }
    }

    /// ONNX graphs are in single-assignment form: each tensor is written once, by a graph input,
    /// an initializer or one node. Importing a second write would silently replace the first
    /// (the nodes after it would read the later value), so it is refused, naming both writers.
    fn check_single_assignment(
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

    fn declare_inputs(&mut self, initializers: HashMap<String, tensor::Tensor>) -> Result<()> {
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
                            "graph input {:?}: dimension {i} is dynamic ({p:?}); isolane needs every dimension but the first (the batch) fixed — re-export with a fixed input size",
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

    fn finish(mut self) -> Result<Graph> {
        let outputs = self.m.outputs.clone();
        self.unshift_outputs(&outputs)?;
        for (k, name) in outputs.iter().enumerate() {
            let v =
                self.vals.get(name).cloned().ok_or_else(|| {
                    self.invalid(format!("graph output {name:?} is never computed"))
                })?;
            if self.uniform.contains(name) {
                return Err(self.invalid(format!(
                    "graph output {name:?} is built from a ConstantOfShape the size of the batch \
                     without meeting the input: isolane holds such values with one row"
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
    fn check_declared_output(&self, k: usize, v: &Val) -> Result<()> {
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

    fn get(&self, c: &Ctx, i: usize) -> Result<Option<Val>> {
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

    fn req(&self, c: &Ctx, i: usize) -> Result<Val> {
        self.get(c, i)?
            .ok_or_else(|| c.bad(format!("required input {i} is missing")))
    }

    /// An input that must be known at import as integers (shape, axes, indices...).
    fn ints_input(&self, c: &Ctx, i: usize, what: &str) -> Result<Option<Vec<i64>>> {
        match self.get(c, i)? {
            None => Ok(None),
            Some(v) => syms_static(c, &v, what).map(Some),
        }
    }

    /// The IR value for an input: runtime tensors as they are, float constants as IR constants
    /// (created once per ONNX name).
    fn ir_value(&mut self, c: &Ctx, name: &str, v: &Val) -> Result<ValueId> {
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
    fn emit(
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
    fn emit1(&mut self, c: &Ctx, op: Op, n_in: usize) -> Result<Vec<Val>> {
        let mut ins = Vec::new();
        for i in 0..n_in {
            if let Some(v) = self.get(c, i)? {
                ins.push((c.n.input[i].clone(), v));
            }
        }
        let out = self.out_name(c, 0);
        self.emit(c, op, &ins, vec![out])
    }

    fn out_name(&mut self, c: &Ctx, i: usize) -> String {
        match c.n.output.get(i).map(String::as_str) {
            Some(s) if !s.is_empty() => s.to_string(),
            _ => {
                self.fresh += 1;
                format!("{}:unnamed{}", c.r.node, self.fresh)
            }
        }
    }

    fn node(&mut self, index: usize, n: &NodeProto) -> Result<()> {
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
        let reads_uniform = n.input.iter().any(|i| self.uniform.contains(i));
        if reads_uniform {
            batch_uniform::check(self, &c)?;
        }
        let int_outputs = self.quantized_readers(&c)?;
        let outs = self.dispatch(&c)?;
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
        // (Shape's output is the shape, with the batch size in it: not a value the size of it.)
        let makes_uniform =
            (reads_uniform && c.op() != "Shape") || batch_uniform::made_by(self, &c);
        for (i, name) in n.output.iter().enumerate() {
            // A row-wise op of a uniform value stays uniform unless it met a batched tensor
            // (broadcast at run time: its result is the real batch).
            if makes_uniform && outs.get(i).is_some_and(|v| !batch_uniform::batched(v)) {
                self.uniform.insert(name.clone());
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

    fn dispatch(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let opset = self.m.opset;
        let op = c.op().to_string();
        match op.as_str() {
            "Identity" => Ok(vec![self.req(c, 0)?]),
            "Dropout" => {
                c.ignore("seed");
                // Before opset 12 the ratio is an attribute: it only matters in training.
                c.ignore("ratio");
                if c.int("is_test", 1)? == 0 {
                    return Err(c.unsupported_attr("is_test", "value 0 (training)"));
                }
                if let Some(t) = self.get(c, 2)? {
                    let on = match &t {
                        Val::B(a) => a.data.iter().any(|&b| b),
                        _ => true,
                    };
                    if on {
                        return Err(c.bad("training_mode must be a constant false for inference"));
                    }
                }
                Ok(vec![self.req(c, 0)?])
            }
            "Constant" => {
                let v = self.constant(c)?;
                self.note_constant_type(c);
                Ok(vec![v])
            }
            "QuantizeLinear" => self.quantize_linear(c),
            "QLinearConv"
            | "QLinearMatMul"
            | "ConvInteger"
            | "MatMulInteger"
            | "DynamicQuantizeLinear"
            | "QLinearAdd"
            | "QLinearMul"
            | "QLinearGlobalAveragePool"
            | "QLinearConcat"
            | "QLinearLeakyRelu"
            | "QLinearSigmoid"
            | "QLinearSoftmax"
            | "QGemm" => self.qoperator(c, &op),
            "DequantizeLinear" => self.dequantize_linear(c),
            "Shape" => self.shape_op(c),
            "Size" => {
                let x = self.req(c, 0)?;
                let s = x.sym_shape().map_err(|e| c.bad(e))?;
                let mut p = Sym::k(1);
                for d in s {
                    p = p.mul(d).map_err(|e| c.bad(e))?;
                }
                Ok(vec![Val::I(Arr::scalar(p))])
            }
            "Cast" => {
                let to = c.int("to", 0)?;
                c.ignore("saturate"); // only affects float8 targets, which are rejected below
                let x = self.req(c, 0)?;
                Ok(vec![cast(c, x, to)?])
            }
            "CastLike" => {
                c.ignore("saturate");
                let x = self.req(c, 0)?;
                let like = self.req(c, 1)?;
                let to = match like {
                    Val::I(_) => 7,
                    Val::B(_) => 9,
                    _ => 1,
                };
                Ok(vec![cast(c, x, to)?])
            }
            "ConstantOfShape" => {
                let shape = match batch_uniform::one_row_shape(self, c)? {
                    Some(one_row) => one_row,
                    None => self
                        .ints_input(c, 0, "shape")?
                        .ok_or_else(|| c.bad("missing shape input"))?,
                };
                let shape: Vec<usize> = shape
                    .iter()
                    .map(|&d| {
                        usize::try_from(d)
                            .map_err(|_| c.bad(format!("negative dimension in {shape:?}")))
                    })
                    .collect::<Result<_>>()?;
                let value = match c.typed("value", AttributeType::Tensor)? {
                    None => Val::F(Arr::scalar(0.0)),
                    Some(a) => self.tensor_attr(c, "value", a.t.as_ref())?,
                };
                let n = match value {
                    Val::I(_) => fold::numel_of::<Sym>(&shape),
                    Val::B(_) => fold::numel_of::<bool>(&shape),
                    _ => fold::numel(&shape),
                }
                .map_err(|e| c.bad(e))?;
                Ok(vec![match value {
                    Val::F(a) if a.data.len() == 1 => Val::F(Arr::new(shape, vec![a.data[0]; n])),
                    Val::I(a) if a.data.len() == 1 => Val::I(Arr::new(shape, vec![a.data[0]; n])),
                    Val::B(a) if a.data.len() == 1 => Val::B(Arr::new(shape, vec![a.data[0]; n])),
                    _ => return Err(c.bad("value must hold exactly one element")),
                }])
            }
            "Range" => self.range(c),
            "CumSum" => self.cumsum(c),
            "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => self.compare(c, &op),
            "Not" => match self.req(c, 0)? {
                Val::B(a) => Ok(vec![Val::B(a.map(|b| !b))]),
                v => Err(c.bad(format!("Not of {} is not supported", v.kind()))),
            },
            "And" | "Or" => {
                let (Val::B(a), Val::B(b)) = (self.req(c, 0)?, self.req(c, 1)?) else {
                    return Err(c.bad("only constant bool inputs are supported"));
                };
                let and = op == "And";
                Ok(vec![Val::B(
                    fold::zip(&a, &b, |x, y| Ok(if and { *x && *y } else { *x || *y }))
                        .map_err(|e| c.bad(e))?,
                )])
            }
            "Where" => self.where_op(c),
            "Add" | "Sub" | "Mul" | "Div" | "Pow" => {
                let b = match op.as_str() {
                    "Add" => Binary::Add,
                    "Sub" => Binary::Sub,
                    "Mul" => Binary::Mul,
                    "Div" => Binary::Div,
                    _ => Binary::Pow,
                };
                let (x, y) = (self.req(c, 0)?, self.req(c, 1)?);
                let (n0, n1) = (&c.n.input[0], &c.n.input[1]);
                let (x, y) = if b == Binary::Mul {
                    // A scaled-down integer accumulator's factor moves into the other operand.
                    (
                        self.shifted_operand(c, n0, x, n1)?,
                        self.shifted_operand(c, n1, y, n0)?,
                    )
                } else {
                    ((n0.clone(), x), (n1.clone(), y))
                };
                self.binary(c, b, x, y, 0)
            }
            "Max" | "Min" | "Sum" | "Mean" => self.variadic(c, &op),
            "Mod" => self.modulo(c),
            "Relu" | "Sigmoid" | "Tanh" | "Exp" | "Log" | "Sqrt" | "Erf" | "Neg" | "Abs"
            | "Reciprocal" | "HardSwish" | "Floor" | "Ceil" | "Sin" | "Cos" => self.unary(c, &op),
            "HardSigmoid" => {
                let alpha = c.float("alpha", 0.2)?;
                let beta = c.float("beta", 0.5)?;
                self.emit1(c, Op::Unary(Unary::HardSigmoid { alpha, beta }), 1)
            }
            "LeakyRelu" => {
                let alpha = c.float("alpha", 0.01)?;
                self.emit1(c, Op::Unary(Unary::LeakyRelu { alpha }), 1)
            }
            "Clip" if opset < 11 => self.clip_v6(c),
            "Clip" => self.clip(c),
            "Conv" if self.input_rank(c) == 5 => self.conv3d(c),
            "Conv" => self.conv(c),
            "BatchNormalization" => self.batch_norm(c),
            "MaxPool" | "AveragePool" if self.input_rank(c) == 5 => self.pool3d(c, op == "MaxPool"),
            "MaxPool" | "AveragePool" => self.pool(c, op == "MaxPool"),
            "GlobalAveragePool" if self.input_rank(c) != 4 => self.global_average_nd(c),
            "GlobalAveragePool" => {
                let x = self.req(c, 0)?;
                if x.rank() != 4 {
                    return Err(c.bad(format!("input must be 4-D NCHW, has rank {}", x.rank())));
                }
                self.emit1(c, Op::GlobalAveragePool, 1)
            }
            "GlobalMaxPool" => {
                let x = self.req(c, 0)?;
                let axes = (2..x.rank() as i64).collect();
                self.emit1(
                    c,
                    Op::Reduce {
                        kind: ReduceKind::Max,
                        axes,
                        keepdims: true,
                    },
                    1,
                )
            }
            "Gemm" => {
                let alpha = c.float("alpha", 1.0)?;
                let beta = c.float("beta", 1.0)?;
                let trans_a = c.int("transA", 0)? != 0;
                let trans_b = c.int("transB", 0)? != 0;
                self.emit1(
                    c,
                    Op::Gemm {
                        alpha,
                        beta,
                        trans_a,
                        trans_b,
                    },
                    3,
                )
            }
            "MatMul" => match (self.req(c, 0)?, self.req(c, 1)?) {
                // Small products of constants fold here so that what follows (GatherND of a
                // bias table) sees values; large ones are left to the compile-time folding.
                (Val::F(a), Val::F(b))
                    if b.shape.len() == 2 && a.data.len().saturating_mul(b.shape[1]) <= 1 << 24 =>
                {
                    Ok(vec![Val::F(fold_matmul(c, &a, &b)?)])
                }
                _ => self.emit1(c, Op::MatMul, 2),
            },
            "GatherND" => self.gather_nd(c),
            "Flatten" => {
                let axis = c.int("axis", 1)?;
                let x = self.req(c, 0)?;
                let r = x.rank();
                // Flatten's axis may also equal the rank (everything in the first dim).
                let a = if axis == r as i64 {
                    r
                } else {
                    norm_axis(c, axis, r)?
                };
                match x {
                    Val::Dyn(_) => self.emit1(c, Op::Flatten { axis }, 1),
                    v => {
                        let s = static_shape(&v);
                        let shape = vec![s[..a].iter().product(), s[a..].iter().product()];
                        Ok(vec![reshape_const(c, v, shape)?])
                    }
                }
            }
            "Reshape" => self.reshape(c),
            "Transpose" => {
                let x = self.req(c, 0)?;
                let r = x.rank();
                let perm: Vec<usize> = match c.ints("perm")? {
                    None => (0..r).rev().collect(),
                    Some(p) => p
                        .iter()
                        .map(|&a| norm_axis(c, a, r))
                        .collect::<Result<_>>()?,
                };
                let mut seen = vec![false; r];
                if perm.len() != r || perm.iter().any(|&p| std::mem::replace(&mut seen[p], true)) {
                    return Err(c.bad(format!("perm {perm:?} is not a permutation of rank {r}")));
                }
                match x {
                    Val::Dyn(_) => self.emit1(c, Op::Transpose { perm }, 1),
                    v => Ok(vec![map_arr(
                        c,
                        v,
                        |a| a.transpose(&perm),
                        |a| a.transpose(&perm),
                        |a| a.transpose(&perm),
                    )?]),
                }
            }
            "Concat" => self.concat(c),
            "Split" if opset < 13 => self.split_v2(c),
            "Split" => self.split(c),
            "Slice" if opset < 10 => self.slice_v1(c),
            "Slice" => self.slice(c),
            "Gather" => self.gather(c),
            "Unsqueeze" | "Squeeze" if opset < 13 => self.squeeze_v1(c, op == "Unsqueeze"),
            "Unsqueeze" | "Squeeze" => self.squeeze(c, op == "Unsqueeze"),
            "Expand" => self.expand(c),
            "Softmax" if opset < 13 => self.softmax_v1(c),
            "Softmax" => {
                let axis = c.int("axis", -1)?;
                let x = self.req(c, 0)?;
                norm_axis(c, axis, x.rank())?;
                self.emit1(c, Op::Softmax { axis }, 1)
            }
            "LayerNormalization" => {
                let axis = c.int("axis", -1)?;
                let eps = c.float("epsilon", 1e-5)?;
                // stash_type selects the precision of the mean/variance; isolane computes them
                // in f32, which is what stash_type=1 (the default) asks for.
                c.ignore("stash_type");
                let x = self.req(c, 0)?;
                norm_axis(c, axis, x.rank())?;
                self.emit1(c, Op::LayerNorm { axis, eps }, 3)
            }
            "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceL2" | "ReduceL1"
            | "ReduceSumSquare" => self.reduce(c, &op),
            "Upsample" if opset < 10 => self.upsample(c),
            "Resize" if opset < 11 => self.upsample(c),
            "Resize" => self.resize(c),
            // Gelu entered the default domain at opset 20 (`approximate`: "none" or "tanh").
            "Gelu" if opset >= 20 => {
                let u = match c.string("approximate", "none")?.as_str() {
                    "none" => Unary::Gelu,
                    "tanh" => Unary::GeluTanh,
                    other => {
                        return Err(c.unsupported_attr(
                            "approximate",
                            format!("value {other:?} (none and tanh are supported)"),
                        ))
                    }
                };
                self.emit1(c, Op::Unary(u), 1)
            }
            "GroupNormalization" => self.group_norm(c),
            "Pad" if opset < 11 => self.pad_v2(c),
            "Pad" => self.pad(c),
            "Tile" => self.tile(c),
            "InstanceNormalization" => self.instance_norm(c),
            "Einsum" => self.einsum(c),
            "ScatterND" => self.scatter_nd(c),
            _ => Err(c.unsupported_op()),
        }
    }

    fn constant(&mut self, c: &Ctx) -> Result<Val> {
        let attrs: Vec<&str> = c.n.attribute.iter().map(|a| a.name()).collect();
        if attrs.len() != 1 {
            return Err(c.bad(format!(
                "expects exactly one value attribute, has {attrs:?}"
            )));
        }
        match attrs[0] {
            "value" => {
                let a = c.typed("value", AttributeType::Tensor)?;
                self.tensor_attr(c, "value", a.and_then(|a| a.t.as_ref()))
            }
            "value_float" => Ok(Val::F(Arr::scalar(c.float("value_float", 0.0)?))),
            "value_floats" => {
                let a = c.typed("value_floats", AttributeType::Floats)?;
                let v = a.map(|a| a.floats.clone()).unwrap_or_default();
                Ok(Val::F(Arr::new(vec![v.len()], v)))
            }
            "value_int" => Ok(Val::I(Arr::scalar(Sym::k(c.int("value_int", 0)?)))),
            "value_ints" => {
                let v = c.ints("value_ints")?.unwrap_or_default();
                Ok(Val::I(Arr::new(
                    vec![v.len()],
                    v.into_iter().map(Sym::k).collect(),
                )))
            }
            other => Err(c.unsupported_attr(
                other,
                "only tensor, float(s) and int(s) constants are supported",
            )),
        }
    }

    fn tensor_attr(&self, c: &Ctx, name: &str, t: Option<&TensorProto>) -> Result<Val> {
        let t = t.ok_or_else(|| c.bad(format!("attribute {name} holds no tensor")))?;
        let path = self.m.path.clone();
        let mut ext = |t: &TensorProto| tensor::read_external(&path, t);
        let t = tensor::from_proto(t, &mut ext).map_err(|e| {
            c.bad(format!(
                "attribute {name}: {}",
                OnnxError::from_tensor_error(&path, t.name(), e)
            ))
        })?;
        Ok(match t.data {
            Data::F32(v) => Val::F(Arr::new(t.shape, v)),
            Data::I64(v) => Val::I(Arr::new(t.shape, v.into_iter().map(Sym::k).collect())),
            Data::Bool(v) => Val::B(Arr::new(t.shape, v)),
        })
    }

    fn shape_op(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let x = self.req(c, 0)?;
        let mut s = x.sym_shape().map_err(|e| c.bad(e))?;
        if let (true, Some(d)) = (self.uniform.contains(&c.n.input[0]), s.first_mut()) {
            *d = batch_uniform::BATCH;
        }
        let r = s.len() as i64;
        let clampi = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) };
        let start = clampi(c.int("start", 0)?) as usize;
        let end = clampi(c.int("end", r)?) as usize;
        let part: Vec<Sym> = if start < end {
            s[start..end].to_vec()
        } else {
            vec![]
        };
        Ok(vec![Val::I(Arr::new(vec![part.len()], part))])
    }

    /// CumSum of a float constant (positional encodings are cumulated masks); a runtime
    /// tensor's is not supported.
    fn cumsum(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let exclusive = c.int("exclusive", 0)? != 0;
        let reverse = c.int("reverse", 0)? != 0;
        let x = self.req(c, 0)?;
        let axis = syms_static(c, &self.req(c, 1)?, "axis")?;
        let &[axis] = axis.as_slice() else {
            return Err(c.bad(format!("axis must hold one value, holds {}", axis.len())));
        };
        let a = norm_axis(c, axis, x.rank())?;
        match x {
            Val::F(arr) => Ok(vec![Val::F(arr.cumsum(a, exclusive, reverse))]),
            other => Err(c.bad(format!(
                "CumSum of {} is not supported (float constants only)",
                other.kind()
            ))),
        }
    }

    fn range(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let (s, l, d) = (self.req(c, 0)?, self.req(c, 1)?, self.req(c, 2)?);
        match (&s, &l, &d) {
            (Val::I(_), Val::I(_), Val::I(_)) => {
                let v = |x: &Val| {
                    syms_static(c, x, "Range bound").map(|v| v.first().copied().unwrap_or(0))
                };
                let (s, l, d) = (v(&s)?, v(&l)?, v(&d)?);
                if d == 0 {
                    return Err(c.bad("delta is 0"));
                }
                let n = ((l as f64 - s as f64) / d as f64).ceil().max(0.0) as usize;
                fold::numel_of::<Sym>(&[n]).map_err(|e| c.bad(e))?;
                let data = (0..n as i64)
                    .map(|i| i.checked_mul(d).and_then(|v| v.checked_add(s)).map(Sym::k))
                    .collect::<Option<_>>()
                    .ok_or_else(|| c.bad("Range overflows int64"))?;
                Ok(vec![Val::I(Arr::new(vec![n], data))])
            }
            (Val::F(a), Val::F(b), Val::F(e))
                if a.data.len() == 1 && b.data.len() == 1 && e.data.len() == 1 =>
            {
                let (s, l, d) = (a.data[0], b.data[0], e.data[0]);
                if d == 0.0 || !d.is_finite() {
                    return Err(c.bad("delta is 0"));
                }
                let n = ((l - s) / d).ceil().max(0.0) as usize;
                fold::numel(&[n]).map_err(|e| c.bad(e))?;
                let data = (0..n).map(|i| s + i as f32 * d).collect();
                Ok(vec![Val::F(Arr::new(vec![n], data))])
            }
            _ => Err(c.bad("Range needs scalar bounds known at import")),
        }
    }

    fn compare(&mut self, c: &Ctx, op: &str) -> Result<Vec<Val>> {
        let (x, y) = (self.req(c, 0)?, self.req(c, 1)?);
        let r = match (&x, &y) {
            (Val::I(a), Val::I(b)) => fold::zip(a, b, |p, q| {
                Ok(match op {
                    "Equal" => p.equal(*q)?,
                    "Less" => p.less(*q)?,
                    "Greater" => q.less(*p)?,
                    "LessOrEqual" => !q.less(*p)?,
                    _ => !p.less(*q)?,
                })
            }),
            (Val::F(a), Val::F(b)) => fold::zip(a, b, |p, q| {
                Ok(match op {
                    "Equal" => p == q,
                    "Less" => p < q,
                    "Greater" => p > q,
                    "LessOrEqual" => p <= q,
                    _ => p >= q,
                })
            }),
            (Val::B(a), Val::B(b)) if op == "Equal" => fold::zip(a, b, |p, q| Ok(p == q)),
            _ => {
                return Err(c.bad(format!(
                    "{op} of {} and {} is not supported (only on values known at import)",
                    x.kind(),
                    y.kind()
                )))
            }
        };
        Ok(vec![Val::B(r.map_err(|e| c.bad(e))?)])
    }

    fn where_op(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let (cond, x, y) = (self.req(c, 0)?, self.req(c, 1)?, self.req(c, 2)?);
        let Val::B(cond) = cond else {
            return Err(c.bad(format!(
                "the condition is {}; isolane folds Where only on values known at import",
                cond.kind()
            )));
        };
        let r = match (&x, &y) {
            (Val::I(a), Val::I(b)) => fold::select(&cond, a, b).map(Val::I),
            (Val::F(a), Val::F(b)) => fold::select(&cond, a, b).map(Val::F),
            (Val::B(a), Val::B(b)) => fold::select(&cond, a, b).map(Val::B),
            _ => {
                return Err(c.bad(format!(
                    "Where on {} and {} is not supported (only on values known at import)",
                    x.kind(),
                    y.kind()
                )))
            }
        };
        Ok(vec![r.map_err(|e| c.bad(e))?])
    }

    /// Elementwise binary op: folded when both sides are known, else an IR node.
    fn binary(
        &mut self,
        c: &Ctx,
        b: Binary,
        x: (String, Val),
        y: (String, Val),
        k: usize,
    ) -> Result<Vec<Val>> {
        let folded = match (&x.1, &y.1) {
            (Val::F(p), Val::F(q)) => Some(
                fold::zip(p, q, |u, v| {
                    Ok(match b {
                        Binary::Add => u + v,
                        Binary::Sub => u - v,
                        Binary::Mul => u * v,
                        Binary::Div => u / v,
                        Binary::Pow => u.powf(*v),
                        Binary::Max => u.max(*v),
                        Binary::Min => u.min(*v),
                    })
                })
                .map(Val::F),
            ),
            (Val::I(p), Val::I(q)) => Some(
                fold::zip(p, q, |u, v| match b {
                    Binary::Add => u.add(*v),
                    Binary::Sub => u.sub(*v),
                    Binary::Mul => u.mul(*v),
                    Binary::Div => u.div(*v),
                    Binary::Max => u.max(*v),
                    Binary::Min => u.min(*v),
                    Binary::Pow => Err("integer Pow is not supported".into()),
                })
                .map(Val::I),
            ),
            _ => None,
        };
        if let Some(r) = folded {
            return Ok(vec![r.map_err(|e| c.bad(e))?]);
        }
        let out = if k == 0 {
            self.out_name(c, 0)
        } else {
            self.fresh += 1;
            format!("{}:partial{}", c.r.node, self.fresh)
        };
        self.emit(c, Op::Binary(b), &[x, y], vec![out])
    }

    /// Mod, on values known at import (exporters use it for axis arithmetic such as
    /// `-1 % rank` in `unflatten`). `fmod=0`: the result takes the divisor's sign (Python);
    /// `fmod=1`: the dividend's (C `fmod`).
    fn modulo(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let fmod = c.int("fmod", 0)? != 0;
        let (x, y) = (self.req(c, 0)?, self.req(c, 1)?);
        let r = match (&x, &y) {
            (Val::I(a), Val::I(b)) => fold::zip(a, b, |p, q| {
                if !p.is_const() || !q.is_const() {
                    return Err("Mod of a batch-dependent value".into());
                }
                if q.c == 0 {
                    return Err("Mod by zero".into());
                }
                let r = p.c.checked_rem(q.c).ok_or("overflow")?;
                Ok(Sym::k(if !fmod && r != 0 && (r < 0) != (q.c < 0) { r + q.c } else { r }))
            })
            .map(Val::I),
            (Val::F(a), Val::F(b)) if fmod => fold::zip(a, b, |p, q| Ok(p % q)).map(Val::F),
            _ => {
                return Err(c.bad(format!(
                    "Mod of {} and {} is supported only on integers known at import (floats need fmod=1)",
                    x.kind(),
                    y.kind()
                )))
            }
        };
        Ok(vec![r.map_err(|e| c.bad(e))?])
    }

    /// Max, Min, Sum and Mean take any number of inputs: a chain of binary ops.
    fn variadic(&mut self, c: &Ctx, op: &str) -> Result<Vec<Val>> {
        let b = match op {
            "Max" => Binary::Max,
            "Min" => Binary::Min,
            _ => Binary::Add,
        };
        let n = c.n.input.len();
        let first = self.req(c, 0)?; // before indexing: a node with no inputs is an error
        let mut acc = (c.n.input[0].clone(), first);
        for i in 1..n {
            let y = (c.n.input[i].clone(), self.req(c, i)?);
            // The last op of the chain gets the node's output name (unless Mean scales after).
            let last = i == n - 1 && op != "Mean";
            let v = self.binary(c, b, acc, y, if last { 0 } else { i })?;
            self.fresh += 1;
            acc = (
                format!("{}:acc{}", c.r.node, self.fresh),
                v.into_iter().next().ok_or_else(|| c.bad("no output"))?,
            );
        }
        if op == "Mean" && n > 1 {
            let k = (
                format!("{}:1/n", c.r.node),
                Val::F(Arr::scalar(1.0 / n as f32)),
            );
            return self.binary(c, Binary::Mul, acc, k, 0);
        }
        Ok(vec![acc.1])
    }

    fn unary(&mut self, c: &Ctx, op: &str) -> Result<Vec<Val>> {
        let x = self.req(c, 0)?;
        // Fold on known floats: shape arithmetic (e.g. 1/sqrt(head_dim) in attention) needs the
        // value at import; on integers only the exact ops.
        let f: Option<fn(f32) -> f32> = match op {
            "Relu" => Some(|v| v.max(0.0)),
            "Neg" => Some(|v| -v),
            "Abs" => Some(f32::abs),
            "Sqrt" => Some(f32::sqrt),
            "Reciprocal" => Some(|v| 1.0 / v),
            "Exp" => Some(f32::exp),
            "Log" => Some(f32::ln),
            "Floor" => Some(f32::floor),
            "Ceil" => Some(f32::ceil),
            "Tanh" => Some(f32::tanh),
            "Sigmoid" => Some(|v| 1.0 / (1.0 + (-v).exp())),
            // Positional encodings computed from constants (edgenext's Fourier features).
            "Sin" => Some(f32::sin),
            "Cos" => Some(f32::cos),
            _ => None,
        };
        match (&x, f) {
            (Val::F(a), Some(f)) => return Ok(vec![Val::F(a.map(|&v| f(v)))]),
            (Val::I(a), _) if matches!(op, "Neg" | "Abs" | "Relu" | "Floor" | "Ceil") => {
                let r = a.try_map(|s| match op {
                    "Neg" => Sym::k(0).sub(*s),
                    "Floor" | "Ceil" => Ok(*s),
                    _ if !s.is_const() => Err("Abs/Relu of a batch-dependent value".into()),
                    "Abs" => {
                        s.c.checked_abs()
                            .map(Sym::k)
                            .ok_or_else(|| "overflow".into())
                    }
                    _ => Ok(Sym::k(s.c.max(0))),
                });
                return Ok(vec![Val::I(r.map_err(|e| c.bad(e))?)]);
            }
            _ => {}
        }
        let u = match op {
            "Relu" => Unary::Relu,
            "Sigmoid" => Unary::Sigmoid,
            "Tanh" => Unary::Tanh,
            "Exp" => Unary::Exp,
            "Log" => Unary::Log,
            "Sqrt" => Unary::Sqrt,
            "Erf" => Unary::Erf,
            "Neg" => Unary::Neg,
            "Abs" => Unary::Abs,
            "Reciprocal" => Unary::Reciprocal,
            "HardSwish" => Unary::HardSwish,
            _ => {
                return Err(c.bad(format!(
                    "{op} is supported only on values known at import, not on {}",
                    x.kind()
                )))
            }
        };
        self.emit1(c, Op::Unary(u), 1)
    }

    fn clip(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let bound = |v: Option<Val>, what: &str| -> Result<Option<f32>> {
            match v {
                None => Ok(None),
                Some(Val::F(a)) if a.data.len() == 1 => Ok(Some(a.data[0])),
                Some(v) => Err(c.bad(format!(
                    "{what} must be a float scalar known at import, is {}",
                    v.kind()
                ))),
            }
        };
        let min = bound(self.get(c, 1)?, "min")?.unwrap_or(f32::NEG_INFINITY);
        let max = bound(self.get(c, 2)?, "max")?.unwrap_or(f32::INFINITY);
        let x = self.req(c, 0)?;
        if let Val::F(a) = x {
            return Ok(vec![Val::F(a.map(|&v| v.max(min).min(max)))]);
        }
        // Exact special cases keep the backends' fused activations simple.
        let u = if min == 0.0 && max == 6.0 {
            Unary::Relu6
        } else if min == 0.0 && max == f32::INFINITY {
            Unary::Relu
        } else {
            Unary::Clip { min, max }
        };
        let out = self.out_name(c, 0);
        self.emit(c, Op::Unary(u), &[(c.n.input[0].clone(), x)], vec![out])
    }

    /// Explicit pads `[top, left, bottom, right]` from ONNX `pads`/`auto_pad` for 2-D windows.
    #[allow(clippy::too_many_arguments)]
    fn window_pads(
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

    fn two(c: &Ctx, name: &str, v: Option<Vec<i64>>, default: usize) -> Result<[usize; 2]> {
        match v {
            None => Ok([default; 2]),
            Some(v) if v.len() == 2 && v.iter().all(|&x| x >= 1) => {
                Ok([v[0] as usize, v[1] as usize])
            }
            Some(v) => Err(c.bad(format!("{name} {v:?}: expected 2 positive values (2-D)"))),
        }
    }

    fn conv(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let x = self.req(c, 0)?;
        let w = self.req(c, 1)?;
        let op = self.conv_op(c, &x, &w)?;
        self.emit1(c, op, 3)
    }

    /// The IR Conv for a 2-D convolution of `x` by weights `w` with the node's attributes
    /// (Conv's, and QLinearConv's and ConvInteger's, which are the same).
    fn conv_op(&mut self, c: &Ctx, x: &Val, w: &Val) -> Result<Op> {
        let ws = w.sym_shape().map_err(|e| c.bad(e))?;
        // A float constant input (a positional encoding computed from constants, as edgenext's)
        // becomes an IR constant; the passes then fold the Conv at compile time.
        let xshape = match x {
            Val::Dyn(d) => d.shapes[0].clone(),
            Val::F(a) => a.shape.clone(),
            other => {
                return Err(c.bad(format!(
                    "the input is {}; expected a float tensor",
                    other.kind()
                )))
            }
        };
        if xshape.len() != 4 || ws.len() != 4 {
            return Err(c.bad(format!(
                "only 2-D convolution is supported (input rank {}, weight rank {})",
                xshape.len(),
                ws.len()
            )));
        }
        let kernel = [ws[2].c as usize, ws[3].c as usize];
        if kernel.contains(&0) || xshape[2] == 0 || xshape[3] == 0 {
            return Err(c.bad(format!("empty kernel {kernel:?} or input {xshape:?}")));
        }
        if let Some(k) = c.ints("kernel_shape")? {
            if k != [kernel[0] as i64, kernel[1] as i64] {
                return Err(c.bad(format!(
                    "kernel_shape {k:?} differs from the weight's {kernel:?}"
                )));
            }
        }
        let strides = Self::two(c, "strides", c.ints("strides")?, 1)?;
        let dilations = Self::two(c, "dilations", c.ints("dilations")?, 1)?;
        let groups = c.int("group", 1)?;
        if groups < 1 {
            return Err(c.bad(format!("group {groups}")));
        }
        let hw = [xshape[2], xshape[3]];
        let pads = self.window_pads(c, hw, kernel, strides, dilations)?;
        Ok(Op::Conv(ir::ConvAttrs {
            strides,
            pads,
            dilations,
            groups: groups as usize,
            activation: None,
            residual: false,
        }))
    }

    fn pool(&mut self, c: &Ctx, max: bool) -> Result<Vec<Val>> {
        let x = self.req(c, 0)?;
        let Val::Dyn(xd) = &x else {
            return Err(c.bad(format!(
                "the input is {}; expected a runtime tensor",
                x.kind()
            )));
        };
        if xd.shapes[0].len() != 4 {
            return Err(c.bad(format!(
                "only 2-D pooling is supported (input rank {})",
                xd.shapes[0].len()
            )));
        }
        let kernel = Self::two(c, "kernel_shape", c.ints("kernel_shape")?, 0)?;
        if kernel[0] == 0 {
            return Err(c.bad("kernel_shape is required"));
        }
        let strides = Self::two(c, "strides", c.ints("strides")?, 1)?;
        let dilations = if max {
            // storage_order only changes the (unsupported) indices output.
            c.ignore("storage_order");
            Self::two(c, "dilations", c.ints("dilations")?, 1)?
        } else {
            // AveragePool has `dilations` from opset 19; exporters write the default [1, 1].
            let d = Self::two(c, "dilations", c.ints("dilations")?, 1)?;
            if d != [1, 1] {
                return Err(c.unsupported_attr(
                    "dilations",
                    format!("value {d:?} (average pooling supports only [1, 1])"),
                ));
            }
            d
        };
        let ceil_mode = c.int("ceil_mode", 0)? != 0;
        let count_include_pad = if max {
            false
        } else {
            c.int("count_include_pad", 0)? != 0
        };
        let hw = [xd.shapes[0][2], xd.shapes[0][3]];
        if hw.contains(&0) {
            return Err(c.bad(format!("empty input {:?}", xd.shapes[0])));
        }
        let pads = self.window_pads(c, hw, kernel, strides, dilations)?;
        let attrs = ir::PoolAttrs {
            kernel,
            strides,
            pads,
            dilations,
            ceil_mode,
            count_include_pad,
        };
        self.emit1(
            c,
            if max {
                Op::MaxPool(attrs)
            } else {
                Op::AveragePool(attrs)
            },
            1,
        )
    }

    /// The Reduce ops (F.normalize writes ReduceL2); each is one `Op::Reduce` of its kind
    /// ([`ReduceKind`] says why L1/L2/SumSquare are not split into steps).
    fn reduce(&mut self, c: &Ctx, op: &str) -> Result<Vec<Val>> {
        // Axes moved from an attribute to an input: ReduceSum at opset 13, the others at 18.
        let axes_as_input = (op == "ReduceSum" && self.m.opset >= 13) || self.m.opset >= 18;
        let axes = if axes_as_input {
            self.ints_input(c, 1, "axes")?
        } else {
            c.ints("axes")?
        };
        let keepdims = c.int("keepdims", 1)? != 0;
        let noop = c.int("noop_with_empty_axes", 0)? != 0;
        let axes = axes.unwrap_or_default();
        if axes.is_empty() && noop {
            if !matches!(op, "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin") {
                return Err(c.unsupported_attr(
                    "noop_with_empty_axes",
                    format!("value 1 with no axes on {op}"),
                ));
            }
            return Ok(vec![self.req(c, 0)?]);
        }
        let x = self.req(c, 0)?;
        for &a in &axes {
            norm_axis(c, a, x.rank())?;
        }
        let axes = if axes.is_empty() {
            (0..x.rank() as i64).collect()
        } else {
            axes
        };
        let kind = match op {
            "ReduceMean" => ReduceKind::Mean,
            "ReduceMax" => ReduceKind::Max,
            "ReduceMin" => ReduceKind::Min,
            "ReduceL1" => ReduceKind::L1,
            "ReduceL2" => ReduceKind::L2,
            "ReduceSumSquare" => ReduceKind::SumSquare,
            _ => ReduceKind::Sum,
        };
        let reduce = Op::Reduce {
            kind,
            axes,
            keepdims,
        };
        self.emit1(c, reduce, 1)
    }

    /// GatherND on values known at import (`batch_dims` 0): swin v2's relative position bias
    /// table, computed from constants, indexed by a constant index.
    fn gather_nd(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        c.int_default_only("batch_dims", 0)?;
        let (data, indices) = (self.req(c, 0)?, self.req(c, 1)?);
        let Val::F(data) = &data else {
            return Err(c.bad(format!(
                "GatherND of {} is supported only on float values known at import",
                data.kind()
            )));
        };
        let dshape = &data.shape;
        let (idx, ishape, q) = nd_indices(c, &indices, dshape)?;
        let slice: usize = dshape[q..].iter().product();
        let mut shape = ishape[..ishape.len() - 1].to_vec();
        shape.extend_from_slice(&dshape[q..]);
        // Every index tuple copies a whole slice: a few indices into a large constant make an
        // output far larger than either, so its size is checked before it is allocated.
        let n = fold::numel(&shape).map_err(|e| c.bad(e))?;
        let mut out = Vec::with_capacity(n);
        for tuple in idx.chunks_exact(q) {
            let at = nd_offset(c, tuple, dshape)? * slice;
            out.extend_from_slice(&data.data[at..at + slice]);
        }
        Ok(vec![Val::F(Arr::new(shape, out))])
    }

    /// ScatterND on values known at import (`reduction` none): the masks and biases that
    /// exporters build from in-place slice assignments (swin v2's shifted-window mask).
    fn scatter_nd(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let reduction = c.string("reduction", "none")?;
        if reduction != "none" {
            return Err(c.unsupported_attr("reduction", format!("value {reduction:?}")));
        }
        let (data, indices, updates) = (self.req(c, 0)?, self.req(c, 1)?, self.req(c, 2)?);
        let (Val::F(data), Val::F(updates)) = (&data, &updates) else {
            return Err(c.bad(format!(
                "ScatterND of {} with updates {} is supported only on float values known at import",
                data.kind(),
                updates.kind()
            )));
        };
        let dshape = &data.shape;
        let (idx, ishape, q) = nd_indices(c, &indices, dshape)?;
        let slice: usize = dshape[q..].iter().product();
        let n = idx.len() / q;
        if updates.data.len() != n * slice {
            return Err(c.bad(format!(
                "updates {:?} do not fit indices {ishape:?} into data {dshape:?}",
                updates.shape
            )));
        }
        let mut out = data.data.clone();
        for (k, tuple) in idx.chunks_exact(q).enumerate() {
            let at = nd_offset(c, tuple, dshape)? * slice;
            out[at..at + slice].copy_from_slice(&updates.data[k * slice..(k + 1) * slice]);
        }
        Ok(vec![Val::F(Arr::new(dshape.clone(), out))])
    }

    /// Einsum of two operands that is a batched matrix product (attention's
    /// `bhid,bhjd->bhij` and `bhij,bhjd->bhid`, maxvit's 5-D forms): one summed letter, shared
    /// batch letters, one free letter per operand. Imported as Transpose → MatMul → Transpose;
    /// any other equation is refused naming it.
    fn einsum(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let eq: String = c
            .string("equation", "")?
            .chars()
            .filter(|ch| !ch.is_whitespace())
            .collect();
        let refuse = |why: &str| {
            c.unsupported_attr(
                "equation",
                format!("{eq:?}: {why} (isolane supports two-operand batched matrix products)"),
            )
        };
        let (lhs, out) = eq
            .split_once("->")
            .ok_or_else(|| refuse("no explicit output"))?;
        let ops: Vec<&str> = lhs.split(',').collect();
        if ops.len() != 2 || c.n.input.len() != 2 || eq.contains('.') {
            return Err(refuse("not two operands without ellipsis"));
        }
        let (a, b) = (ops[0], ops[1]);
        let distinct = |t: &str| t.chars().collect::<HashSet<_>>().len() == t.len();
        if !distinct(a) || !distinct(b) || !distinct(out) {
            return Err(refuse("a letter repeats within a term"));
        }
        let summed: Vec<char> = a
            .chars()
            .filter(|&l| b.contains(l) && !out.contains(l))
            .collect();
        let batch: Vec<char> = a
            .chars()
            .filter(|&l| b.contains(l) && out.contains(l))
            .collect();
        let free_a: Vec<char> = a.chars().filter(|&l| !b.contains(l)).collect();
        let free_b: Vec<char> = b.chars().filter(|&l| !a.contains(l)).collect();
        let all_out = out
            .chars()
            .all(|l| batch.contains(&l) || free_a.contains(&l) || free_b.contains(&l));
        if summed.len() != 1 || free_a.len() != 1 || free_b.len() != 1 || !all_out {
            return Err(refuse("not a batched matrix product"));
        }
        if out.len() != batch.len() + 2 {
            return Err(refuse("an operand's free letter is summed away"));
        }
        let (x, y) = (self.req(c, 0)?, self.req(c, 1)?);
        if x.rank() != a.len() || y.rank() != b.len() {
            return Err(c.bad(format!(
                "equation {eq:?} does not match operand ranks {} and {}",
                x.rank(),
                y.rank()
            )));
        }
        let k = summed[0];
        let order_a: String = batch.iter().chain([&free_a[0], &k]).collect();
        let order_b: String = batch.iter().chain([&k, &free_b[0]]).collect();
        let prod: String = batch.iter().chain([&free_a[0], &free_b[0]]).collect();
        let xa = self.permute_to(c, (c.n.input[0].clone(), x), a, &order_a, "lhs")?;
        let yb = self.permute_to(c, (c.n.input[1].clone(), y), b, &order_b, "rhs")?;
        if prod == out {
            let name = self.out_name(c, 0);
            return self.emit(c, Op::MatMul, &[xa, yb], vec![name]);
        }
        let m = self.emit_tmp(c, Op::MatMul, &[xa, yb], "product")?;
        let perm: Vec<usize> = out.chars().filter_map(|l| prod.find(l)).collect();
        let name = self.out_name(c, 0);
        self.emit(
            c,
            Op::Transpose { perm },
            &[(format!("{}:product", c.r.node), m)],
            vec![name],
        )
    }

    /// `x` (letters `from`) transposed to the letter order `to` (a permutation of `from`).
    fn permute_to(
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
    fn emit_tmp(&mut self, c: &Ctx, op: Op, ins: &[(String, Val)], what: &str) -> Result<Val> {
        self.fresh += 1;
        let out = format!("{}:{what}{}", c.r.node, self.fresh);
        let mut v = self.emit(c, op, ins, vec![out])?;
        v.pop().ok_or_else(|| c.bad("internal: no output"))
    }

    /// GroupNormalization (opset 18: `scale`/`bias` per group; opset 21: per channel) as IR ops:
    /// `[N, C, ...] → [N, G, rest]`, LayerNorm over `rest` with a unit scale, back to
    /// `[N, C, ...]`, then the per-channel affine `x·scale + bias` broadcast over `[C, 1, ...]`.
    fn group_norm(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let eps = c.float("epsilon", 1e-5)?;
        let groups = c.int("num_groups", 0)?;
        // stash_type (opset 21) selects the precision of mean/variance; isolane's are f32,
        // which is the default (stash_type = 1).
        c.ignore("stash_type");
        let x = self.req(c, 0)?;
        let xs = x.sym_shape().map_err(|e| c.bad(e))?;
        if !x.is_dyn() || xs.len() < 3 {
            return Err(c.bad(format!(
                "the input must be a runtime tensor [N, C, ...] of rank 3 or more, is {} of rank {}",
                x.kind(),
                xs.len()
            )));
        }
        let ch = xs[1];
        if !ch.is_const() || groups < 1 || ch.c % groups != 0 {
            return Err(c.bad(format!(
                "num_groups {groups} must be positive and divide the {} channels",
                ch
            )));
        }
        let (ch, groups) = (ch.c as usize, groups as usize);
        // The per-channel scale and bias are built at import: a channel count from a corrupt
        // file must be refused, not allocated.
        fold::numel(&[ch]).map_err(|e| c.bad(format!("the scale per channel: {e}")))?;
        let per_channel = |v: Val, what: &str| -> Result<Vec<f32>> {
            let Val::F(a) = v else {
                return Err(c.bad(format!("{what} must be a float tensor known at import")));
            };
            match a.data.len() {
                n if n == ch => Ok(a.data),
                // Opset 18's per-group form: each group's value for each of its channels.
                n if n == groups => Ok((0..ch).map(|i| a.data[i / (ch / groups)]).collect()),
                n => Err(c.bad(format!(
                    "{what} has {n} values; expected {ch} (channels) or {groups} (groups)"
                ))),
            }
        };
        let scale = per_channel(self.req(c, 1)?, "scale")?;
        let bias = per_channel(self.req(c, 2)?, "bias")?;
        let rest: usize = static_shape(&x)[2..].iter().product::<usize>() * (ch / groups);
        let grouped = self.emit_tmp(
            c,
            Op::Reshape {
                shape: vec![Dim::Copy, Dim::Fixed(groups), Dim::Fixed(rest)],
            },
            &[(c.n.input[0].clone(), x.clone())],
            "grouped",
        )?;
        let ones = (
            format!("{}:unit_scale", c.r.node),
            ones(&[rest]).map_err(|e| c.bad(e))?,
        );
        let normed = self.emit_tmp(
            c,
            Op::LayerNorm { axis: -1, eps },
            &[(format!("{}:grouped", c.r.node), grouped), ones],
            "normed",
        )?;
        let mut back = vec![Dim::Copy];
        back.extend(static_shape(&x)[1..].iter().map(|&d| Dim::Fixed(d)));
        let ungrouped = self.emit_tmp(
            c,
            Op::Reshape { shape: back },
            &[(format!("{}:normed", c.r.node), normed)],
            "ungrouped",
        )?;
        self.channel_affine(c, ungrouped, xs.len(), scale, bias)
    }

    /// `x·scale + bias` with per-channel (dim 1) `scale` and `bias`, the node's output.
    fn channel_affine(
        &mut self,
        c: &Ctx,
        x: Val,
        rank: usize,
        scale: Vec<f32>,
        bias: Vec<f32>,
    ) -> Result<Vec<Val>> {
        let mut shape = vec![scale.len()];
        shape.extend(std::iter::repeat_n(1, rank - 2));
        self.affine(c, (format!("{}:normed", c.r.node), x), &shape, scale, bias)
    }

    /// `x·scale + bias` with constant `scale` and `bias` of `shape` (broadcast against `x`),
    /// the node's output.
    pub(super) fn affine(
        &mut self,
        c: &Ctx,
        x: (String, Val),
        shape: &[usize],
        scale: Vec<f32>,
        bias: Vec<f32>,
    ) -> Result<Vec<Val>> {
        let scale = (
            format!("{}:scale", c.r.node),
            Val::F(Arr::new(shape.to_vec(), scale)),
        );
        let bias = (
            format!("{}:bias", c.r.node),
            Val::F(Arr::new(shape.to_vec(), bias)),
        );
        let scaled = self.binary(c, Binary::Mul, x, scale, 1)?;
        let scaled = scaled
            .into_iter()
            .next()
            .ok_or_else(|| c.bad("no output"))?;
        self.binary(
            c,
            Binary::Add,
            (format!("{}:scaled", c.r.node), scaled),
            bias,
            0,
        )
    }

    /// InstanceNormalization (`[N, C, ...]`, each (n, c) normalised over the spatial dims;
    /// the classic exporter writes GroupNorm as Reshape → InstanceNormalization → Reshape):
    /// LayerNorm over dims `2..` with a unit scale, then the per-channel affine.
    fn instance_norm(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let eps = c.float("epsilon", 1e-5)?;
        let x = self.req(c, 0)?;
        let rank = x.rank();
        if !x.is_dyn() || rank < 3 {
            return Err(c.bad(format!(
                "the input must be a runtime tensor [N, C, ...] of rank 3 or more, is {} of rank {rank}",
                x.kind()
            )));
        }
        let shape = static_shape(&x);
        let ch = shape[1];
        let vec_of = |v: Val, what: &str| -> Result<Vec<f32>> {
            match v {
                Val::F(a) if a.data.len() == ch => Ok(a.data),
                v => Err(c.bad(format!(
                    "{what} must be {ch} floats known at import, is {}",
                    v.kind()
                ))),
            }
        };
        let scale = vec_of(self.req(c, 1)?, "scale")?;
        let bias = vec_of(self.req(c, 2)?, "B")?;
        let spatial = shape[2..].to_vec();
        let ones = (
            format!("{}:unit_scale", c.r.node),
            ones(&spatial).map_err(|e| c.bad(e))?,
        );
        let normed = self.emit_tmp(
            c,
            Op::LayerNorm { axis: 2, eps },
            &[(c.n.input[0].clone(), x), ones],
            "normed",
        )?;
        self.channel_affine(c, normed, rank, scale, bias)
    }

    /// Pad (opsets 13–21: `pads`, `constant_value` and, from 18, `axes` as inputs; modes
    /// constant, reflect, edge and, from 19, wrap) as existing IR ops, one padded axis at a
    /// time: negative pads are a Slice; the new borders are a constant broadcast with Expand
    /// (constant) or rows of the input picked with Gather (reflect, edge, wrap), joined with
    /// Concat. All-zero pads (what exporters write for sizes that need none) vanish.
    fn pad(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let mode = c.string("mode", "constant")?;
        let known = matches!(mode.as_str(), "constant" | "reflect" | "edge")
            || (mode == "wrap" && self.m.opset >= 19);
        if !known {
            return Err(c.unsupported_attr("mode", format!("value {mode:?}")));
        }
        let x = self.req(c, 0)?;
        let pads = self
            .ints_input(c, 1, "pads")?
            .ok_or_else(|| c.bad("the pads input is required"))?;
        let value = match self.get(c, 2)? {
            None => 0.0,
            Some(Val::F(a)) if a.data.len() <= 1 => a.data.first().copied().unwrap_or(0.0),
            Some(v) => {
                return Err(c.bad(format!(
                    "constant_value must be a float scalar known at import, is {}",
                    v.kind()
                )))
            }
        };
        let r = x.rank();
        let axes: Vec<usize> = match self.ints_input(c, 3, "axes")? {
            None => (0..r).collect(),
            Some(a) => a
                .iter()
                .map(|&v| norm_axis(c, v, r))
                .collect::<Result<_>>()?,
        };
        if pads.len() != 2 * axes.len() {
            return Err(c.bad(format!(
                "pads {pads:?} needs 2 values per padded axis ({} axes)",
                axes.len()
            )));
        }
        if pads.iter().all(|&p| p == 0) {
            return Ok(vec![x]);
        }
        if !x.is_dyn() {
            return Err(c.bad(format!(
                "Pad of {} is not supported (only runtime tensors)",
                x.kind()
            )));
        }
        let xs = x.sym_shape().map_err(|e| c.bad(e))?;
        check_pads(&xs, &axes, &pads).map_err(|e| c.bad(e))?;
        let mut cur = (c.n.input[0].clone(), x);
        for (k, &ax) in axes.iter().enumerate() {
            let (before, after) = (pads[k], pads[k + axes.len()]);
            if before == 0 && after == 0 {
                continue;
            }
            if !xs[ax].is_const() {
                return Err(c.bad(format!(
                    "pads {pads:?} pad axis {ax}, whose size depends on the batch"
                )));
            }
            let v = self.pad_axis(c, cur, ax, [before, after], &mode, value)?;
            self.fresh += 1;
            cur = (format!("{}:padded{}", c.r.node, self.fresh), v);
        }
        Ok(vec![cur.1])
    }

    /// Pads one axis of `x` by `[before, after]` (negative: cropped) in `mode`.
    fn pad_axis(
        &mut self,
        c: &Ctx,
        x: (String, Val),
        ax: usize,
        [before, after]: [i64; 2],
        mode: &str,
        value: f32,
    ) -> Result<Val> {
        let mut x = x;
        let n = static_shape(&x.1)[ax] as i64;
        if before < 0 || after < 0 {
            let (start, end) = (before.min(0).abs(), n - after.min(0).abs());
            if start >= end {
                return Err(c.bad(format!("pads crop axis {ax} of size {n} to nothing")));
            }
            let op = Op::Slice {
                starts: vec![start],
                ends: vec![end],
                axes: vec![ax as i64],
                steps: vec![1],
            };
            let v = self.emit_tmp(c, op, &[x], "cropped")?;
            x = (format!("{}:cropped", c.r.node), v);
        }
        let n = static_shape(&x.1)[ax] as i64;
        let shape = x.1.sym_shape().map_err(|e| c.bad(e))?;
        let mut pieces = Vec::new();
        for (is_before, p) in [(true, before.max(0)), (false, after.max(0))] {
            if p == 0 {
                continue;
            }
            let indices: Vec<i64> = match mode {
                "constant" => vec![],
                "edge" => vec![if is_before { 0 } else { n - 1 }; p as usize],
                "reflect" if p < n => {
                    if is_before {
                        (1..=p).rev().collect()
                    } else {
                        (0..p).map(|i| n - 2 - i).collect()
                    }
                }
                "wrap" if p <= n => {
                    if is_before {
                        (n - p..n).collect()
                    } else {
                        (0..p).collect()
                    }
                }
                _ => {
                    return Err(c.bad(format!(
                        "{mode} padding of {p} on axis {ax} of size {n} (must be smaller than the axis)"
                    )))
                }
            };
            let piece = if mode == "constant" {
                let mut dims = Vec::with_capacity(shape.len());
                for (i, &d) in shape.iter().enumerate() {
                    let d = if i == ax { Sym::k(p) } else { d };
                    dims.push(sym_to_dim(d, false).map_err(|e| c.bad(format!("pad: {e}")))?);
                }
                self.fresh += 1;
                let fill = (
                    format!("{}:fill{}", c.r.node, self.fresh),
                    Val::F(Arr::new(vec![1; shape.len()], vec![value])),
                );
                self.emit_tmp(c, Op::Expand { shape: dims }, &[fill], "border")?
            } else {
                let op = Op::Gather {
                    axis: ax as i64,
                    indices_shape: vec![indices.len()],
                    indices,
                };
                self.emit_tmp(c, op, std::slice::from_ref(&x), "border")?
            };
            self.fresh += 1;
            pieces.push((
                is_before,
                (format!("{}:border{}", c.r.node, self.fresh), piece),
            ));
        }
        let mut ins: Vec<(String, Val)> = pieces
            .iter()
            .filter(|(b, _)| *b)
            .map(|(_, v)| v.clone())
            .collect();
        ins.push(x);
        ins.extend(pieces.into_iter().filter(|(b, _)| !*b).map(|(_, v)| v));
        self.emit_tmp(c, Op::Concat { axis: ax as i64 }, &ins, "joined")
    }

    fn reshape(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let allowzero = c.int("allowzero", 0)? != 0;
        let x = self.req(c, 0)?;
        let mut shape = known_shape(c, self.req(c, 1)?)?;
        if let (true, Some(d)) = (self.uniform.contains(&c.n.input[0]), shape.first_mut()) {
            *d = Sym::k(1);
        }
        if allowzero && shape.iter().any(|s| *s == Sym::k(0)) {
            return Err(c.unsupported_attr(
                "allowzero",
                "allowzero=1 with a 0 in the shape (an empty tensor)",
            ));
        }
        let dims: Vec<Dim> = shape
            .iter()
            .map(|&s| sym_to_dim(s, true))
            .collect::<Result<_, _>>()
            .map_err(|e| c.bad(format!("shape {}: {e}", fmt_syms(&shape))))?;
        check_dims_size(&dims).map_err(|e| c.bad(format!("shape {e}")))?;
        match x {
            Val::Dyn(_) => self.emit1(c, Op::Reshape { shape: dims }, 1),
            v => {
                let s = static_shape(&v);
                let out = ir::resolve_dims(&dims, Some(&s), 1).map_err(|e| c.bad(e))?;
                Ok(vec![reshape_const(c, v, out)?])
            }
        }
    }

    fn concat(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let axis = c.int("axis", i64::MIN)?;
        if axis == i64::MIN {
            return Err(c.bad("attribute axis is required"));
        }
        let mut vals = Vec::new();
        for i in 0..c.n.input.len() {
            if let Some(v) = self.get(c, i)? {
                vals.push((c.n.input[i].clone(), v));
            }
        }
        let first = vals.first().ok_or_else(|| c.bad("no inputs"))?.1.clone();
        let a = norm_axis(c, axis, first.rank())?;
        if vals.iter().any(|(_, v)| v.is_dyn()) {
            let out = self.out_name(c, 0);
            // Empty constant pieces (e.g. a torch shape list with nothing to add) drop out.
            vals.retain(|(_, v)| v.is_dyn() || !static_shape(v).contains(&0));
            return self.emit(c, Op::Concat { axis }, &vals, vec![out]);
        }
        let r = match &first {
            Val::I(_) => concat_known(c, &vals, a, |v| match v {
                Val::I(x) => Some(x),
                _ => None,
            })
            .map(Val::I),
            Val::F(_) => concat_known(c, &vals, a, |v| match v {
                Val::F(x) => Some(x),
                _ => None,
            })
            .map(Val::F),
            _ => concat_known(c, &vals, a, |v| match v {
                Val::B(x) => Some(x),
                _ => None,
            })
            .map(Val::B),
        };
        Ok(vec![r?])
    }

    fn split(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let axis = c.int("axis", 0)?;
        let num_outputs = if self.m.opset >= 18 {
            c.int("num_outputs", 0)?
        } else {
            0
        };
        let x = self.req(c, 0)?;
        let a = norm_axis(c, axis, x.rank())?;
        let d = x.sym_shape().map_err(|e| c.bad(e))?[a];
        if !d.is_const() {
            return Err(c.bad("splitting along the batch dimension is not supported"));
        }
        let d = d.c as usize;
        let n_out = c.n.output.len();
        let sizes: Vec<usize> = match self.ints_input(c, 1, "split")? {
            Some(s) => s
                .iter()
                .map(|&v| usize::try_from(v).map_err(|_| c.bad(format!("negative split {s:?}"))))
                .collect::<Result<_>>()?,
            None => {
                let n = if num_outputs > 0 {
                    num_outputs as usize
                } else {
                    n_out
                };
                if n == 0 {
                    return Err(c.bad("no outputs"));
                }
                // Checked before the parts are listed: a huge num_outputs must not allocate.
                if n != n_out {
                    return Err(c.bad(format!(
                        "num_outputs = {num_outputs}, but the node has {n_out} outputs"
                    )));
                }
                // ONNX: equal parts of ceil(d/n), the last one smaller if d is not divisible.
                let part = d.div_ceil(n);
                (0..n)
                    .map(|i| part.min(d.saturating_sub(i * part)))
                    .collect()
            }
        };
        if sizes.iter().sum::<usize>() != d || sizes.len() != n_out {
            return Err(c.bad(format!(
                "split sizes {sizes:?} do not cover dimension {a} of size {d} with {n_out} outputs"
            )));
        }
        if let Val::Dyn(_) = x {
            let outs = (0..n_out).map(|i| self.out_name(c, i)).collect();
            let ins = [(c.n.input[0].clone(), x)];
            return self.emit(c, Op::Split { axis, sizes }, &ins, outs);
        }
        let s = static_shape(&x);
        let mut outs = Vec::new();
        let mut start = 0i64;
        for &sz in &sizes {
            let mut p: Vec<(i64, i64, usize)> = s.iter().map(|&d| (0, 1, d)).collect();
            p[a] = (start, 1, sz);
            start += sz as i64;
            outs.push(map_arr(
                c,
                x.clone(),
                |t| t.slice(&p),
                |t| t.slice(&p),
                |t| t.slice(&p),
            )?);
        }
        Ok(outs)
    }

    fn slice(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let x = self.req(c, 0)?;
        let starts = self
            .ints_input(c, 1, "starts")?
            .ok_or_else(|| c.bad("missing starts"))?;
        let ends = self
            .ints_input(c, 2, "ends")?
            .ok_or_else(|| c.bad("missing ends"))?;
        let axes = self.ints_input(c, 3, "axes")?.unwrap_or_default();
        let steps = self.ints_input(c, 4, "steps")?.unwrap_or_default();
        if let Val::Dyn(d) = &x {
            // Bounds on the batch axis would have to be the same at every batch size.
            let r = d.shapes[0].len();
            let ax: Vec<i64> = if axes.is_empty() {
                (0..starts.len() as i64).collect()
            } else {
                axes.clone()
            };
            for k in 0..2 {
                ir::slice_params(&d.shapes[k], &starts, &ends, &ax, &steps)
                    .map_err(|e| c.bad(e))?;
            }
            let batch_dims: Vec<usize> = (0..r)
                .filter(|&i| d.shapes[0][i] != d.shapes[1][i])
                .collect();
            for (i, &a) in ax.iter().enumerate() {
                let a = norm_axis(c, a, r)?;
                let full = starts[i] == 0
                    && ends[i] >= i32::MAX as i64
                    && steps.get(i).is_none_or(|&s| s == 1);
                if batch_dims.contains(&a) && !full {
                    return Err(c.bad("slicing the batch dimension is not supported"));
                }
            }
            return self.emit1(
                c,
                Op::Slice {
                    starts,
                    ends,
                    axes: ax,
                    steps,
                },
                1,
            );
        }
        let s = static_shape(&x);
        let p = ir::slice_params(&s, &starts, &ends, &axes, &steps).map_err(|e| c.bad(e))?;
        Ok(vec![map_arr(
            c,
            x,
            |t| t.slice(&p),
            |t| t.slice(&p),
            |t| t.slice(&p),
        )?])
    }

    fn gather(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let axis = c.int("axis", 0)?;
        let x = self.req(c, 0)?;
        let idx = self.req(c, 1)?;
        let Val::I(ia) = &idx else {
            return Err(c.bad(format!(
                "the indices are {}; isolane supports Gather with indices known at import",
                idx.kind()
            )));
        };
        let indices: Vec<i64> = syms_static(c, &idx, "indices")?;
        let ishape = ia.shape.clone();
        let r = x.rank();
        let a = norm_axis(c, axis, r)?;
        let dim = x.sym_shape().map_err(|e| c.bad(e))?[a];
        if let Val::Dyn(_) = x {
            if !dim.is_const() && indices.iter().any(|&i| i < 0) {
                return Err(c.bad("negative indices along the batch dimension are not supported"));
            }
            return self.emit1(
                c,
                Op::Gather {
                    axis,
                    indices,
                    indices_shape: ishape,
                },
                1,
            );
        }
        let d = dim.c;
        let norm: Vec<usize> = indices
            .iter()
            .map(|&i| {
                let j = if i < 0 { i + d } else { i };
                if j < 0 || j >= d {
                    Err(c.bad(format!(
                        "index {i} is out of range for a dimension of size {d}"
                    )))
                } else {
                    Ok(j as usize)
                }
            })
            .collect::<Result<_>>()?;
        Ok(vec![map_arr(
            c,
            x,
            |t| t.gather(a, &norm, &ishape),
            |t| t.gather(a, &norm, &ishape),
            |t| t.gather(a, &norm, &ishape),
        )?])
    }

    fn squeeze(&mut self, c: &Ctx, unsqueeze: bool) -> Result<Vec<Val>> {
        let x = self.req(c, 0)?;
        let axes = self.ints_input(c, 1, "axes")?;
        if unsqueeze && axes.is_none() {
            return Err(c.bad("Unsqueeze needs axes"));
        }
        let axes = axes.unwrap_or_default();
        let op = if unsqueeze {
            Op::Unsqueeze { axes }
        } else {
            Op::Squeeze { axes }
        };
        if let Val::Dyn(_) = x {
            return self.emit1(c, op, 1);
        }
        let s = static_shape(&x);
        let node = ir::Node {
            name: c.r.node.clone(),
            op,
            inputs: vec![],
            outputs: vec![],
        };
        let out = ir::infer_node(&node, &[&s], 1)
            .map_err(|e| c.bad(e.to_string()))?
            .into_iter()
            .next()
            .unwrap_or_default();
        Ok(vec![reshape_const(c, x, out)?])
    }

    fn expand(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let x = self.req(c, 0)?;
        let shape = known_shape(c, self.req(c, 1)?)?;
        let all_static = shape.iter().all(|s| s.is_const());
        if !x.is_dyn() && all_static {
            let t: Vec<usize> = shape.iter().map(|s| s.c.max(0) as usize).collect();
            let xs = static_shape(&x);
            let out = ir::broadcast_shapes(&xs, &t)
                .ok_or_else(|| c.bad(format!("cannot expand {xs:?} to {t:?}")))?;
            match x {
                Val::I(_) => fold::numel_of::<Sym>(&out),
                Val::B(_) => fold::numel_of::<bool>(&out),
                _ => fold::numel(&out),
            }
            .map_err(|e| c.bad(e))?;
            return Ok(vec![map_arr(
                c,
                x,
                |a| a.broadcast_to(&out),
                |a| a.broadcast_to(&out),
                |a| a.broadcast_to(&out),
            )?]);
        }
        let dims: Vec<Dim> = shape
            .iter()
            .map(|&s| sym_to_dim(s, false))
            .collect::<Result<_, _>>()
            .map_err(|e| c.bad(format!("shape {}: {e}", fmt_syms(&shape))))?;
        check_dims_size(&dims).map_err(|e| c.bad(format!("shape {e}")))?;
        self.emit1(c, Op::Expand { shape: dims }, 1)
    }

    fn resize(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let mode = c.string("mode", "nearest")?;
        let coord = c.string("coordinate_transformation_mode", "half_pixel")?;
        let nearest = c.string("nearest_mode", "round_prefer_floor")?;
        c.ignore("cubic_coeff_a"); // only for mode=cubic, rejected below
        c.int_default_only("exclude_outside", 0)?;
        c.ignore("extrapolation_value"); // only for tf_crop_and_resize, rejected below
        let opset = self.m.opset;
        let axes = if opset >= 18 {
            c.int_default_only("antialias", 0)?;
            let p = c.string("keep_aspect_ratio_policy", "stretch")?;
            if p != "stretch" {
                return Err(c.unsupported_attr("keep_aspect_ratio_policy", format!("value {p:?}")));
            }
            c.ints("axes")?
        } else {
            None
        };
        let mode = match mode.as_str() {
            "nearest" => ir::ResizeMode::Nearest,
            "linear" => ir::ResizeMode::Linear,
            other => {
                return Err(c.unsupported_attr(
                    "mode",
                    format!("value {other:?} (nearest and linear are supported)"),
                ))
            }
        };
        let coord = match coord.as_str() {
            "half_pixel" => ir::CoordMode::HalfPixel,
            "pytorch_half_pixel" => ir::CoordMode::PytorchHalfPixel,
            "align_corners" => ir::CoordMode::AlignCorners,
            "asymmetric" => ir::CoordMode::Asymmetric,
            other => {
                return Err(c.unsupported_attr(
                    "coordinate_transformation_mode",
                    format!("value {other:?}"),
                ))
            }
        };
        let nearest = match nearest.as_str() {
            "round_prefer_floor" => ir::NearestMode::RoundPreferFloor,
            "round_prefer_ceil" => ir::NearestMode::RoundPreferCeil,
            "floor" => ir::NearestMode::Floor,
            "ceil" => ir::NearestMode::Ceil,
            other => return Err(c.unsupported_attr("nearest_mode", format!("value {other:?}"))),
        };
        let x = self.req(c, 0)?;
        let xs = x.sym_shape().map_err(|e| c.bad(e))?;
        if xs.len() != 4 {
            return Err(c.bad(format!(
                "only 4-D NCHW input is supported (rank {})",
                xs.len()
            )));
        }
        // The axes the scales/sizes inputs refer to.
        let axes: Vec<usize> = match axes {
            None => (0..4).collect(),
            Some(a) => a
                .iter()
                .map(|&v| norm_axis(c, v, 4))
                .collect::<Result<_>>()?,
        };
        let scales = match self.get(c, 2)? {
            None => None,
            Some(Val::F(a)) if a.data.is_empty() => None,
            Some(Val::F(a)) => Some(a.data),
            Some(v) => {
                return Err(c.bad(format!(
                    "scales is {}; it must be known at import",
                    v.kind()
                )))
            }
        };
        let sizes = match self.get(c, 3)? {
            None => None,
            Some(Val::I(a)) if a.data.is_empty() => None,
            Some(Val::I(a)) => Some(a.data),
            Some(v) => {
                return Err(c.bad(format!("sizes is {}; it must be known at import", v.kind())))
            }
        };
        let size = match (scales, sizes) {
            (Some(s), None) => {
                if s.len() != axes.len() {
                    return Err(c.bad(format!("{} scales for {} axes", s.len(), axes.len())));
                }
                let mut full = [1.0f32; 4];
                for (&a, &v) in axes.iter().zip(&s) {
                    full[a] = v;
                }
                if full[0] != 1.0 || full[1] != 1.0 {
                    return Err(c.bad(format!("scales {s:?}: only H and W may be resized")));
                }
                if !(full[2] > 0.0 && full[3] > 0.0 && full[2] < 1e4 && full[3] < 1e4) {
                    return Err(c.bad(format!("scales {s:?} out of range")));
                }
                ir::ResizeSize::Scales([full[2], full[3]])
            }
            (None, Some(s)) => {
                if s.len() != axes.len() {
                    return Err(c.bad(format!("{} sizes for {} axes", s.len(), axes.len())));
                }
                let mut full = xs.clone();
                for (&a, &v) in axes.iter().zip(&s) {
                    full[a] = v;
                }
                if full[0] != xs[0] || full[1] != xs[1] {
                    return Err(c.bad(format!(
                        "sizes {}: only H and W may be resized",
                        fmt_syms(&s)
                    )));
                }
                if !full[2].is_const() || !full[3].is_const() || full[2].c < 1 || full[3].c < 1 {
                    return Err(c.bad(format!(
                        "sizes {}: H and W must be positive and fixed",
                        fmt_syms(&s)
                    )));
                }
                let hw = [full[2].c as usize, full[3].c as usize];
                check_dims_size(&[Dim::Fixed(hw[0]), Dim::Fixed(hw[1])])
                    .map_err(|e| c.bad(format!("sizes {e}")))?;
                ir::ResizeSize::Size(hw)
            }
            _ => return Err(c.bad("exactly one of scales and sizes must be given")),
        };
        let out = self.out_name(c, 0);
        let ins = [(c.n.input[0].clone(), x)];
        self.emit(
            c,
            Op::Resize(ir::ResizeAttrs {
                mode,
                coord,
                nearest,
                size,
            }),
            &ins,
            vec![out],
        )
    }
}

/// The C-order offset (in units of the trailing slice) of an index tuple into the leading dims
/// of `shape` (negative indices count from the end), for GatherND and ScatterND.
/// GatherND's and ScatterND's `indices` (known at import) for data of shape `dshape`: their
/// values, their shape, and `q`, the length of the index tuples along their last axis
/// (1 to the rank of the data).
fn nd_indices(c: &Ctx, indices: &Val, dshape: &[usize]) -> Result<(Vec<i64>, Vec<usize>, usize)> {
    let idx = syms_static(c, indices, "indices")?;
    let ishape = static_shape(indices);
    let q = ishape.last().copied().unwrap_or(0);
    if q == 0 || q > dshape.len() {
        return Err(c.bad(format!("indices {ishape:?} do not index data {dshape:?}")));
    }
    Ok((idx, ishape, q))
}

fn nd_offset(c: &Ctx, tuple: &[i64], shape: &[usize]) -> Result<usize> {
    let mut offset = 0usize;
    for (d, &i) in tuple.iter().enumerate() {
        let size = shape[d] as i64;
        let j = if i < 0 { i + size } else { i };
        if !(0..size).contains(&j) {
            return Err(c.bad(format!(
                "index {i} is out of range for dimension {d} of size {size}"
            )));
        }
        offset = offset * shape[d] + j as usize;
    }
    Ok(offset)
}

/// `a @ b` for values known at import with a 2-D `b` (a positional-bias MLP on a constant
/// table), computed in f64 and rounded once.
fn fold_matmul(c: &Ctx, a: &Arr<f32>, b: &Arr<f32>) -> Result<Arr<f32>> {
    let (k, n) = (b.shape[0], b.shape[1]);
    let ka = a.shape.last().copied().unwrap_or(0);
    if a.shape.len() < 2 || ka != k {
        return Err(c.bad(format!(
            "MatMul of constants {:?} and {:?}: inner dimensions differ",
            a.shape, b.shape
        )));
    }
    let rows = a.data.len() / k.max(1);
    fold::numel(&[rows, n]).map_err(|e| c.bad(e))?;
    let mut out = vec![0f32; rows * n];
    for r in 0..rows {
        for j in 0..n {
            let acc: f64 = (0..k)
                .map(|i| a.data[r * k + i] as f64 * b.data[i * n + j] as f64)
                .sum();
            out[r * n + j] = acc as f32;
        }
    }
    let mut shape = a.shape.clone();
    if let Some(last) = shape.last_mut() {
        *last = n;
    }
    Ok(Arr::new(shape, out))
}

/// Integer values that must not depend on the batch.
fn syms_static(c: &Ctx, v: &Val, what: &str) -> Result<Vec<i64>> {
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

fn fmt_syms(s: &[Sym]) -> String {
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
const MAX_ELEMS: u64 = 1 << 40;

/// A constant of ones of `shape`, no larger than folding allows (a corrupt shape must not
/// allocate without bound: the fuzzer found a GroupNorm over 2^34 elements).
fn ones(shape: &[usize]) -> Result<Val, String> {
    let n = fold::numel(shape)?;
    Ok(Val::F(Arr::new(shape.to_vec(), vec![1.0; n])))
}

/// Largest pad on one side of one axis. Real models pad by a few elements; a pad beyond this
/// comes from a corrupt file, and refusing it keeps edge/reflect index lists (one entry per padded
/// element) small.
const MAX_PAD: i64 = 1 << 20;

/// Checks Pad amounts before any index list or shape is built: each within ±[`MAX_PAD`], and the
/// padded shape under [`MAX_ELEMS`].
fn check_pads(shape: &[Sym], axes: &[usize], pads: &[i64]) -> Result<(), String> {
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
fn check_dims_size(dims: &[Dim]) -> Result<(), String> {
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
fn in_dims_text(dims: &[InDim]) -> String {
    dims.iter()
        .map(|d| match d {
            InDim::Fixed(n) => n.to_string(),
            InDim::Dynamic(p) => p.clone(),
        })
        .collect::<Vec<_>>()
        .join(" × ")
}

/// An `a·B + c` shape entry as an IR dim. `reshape`: 0 means copy and -1 infer (ONNX Reshape).
fn sym_to_dim(s: Sym, reshape: bool) -> Result<Dim, String> {
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
fn static_shape(v: &Val) -> Vec<usize> {
    match v {
        Val::Dyn(d) => d.shapes[0].clone(),
        Val::Q(q) => q.x.shapes[0].clone(),
        Val::F(a) => a.shape.clone(),
        Val::I(a) => a.shape.clone(),
        Val::B(a) => a.shape.clone(),
    }
}

fn reshape_const(c: &Ctx, v: Val, shape: Vec<usize>) -> Result<Val> {
    map_arr(
        c,
        v,
        |a| a.reshape(shape.clone()),
        |a| a.reshape(shape.clone()),
        |a| a.reshape(shape.clone()),
    )
}

/// Applies a structural op to a value known at import, whatever its element type.
fn map_arr(
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
        Val::Dyn(_) | Val::Q(_) => {
            return Err(c.bad("internal: structural fold of a runtime tensor"))
        }
    };
    r.map_err(|e| c.bad(e))
}

/// The data of a `shape` input, which must be an integer constant.
fn known_shape(c: &Ctx, v: Val) -> Result<Vec<Sym>> {
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
fn concat_known<T: Clone>(
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

fn check_concat<'a>(
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

/// ONNX Cast to data type `to` (TensorProto.DataType numbers).
fn cast(c: &Ctx, x: Val, to: i64) -> Result<Val> {
    const FLOAT: i64 = 1;
    const DOUBLE: i64 = 11;
    const FLOAT16: i64 = 10;
    const BFLOAT16: i64 = 16;
    const BOOL: i64 = 9;
    const INTS: [i64; 8] = [2, 3, 4, 5, 6, 7, 12, 13];
    let float_target = matches!(to, FLOAT | DOUBLE | FLOAT16 | BFLOAT16);
    Ok(match x {
        // Runtime tensors are f32 in the IR and computed at the precision the model is compiled
        // for (`--precision`), so a cast between float types (the Cast to/from float16 that an
        // fp16-converted model has at its input and output) is a pass-through: it names a
        // storage type, and the backend's precision decides the rounding (docs/onnx.md).
        // A cast to an integer type would change values and is not supported.
        Val::Dyn(_) if float_target => x,
        Val::Dyn(_) => {
            return Err(c.bad(format!(
                "casting a runtime tensor to data type {to} is not supported"
            )))
        }
        // A value known at import is rounded exactly as the cast asks (e.g. a float16 constant).
        Val::F(a) if to == FLOAT16 => Val::F(a.map(|&v| half::f16::from_f32(v).to_f32())),
        Val::F(a) if to == BFLOAT16 => Val::F(a.map(|&v| half::bf16::from_f32(v).to_f32())),
        Val::F(a) if float_target => Val::F(a),
        Val::F(a) if to == BOOL => Val::B(a.map(|&v| v != 0.0)),
        // Float → integer truncates toward zero (C semantics, as onnxruntime).
        Val::F(a) if INTS.contains(&to) => Val::I(a.map(|&v| Sym::k(v.trunc() as i64))),
        Val::I(a) if float_target => {
            let v = a
                .try_map(|s| {
                    if s.is_const() {
                        Ok(s.c as f32)
                    } else {
                        Err("cast of a batch-dependent value to float".into())
                    }
                })
                .map_err(|e| c.bad(e))?;
            Val::F(v)
        }
        Val::I(a) if INTS.contains(&to) => Val::I(a),
        Val::I(a) if to == BOOL => Val::B(
            a.try_map(|s| s.equal(Sym::k(0)).map(|z| !z))
                .map_err(|e| c.bad(e))?,
        ),
        Val::B(a) if float_target => Val::F(a.map(|&b| b as i32 as f32)),
        Val::B(a) if INTS.contains(&to) => Val::I(a.map(|&b| Sym::k(b as i64))),
        Val::B(a) if to == BOOL => Val::B(a),
        _ => return Err(c.unsupported_attr("to", format!("data type {to}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
            OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
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
        import_within(&m, m.initializers.clone(), 40 << 10).unwrap();
        let e = import_within(&m, m.initializers.clone(), 20 << 10)
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

/// Values the size of the batch that do not depend on the input's rows.
///
/// PyTorch's classic exporter writes `torch.zeros(x.shape[0], h, w)` (edgenext's positional
/// encoding: a mask of zeros, cumulated, through sin/cos and a 1×1 convolution, then added to
/// the activations) as a ConstantOfShape whose shape holds the batch size, which import-time
/// folding cannot know. Every row of such a value is the same, so it is held with one row and
/// broadcast where it meets the batched activations, which gives each row what the model
/// computes. That holds only while every op treats rows alike: [`check`] admits the row-wise
/// ops whose dimension 0 stays the batch and refuses the rest by name.
mod batch_uniform {
    use super::*;

    /// The batch size as a symbolic integer (`1·B + 0`).
    pub(super) const BATCH: Sym = Sym { a: 1, c: 0 };

    /// Elementwise ops: a uniform value may be any of their inputs if the others broadcast
    /// along dimension 0 ([`broadcasts_by_row`]).
    const ELEMENTWISE: &[&str] = &[
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "And",
        "Or",
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "Where",
        "Max",
        "Min",
        "Mod",
    ];

    /// The shape of a ConstantOfShape whose shape input is `[B, fixed...]`, with one row.
    pub(super) fn one_row_shape(im: &Importer, c: &Ctx) -> Result<Option<Vec<i64>>> {
        let Some(Val::I(a)) = im.get(c, 0)? else {
            return Ok(None);
        };
        match a.data.split_first() {
            Some((&first, rest)) if first == BATCH && rest.iter().all(|s| s.is_const()) => Ok(
                Some(std::iter::once(1).chain(rest.iter().map(|s| s.c)).collect()),
            ),
            _ => Ok(None),
        }
    }

    /// Whether node `c` just created a uniform value (a ConstantOfShape of `[B, ...]`).
    pub(super) fn made_by(im: &Importer, c: &Ctx) -> bool {
        c.op() == "ConstantOfShape" && matches!(one_row_shape(im, c), Ok(Some(_)))
    }

    /// A value whose dimension 0 is the batch (a runtime tensor of the real batch).
    pub(super) fn batched(v: &Val) -> bool {
        v.sym_shape()
            .ok()
            .and_then(|s| s.first().copied())
            .is_some_and(|d| !d.is_const())
    }

    /// Refuses node `c`, which reads a uniform value, unless it treats rows alike and keeps
    /// dimension 0 the batch.
    pub(super) fn check(im: &Importer, c: &Ctx) -> Result<()> {
        let op = c.op();
        // Apart from elementwise ops and Concat, the rule is about the op's data input: a
        // uniform weight, shape, axes or bound means something else entirely (a weight's
        // dimension 0 is its output channels, not the batch).
        let elementwise = ELEMENTWISE.contains(&op);
        let only_data = c.n.input.iter().skip(1).all(|i| !im.uniform.contains(i));
        let keeps_rows = (elementwise || op == "Concat" || only_data)
            && match op {
                _ if elementwise => broadcasts_by_row(im, c)?,
                "Identity" | "Cast" | "CastLike" | "Not" | "Neg" | "Abs" | "Sin" | "Cos"
                | "Exp" | "Log" | "Sqrt" | "Relu" | "Sigmoid" | "Tanh" | "Erf" | "Reciprocal"
                | "Floor" | "Ceil" | "Clip" | "HardSwish" | "Shape" | "Conv"
                | "BatchNormalization" | "MaxPool" | "AveragePool" | "GlobalAveragePool" => true,
                "CumSum" => !axes_touch_rows(im, c, 1)?,
                "Slice" => !axes_touch_rows(im, c, 3)?,
                "Unsqueeze" | "Squeeze" => {
                    let axes = if im.m.opset >= 13 {
                        im.ints_input(c, 1, "axes")?
                    } else {
                        c.peek_ints("axes")
                    };
                    axes.is_some_and(|a| !a.contains(&0))
                }
                "Transpose" => c.peek_ints("perm").is_some_and(|p| p.first() == Some(&0)),
                "Concat" => {
                    c.peek_int("axis")
                        .is_some_and(|a| a != 0 && a != -rank_of(im, c))
                        && c.n
                            .input
                            .iter()
                            .all(|i| i.is_empty() || im.uniform.contains(i))
                }
                "Reshape" => {
                    let target = super::known_shape(c, im.req(c, 1)?).ok();
                    target.is_some_and(|t| t.first().is_some_and(|&d| d == BATCH || d == Sym::k(0)))
                }
                "Softmax" | "LayerNormalization" => c.peek_int("axis").unwrap_or(-1) != 0,
                _ => false,
            };
        if keeps_rows {
            return Ok(());
        }
        let name =
            c.n.input
                .iter()
                .find(|i| im.uniform.contains(*i))
                .cloned()
                .unwrap_or_default();
        Err(c.bad(format!(
            "{op} of {name:?}, a value the size of the batch built by a ConstantOfShape \
             (isolane holds it with one row, the rows being equal), in a way that does not \
             treat its rows alike or moves the batch from dimension 0: not supported"
        )))
    }

    fn rank_of(im: &Importer, c: &Ctx) -> i64 {
        c.n.input
            .iter()
            .find_map(|i| im.vals.get(i))
            .map_or(0, |v| v.rank() as i64)
    }

    /// An elementwise op of uniform values and others that broadcast along dimension 0: of
    /// lower rank, one row, uniform too, or batched at run time.
    fn broadcasts_by_row(im: &Importer, c: &Ctx) -> Result<bool> {
        let rank = rank_of(im, c) as usize;
        for (i, name) in c.n.input.iter().enumerate() {
            if name.is_empty() || im.uniform.contains(name) {
                continue;
            }
            let Some(v) = im.get(c, i)? else { continue };
            let s = v.sym_shape().map_err(|e| c.bad(e))?;
            let fine =
                s.len() < rank || s.first().is_some_and(|&d| d == Sym::k(1) || !d.is_const());
            if s.len() > rank || !fine {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether the axes of node `c` (its input `i`) include dimension 0. Absent axes do: a
    /// Slice without them starts at axis 0, and CumSum requires its axis.
    fn axes_touch_rows(im: &Importer, c: &Ctx, i: usize) -> Result<bool> {
        let rank = rank_of(im, c);
        Ok(match im.ints_input(c, i, "axes")? {
            Some(axes) => axes.iter().any(|&a| a == 0 || a == -rank),
            None => true,
        })
    }
}
