//! L2 set aside for a critical model's weights (`[protection] l2_persist_mib`,
//! docs/criticality.md): CUDA's persisting-L2 limit for the context, and an access-policy
//! window over the model's weights on every kernel node of its graphs (a graph's kernel nodes
//! do not take the stream's window: each one needs the attribute of its own) and on its stream.
//! Accesses inside the window persist in the set-aside part of the L2, where a neighbour's
//! streaming accesses (normal or streaming property) do not evict them.

use cudarc::driver::sys as cu;
use isolane_engine::{EngineError, Result};

use crate::error::cu_check;

const MIB: usize = 1 << 20;

/// An access-policy window: `bytes` from `base`, of which `hit_ratio` is given the persisting
/// property (the rest the streaming one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub base: u64,
    pub bytes: usize,
    pub hit_ratio: f32,
}

/// The window over `weights_bytes` of weights at `base` with `persist_bytes` of L2 set aside,
/// on a device whose windows are at most `max_window_bytes`: the weights from their start up
/// to that size, and a hit ratio of what is set aside over the window (1 when all of it fits:
/// a ratio above what fits would make the window's lines evict each other). `None` when there
/// is nothing to cover.
pub fn window(
    base: u64,
    weights_bytes: usize,
    persist_bytes: usize,
    max_window_bytes: usize,
) -> Option<Window> {
    let bytes = weights_bytes.min(max_window_bytes);
    if bytes == 0 || persist_bytes == 0 {
        return None;
    }
    Some(Window {
        base,
        bytes,
        hit_ratio: (persist_bytes as f64 / bytes as f64).min(1.0) as f32,
    })
}

/// What the device allows: the most L2 that may persist, and the largest window (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_persisting_bytes: usize,
    pub max_window_bytes: usize,
}

/// The bytes `mib` asks for, or why the device cannot set them aside (never clamped).
pub fn persist_bytes(mib: u64, limits: &Limits) -> Result<usize> {
    let asked = usize::try_from(mib)
        .ok()
        .and_then(|m| m.checked_mul(MIB))
        .unwrap_or(usize::MAX);
    if limits.max_persisting_bytes == 0 {
        return Err(EngineError::Unsupported(
            "[protection] l2_persist_mib: this GPU cannot set L2 aside (its persisting-L2 \
             limit is 0; CUDA's persisting L2 needs compute capability 8.0 or later)"
                .into(),
        ));
    }
    if asked > limits.max_persisting_bytes {
        return Err(EngineError::Unsupported(format!(
            "[protection] l2_persist_mib = {mib}: this GPU sets at most {} MiB of its L2 aside \
             (CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE = {} bytes)",
            limits.max_persisting_bytes / MIB,
            limits.max_persisting_bytes
        )));
    }
    Ok(asked)
}

/// The L2 of the device of the current context (bytes): what a model's traffic is computed
/// against (`isolane_engine::traffic`), for a sharing guard's profile of it.
pub fn l2_bytes() -> Result<usize> {
    let mut dev: cu::CUdevice = 0;
    // SAFETY: valid out-pointer; a context is current.
    cu_check("cuCtxGetDevice", unsafe { cu::cuCtxGetDevice(&mut dev) })?;
    let mut v = 0;
    // SAFETY: valid out-pointer and device.
    cu_check("cuDeviceGetAttribute", unsafe {
        cu::cuDeviceGetAttribute(
            &mut v,
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
            dev,
        )
    })?;
    Ok(v.max(0) as usize)
}

/// The limits of the device of the current context.
pub fn limits() -> Result<Limits> {
    let mut dev: cu::CUdevice = 0;
    // SAFETY: valid out-pointer; a context is current (the caller's model's).
    cu_check("cuCtxGetDevice", unsafe { cu::cuCtxGetDevice(&mut dev) })?;
    let attr = |a: cu::CUdevice_attribute| -> Result<usize> {
        let mut v = 0;
        // SAFETY: valid out-pointer and device.
        cu_check("cuDeviceGetAttribute", unsafe {
            cu::cuDeviceGetAttribute(&mut v, a, dev)
        })?;
        Ok(v.max(0) as usize)
    };
    Ok(Limits {
        max_persisting_bytes: attr(
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE,
        )?,
        max_window_bytes: attr(
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE,
        )?,
    })
}

/// Sets the current context's persisting-L2 limit to `bytes`, unless it is already at least
/// that (several critical models of one context share the set-aside part).
pub fn set_aside(bytes: usize) -> Result<()> {
    let mut now = 0usize;
    // SAFETY: valid out-pointer; a context is current.
    cu_check("cuCtxGetLimit", unsafe {
        cu::cuCtxGetLimit(&mut now, cu::CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
    })?;
    if now >= bytes {
        return Ok(());
    }
    // SAFETY: a context is current; the size was checked against the device's maximum.
    cu_check("cuCtxSetLimit", unsafe {
        cu::cuCtxSetLimit(cu::CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE, bytes)
    })?;
    Ok(())
}

fn attr_value(w: &Window) -> cu::CUlaunchAttributeValue {
    // SAFETY: a plain C union of integers, floats and pointers: all zeros is a valid value.
    let mut v: cu::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    v.accessPolicyWindow = cu::CUaccessPolicyWindow {
        base_ptr: w.base as *mut std::ffi::c_void,
        num_bytes: w.bytes,
        hitRatio: w.hit_ratio,
        hitProp: cu::CUaccessProperty::CU_ACCESS_PROPERTY_PERSISTING,
        missProp: cu::CUaccessProperty::CU_ACCESS_PROPERTY_STREAMING,
    };
    v
}

/// The window on `stream`'s own launches (those not in a graph).
///
/// # Safety
/// `stream` must be a live stream of the current context.
pub unsafe fn on_stream(stream: cu::CUstream, w: &Window) -> Result<()> {
    let v = attr_value(w);
    // SAFETY: the caller's stream; `v` lives across the call.
    cu_check("cuStreamSetAttribute", unsafe {
        cu::cuStreamSetAttribute(
            stream,
            cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
            &v,
        )
    })?;
    Ok(())
}

/// The window on every kernel node of `graph` (before it is instantiated). Returns how many
/// kernel nodes took it (library nodes that are not kernels — copies, memsets — have none).
///
/// # Safety
/// `graph` must be a live graph of the current context, not instantiated since.
pub unsafe fn on_graph(graph: cu::CUgraph, w: &Window) -> Result<usize> {
    let mut n = 0usize;
    // SAFETY: a null node array asks for the count only.
    cu_check("cuGraphGetNodes", unsafe {
        cu::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n)
    })?;
    let mut nodes: Vec<cu::CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: room for `n` nodes; `n` is updated to the count written.
    cu_check("cuGraphGetNodes", unsafe {
        cu::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n)
    })?;
    nodes.truncate(n);
    let v = attr_value(w);
    let mut kernels = 0;
    for node in nodes {
        let mut t = cu::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: a node of the caller's graph; valid out-pointer.
        cu_check("cuGraphNodeGetType", unsafe {
            cu::cuGraphNodeGetType(node, &mut t)
        })?;
        if t != cu::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
            continue;
        }
        // SAFETY: a kernel node of the caller's graph; `v` lives across the call.
        cu_check("cuGraphKernelNodeSetAttribute", unsafe {
            cu::cuGraphKernelNodeSetAttribute(
                node,
                cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
                &v,
            )
        })?;
        kernels += 1;
    }
    Ok(kernels)
}

/// What setting L2 aside did for one model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Persisted {
    /// The L2 set aside (bytes) and the window over the weights.
    pub persist_bytes: usize,
    pub window: Window,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device that lets 45 MiB of its L2 persist, with windows of up to 128 MiB (the real
    /// figures are read from the device, [`limits`]).
    const H200: Limits = Limits {
        max_persisting_bytes: 45 * MIB,
        max_window_bytes: 128 * MIB,
    };

    #[test]
    fn the_window_covers_the_weights_and_its_hit_ratio_is_what_fits() {
        // resnet18 fp16: 23 MiB of weights, 24 MiB set aside: all of it persists.
        let w = window(0x1000, 23 * MIB, 24 * MIB, H200.max_window_bytes).unwrap();
        assert_eq!((w.base, w.bytes, w.hit_ratio), (0x1000, 23 * MIB, 1.0));
        // vit_b_16 fp16: 165 MiB of weights; the window stops at the device's 128 MiB and
        // 32 MiB of it persist: a quarter.
        let w = window(0, 165 * MIB, 32 * MIB, H200.max_window_bytes).unwrap();
        assert_eq!(w.bytes, 128 * MIB);
        assert_eq!(w.hit_ratio, 0.25);
        assert_eq!(window(0, 0, MIB, H200.max_window_bytes), None);
        assert_eq!(window(0, MIB, 0, H200.max_window_bytes), None);
    }

    #[test]
    fn more_than_the_device_sets_aside_is_refused_naming_the_key_and_the_limit() {
        assert_eq!(persist_bytes(24, &H200).unwrap(), 24 * MIB);
        assert_eq!(persist_bytes(45, &H200).unwrap(), 45 * MIB);
        let e = persist_bytes(46, &H200).unwrap_err().to_string();
        assert!(
            e.contains("l2_persist_mib = 46") && e.contains("at most 45 MiB"),
            "{e}"
        );
        let none = Limits {
            max_persisting_bytes: 0,
            ..H200
        };
        assert!(persist_bytes(1, &none)
            .unwrap_err()
            .to_string()
            .contains("cannot set L2 aside"));
        // Far beyond usize: refused, not wrapped.
        assert!(persist_bytes(u64::MAX, &H200).is_err());
    }
}
