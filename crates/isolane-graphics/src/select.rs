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
        }
    }
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
            format!("{i}: {} ({:?}{draws})", d.name, d.kind)
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
