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
