//! The Vulkan loader, instance, chosen physical device, logical device and its queue.

use std::ffi::CStr;

use ash::vk;

use crate::error::VkContext;
use crate::select::{choose, DeviceInfo, DeviceKind};
use crate::{DevicePreference, GraphicsError};

/// Vulkan 1.1: naga's SPIR-V declares storage buffers the 1.1 way (SPV_KHR_storage_buffer_storage_class,
/// core in 1.1). Every current driver has it (lavapipe, NVIDIA: 1.3).
const API_VERSION: u32 = vk::API_VERSION_1_1;

/// Everything a renderer draws with, owned: dropping it destroys the device and the instance
/// (the renderer destroys its own objects first).
pub(crate) struct Context {
    pub device: ash::Device,
    pub queue: vk::Queue,
    pub queue_family: u32,
    pub memory: vk::PhysicalDeviceMemoryProperties,
    pub limits: vk::PhysicalDeviceLimits,
    pub info: DeviceInfo,
    /// Nanoseconds per timestamp tick and the valid bits' mask, where the queue has timestamps.
    pub timestamps: Option<(f64, u64)>,
    instance: ash::Instance,
    // Keeps libvulkan loaded while the instance lives; dropped last.
    _entry: ash::Entry,
}

/// The Vulkan loader and an instance of API 1.1: what both a context and a look at the
/// devices start from. The caller destroys the instance, before dropping the entry.
fn instance() -> Result<(ash::Entry, ash::Instance), GraphicsError> {
    // SAFETY: loading libvulkan runs its initialisers; the loader is a well-behaved system
    // library, and the Entry is kept for as long as anything made from it.
    let entry =
        unsafe { ash::Entry::load() }.map_err(|e| GraphicsError::LoaderMissing(e.to_string()))?;
    let app = vk::ApplicationInfo::default()
        .application_name(c"isolane")
        .api_version(API_VERSION);
    let create = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: `create` and what it points to outlive the call.
    match unsafe { entry.create_instance(&create, None) } {
        Ok(instance) => Ok((entry, instance)),
        // What the loader answers when it found no driver at all.
        Err(vk::Result::ERROR_INCOMPATIBLE_DRIVER) => Err(GraphicsError::NoDevice),
        Err(result) => Err(GraphicsError::Vulkan {
            call: "vkCreateInstance",
            result,
        }),
    }
}

/// Every physical device the driver offers, described as [`choose`] sees them (no device is
/// opened).
pub(crate) fn devices() -> Result<Vec<DeviceInfo>, GraphicsError> {
    let _turn = lifecycle();
    let (_entry, instance) = instance()?;
    // SAFETY: a valid instance.
    let listed =
        unsafe { instance.enumerate_physical_devices() }.call("vkEnumeratePhysicalDevices");
    let infos = listed.map(|physicals| {
        physicals
            .iter()
            .map(|&p| describe(&instance, p).0)
            .collect()
    });
    // SAFETY: nothing was made from the instance (physical devices are not destroyed).
    unsafe { instance.destroy_instance(None) };
    infos
}

/// Held while a context is made or destroyed. On the H100 (driver 580) four graphics stages of
/// one process ending together left one thread inside `vkDestroyDevice` for good (an app run
/// under green partitions hung at its end). Vulkan asks for external synchronisation per object
/// only, so this works around the driver; contexts are made and destroyed once per stage, so
/// taking turns costs nothing a frame sees.
static LIFECYCLE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lifecycle() -> std::sync::MutexGuard<'static, ()> {
    LIFECYCLE.lock().unwrap_or_else(|p| p.into_inner())
}

impl Context {
    pub fn new(preference: &DevicePreference) -> Result<Self, GraphicsError> {
        let _turn = lifecycle();
        let (entry, instance) = instance()?;
        match open_device(&instance, preference) {
            Ok(parts) => Ok(Self {
                device: parts.device,
                queue: parts.queue,
                queue_family: parts.queue_family,
                memory: parts.memory,
                limits: parts.limits,
                info: parts.info,
                timestamps: parts.timestamps,
                instance,
                _entry: entry,
            }),
            Err(e) => {
                // SAFETY: nothing made from the instance survives the failed open_device.
                unsafe { instance.destroy_instance(None) };
                Err(e)
            }
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let _turn = lifecycle();
        // SAFETY: the renderer destroyed every object of the device and waited for it to be
        // idle before its context is dropped; the device is destroyed before its instance.
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

struct DeviceParts {
    device: ash::Device,
    queue: vk::Queue,
    queue_family: u32,
    memory: vk::PhysicalDeviceMemoryProperties,
    limits: vk::PhysicalDeviceLimits,
    info: DeviceInfo,
    timestamps: Option<(f64, u64)>,
}

fn open_device(
    instance: &ash::Instance,
    preference: &DevicePreference,
) -> Result<DeviceParts, GraphicsError> {
    // SAFETY: a valid instance.
    let physicals =
        unsafe { instance.enumerate_physical_devices() }.call("vkEnumeratePhysicalDevices")?;
    let described: Vec<(DeviceInfo, Option<vk::QueueFamilyProperties>, usize)> =
        physicals.iter().map(|&p| describe(instance, p)).collect();
    let infos: Vec<DeviceInfo> = described.iter().map(|(info, _, _)| info.clone()).collect();
    let chosen = choose(&infos, preference)?;
    let physical = physicals[chosen];
    let (info, family, family_index) = described[chosen].clone();
    let family = family.ok_or(GraphicsError::NoDevice)?;
    let queue_family = u32::try_from(family_index).map_err(|_| GraphicsError::NoDevice)?;
    // SAFETY: `physical` came from this instance.
    let (properties, memory) = unsafe {
        (
            instance.get_physical_device_properties(physical),
            instance.get_physical_device_memory_properties(physical),
        )
    };
    let priorities = [1.0f32];
    let queue_info = vk::DeviceQueueCreateInfo::default()
        .queue_family_index(queue_family)
        .queue_priorities(&priorities);
    let create =
        vk::DeviceCreateInfo::default().queue_create_infos(std::slice::from_ref(&queue_info));
    // SAFETY: `create` and what it points to outlive the call; the family index is the device's.
    let device =
        unsafe { instance.create_device(physical, &create, None) }.call("vkCreateDevice")?;
    // SAFETY: queue 0 of a family the device was created with.
    let queue = unsafe { device.get_device_queue(queue_family, 0) };
    Ok(DeviceParts {
        device,
        queue,
        queue_family,
        memory,
        limits: properties.limits,
        info,
        timestamps: timestamp_scale(
            family.timestamp_valid_bits,
            properties.limits.timestamp_period,
        ),
    })
}

/// The device's description and its first queue family that can draw (preferring one with
/// timestamps), with that family's index. A device below Vulkan 1.1 counts as unable to draw.
fn describe(
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
) -> (DeviceInfo, Option<vk::QueueFamilyProperties>, usize) {
    // SAFETY: `physical` came from this instance.
    let (properties, families) = unsafe {
        (
            instance.get_physical_device_properties(physical),
            instance.get_physical_device_queue_family_properties(physical),
        )
    };
    let graphics =
        |f: &&vk::QueueFamilyProperties| f.queue_flags.contains(vk::QueueFlags::GRAPHICS);
    let family = families
        .iter()
        .enumerate()
        .filter(|(_, f)| graphics(f))
        .max_by_key(|(i, f)| (f.timestamp_valid_bits > 0, std::cmp::Reverse(*i)))
        .map(|(i, f)| (i, *f));
    let name = properties
        .device_name_as_c_str()
        .map(CStr::to_string_lossy)
        .map(|n| n.into_owned())
        .unwrap_or_else(|_| "(unnamed device)".to_string());
    let at_least_1_1 = properties.api_version >= API_VERSION;
    let info = DeviceInfo {
        name,
        kind: kind(properties.device_type),
        vendor_id: properties.vendor_id,
        can_draw: family.is_some() && at_least_1_1,
        uuid: at_least_1_1.then(|| device_uuid(instance, physical)),
    };
    let index = family.map_or(0, |(i, _)| i);
    (info, family.map(|(_, f)| f), index)
}

/// The device's `deviceUUID` (core in Vulkan 1.1, which the caller checked the device has):
/// for an NVIDIA GPU, the UUID CUDA gives it.
fn device_uuid(instance: &ash::Instance, physical: vk::PhysicalDevice) -> [u8; 16] {
    let mut id = vk::PhysicalDeviceIDProperties::default();
    {
        let mut properties = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
        // SAFETY: `physical` came from this instance (created for Vulkan 1.1) and supports
        // 1.1; `properties` and the chained `id` are valid, writable and outlive the call.
        unsafe { instance.get_physical_device_properties2(physical, &mut properties) };
    }
    id.device_uuid
}

fn kind(device_type: vk::PhysicalDeviceType) -> DeviceKind {
    match device_type {
        vk::PhysicalDeviceType::DISCRETE_GPU => DeviceKind::Discrete,
        vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceKind::Integrated,
        vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceKind::Virtual,
        vk::PhysicalDeviceType::CPU => DeviceKind::Cpu,
        _ => DeviceKind::Other,
    }
}

/// Nanoseconds per tick and the mask of valid bits, or None when the queue has no timestamps.
fn timestamp_scale(valid_bits: u32, period_ns: f32) -> Option<(f64, u64)> {
    if valid_bits == 0 || period_ns <= 0.0 {
        return None;
    }
    let mask = if valid_bits >= 64 {
        u64::MAX
    } else {
        (1u64 << valid_bits) - 1
    };
    Some((f64::from(period_ns), mask))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_need_valid_bits_and_a_period() {
        assert_eq!(timestamp_scale(0, 1.0), None);
        assert_eq!(timestamp_scale(64, 0.0), None);
        assert_eq!(timestamp_scale(64, 1.0), Some((1.0, u64::MAX)));
        assert_eq!(timestamp_scale(36, 2.5), Some((2.5, (1 << 36) - 1)));
    }
}
