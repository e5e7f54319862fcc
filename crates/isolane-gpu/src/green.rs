//! Green contexts: disjoint groups of SMs of one GPU, one green context and one stream each.
//!
//! How the groups are made (CUDA driver API, "Green Contexts"):
//! 1. `cuDeviceGetDevResource(dev, SM)` gives the device's whole SM resource, with the driver's
//!    own granularity (`minSmPartitionSize`, `smCoscheduledAlignment`).
//! 2. One split of it with `cuDevSmResourceSplitByCount`. NVIDIA documents that one split yields
//!    *disjoint, symmetrical* groups, that split results cannot be split again without first
//!    making a green context of them, and that splitting the remainder again is discouraged.
//!    So: equal sizes → one split into `n` groups of `s` SMs. Different sizes → one split into
//!    units of `gcd(sizes)` SMs, and each group is the combination of consecutive units
//!    (`cuDevResourceGenerateDesc` accepts several results of the same split). Only when the gcd
//!    is below the driver's minimum (e.g. 4 + 6 SMs on Ampere) do we fall back to splitting the
//!    remainder again, group by group, and let the driver say whether it accepts that.
//! 3. Per group: `cuDevResourceGenerateDesc` → `cuGreenCtxCreate(.., CU_GREEN_CTX_DEFAULT_STREAM)`
//!    → `cuGreenCtxStreamCreate(.., CU_STREAM_NON_BLOCKING, 0)` (the flag is mandatory) →
//!    `cuGreenCtxGetDevResource(.., SM)` reads back the SMs actually granted; fewer than asked is
//!    an error, never silently accepted.
//!
//! Measured on the H100 (driver 580): green contexts of one process run concurrently and get
//! disjoint SM sets; separate processes only run concurrently under MPS. So a green partition is
//! used from threads of one process (`host = "thread"`).

use std::sync::Arc;

use isolane_core::device_model::green_unit;
use serde::Serialize;

use crate::driver::{self, check, sys, PrimaryContext};
use crate::error::{GpuError, Result};
use crate::loader;

/// Functions this module needs; absent on drivers before CUDA 12.4.
pub(crate) const GREEN_SYMBOLS: &[&str] = &[
    "cuDeviceGetDevResource",
    "cuDevSmResourceSplitByCount",
    "cuDevResourceGenerateDesc",
    "cuGreenCtxCreate",
    "cuGreenCtxDestroy",
    "cuGreenCtxStreamCreate",
    "cuGreenCtxGetDevResource",
    "cuCtxFromGreenCtx",
    "cuCtxGetStreamPriorityRange",
];

/// How one split of the device serves the requested group sizes (pure logic, tested on CPU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitPlan {
    /// Every group has `sms` SMs: one split into `groups` results, one per group.
    Equal { sms: u32, groups: u32 },
    /// One split into `units` results of `unit` SMs; each group combines consecutive units.
    Units { unit: u32, units: u32 },
    /// Split the group off the remainder, one group at a time (last resort, see module docs).
    Sequential,
}

/// The splits to try for `sizes` on a resource of `total` SMs whose driver-reported minimum
/// partition is `min` and co-scheduling alignment `align` (0 = none reported), best first.
///
/// Equal sizes: one group per result first. If the driver cannot make that many groups of
/// that size (NVIDIA: "may lead to fewer groups ... due to cluster requirements or alignment
/// and granularity requirements"), the finest units it allows are combined instead. Different
/// sizes: units of their gcd, then the finest units, then group by group.
pub fn plan_split(sizes: &[u32], total: u32, min: u32, align: u32) -> Result<Vec<SplitPlan>> {
    if sizes.is_empty() {
        return Err(GpuError::GreenRequest("no groups requested".into()));
    }
    if let Some(i) = sizes.iter().position(|&s| s == 0) {
        return Err(GpuError::GreenRequest(format!("group {i} asks for 0 SMs")));
    }
    let sum: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    if sum > u64::from(total) {
        return Err(GpuError::GreenRequest(format!(
            "the groups ask for {sum} SMs together; the device has {total}"
        )));
    }
    if let Some((i, s)) = sizes.iter().enumerate().find(|(_, &s)| s < min) {
        return Err(GpuError::GreenRequest(format!(
            "group {i} asks for {s} SMs; the driver's minimum green-context size is {min}"
        )));
    }
    let valid_unit = |u: u32| {
        u >= min.max(1)
            && (align <= 1 || u.is_multiple_of(align))
            && sizes.iter().all(|&s| s.is_multiple_of(u))
    };
    let units = |u: u32| SplitPlan::Units {
        unit: u,
        units: (sum / u64::from(u)) as u32,
    };
    // The finest unit the driver allows: the minimum, rounded up to the alignment.
    let finest = if align > 1 {
        min.max(1).div_ceil(align) * align
    } else {
        min.max(1)
    };
    let mut plans = Vec::new();
    let first = sizes[0];
    if sizes.iter().all(|&s| s == first) {
        plans.push(SplitPlan::Equal {
            sms: first,
            groups: sizes.len() as u32,
        });
    } else {
        let g = green_unit(sizes.iter().copied());
        if valid_unit(g) {
            plans.push(units(g));
        }
    }
    if valid_unit(finest) && !plans.contains(&units(finest)) && finest != first {
        plans.push(units(finest));
    }
    if sizes.len() > 1 || plans.is_empty() {
        plans.push(SplitPlan::Sequential);
    }
    Ok(plans)
}

/// Assigns consecutive split results (with SM counts `unit_sms`) to groups asking for
/// `requested` SMs each: a group takes units until it has at least what it asked for. Returns
/// each group's range of unit indices.
pub fn assign_units(unit_sms: &[u32], requested: &[u32]) -> Result<Vec<std::ops::Range<usize>>> {
    let mut out = Vec::with_capacity(requested.len());
    let mut next = 0usize;
    for (g, &want) in requested.iter().enumerate() {
        let start = next;
        let mut have = 0u32;
        while have < want {
            let Some(&u) = unit_sms.get(next) else {
                return Err(GpuError::GreenRequest(format!(
                    "the split ran out of SMs at group {g} ({have} of {want} SMs)"
                )));
            };
            have += u;
            next += 1;
        }
        out.push(start..next);
    }
    Ok(out)
}

pub(crate) fn zeroed_resource() -> sys::CUdevResource {
    // SAFETY: CUdevResource is a plain C struct (enum tag 0 = CU_DEV_RESOURCE_TYPE_INVALID,
    // byte arrays, a union of plain structs); all-zero is a valid value, and the driver expects
    // zero-initialised structs.
    unsafe { std::mem::zeroed() }
}

/// The SM part of a resource the driver filled in.
pub(crate) fn sm_part(r: &sys::CUdevResource) -> Result<sys::CUdevSmResource> {
    if r.type_ != sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM {
        return Err(GpuError::Other(format!(
            "expected an SM resource, the driver returned {:?}",
            r.type_
        )));
    }
    // SAFETY: the tag says the union holds `sm` (checked above).
    Ok(unsafe { r.__bindgen_anon_1.sm })
}

/// SM granularity of a device as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DriverSmInfo {
    pub sm_count: u32,
    pub min_partition_sms: u32,
    pub coscheduled_alignment: u32,
}

/// The device's whole SM resource (`cuDeviceGetDevResource`), with the driver's granularity.
pub fn device_sm_info(device_index: u32) -> Result<DriverSmInfo> {
    let dev = driver::device(device_index)?;
    loader::require_cuda_symbols(&["cuDeviceGetDevResource"], GREEN_HINT)?;
    let (_, sm) = device_sm_resource(dev)?;
    Ok(DriverSmInfo::of(&sm))
}

/// The device's whole SM resource as the driver fills it in, and its SM part.
fn device_sm_resource(dev: sys::CUdevice) -> Result<(sys::CUdevResource, sys::CUdevSmResource)> {
    let mut full = zeroed_resource();
    // SAFETY: valid out-pointer to a zeroed CUdevResource; dev from cuDeviceGet.
    check("cuDeviceGetDevResource", unsafe {
        sys::cuDeviceGetDevResource(
            dev,
            &mut full,
            sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
        )
    })?;
    let sm = sm_part(&full)?;
    Ok((full, sm))
}

impl DriverSmInfo {
    fn of(sm: &sys::CUdevSmResource) -> DriverSmInfo {
        DriverSmInfo {
            sm_count: sm.smCount,
            min_partition_sms: sm.minSmPartitionSize,
            coscheduled_alignment: sm.smCoscheduledAlignment,
        }
    }
}

pub(crate) const GREEN_HINT: &str =
    "green contexts need a CUDA 12.4 or later driver (CUDA 13.0 API used here)";

/// One group: its green context, the context handle to make current, and its stream.
///
/// Owns the green context and the stream and destroys them in `Drop` (stream first). `Send`
/// (hand it to the worker thread that runs the group's work) but not `Sync`: NVIDIA documents
/// that a green context can be current to only one thread at a time and that the driver does
/// not synchronise API calls on one green context made from several threads.
pub struct GreenGroup {
    index: usize,
    requested_sms: u32,
    granted_sms: u32,
    green: sys::CUgreenCtx,
    context: sys::CUcontext,
    stream: sys::CUstream,
    // Keeps the device's primary context retained while the group lives.
    _primary: Arc<PrimaryContext>,
    /// A resizable group's hold on its units of the pool's split (`green_pool`), given back
    /// after the context is destroyed (fields drop after `Drop::drop`).
    lease: Option<crate::green_pool::Lease>,
    _not_sync: std::marker::PhantomData<std::cell::Cell<()>>,
}

// SAFETY: the handles are driver objects usable from any thread; the group is used by one
// thread at a time (not Sync), and destroyed exactly once in Drop.
unsafe impl Send for GreenGroup {}

impl GreenGroup {
    pub fn index(&self) -> usize {
        self.index
    }
    pub fn requested_sms(&self) -> u32 {
        self.requested_sms
    }
    /// SMs the driver granted (read back with `cuGreenCtxGetDevResource`).
    pub fn granted_sms(&self) -> u32 {
        self.granted_sms
    }
    /// The group's stream (created with CU_STREAM_NON_BLOCKING): work launched on it runs on
    /// the group's SMs only.
    pub fn stream(&self) -> sys::CUstream {
        self.stream
    }
    /// The green context as a `CUcontext` (`cuCtxFromGreenCtx`), to make current on the thread
    /// that allocates memory and loads modules for this group.
    pub fn context(&self) -> sys::CUcontext {
        self.context
    }
    pub fn green_context(&self) -> sys::CUgreenCtx {
        self.green
    }
    /// `cuCtxSetCurrent(self.context())` on the calling thread.
    pub fn make_current(&self) -> Result<()> {
        driver::set_current(self.context)
    }
    /// `cuCtxSetCurrent(NULL)` on the calling thread: for threads that take turns in one group
    /// (under a lock), each leaving no context current when its turn ends, so that the green
    /// context is current to one thread at a time.
    pub fn release_current(&self) -> Result<()> {
        driver::set_current(std::ptr::null_mut())
    }
    pub(crate) fn set_lease(&mut self, lease: crate::green_pool::Lease) {
        self.lease = Some(lease);
    }
    pub fn info(&self) -> GroupInfo {
        GroupInfo {
            group: self.index,
            requested_sms: self.requested_sms,
            granted_sms: self.granted_sms,
        }
    }
}

impl Drop for GreenGroup {
    fn drop(&mut self) {
        // Both handles were created by us and are destroyed exactly once; the stream goes first
        // because it belongs to the green context. Errors cannot be reported from Drop (a
        // failed destroy at worst leaks until the process exits).
        if !self.stream.is_null() {
            // SAFETY: our stream, destroyed once, before its green context.
            let _ = unsafe { sys::cuStreamDestroy_v2(self.stream) };
        }
        if !self.green.is_null() {
            // SAFETY: our green context, destroyed once, after its stream.
            let _ = unsafe { sys::cuGreenCtxDestroy(self.green) };
        }
    }
}

/// What was asked and what was granted, per group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupInfo {
    pub group: usize,
    pub requested_sms: u32,
    pub granted_sms: u32,
}

/// Disjoint SM groups of one device, made from one split.
pub struct GreenPartitioning {
    device_index: u32,
    sm_info: DriverSmInfo,
    plan: SplitPlan,
    groups: Vec<GreenGroup>,
}

impl GreenPartitioning {
    /// Creates one green context and one stream per entry of `sms_per_group`, on disjoint SMs.
    /// Fails (destroying whatever was created) if the driver grants any group fewer SMs than
    /// asked.
    pub fn create(device_index: u32, sms_per_group: &[u32]) -> Result<Self> {
        Self::create_with_urgency(device_index, sms_per_group, &[])
    }

    /// As [`create`](Self::create), with the streams of the groups whose `urgent` entry is true
    /// at the device's greatest stream priority (the others, and any entry `urgent` lacks, at
    /// the default, which is the least): where the hardware arbitrates between the groups'
    /// pending work, urgent work goes first (docs/criticality.md).
    pub fn create_with_urgency(
        device_index: u32,
        sms_per_group: &[u32],
        urgent: &[bool],
    ) -> Result<Self> {
        let DeviceSms {
            dev,
            primary,
            full,
            sm,
            info: sm_info,
        } = DeviceSms::of(device_index)?;
        let plans = plan_split(
            sms_per_group,
            sm.smCount,
            sm.minSmPartitionSize,
            sm.smCoscheduledAlignment,
        )?;
        // Splitting only fills in plain structs (nothing to clean up), so a split the driver
        // refuses is simply followed by the next candidate.
        let mut chosen = None;
        let mut failures = Vec::new();
        for plan in plans {
            match split_for(&full, &plan, sms_per_group) {
                Ok(per_group) => {
                    chosen = Some((plan, per_group));
                    break;
                }
                Err(e) => failures.push(format!("{plan:?}: {e}")),
            }
        }
        let Some((plan, per_group)) = chosen else {
            // The request passed the checks above; the driver refusing it is a device failure.
            return Err(GpuError::Other(format!(
                "the driver could not split {} SMs into groups of {:?} SMs ({})",
                sm.smCount,
                sms_per_group,
                failures.join("; ")
            )));
        };

        let mut groups = Vec::with_capacity(per_group.len());
        for (i, mut resources) in per_group.into_iter().enumerate() {
            // If this fails, `groups` (and with it every context made so far) is dropped.
            let urgent = urgent.get(i).copied().unwrap_or(false);
            let g = make_group(dev, i, sms_per_group[i], urgent, &mut resources, &primary)?;
            groups.push(g);
        }
        Ok(GreenPartitioning {
            device_index,
            sm_info,
            plan,
            groups,
        })
    }

    pub fn device_index(&self) -> u32 {
        self.device_index
    }
    pub fn sm_info(&self) -> DriverSmInfo {
        self.sm_info
    }
    pub fn plan(&self) -> &SplitPlan {
        &self.plan
    }
    pub fn groups(&self) -> &[GreenGroup] {
        &self.groups
    }
    pub fn infos(&self) -> Vec<GroupInfo> {
        self.groups.iter().map(GreenGroup::info).collect()
    }
    /// The groups, to move each to its own worker thread. Each keeps the primary context
    /// retained until it is dropped.
    pub fn into_groups(self) -> Vec<GreenGroup> {
        self.groups
    }
}

/// A device's whole SM resource as its driver reports it, with the primary context retained:
/// what every split of it (`GreenPartitioning`, `GreenPool`) starts from.
pub(crate) struct DeviceSms {
    pub dev: sys::CUdevice,
    pub primary: Arc<PrimaryContext>,
    pub full: sys::CUdevResource,
    pub sm: sys::CUdevSmResource,
    pub info: DriverSmInfo,
}

impl DeviceSms {
    pub fn of(device_index: u32) -> Result<DeviceSms> {
        let dev = driver::device(device_index)?;
        loader::require_cuda_symbols(GREEN_SYMBOLS, GREEN_HINT)?;
        let primary = Arc::new(PrimaryContext::retain(dev)?);
        let (full, sm) = device_sm_resource(dev)?;
        let info = DriverSmInfo::of(&sm);
        Ok(DeviceSms {
            dev,
            primary,
            full,
            sm,
            info,
        })
    }
}

/// Each group's resources (one or several results of one split) under `plan`.
fn split_for(
    full: &sys::CUdevResource,
    plan: &SplitPlan,
    sms_per_group: &[u32],
) -> Result<Vec<Vec<sys::CUdevResource>>> {
    match *plan {
        SplitPlan::Equal { sms, groups } => {
            let results = split_by_count(full, groups, sms)?;
            Ok(results.into_iter().map(|r| vec![r]).collect())
        }
        SplitPlan::Units { unit, units } => {
            let results = split_by_count(full, units, unit)?;
            let counts: Vec<u32> = results
                .iter()
                .map(|r| sm_part(r).map(|s| s.smCount))
                .collect::<Result<_>>()?;
            Ok(assign_units(&counts, sms_per_group)?
                .into_iter()
                .map(|range| results[range].to_vec())
                .collect())
        }
        SplitPlan::Sequential => {
            let mut input = *full;
            let mut out = Vec::new();
            for &s in sms_per_group {
                let mut result = zeroed_resource();
                let mut remainder = zeroed_resource();
                let mut nb: std::ffi::c_uint = 1;
                // SAFETY: one-element result array with nb = 1; input and remainder are valid
                // SM resources / out-pointers.
                check("cuDevSmResourceSplitByCount", unsafe {
                    sys::cuDevSmResourceSplitByCount(
                        &mut result,
                        &mut nb,
                        &input,
                        &mut remainder,
                        0,
                        s,
                    )
                })?;
                if nb != 1 {
                    return Err(GpuError::GreenRequest(format!(
                        "the driver could not split off {s} more SMs"
                    )));
                }
                out.push(vec![result]);
                input = remainder;
            }
            Ok(out)
        }
    }
}

/// One `cuDevSmResourceSplitByCount` of `input` into exactly `n` results of at least
/// `min_count` SMs.
///
/// The split keeps each group within SMs that can be co-scheduled (one GPC), and the H100's
/// GPCs are uneven: 132 SMs give only 15 groups of 8 that way (measured). Splitting again with
/// `CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING` gives a 16th, but in it cuDNN's
/// runtime-compiled kernels die of a divide error (SIGFPE, measured with 112 + 8 + 8 SMs on
/// the H100, driver 580), so a layout that needs it is refused here, by name, before any model
/// is built; admission refuses it before that (`DeviceModel::green_split_limit`).
fn split_by_count(
    input: &sys::CUdevResource,
    n: u32,
    min_count: u32,
) -> Result<Vec<sys::CUdevResource>> {
    let mut results: Vec<sys::CUdevResource> = (0..n).map(|_| zeroed_resource()).collect();
    let mut remainder = zeroed_resource();
    let mut nb: std::ffi::c_uint = n;
    // SAFETY: `results` has room for `nb` resources (nbGroups is in/out: capacity in, count
    // out); input is the device's SM resource; remainder is a valid out-pointer.
    check("cuDevSmResourceSplitByCount", unsafe {
        sys::cuDevSmResourceSplitByCount(
            results.as_mut_ptr(),
            &mut nb,
            input,
            &mut remainder,
            0,
            min_count,
        )
    })?;
    if nb < n {
        return Err(GpuError::GreenRequest(format!(
            "the driver splits the device into only {nb} groups of at least {min_count} SMs that \
             keep SMs scheduled together ({n} needed for these partitions); SMs split off \
             beyond that crash cuDNN's kernels (docs/partitions.md): give the green contexts \
             at most {} SMs together",
            nb * min_count
        )));
    }
    results.truncate(nb as usize);
    Ok(results)
}

pub(crate) fn make_group(
    dev: sys::CUdevice,
    index: usize,
    requested: u32,
    urgent: bool,
    resources: &mut [sys::CUdevResource],
    primary: &Arc<PrimaryContext>,
) -> Result<GreenGroup> {
    let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
    // SAFETY: `resources` are results of one split (as cuDevResourceGenerateDesc requires) and
    // its length is passed; desc is a valid out-pointer. Descriptors live for the process.
    check("cuDevResourceGenerateDesc", unsafe {
        sys::cuDevResourceGenerateDesc(
            &mut desc,
            resources.as_mut_ptr(),
            resources.len() as std::ffi::c_uint,
        )
    })?;
    // The group is built field by field so that Drop cleans up whatever exists on error.
    let mut g = GreenGroup {
        index,
        requested_sms: requested,
        granted_sms: 0,
        green: std::ptr::null_mut(),
        context: std::ptr::null_mut(),
        stream: std::ptr::null_mut(),
        _primary: Arc::clone(primary),
        lease: None,
        _not_sync: std::marker::PhantomData,
    };
    // SAFETY: desc from cuDevResourceGenerateDesc; the default-stream flag is required by the
    // CUDA 12.4–13.0 API.
    check("cuGreenCtxCreate", unsafe {
        sys::cuGreenCtxCreate(
            &mut g.green,
            desc,
            dev,
            sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as std::ffi::c_uint,
        )
    })?;
    // SAFETY: g.green is a live green context; valid out-pointer.
    check("cuCtxFromGreenCtx", unsafe {
        sys::cuCtxFromGreenCtx(&mut g.context, g.green)
    })?;
    let priority = if urgent {
        greatest_stream_priority(g.context)?
    } else {
        0
    };
    // SAFETY: g.green is live; CU_STREAM_NON_BLOCKING is the mandatory flag; `priority` is 0
    // (the default) or the context's greatest, both in its range.
    check("cuGreenCtxStreamCreate", unsafe {
        sys::cuGreenCtxStreamCreate(
            &mut g.stream,
            g.green,
            sys::CUstream_flags::CU_STREAM_NON_BLOCKING as std::ffi::c_uint,
            priority,
        )
    })?;
    let mut granted = zeroed_resource();
    // SAFETY: g.green is live; valid out-pointer.
    check("cuGreenCtxGetDevResource", unsafe {
        sys::cuGreenCtxGetDevResource(
            g.green,
            &mut granted,
            sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
        )
    })?;
    g.granted_sms = sm_part(&granted)?.smCount;
    if g.granted_sms < requested {
        return Err(GpuError::GrantedFewer {
            group: index,
            requested,
            granted: g.granted_sms,
        });
    }
    Ok(g)
}

/// The greatest (most urgent, numerically lowest) stream priority of `ctx`, asked with `ctx`
/// pushed current for the call and popped again, so the caller's current context is unchanged.
pub(crate) fn greatest_stream_priority(ctx: sys::CUcontext) -> Result<i32> {
    // SAFETY: ctx is a live context of the caller's; it is popped again below on every path.
    check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(ctx) })?;
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: two valid out-pointers; a context is current (pushed above).
    let asked = check("cuCtxGetStreamPriorityRange", unsafe {
        sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest)
    });
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above; valid out-pointer.
    check("cuCtxPopCurrent", unsafe {
        sys::cuCtxPopCurrent_v2(&mut popped)
    })?;
    asked.map(|_| greatest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_sizes_are_one_split_into_n_groups_then_finest_units() {
        assert_eq!(
            plan_split(&[8; 16], 132, 8, 8).unwrap(),
            vec![
                SplitPlan::Equal { sms: 8, groups: 16 },
                SplitPlan::Sequential
            ]
        );
        assert_eq!(
            plan_split(&[32; 4], 132, 8, 8).unwrap(),
            vec![
                SplitPlan::Equal { sms: 32, groups: 4 },
                SplitPlan::Units { unit: 8, units: 16 },
                SplitPlan::Sequential
            ]
        );
        // One group: nothing to fall back to but the split itself.
        assert_eq!(
            plan_split(&[64], 132, 8, 8).unwrap(),
            vec![
                SplitPlan::Equal { sms: 64, groups: 1 },
                SplitPlan::Units { unit: 8, units: 8 }
            ]
        );
    }

    #[test]
    fn different_sizes_combine_units_of_the_gcd() {
        assert_eq!(
            plan_split(&[16, 8, 24], 132, 8, 8).unwrap(),
            vec![
                SplitPlan::Units { unit: 8, units: 6 },
                SplitPlan::Sequential
            ]
        );
        assert_eq!(
            plan_split(&[64, 32], 132, 8, 8).unwrap(),
            vec![
                SplitPlan::Units { unit: 32, units: 3 },
                SplitPlan::Units { unit: 8, units: 12 },
                SplitPlan::Sequential
            ]
        );
        // Ampere: 4 and 6 SMs have gcd 2, below the minimum of 4 → group by group.
        assert_eq!(
            plan_split(&[4, 6], 108, 4, 2).unwrap(),
            vec![SplitPlan::Sequential]
        );
        // No alignment reported: the minimum is the finest unit.
        assert_eq!(
            plan_split(&[16, 24], 132, 8, 0).unwrap()[..2],
            [
                SplitPlan::Units { unit: 8, units: 5 },
                SplitPlan::Sequential
            ]
        );
    }

    #[test]
    fn impossible_requests_are_refused_before_any_call() {
        assert!(plan_split(&[], 132, 8, 8).is_err());
        assert!(plan_split(&[0], 132, 8, 8).is_err());
        let e = plan_split(&[8; 17], 132, 8, 8).unwrap_err().to_string();
        assert!(e.contains("136") && e.contains("132"), "{e}");
        let e = plan_split(&[4], 132, 8, 8).unwrap_err().to_string();
        assert!(e.contains("minimum"), "{e}");
    }

    #[test]
    fn units_are_assigned_in_order_until_each_group_has_enough() {
        let r = assign_units(&[8; 6], &[16, 8, 24]).unwrap();
        assert_eq!(r, vec![0..2, 2..3, 3..6]);
        // A driver that rounds units up gives a group fewer units.
        let r = assign_units(&[16, 16, 16], &[32, 16]).unwrap();
        assert_eq!(r, vec![0..2, 2..3]);
        assert!(assign_units(&[8, 8], &[16, 8]).is_err());
    }
}
