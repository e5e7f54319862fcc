//! Tests that need a package of the system rather than a crate (a Vulkan loader and driver, a
//! Python module): on a fresh machine they skip with a line that names what is missing and how
//! to install it, so that `cargo test --workspace` passes there as the README promises; CI sets
//! [`STRICT_ENV`]`=1`, which makes the same tests fail instead, so a missing install step in CI
//! cannot hide behind a skip (`test-support` feature only).

use std::fmt::Display;

/// Set to 1 (as `.ci/run` does) to make a missing system package a test failure.
pub const STRICT_ENV: &str = "ISOLANE_STRICT";

/// A system package a test can need.
#[derive(Debug, Clone, Copy)]
pub struct SystemPackage {
    /// What it is, in words.
    pub what: &'static str,
    /// The command that installs it on Debian or Ubuntu.
    pub install: &'static str,
}

/// The Vulkan loader and a driver; Mesa's lavapipe renders on the CPU where there is no GPU.
pub const VULKAN: SystemPackage = SystemPackage {
    what: "a Vulkan loader and driver",
    install: "apt install libvulkan1 mesa-vulkan-drivers",
};

/// Triton's Python client with its HTTP and gRPC transports (and numpy), which
/// `isolane serve`'s end-to-end test drives the server with (tests/serve_client.py).
pub const TRITONCLIENT: SystemPackage = SystemPackage {
    what: "the Python modules tritonclient (HTTP and gRPC) and numpy",
    install: "python3 -m pip install 'tritonclient[http,grpc]' numpy",
};

/// kubernetes-validate (PyPI: the Kubernetes JSON schemas, with jsonschema and PyYAML), which
/// the tests of `isolane export` check every manifest with (crates/isolane-export/validate).
pub const KUBERNETES_VALIDATE: SystemPackage = SystemPackage {
    what: "the Python package kubernetes-validate",
    install: "python3 -m pip install kubernetes-validate",
};

/// Whether [`STRICT_ENV`] is set to 1.
pub fn strict() -> bool {
    std::env::var(STRICT_ENV).is_ok_and(|v| v == "1")
}

/// The line a skipped test prints, or the message it fails with under [`STRICT_ENV`]`=1`.
pub fn missing_message(package: &SystemPackage, why: &dyn Display) -> String {
    format!(
        "needs {} ({why}); install it with `{}`; {STRICT_ENV}=1 makes this a failure",
        package.what, package.install
    )
}

/// Called by a test that found `package` missing (`why`: the error that said so): prints the
/// skip line and returns, after which the test returns too; under [`STRICT_ENV`]`=1` it panics
/// with the same words instead.
pub fn skip_without(package: &SystemPackage, why: &dyn Display) {
    let message = missing_message(package, why);
    if strict() {
        panic!("{message}");
    }
    eprintln!("skipped: {message}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_package_its_install_and_the_strict_switch() {
        let m = missing_message(&VULKAN, &"libvulkan.so.1 not found");
        assert!(m.contains("a Vulkan loader and driver"), "{m}");
        assert!(m.contains("libvulkan.so.1 not found"), "{m}");
        assert!(
            m.contains("apt install libvulkan1 mesa-vulkan-drivers"),
            "{m}"
        );
        assert!(m.contains("ISOLANE_STRICT=1"), "{m}");
    }
}
