//! The cache of a server's compiled kernels.

use hashbrown::HashMap;
use std::sync::Arc;

use crate::kernel::KernelId;

/// A server's compiled kernels (pipelines, modules), one per kernel id and bounds-check mode.
///
/// The entry found or inserted last answers the next lookup without hashing: a loop launching
/// one kernel again and again finds it at once.
pub struct KernelCache<V> {
    compiled: HashMap<(KernelId, bool), Arc<V>>,
    last: Option<(KernelId, bool, Arc<V>)>,
}

impl<V> Default for KernelCache<V> {
    fn default() -> Self {
        Self {
            compiled: HashMap::new(),
            last: None,
        }
    }
}

impl<V> KernelCache<V> {
    /// The compiled form of kernel `id` in mode `checked`, when it was made already.
    pub fn get(&mut self, id: KernelId, checked: bool) -> Option<Arc<V>> {
        if let Some((last_id, last_checked, found)) = &self.last
            && *last_id == id
            && *last_checked == checked
        {
            return Some(found.clone());
        }
        let found = self.compiled.get(&(id, checked))?.clone();
        self.last = Some((id, checked, found.clone()));
        Some(found)
    }

    /// Keep `compiled` as kernel `id` in mode `checked` (the next lookup's fast answer).
    pub fn insert(&mut self, id: KernelId, checked: bool, compiled: Arc<V>) {
        self.compiled.insert((id, checked), compiled.clone());
        self.last = Some((id, checked, compiled));
    }

    /// How many compiled kernels are kept.
    pub fn len(&self) -> usize {
        self.compiled.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.compiled.is_empty()
    }

    /// Drop every compiled kernel.
    pub fn clear(&mut self) {
        self.last = None;
        self.compiled.clear();
    }
}
