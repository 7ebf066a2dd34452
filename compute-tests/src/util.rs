//! Small helpers shared by the tests.

use compute_core::{ComputeClient, Device, DeviceId, Runtime};

/// Bytes of a slice of `f32`.
pub fn f32_bytes(values: &[f32]) -> compute_core::Bytes {
    compute_core::Bytes::from_elem_slice(values)
}

/// The client of another device of the same runtime.
pub fn client_of<R: Runtime>(id: DeviceId) -> ComputeClient<R> {
    ComputeClient::<R>::load(&<R::Device as Device>::from_id(id))
}

/// Block on a client's sync and panic with the error if it fails.
pub fn sync<R: Runtime>(client: &ComputeClient<R>) {
    compute_core::block_on(client.sync()).expect("sync failed");
}

/// `0.0, 1.0, 2.0, ...` for `n` elements, scaled by `scale`.
pub fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| i as f32 * scale).collect()
}

/// How the reason of a multi-device test's reduced run begins (see
/// [`devices_or_single_device_check`]). `cargo xtask test-all` keys on it: with
/// `COMPUTE_REQUIRE_BACKENDS`, a required backend's reduced run with this reason fails the run
/// (CI gives each backend 3 logical devices, so there it is a regression). xtask has its own copy
/// of this text, and a test there checks that the two agree.
pub const MULTI_DEVICE_REDUCED: &str = "too few devices";

/// The first `n` devices of the client's type, or `None` when the machine has fewer.
///
/// With too few devices (one GPU, say), the multi-device test cannot run; this then checks the
/// single-device contract instead — loading a device index that does not exist is a clean error,
/// never a panic — and says so on stderr, so the reduced run is visible in the test output.
pub fn devices_or_single_device_check<R: Runtime>(
    client: &ComputeClient<R>,
    n: usize,
    test: &str,
) -> Option<Vec<DeviceId>> {
    let type_id = client.device_id().type_id;
    let devices = client.enumerate_devices(type_id);
    if devices.len() >= n {
        return Some(devices[..n].to_vec());
    }
    let missing = DeviceId::new(type_id, devices.len() as u32);
    let loaded = ComputeClient::<R>::try_load(&<R::Device as Device>::from_id(missing));
    assert!(
        loaded.is_err(),
        "device {missing} does not exist on {}, yet it loaded",
        R::name()
    );
    compute_core::env::report_reduced(&format!(
        "{MULTI_DEVICE_REDUCED}: {}::{test} needs {n} devices, this machine has {}; only the clean error for a missing device was checked",
        R::name(),
        devices.len()
    ));
    None
}
