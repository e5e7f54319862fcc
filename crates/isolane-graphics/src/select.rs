//! Which Vulkan device renders: the preference a caller gives and the choice among the devices a
//! driver offers. Pure logic, tested without Vulkan.

use std::fmt;
use std::str::FromStr;

use crate::GraphicsError;

/// The environment variable callers may read to override the device (see
/// [`DevicePreference::from_env`]); the library itself never reads it behind a caller's back.
pub const DEVICE_ENV: &str = "ISOLANE_VULKAN_DEVICE";

/// PCI vendor id of NVIDIA, preferred among devices of the same kind.
const NVIDIA_VENDOR_ID: u32 = 0x10de;

/// Which device to render on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DevicePreference {
    /// A discrete GPU if there is one (NVIDIA first), else an integrated or virtual one, else a
    /// software renderer such as Mesa's lavapipe.
    #[default]
    Auto,
    /// A hardware GPU (discrete, integrated or virtual), never a software renderer.
    Gpu,
    /// A software renderer on the CPU (lavapipe).
    Cpu,
    /// The device at this index in the driver's enumeration order.
    Index(usize),
    /// The first device whose name contains this text (case-insensitive).
    Name(String),
    /// The device with this UUID (`VkPhysicalDeviceIDProperties::deviceUUID`), written as
    /// `nvidia-smi` and CUDA write a GPU's: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`. NVIDIA's
    /// Vulkan driver gives a GPU the UUID CUDA gives it (`cuDeviceGetUuid`), so this finds the
    /// Vulkan device that IS a CUDA GPU, whatever order either API lists them in.
    Uuid([u8; 16]),
}

impl DevicePreference {
    /// The preference in [`DEVICE_ENV`], if it is set and not empty.
    pub fn from_env() -> Result<Option<Self>, GraphicsError> {
        match std::env::var(DEVICE_ENV) {
            Ok(text) if !text.trim().is_empty() => text.parse().map(Some),
            _ => Ok(None),
        }
    }
}

impl FromStr for DevicePreference {
    type Err = GraphicsError;

    /// `auto`, `gpu`, `cpu`, a number (an index) or any other text (part of a device name).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.is_empty() {
            return Err(GraphicsError::BadDevicePreference(text.to_string()));
        }
        if let Some(uuid) = parse_gpu_uuid(text) {
            return Ok(Self::Uuid(uuid));
        }
        Ok(match text.to_ascii_lowercase().as_str() {
            "auto" => Self::Auto,
            "gpu" => Self::Gpu,
            "cpu" => Self::Cpu,
            lower => match lower.parse::<usize>() {
                Ok(index) => Self::Index(index),
                Err(_) => Self::Name(text.to_string()),
            },
        })
    }
}

impl fmt::Display for DevicePreference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => write!(f, "auto"),
            Self::Gpu => write!(f, "gpu"),
            Self::Cpu => write!(f, "cpu"),
            Self::Index(i) => write!(f, "device index {i}"),
            Self::Name(name) => write!(f, "a name containing {name:?}"),
            Self::Uuid(uuid) => write!(f, "UUID {}", format_gpu_uuid(uuid)),
        }
    }
}

/// `GPU-` and 32 hex digits in the groups 8-4-4-4-12 (any case): the UUID's 16 bytes.
/// Anything else is not a UUID (it may still be part of a device name).
pub fn parse_gpu_uuid(text: &str) -> Option<[u8; 16]> {
    let rest = text
        .strip_prefix("GPU-")
        .or_else(|| text.strip_prefix("gpu-"))?;
    let groups: Vec<&str> = rest.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    if lengths != [8, 4, 4, 4, 12] {
        return None;
    }
    let hex: String = groups.concat();
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The UUID as [`parse_gpu_uuid`] reads it (lower-case hex, as `nvidia-smi -L` prints it).
pub fn format_gpu_uuid(b: &[u8; 16]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The kind of a Vulkan physical device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Discrete,
    Integrated,
    Virtual,
    Cpu,
    Other,
}

impl DeviceKind {
    fn rank(self) -> u32 {
        match self {
            Self::Discrete => 4,
            Self::Integrated => 3,
            Self::Virtual => 2,
            Self::Cpu => 1,
            Self::Other => 0,
        }
    }

    fn is_hardware(self) -> bool {
        matches!(self, Self::Discrete | Self::Integrated | Self::Virtual)
    }
}

/// What the choice needs to know of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub kind: DeviceKind,
    pub vendor_id: u32,
    /// Whether one of its queue families can draw.
    pub can_draw: bool,
    /// Its `deviceUUID` (Vulkan 1.1's ID properties); `None` where the device does not say.
    pub uuid: Option<[u8; 16]>,
}

/// The index (in `devices`) of the device to use.
pub fn choose(
    devices: &[DeviceInfo],
    preference: &DevicePreference,
) -> Result<usize, GraphicsError> {
    let usable = || devices.iter().enumerate().filter(|(_, d)| d.can_draw);
    if usable().next().is_none() {
        return Err(GraphicsError::NoDevice);
    }
    let best = |pick: &dyn Fn(&DeviceInfo) -> bool| {
        usable()
            .filter(|(_, d)| pick(d))
            .max_by_key(|(i, d)| (score(d), std::cmp::Reverse(*i)))
            .map(|(i, _)| i)
    };
    let chosen = match preference {
        DevicePreference::Auto => best(&|_| true),
        DevicePreference::Gpu => best(&|d| d.kind.is_hardware()),
        DevicePreference::Cpu => best(&|d| d.kind == DeviceKind::Cpu),
        DevicePreference::Index(index) => usable().find(|(i, _)| i == index).map(|(i, _)| i),
        DevicePreference::Name(part) => {
            let part = part.to_lowercase();
            usable()
                .find(|(_, d)| d.name.to_lowercase().contains(&part))
                .map(|(i, _)| i)
        }
        DevicePreference::Uuid(uuid) => usable()
            .find(|(_, d)| d.uuid.as_ref() == Some(uuid))
            .map(|(i, _)| i),
    };
    chosen.ok_or_else(|| GraphicsError::NoMatchingDevice {
        wanted: preference.to_string(),
        available: describe(devices),
    })
}

fn score(device: &DeviceInfo) -> u32 {
    device.kind.rank() * 2 + u32::from(device.vendor_id == NVIDIA_VENDOR_ID)
}

fn describe(devices: &[DeviceInfo]) -> String {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let draws = if d.can_draw { "" } else { ", cannot draw" };
            let uuid = d
                .uuid
                .map_or_else(String::new, |u| format!(", {}", format_gpu_uuid(&u)));
            format!("{i}: {} ({:?}{draws}{uuid})", d.name, d.kind)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, kind: DeviceKind, vendor_id: u32) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            kind,
            vendor_id,
            can_draw: true,
            uuid: None,
        }
    }

    fn lavapipe() -> DeviceInfo {
        device("llvmpipe (LLVM 15.0.6, 256 bits)", DeviceKind::Cpu, 0x10005)
    }

    fn h100() -> DeviceInfo {
        device(
            "NVIDIA H100 80GB HBM3",
            DeviceKind::Discrete,
            NVIDIA_VENDOR_ID,
        )
    }

    #[test]
    fn auto_prefers_a_discrete_gpu_over_lavapipe() {
        let devices = [lavapipe(), h100()];
        assert_eq!(choose(&devices, &DevicePreference::Auto).unwrap(), 1);
    }

    #[test]
    fn auto_prefers_nvidia_among_discrete_gpus() {
        let other = device("Other GPU", DeviceKind::Discrete, 0x1002);
        assert_eq!(
            choose(&[other, h100()], &DevicePreference::Auto).unwrap(),
            1
        );
    }

    #[test]
    fn auto_falls_back_to_lavapipe() {
        assert_eq!(choose(&[lavapipe()], &DevicePreference::Auto).unwrap(), 0);
    }

    #[test]
    fn cpu_and_gpu_preferences_pick_by_kind() {
        let devices = [h100(), lavapipe()];
        assert_eq!(choose(&devices, &DevicePreference::Cpu).unwrap(), 1);
        assert_eq!(choose(&devices, &DevicePreference::Gpu).unwrap(), 0);
    }

    #[test]
    fn gpu_preference_refuses_a_software_renderer_and_lists_the_devices() {
        let err = choose(&[lavapipe()], &DevicePreference::Gpu).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("llvmpipe"), "{text}");
        assert!(matches!(err, GraphicsError::NoMatchingDevice { .. }));
    }

    #[test]
    fn name_matches_part_of_the_name_ignoring_case() {
        let devices = [h100(), lavapipe()];
        let pref: DevicePreference = "LLVMpipe".parse().unwrap();
        assert_eq!(choose(&devices, &pref).unwrap(), 1);
    }

    #[test]
    fn index_picks_that_device_or_says_none_matches() {
        let devices = [h100(), lavapipe()];
        assert_eq!(choose(&devices, &DevicePreference::Index(1)).unwrap(), 1);
        assert!(choose(&devices, &DevicePreference::Index(2)).is_err());
    }

    #[test]
    fn devices_that_cannot_draw_are_never_chosen() {
        let mut compute_only = h100();
        compute_only.can_draw = false;
        assert_eq!(
            choose(&[compute_only.clone(), lavapipe()], &DevicePreference::Auto).unwrap(),
            1
        );
        assert!(matches!(
            choose(&[compute_only], &DevicePreference::Auto),
            Err(GraphicsError::NoDevice)
        ));
        assert!(matches!(
            choose(&[], &DevicePreference::Auto),
            Err(GraphicsError::NoDevice)
        ));
    }

    #[test]
    fn a_uuid_finds_its_device_whatever_the_enumeration_order() {
        let text = "GPU-5d4a4b1c-0f3e-2a6b-9c8d-7e6f5a4b3c2d";
        let uuid = parse_gpu_uuid(text).unwrap();
        assert_eq!(format_gpu_uuid(&uuid), text);
        // The text isolane-gpu makes of a CUDA UUID (as nvidia-smi prints it) reads back.
        let counting: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert_eq!(
            parse_gpu_uuid("GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"),
            Some(counting)
        );
        let mut first = h100();
        first.uuid = Some([7; 16]);
        let mut second = h100();
        second.uuid = Some(uuid);
        let pref: DevicePreference = text.parse().unwrap();
        assert_eq!(pref, DevicePreference::Uuid(uuid));
        assert_eq!(choose(&[first.clone(), second.clone()], &pref).unwrap(), 1);
        assert_eq!(choose(&[second, first.clone()], &pref).unwrap(), 0);
        // No device with it (lavapipe has its own UUID, never a CUDA GPU's): refused, listing
        // the devices with their UUIDs.
        let err = choose(&[first, lavapipe()], &pref).unwrap_err().to_string();
        assert!(err.contains(text) && err.contains("llvmpipe"), "{err}");
        assert!(err.contains(&format_gpu_uuid(&[7; 16])), "{err}");
    }

    #[test]
    fn text_that_is_not_a_whole_uuid_stays_a_name() {
        for text in [
            "GPU-5d4a4b1c",
            "GPU-5d4a4b1c-0f3e-2a6b-9c8d-7e6f5a4b3c2",
            "GPU-5d4a4b1c-0f3e-2a6b-9c8d-7e6f5a4b3c2g",
            "GPU-5d4a4b1c-0f3e-2a6b-9c8d7-e6f5a4b3c2d",
            "GPU-é",
        ] {
            assert_eq!(parse_gpu_uuid(text), None, "{text}");
            assert!(
                matches!(text.parse(), Ok(DevicePreference::Name(_))),
                "{text}"
            );
        }
    }

    #[test]
    fn preferences_parse() {
        assert_eq!(
            "auto".parse::<DevicePreference>().unwrap(),
            DevicePreference::Auto
        );
        assert_eq!(
            " GPU ".parse::<DevicePreference>().unwrap(),
            DevicePreference::Gpu
        );
        assert_eq!(
            "cpu".parse::<DevicePreference>().unwrap(),
            DevicePreference::Cpu
        );
        assert_eq!(
            "0".parse::<DevicePreference>().unwrap(),
            DevicePreference::Index(0)
        );
        assert_eq!(
            "H100".parse::<DevicePreference>().unwrap(),
            DevicePreference::Name("H100".into())
        );
        assert!(matches!(
            "  ".parse::<DevicePreference>(),
            Err(GraphicsError::BadDevicePreference(_))
        ));
    }
}
