//! Devices and the process-wide registry of servers behind [`ComputeClient::load`](crate::ComputeClient::load).

use core::any::{Any, TypeId};
use std::sync::Arc;

use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

/// Identifies a device within a runtime: a device type (discrete GPU, CPU, ...) and an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceId {
    /// The kind of device, as the backend numbers them (see each backend's device type).
    pub type_id: u16,
    /// The index of the device among those of its type.
    pub index_id: u32,
}

impl DeviceId {
    /// A device id from its type and index.
    pub const fn new(type_id: u16, index_id: u32) -> Self {
        Self { type_id, index_id }
    }
}

impl core::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}:{}", self.type_id, self.index_id)
    }
}

/// A device a runtime can run on.
pub trait Device: Clone + Send + Sync + core::fmt::Debug + 'static {
    /// The device's id.
    fn to_id(&self) -> DeviceId;
    /// The device with the given id (the id need not exist; creating its server then fails).
    fn from_id(id: DeviceId) -> Self;
}

type Registry = HashMap<(TypeId, DeviceId), Arc<dyn Any + Send + Sync>>;

static REGISTRY: spin::Mutex<Option<Registry>> = spin::Mutex::new(None);

/// Return the registered value for `(runtime type K, device)`, creating it with `create` on first use.
///
/// The registry lock is not held while `create` runs, so a slow server start blocks no other device;
/// if two threads race, the first value registered wins and the other is dropped.
pub(crate) fn registry_get_or_create<K: 'static, V: Send + Sync + 'static, E>(
    device: DeviceId,
    create: impl FnOnce() -> Result<V, E>,
) -> Result<Arc<V>, E> {
    let key = (TypeId::of::<K>(), device);
    if let Some(found) = lookup::<V>(&key) {
        return Ok(found);
    }
    let created: Arc<dyn Any + Send + Sync> = Arc::new(create()?);
    let mut guard = REGISTRY.lock();
    let entry = guard
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_insert(created)
        .clone();
    drop(guard);
    Ok(entry
        .downcast::<V>()
        .unwrap_or_else(|_| unreachable!("registry entry type is fixed by its runtime key")))
}

/// Register a value for `(K, device)`, replacing any previous one.
pub(crate) fn registry_set<K: 'static, V: Send + Sync + 'static>(device: DeviceId, value: Arc<V>) {
    let mut guard = REGISTRY.lock();
    guard
        .get_or_insert_with(HashMap::new)
        .insert((TypeId::of::<K>(), device), value);
}

fn lookup<V: Send + Sync + 'static>(key: &(TypeId, DeviceId)) -> Option<Arc<V>> {
    let guard = REGISTRY.lock();
    let found = guard.as_ref()?.get(key)?.clone();
    drop(guard);
    found.downcast::<V>().ok()
}
