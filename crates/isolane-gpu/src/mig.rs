//! MIG through NVML: list profiles and instances; create the planned GPU and compute instances
//! and destroy them afterwards — only when MIG mode is **already on** and the user allowed it.
//!
//! Nothing here can change MIG mode: [`MigBackend`] has no such call, and the NVML backend
//! never calls `nvmlDeviceSetMigMode`. MIG is off on our H100 test machine and must stay off,
//! so the logic is tested against `fake::FakeMig` (built for tests only: `cfg(test)` or the
//! `test-support` feature, which only dev-dependencies enable).

use serde::Serialize;

use isolane_core::admission::{Plan, ResolvedPartition};

use crate::error::{GpuError, Result};

/// MIG mode as NVML reports it (current, and pending after the next GPU reset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MigModeState {
    pub current: bool,
    pub pending: bool,
}

/// A GPU-instance profile the GPU offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GiProfile {
    /// NVML's profile id (what creation takes).
    pub id: u32,
    /// e.g. "1g.10gb" (NVML's "MIG 1g.10gb" without the prefix).
    pub name: String,
    pub compute_slices: u32,
    pub memory_slices: u32,
    pub sms: u32,
    pub memory_mib: u64,
    pub max_instances: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuInstance {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComputeInstance {
    pub gpu_instance: u32,
    pub id: u32,
}

/// The NVML calls MIG management needs. No call changes MIG mode.
pub trait MigBackend {
    fn mig_mode(&self, gpu: u32) -> Result<MigModeState>;
    fn profiles(&self, gpu: u32) -> Result<Vec<GiProfile>>;
    fn gpu_instances(&self, gpu: u32) -> Result<Vec<GpuInstance>>;
    fn compute_instances(&self, gpu: u32, gi: u32) -> Result<Vec<ComputeInstance>>;
    /// Creates a GPU instance of `profile_id` at memory slice `start` spanning `size` slices.
    fn create_gpu_instance(&self, gpu: u32, profile_id: u32, start: u32, size: u32) -> Result<u32>;
    /// Creates one compute instance spanning all `compute_slices` of GPU instance `gi`.
    fn create_compute_instance(&self, gpu: u32, gi: u32, compute_slices: u32) -> Result<u32>;
    fn destroy_compute_instance(&self, gpu: u32, gi: u32, ci: u32) -> Result<()>;
    fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<()>;
    /// `MIG-<uuid>` of the MIG device of (gi, ci), for CUDA_VISIBLE_DEVICES.
    fn mig_device_uuid(&self, gpu: u32, gi: u32, ci: u32) -> Result<String>;
}

/// One created instance, bound to one workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CreatedInstance {
    pub workload: String,
    pub profile: String,
    pub start: u32,
    pub gpu_instance: u32,
    pub compute_instance: u32,
    /// For the worker's `CUDA_VISIBLE_DEVICES`.
    pub uuid: String,
}

/// The instances created for a plan; destroyed (compute, then GPU instances, in reverse order)
/// by [`MigInstances::destroy`] or on drop.
pub struct MigInstances<'b> {
    backend: &'b dyn MigBackend,
    gpu: u32,
    created: Vec<CreatedInstance>,
    /// GPU instances whose compute instance was not made (cleanup after an error midway).
    bare_gis: Vec<u32>,
}

impl std::fmt::Debug for MigInstances<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigInstances")
            .field("gpu", &self.gpu)
            .field("created", &self.created)
            .finish()
    }
}

impl MigInstances<'_> {
    pub fn instances(&self) -> &[CreatedInstance] {
        &self.created
    }

    /// `CUDA_VISIBLE_DEVICES` value for `workload`.
    pub fn visible_devices(&self, workload: &str) -> Option<&str> {
        self.created
            .iter()
            .find(|c| c.workload == workload)
            .map(|c| c.uuid.as_str())
    }

    /// Destroys everything created; reports every failure (and keeps going).
    pub fn destroy(mut self) -> Result<()> {
        self.destroy_inner()
    }

    fn destroy_inner(&mut self) -> Result<()> {
        let mut errors = Vec::new();
        for c in std::mem::take(&mut self.created).iter().rev() {
            if let Err(e) =
                self.backend
                    .destroy_compute_instance(self.gpu, c.gpu_instance, c.compute_instance)
            {
                errors.push(e.to_string());
            }
            if let Err(e) = self.backend.destroy_gpu_instance(self.gpu, c.gpu_instance) {
                errors.push(e.to_string());
            }
        }
        for gi in std::mem::take(&mut self.bare_gis).into_iter().rev() {
            if let Err(e) = self.backend.destroy_gpu_instance(self.gpu, gi) {
                errors.push(e.to_string());
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(GpuError::Mig(format!(
                "destroying the instances: {}",
                errors.join("; ")
            )))
        }
    }
}

impl Drop for MigInstances<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.destroy_inner() {
            eprintln!("isolane: {e}");
        }
    }
}

/// Creates the GPU and compute instances of an admitted MIG `plan` on `gpu`.
///
/// Refuses unless MIG mode is already on (current and pending) and `allow_reconfigure` is true
/// (`--allow-mig-reconfigure`). If any step fails, whatever was created is destroyed before the
/// error is returned.
pub fn plan_and_create<'b>(
    backend: &'b dyn MigBackend,
    gpu: u32,
    plan: &Plan,
    allow_reconfigure: bool,
) -> Result<MigInstances<'b>> {
    let mode = backend.mig_mode(gpu)?;
    if !mode.current {
        return Err(GpuError::Mig(format!(
            "MIG mode is off on GPU {gpu}; isolane never changes it (an administrator enables it \
             with nvidia-smi -i {gpu} -mig 1 and a GPU reset)"
        )));
    }
    if !mode.pending {
        return Err(GpuError::Mig(format!(
            "MIG mode on GPU {gpu} is pending to be turned off; refusing to create instances"
        )));
    }
    if !allow_reconfigure {
        return Err(GpuError::Mig(
            "creating MIG instances changes the GPU's layout for every user; pass \
             --allow-mig-reconfigure to allow it"
                .into(),
        ));
    }
    let profiles = backend.profiles(gpu)?;
    let mut wanted = Vec::new();
    for w in &plan.workloads {
        if let ResolvedPartition::Mig { profile, start, .. } = &w.partition {
            let Some(p) = profiles.iter().find(|p| &p.name == profile) else {
                return Err(GpuError::Mig(format!(
                    "GPU {gpu} offers no MIG profile {profile} (it offers: {})",
                    profiles
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            };
            wanted.push((w.workload.clone(), p.clone(), *start));
        }
    }
    if wanted.is_empty() {
        return Err(GpuError::Mig("the plan has no MIG partitions".into()));
    }
    let mut out = MigInstances {
        backend,
        gpu,
        created: Vec::new(),
        bare_gis: Vec::new(),
    };
    for (workload, p, start) in wanted {
        // On error `out` is dropped, which destroys everything created so far.
        let gi = backend.create_gpu_instance(gpu, p.id, start, p.memory_slices)?;
        out.bare_gis.push(gi);
        let ci = backend.create_compute_instance(gpu, gi, p.compute_slices)?;
        out.bare_gis.pop();
        out.created.push(CreatedInstance {
            workload: workload.clone(),
            profile: p.name.clone(),
            start,
            gpu_instance: gi,
            compute_instance: ci,
            uuid: String::new(),
        });
        let uuid = backend.mig_device_uuid(gpu, gi, ci)?;
        if let Some(last) = out.created.last_mut() {
            last.uuid = uuid;
        }
    }
    Ok(out)
}

/// What `isolane devices` and the docs show about MIG on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigListing {
    pub mode: MigModeState,
    pub profiles: Vec<GiProfile>,
    pub gpu_instances: Vec<GpuInstance>,
    pub compute_instances: Vec<ComputeInstance>,
}

/// Lists profiles and instances (read-only). Profiles and instances are only listed when MIG
/// mode is on (NVML answers NOT_SUPPORTED otherwise).
pub fn list(backend: &dyn MigBackend, gpu: u32) -> Result<MigListing> {
    let mode = backend.mig_mode(gpu)?;
    let (profiles, gis, cis) = if mode.current {
        let gis = backend.gpu_instances(gpu)?;
        let mut cis = Vec::new();
        for g in &gis {
            cis.extend(backend.compute_instances(gpu, g.id)?);
        }
        (backend.profiles(gpu)?, gis, cis)
    } else {
        (Vec::new(), Vec::new(), Vec::new())
    };
    Ok(MigListing {
        mode,
        profiles,
        gpu_instances: gis,
        compute_instances: cis,
    })
}

pub mod nvml {
    //! The real backend: nvml-wrapper for what its safe layer has, its sys layer for GPU and
    //! compute instances.

    use std::ffi::{c_uint, CStr};

    use nvml_wrapper::Nvml;
    use nvml_wrapper_sys::bindings as nv;

    use super::*;

    /// Initialises NVML, finding libnvidia-ml first (see [`crate::loader`]).
    pub fn init_nvml() -> Result<Nvml> {
        let lib = crate::loader::ensure(crate::loader::NvLib::Nvml)?;
        Nvml::builder()
            .lib_path(lib.path.as_os_str())
            .init()
            .map_err(|e| GpuError::Nvml {
                call: "nvmlInit_v2",
                error: e.to_string(),
            })
    }

    pub struct NvmlMig {
        nvml: Nvml,
    }

    fn ck(nvml: &Nvml, call: &'static str, r: nv::nvmlReturn_t) -> Result<()> {
        if r == nv::nvmlReturn_enum_NVML_SUCCESS {
            return Ok(());
        }
        // SAFETY: nvmlErrorString takes any code and returns a pointer (or null).
        let p = unsafe { nvml.lib().nvmlErrorString(r) };
        let s = if p.is_null() {
            format!("NVML error {r}")
        } else {
            // SAFETY: a non-null result is a static NUL-terminated string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(GpuError::Nvml { call, error: s })
    }

    /// NVML's compute-instance profile index for a GPU instance of `slices` compute slices.
    fn ci_profile_for(slices: u32) -> Option<u32> {
        Some(match slices {
            1 => nv::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
            2 => nv::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
            3 => nv::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
            4 => nv::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
            6 => nv::NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
            7 => nv::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
            8 => nv::NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
            _ => return None,
        })
    }

    impl NvmlMig {
        pub fn new() -> Result<Self> {
            Ok(NvmlMig { nvml: init_nvml()? })
        }

        pub fn from_nvml(nvml: Nvml) -> Self {
            NvmlMig { nvml }
        }

        fn device(&self, gpu: u32) -> Result<nv::nvmlDevice_t> {
            let d = self.nvml.device_by_index(gpu).map_err(|e| GpuError::Nvml {
                call: "nvmlDeviceGetHandleByIndex_v2",
                error: e.to_string(),
            })?;
            // SAFETY: the raw handle is used only while self.nvml (which owns the library and
            // the NVML session) is alive.
            Ok(unsafe { d.handle() })
        }

        fn gi_handle(&self, gpu: u32, gi: u32) -> Result<nv::nvmlGpuInstance_t> {
            let dev = self.device(gpu)?;
            let mut h: nv::nvmlGpuInstance_t = std::ptr::null_mut();
            // SAFETY: valid device handle and out-pointer.
            let r = unsafe {
                self.nvml
                    .lib()
                    .nvmlDeviceGetGpuInstanceById(dev, gi, &mut h)
            };
            ck(&self.nvml, "nvmlDeviceGetGpuInstanceById", r)?;
            Ok(h)
        }

        fn ci_handle(&self, gpu: u32, gi: u32, ci: u32) -> Result<nv::nvmlComputeInstance_t> {
            let g = self.gi_handle(gpu, gi)?;
            let mut h: nv::nvmlComputeInstance_t = std::ptr::null_mut();
            // SAFETY: valid GPU-instance handle and out-pointer.
            let r = unsafe {
                self.nvml
                    .lib()
                    .nvmlGpuInstanceGetComputeInstanceById(g, ci, &mut h)
            };
            ck(&self.nvml, "nvmlGpuInstanceGetComputeInstanceById", r)?;
            Ok(h)
        }
    }

    impl MigBackend for NvmlMig {
        fn mig_mode(&self, gpu: u32) -> Result<MigModeState> {
            let dev = self.device(gpu)?;
            let (mut cur, mut pend): (c_uint, c_uint) = (0, 0);
            // SAFETY: valid device handle and out-pointers. Read-only query.
            let r = unsafe {
                self.nvml
                    .lib()
                    .nvmlDeviceGetMigMode(dev, &mut cur, &mut pend)
            };
            if r == nv::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED {
                return Ok(MigModeState {
                    current: false,
                    pending: false,
                });
            }
            ck(&self.nvml, "nvmlDeviceGetMigMode", r)?;
            Ok(MigModeState {
                current: cur == nv::NVML_DEVICE_MIG_ENABLE,
                pending: pend == nv::NVML_DEVICE_MIG_ENABLE,
            })
        }

        fn profiles(&self, gpu: u32) -> Result<Vec<GiProfile>> {
            let dev = self.device(gpu)?;
            let mut out = Vec::new();
            for idx in 0..nv::NVML_GPU_INSTANCE_PROFILE_COUNT {
                // SAFETY: zeroed plain C struct; version set as NVML_STRUCT_VERSION(.., 2).
                let mut info: nv::nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
                info.version =
                    std::mem::size_of::<nv::nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
                // SAFETY: valid device handle and out-pointer to a versioned struct.
                let r = unsafe {
                    self.nvml
                        .lib()
                        .nvmlDeviceGetGpuInstanceProfileInfoV(dev, idx, &mut info)
                };
                if r != nv::nvmlReturn_enum_NVML_SUCCESS {
                    continue; // profile not offered by this GPU
                }
                // SAFETY: NVML NUL-terminates the 96-byte name.
                let name = unsafe { CStr::from_ptr(info.name.as_ptr()) }
                    .to_string_lossy()
                    .trim_start_matches("MIG ")
                    .to_string();
                // Memory slices: the largest placement size NVML reports for the profile.
                let mut placements = [nv::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 16];
                let mut count: c_uint = placements.len() as c_uint;
                // SAFETY: array of `count` placements; count is in/out.
                let r = unsafe {
                    self.nvml
                        .lib()
                        .nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                            dev,
                            info.id,
                            placements.as_mut_ptr(),
                            &mut count,
                        )
                };
                let memory_slices = if r == nv::nvmlReturn_enum_NVML_SUCCESS && count > 0 {
                    placements[0].size
                } else {
                    info.sliceCount
                };
                out.push(GiProfile {
                    id: info.id,
                    name,
                    compute_slices: info.sliceCount,
                    memory_slices,
                    sms: info.multiprocessorCount,
                    memory_mib: info.memorySizeMB,
                    max_instances: info.instanceCount,
                });
            }
            Ok(out)
        }

        fn gpu_instances(&self, gpu: u32) -> Result<Vec<GpuInstance>> {
            let dev = self.device(gpu)?;
            let mut out = Vec::new();
            for p in self.profiles(gpu)? {
                let mut hs: Vec<nv::nvmlGpuInstance_t> = vec![std::ptr::null_mut(); 8];
                let mut count: c_uint = 0;
                // SAFETY: array of 8 handles (at most 7 instances per profile exist).
                let r = unsafe {
                    self.nvml.lib().nvmlDeviceGetGpuInstances(
                        dev,
                        p.id,
                        hs.as_mut_ptr(),
                        &mut count,
                    )
                };
                ck(&self.nvml, "nvmlDeviceGetGpuInstances", r)?;
                for h in hs.iter().take(count as usize) {
                    // SAFETY: zeroed plain C struct filled by NVML.
                    let mut info: nv::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
                    // SAFETY: handle from NVML above; valid out-pointer.
                    let r = unsafe { self.nvml.lib().nvmlGpuInstanceGetInfo(*h, &mut info) };
                    ck(&self.nvml, "nvmlGpuInstanceGetInfo", r)?;
                    out.push(GpuInstance {
                        id: info.id,
                        profile_id: info.profileId,
                        start: info.placement.start,
                        size: info.placement.size,
                    });
                }
            }
            Ok(out)
        }

        fn compute_instances(&self, gpu: u32, gi: u32) -> Result<Vec<ComputeInstance>> {
            let g = self.gi_handle(gpu, gi)?;
            let mut out = Vec::new();
            for prof in 0..nv::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
                // SAFETY: zeroed plain C struct filled by NVML.
                let mut pinfo: nv::nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: valid handle and out-pointer.
                let r = unsafe {
                    self.nvml
                        .lib()
                        .nvmlGpuInstanceGetComputeInstanceProfileInfo(
                            g,
                            prof,
                            nv::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                            &mut pinfo,
                        )
                };
                if r != nv::nvmlReturn_enum_NVML_SUCCESS {
                    continue;
                }
                let mut hs: Vec<nv::nvmlComputeInstance_t> = vec![std::ptr::null_mut(); 8];
                let mut count: c_uint = 0;
                // SAFETY: array of 8 handles; count is an out-parameter.
                let r = unsafe {
                    self.nvml.lib().nvmlGpuInstanceGetComputeInstances(
                        g,
                        pinfo.id,
                        hs.as_mut_ptr(),
                        &mut count,
                    )
                };
                ck(&self.nvml, "nvmlGpuInstanceGetComputeInstances", r)?;
                for h in hs.iter().take(count as usize) {
                    // SAFETY: zeroed plain C struct filled by NVML.
                    let mut info: nv::nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
                    // SAFETY: handle from NVML above; valid out-pointer.
                    let r = unsafe { self.nvml.lib().nvmlComputeInstanceGetInfo_v2(*h, &mut info) };
                    ck(&self.nvml, "nvmlComputeInstanceGetInfo_v2", r)?;
                    out.push(ComputeInstance {
                        gpu_instance: gi,
                        id: info.id,
                    });
                }
            }
            Ok(out)
        }

        fn create_gpu_instance(
            &self,
            gpu: u32,
            profile_id: u32,
            start: u32,
            size: u32,
        ) -> Result<u32> {
            let dev = self.device(gpu)?;
            let placement = nv::nvmlGpuInstancePlacement_t { start, size };
            let mut h: nv::nvmlGpuInstance_t = std::ptr::null_mut();
            // SAFETY: valid device handle, placement and out-pointer. MIG mode is already on
            // (checked by the caller); this call does not change it.
            let r = unsafe {
                self.nvml
                    .lib()
                    .nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile_id, &placement, &mut h)
            };
            ck(&self.nvml, "nvmlDeviceCreateGpuInstanceWithPlacement", r)?;
            // SAFETY: zeroed plain C struct filled by NVML.
            let mut info: nv::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: handle just created; valid out-pointer.
            let r = unsafe { self.nvml.lib().nvmlGpuInstanceGetInfo(h, &mut info) };
            if let Err(e) = ck(&self.nvml, "nvmlGpuInstanceGetInfo", r) {
                // Without its id we could not destroy it later: destroy it now.
                // SAFETY: handle just created.
                let _ = unsafe { self.nvml.lib().nvmlGpuInstanceDestroy(h) };
                return Err(e);
            }
            Ok(info.id)
        }

        fn create_compute_instance(&self, gpu: u32, gi: u32, compute_slices: u32) -> Result<u32> {
            let g = self.gi_handle(gpu, gi)?;
            let prof = ci_profile_for(compute_slices).ok_or_else(|| {
                GpuError::Mig(format!(
                    "no compute-instance profile for {compute_slices} slices"
                ))
            })?;
            // SAFETY: zeroed plain C struct filled by NVML.
            let mut pinfo: nv::nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: valid handle and out-pointer.
            let r = unsafe {
                self.nvml
                    .lib()
                    .nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        g,
                        prof,
                        nv::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                        &mut pinfo,
                    )
            };
            ck(
                &self.nvml,
                "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                r,
            )?;
            let mut h: nv::nvmlComputeInstance_t = std::ptr::null_mut();
            // SAFETY: valid GPU-instance handle and out-pointer.
            let r = unsafe {
                self.nvml
                    .lib()
                    .nvmlGpuInstanceCreateComputeInstance(g, pinfo.id, &mut h)
            };
            ck(&self.nvml, "nvmlGpuInstanceCreateComputeInstance", r)?;
            // SAFETY: zeroed plain C struct filled by NVML.
            let mut info: nv::nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: handle just created; valid out-pointer.
            let r = unsafe { self.nvml.lib().nvmlComputeInstanceGetInfo_v2(h, &mut info) };
            if let Err(e) = ck(&self.nvml, "nvmlComputeInstanceGetInfo_v2", r) {
                // SAFETY: handle just created.
                let _ = unsafe { self.nvml.lib().nvmlComputeInstanceDestroy(h) };
                return Err(e);
            }
            Ok(info.id)
        }

        fn destroy_compute_instance(&self, gpu: u32, gi: u32, ci: u32) -> Result<()> {
            let h = self.ci_handle(gpu, gi, ci)?;
            // SAFETY: handle looked up by id just now.
            let r = unsafe { self.nvml.lib().nvmlComputeInstanceDestroy(h) };
            ck(&self.nvml, "nvmlComputeInstanceDestroy", r)
        }

        fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<()> {
            let h = self.gi_handle(gpu, gi)?;
            // SAFETY: handle looked up by id just now.
            let r = unsafe { self.nvml.lib().nvmlGpuInstanceDestroy(h) };
            ck(&self.nvml, "nvmlGpuInstanceDestroy", r)
        }

        fn mig_device_uuid(&self, gpu: u32, gi: u32, ci: u32) -> Result<String> {
            let parent = self.nvml.device_by_index(gpu).map_err(|e| GpuError::Nvml {
                call: "nvmlDeviceGetHandleByIndex_v2",
                error: e.to_string(),
            })?;
            let max = parent.mig_device_count().map_err(|e| GpuError::Nvml {
                call: "nvmlDeviceGetMaxMigDeviceCount",
                error: e.to_string(),
            })?;
            for i in 0..max {
                let Ok(m) = parent.mig_device_by_index(i) else {
                    continue;
                };
                // SAFETY: raw handle of a live MIG device of this NVML session.
                let h = unsafe { m.handle() };
                let (mut g, mut c): (c_uint, c_uint) = (0, 0);
                let lib = self.nvml.lib();
                // SAFETY: valid MIG device handle and out-pointer.
                let ok = unsafe { lib.nvmlDeviceGetGpuInstanceId(h, &mut g) }
                    == nv::nvmlReturn_enum_NVML_SUCCESS
                    // SAFETY: as above.
                    && unsafe { lib.nvmlDeviceGetComputeInstanceId(h, &mut c) }
                        == nv::nvmlReturn_enum_NVML_SUCCESS;
                if ok && g == gi && c == ci {
                    return m.uuid().map_err(|e| GpuError::Nvml {
                        call: "nvmlDeviceGetUUID",
                        error: e.to_string(),
                    });
                }
            }
            Err(GpuError::Mig(format!(
                "no MIG device found for GPU instance {gi}, compute instance {ci}"
            )))
        }
    }
}

#[cfg(any(test, feature = "test-support"))]
pub mod fake {
    //! An in-memory MIG backend for tests: records every call, can be told to fail a call.

    use std::cell::RefCell;

    use super::*;

    #[derive(Debug, Default)]
    pub struct FakeState {
        pub mode: Option<MigModeState>,
        pub gis: Vec<GpuInstance>,
        pub cis: Vec<ComputeInstance>,
        pub calls: Vec<String>,
        /// The GPU of each GPU instance, by id (ids are unique over every GPU): the fake
        /// stands for several GPUs, each with its own memory slices.
        pub gi_gpu: std::collections::BTreeMap<u32, u32>,
        next_id: u32,
    }

    /// Offers the h100-sxm profiles of `isolane_core::device_model`.
    pub struct FakeMig {
        pub state: RefCell<FakeState>,
        pub profiles: Vec<GiProfile>,
        /// Fail the n-th (0-based) call whose name is the key, e.g. ("create_compute_instance", 1).
        pub fail: Option<(&'static str, usize)>,
    }

    impl FakeMig {
        pub fn new(mig_on: bool) -> Self {
            let model = isolane_core::device_model::device_model("h100-sxm")
                .and_then(|d| d.mig)
                .map(|m| m.profiles)
                .unwrap_or_default();
            let profiles = model
                .iter()
                .enumerate()
                .map(|(i, p)| GiProfile {
                    id: 100 + i as u32,
                    name: p.name.to_string(),
                    compute_slices: p.compute_slices,
                    memory_slices: p.memory_slices,
                    sms: p.sms,
                    memory_mib: p.memory_mib,
                    max_instances: p.max_instances,
                })
                .collect();
            FakeMig {
                state: RefCell::new(FakeState {
                    mode: Some(MigModeState {
                        current: mig_on,
                        pending: mig_on,
                    }),
                    ..Default::default()
                }),
                profiles,
                fail: None,
            }
        }

        fn call(&self, name: &'static str) -> Result<()> {
            let mut s = self.state.borrow_mut();
            let n = s.calls.iter().filter(|c| c.as_str() == name).count();
            s.calls.push(name.to_string());
            if self.fail == Some((name, n)) {
                return Err(GpuError::Nvml {
                    call: name,
                    error: "Insufficient Resources (injected)".into(),
                });
            }
            Ok(())
        }

        pub fn calls(&self) -> Vec<String> {
            self.state.borrow().calls.clone()
        }
    }

    impl MigBackend for FakeMig {
        fn mig_mode(&self, _gpu: u32) -> Result<MigModeState> {
            self.call("mig_mode")?;
            self.state
                .borrow()
                .mode
                .ok_or_else(|| GpuError::Mig("no mode".into()))
        }
        fn profiles(&self, _gpu: u32) -> Result<Vec<GiProfile>> {
            self.call("profiles")?;
            Ok(self.profiles.clone())
        }
        fn gpu_instances(&self, gpu: u32) -> Result<Vec<GpuInstance>> {
            self.call("gpu_instances")?;
            let s = self.state.borrow();
            let on_gpu = |g: &&GpuInstance| s.gi_gpu.get(&g.id) == Some(&gpu);
            Ok(s.gis.iter().filter(on_gpu).cloned().collect())
        }
        fn compute_instances(&self, _gpu: u32, gi: u32) -> Result<Vec<ComputeInstance>> {
            self.call("compute_instances")?;
            Ok(self
                .state
                .borrow()
                .cis
                .iter()
                .filter(|c| c.gpu_instance == gi)
                .cloned()
                .collect())
        }
        fn create_gpu_instance(
            &self,
            gpu: u32,
            profile_id: u32,
            start: u32,
            size: u32,
        ) -> Result<u32> {
            self.call("create_gpu_instance")?;
            let mut s = self.state.borrow_mut();
            let on_gpu = |g: &&GpuInstance| s.gi_gpu.get(&g.id) == Some(&gpu);
            if s.gis
                .iter()
                .filter(on_gpu)
                .any(|g| g.start < start + size && start < g.start + g.size)
            {
                return Err(GpuError::Nvml {
                    call: "nvmlDeviceCreateGpuInstanceWithPlacement",
                    error: "In use by another client".into(),
                });
            }
            s.next_id += 1;
            let id = s.next_id;
            s.gi_gpu.insert(id, gpu);
            s.gis.push(GpuInstance {
                id,
                profile_id,
                start,
                size,
            });
            Ok(id)
        }
        fn create_compute_instance(&self, _gpu: u32, gi: u32, _slices: u32) -> Result<u32> {
            self.call("create_compute_instance")?;
            let mut s = self.state.borrow_mut();
            if !s.gis.iter().any(|g| g.id == gi) {
                return Err(GpuError::Mig(format!("no GPU instance {gi}")));
            }
            s.cis.push(ComputeInstance {
                gpu_instance: gi,
                id: 0,
            });
            Ok(0)
        }
        fn destroy_compute_instance(&self, _gpu: u32, gi: u32, ci: u32) -> Result<()> {
            self.call("destroy_compute_instance")?;
            let mut s = self.state.borrow_mut();
            let before = s.cis.len();
            s.cis.retain(|c| !(c.gpu_instance == gi && c.id == ci));
            if s.cis.len() == before {
                return Err(GpuError::Mig(format!("no compute instance {gi}/{ci}")));
            }
            Ok(())
        }
        fn destroy_gpu_instance(&self, _gpu: u32, gi: u32) -> Result<()> {
            self.call("destroy_gpu_instance")?;
            let mut s = self.state.borrow_mut();
            if s.cis.iter().any(|c| c.gpu_instance == gi) {
                return Err(GpuError::Mig(format!(
                    "GPU instance {gi} still has compute instances"
                )));
            }
            let before = s.gis.len();
            s.gis.retain(|g| g.id != gi);
            if s.gis.len() == before {
                return Err(GpuError::Mig(format!("no GPU instance {gi}")));
            }
            Ok(())
        }
        fn mig_device_uuid(&self, gpu: u32, gi: u32, ci: u32) -> Result<String> {
            self.call("mig_device_uuid")?;
            Ok(format!("MIG-{gpu:08x}-0000-0000-0000-{gi:08x}{ci:04x}"))
        }
    }
}
