//! The CUDA server: the struct, its construction and its [`ServerKit`]. Each role trait is
//! implemented in the file of its role: [`storage`](crate::storage) (`ServerMemory`: device
//! memory, retirement, host memory), [`transfer`](crate::transfer) (`ServerTransfer`),
//! [`staging`](crate::staging) (the pinned staging of pageable writes), [`launch`](crate::launch)
//! (the `ComputeServer` core calls: launch, `get_resource`, flush, sync), [`graph`](crate::graph)
//! (`ServerGraph`), [`profile`](crate::profile) (`ServerProfile`),
//! [`collective`](crate::collective) (`ServerCollective`: NCCL) and [`stream`](crate::stream)
//! (stream order, flush and sync). A stream per `StreamId`, pools over device memory and graphs
//! are kept by compute-core's backend kit ([`Streams`], [`Graphs`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use compute_core::backend::{CreateRules, Graphs, KernelCache, ServerKit, StreamEntry, Streams};
use compute_core::future::DynFut;
use compute_core::handle::HandleOwner;
use compute_core::{Binding, DeviceId, DeviceProperties, ServerError, StreamId};
use cudarc::driver::{result, sys};
use hashbrown::HashMap;

use crate::compiler::{CompiledKernel, Target};
use crate::device::CudaDevice;
use crate::driver::{Context, Raw};
use crate::graph::CudaGraph;
use crate::pinned::PinnedPool;
use crate::staging::{Issue, IssueError, StagingRing};
use crate::storage::{CUDA_ALIGNMENT, CudaResource, CudaStorage};
use crate::stream::{EventPool, StreamQueue, StreamState, WaitEvents};

/// Backend information of a CUDA server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaInfo {
    /// The GPU.
    pub device: CudaDevice,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Driver version, e.g. 13000.
    pub driver_version: i32,
}

/// A future that is ready with `value`.
pub(crate) fn ready<T: Send + 'static>(value: T) -> DynFut<T> {
    Box::pin(core::future::ready(value))
}

/// Entries of the [`ResolveCache`]: `1 << RESOLVE_BITS`.
const RESOLVE_BITS: u32 = 6;
const RESOLVE_ENTRIES: usize = 1 << RESOLVE_BITS;

/// A slice range as the [`ResolveCache`] keys it: the slice id, and the offsets of the range from
/// the slice's start and end.
type SliceRange = (u64, u64, u64);

/// The device ranges of recently resolved slice ranges, so that a launch with the buffers of a
/// recent one skips the pools' lookups (two hash lookups and a call through the pool's trait
/// object per binding). Direct-mapped on the slice id, bounded, never invalidated, and sound
/// because of what it is asked with: a lookup comes with a live [`Binding`] of that slice, a
/// live slice keeps its place in its block for as long as it lives (the pools release only free
/// pages and blocks, and rebuild only pools with no live slice; graphs rely on the same), and a
/// slice id is never used again once its slice is freed, so an entry of a freed slice is never
/// asked for. The entries are plain addresses: they keep no memory alive.
#[derive(Debug)]
pub(crate) struct ResolveCache {
    entries: [Option<(SliceRange, CudaResource)>; RESOLVE_ENTRIES],
}

impl Default for ResolveCache {
    fn default() -> Self {
        Self {
            entries: [None; RESOLVE_ENTRIES],
        }
    }
}

impl ResolveCache {
    fn slot(key: SliceRange) -> usize {
        // Fibonacci hashing of the slice id (its low bits are the pool's tag): the product's
        // top `RESOLVE_BITS` bits.
        (key.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (u64::BITS - RESOLVE_BITS)) as usize
    }

    /// The range cached for `key` (slice id, offset from its start, offset from its end).
    #[inline]
    fn get(&self, key: SliceRange) -> Option<CudaResource> {
        match self.entries[Self::slot(key)] {
            Some((k, resource)) if k == key => Some(resource),
            _ => None,
        }
    }

    fn insert(&mut self, key: SliceRange, resource: CudaResource) {
        self.entries[Self::slot(key)] = Some((key, resource));
    }
}

/// The server of one GPU.
pub struct CudaServer {
    pub(crate) device: CudaDevice,
    pub(crate) context: Arc<Context>,
    pub(crate) owner: HandleOwner,
    pub(crate) target: Target,
    pub(crate) streams: Streams<CudaStorage, StreamQueue, Vec<Binding>>,
    pub(crate) resolved: ResolveCache,
    pub(crate) events: EventPool,
    pub(crate) pinned: Arc<PinnedPool>,
    pub(crate) staging: StagingRing,
    /// Where writes of at most [`SMALL_PIECE`](crate::staging::SMALL_PIECE) bytes are staged: a
    /// ring small enough to stay in the core's cache (fresh lines of the large ring cost their
    /// fetch on every write).
    pub(crate) small_staging: StagingRing,
    /// The last staged piece's driver calls handed to the copy team, and their stream.
    pub(crate) issuing: Option<(Arc<Issue>, Raw<sys::CUstream>)>,
    /// Where the issues put their first error, and that error once the server took it.
    pub(crate) issue_errors: IssueError,
    pub(crate) issue_error: Option<ServerError>,
    pub(crate) kernels: KernelCache<CompiledKernel>,
    /// The launch parameter words of the last launch, kept for their capacity: a launch packs
    /// its parameters without allocating.
    pub(crate) launch_words: Vec<u64>,
    /// The `kernelParams` array of the last launch (the parameters' addresses), kept for its
    /// capacity.
    pub(crate) launch_params: Vec<usize>,
    pub(crate) graphs: Graphs<CudaGraph>,
    pub(crate) profiles: HashMap<u64, Raw<sys::CUevent>>,
    pub(crate) next_profile: u64,
    /// One communication stream per group: NCCL calls of two groups issued in different orders
    /// on two devices would deadlock on one shared stream (each device's first call waits for a
    /// peer whose stream is blocked behind the other group's call).
    pub(crate) comm_streams: BTreeMap<Vec<DeviceId>, StreamId>,
    pub(crate) collective_groups: Vec<Vec<DeviceId>>,
}

impl core::fmt::Debug for CudaServer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CudaServer")
            .field("device", &self.device)
            .field("streams", &self.streams.len())
            .field("kernels", &self.kernels.len())
            .finish_non_exhaustive()
    }
}

impl CudaServer {
    pub(crate) fn new(
        device: CudaDevice,
        context: Arc<Context>,
        properties: DeviceProperties,
    ) -> Result<Self, ServerError> {
        use sys::CUdevice_attribute as A;
        let target = Target {
            major: context.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            minor: context.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            driver: crate::driver::driver_version(),
        };
        let pinned = PinnedPool::new(context.clone());
        let events = EventPool::new(WaitEvents::new(context.clone()));
        let owner = HandleOwner::fresh(compute_core::Device::to_id(&device));
        Ok(Self {
            device,
            owner,
            context,
            streams: Streams::new(owner, properties),
            resolved: ResolveCache::default(),
            target,
            events,
            pinned,
            staging: StagingRing::default(),
            small_staging: StagingRing::default(),
            issuing: None,
            issue_errors: IssueError::default(),
            issue_error: None,
            kernels: KernelCache::default(),
            launch_words: Vec::new(),
            launch_params: Vec::new(),
            graphs: Graphs::default(),
            profiles: HashMap::new(),
            next_profile: 1,
            comm_streams: BTreeMap::new(),
            collective_groups: Vec::new(),
        })
    }

    /// The pinned staging pool of this device.
    pub fn pinned_pool(&self) -> &Arc<PinnedPool> {
        &self.pinned
    }

    /// The device range of `binding`: from the resolve cache when the same slice range was
    /// resolved lately, else through the pools (and cached).
    pub(crate) fn resolve(&mut self, binding: &Binding) -> Result<CudaResource, ServerError> {
        binding.check_owner(self.owner)?;
        let handle = binding.handle();
        let key = (
            handle.memory().id().value(),
            handle.slice_offset_start(),
            handle.slice_offset_end(),
        );
        if let Some(found) = self.resolved.get(key) {
            return Ok(found);
        }
        let resource = self.streams.resolve(binding)?;
        self.resolved.insert(key, resource);
        Ok(resource)
    }

    /// The capture rule for `what` on `stream` (the kit's
    /// [`ServerKit::ensure_not_capturing`], which this shadows); binds the context and creates
    /// the stream first, as every caller goes on to the driver.
    pub(crate) fn ensure_not_capturing(
        &mut self,
        stream: StreamId,
        what: &str,
    ) -> Result<(), ServerError> {
        self.stream(stream)?;
        self.streams.ensure_not_capturing(stream, what)
    }
}

/// The kit behind the role traits' defaults: the CUDA streams, graphs and create layout.
impl ServerKit for CudaServer {
    type KitStorage = CudaStorage;
    type KitQueue = StreamQueue;
    type KitCapture = Vec<Binding>;
    type KitGraph = CudaGraph;

    fn kit_streams(&self) -> &Streams<CudaStorage, StreamQueue, Vec<Binding>> {
        &self.streams
    }

    fn kit_parts(
        &mut self,
    ) -> (
        &mut Streams<CudaStorage, StreamQueue, Vec<Binding>>,
        &mut Graphs<CudaGraph>,
    ) {
        (&mut self.streams, &mut self.graphs)
    }

    /// The stream `id` (created on first use), with the device's context bound. What its
    /// completed work kept alive is retired on the way, unless a capture runs on it (a capturing
    /// stream's events are never queried).
    fn stream(&mut self, id: StreamId) -> Result<&mut StreamState, ServerError> {
        self.context.bind()?;
        let state = self
            .streams
            .get_or_create(id, || Ok((CudaStorage::new(), StreamQueue::new()?)))?;
        if state.capture.is_none() {
            state.queue.retire(&mut self.events);
        }
        Ok(state)
    }

    /// The CUDA layout of a `create`: 256-byte starts, 128-byte row pitch (the pools refuse one
    /// allocation above `max_page_size`).
    fn create_rules(&self) -> CreateRules {
        CreateRules {
            alignment: CUDA_ALIGNMENT,
            pitch_alignment: self.streams.properties().pitch_alignment,
        }
    }
}

impl Drop for CudaServer {
    fn drop(&mut self) {
        self.settle_quietly();
        if self.context.bind().is_err() {
            return;
        }
        // A round holding a call of this server still uses its streams and buffers: wait for
        // it to be issued (at most the rendezvous timeout) before they go.
        let groups: Vec<Vec<DeviceId>> = self.comm_streams.keys().cloned().collect();
        for group in groups {
            if let Err(e) = self.await_round(&group) {
                compute_core::error::report_unreturned("a collective round at server drop", &e);
            }
        }
        for (_, state) in self.streams.iter_mut() {
            if let Err(e) = state.queue.wait_idle(&mut self.events) {
                crate::driver::record_release_error(e);
            }
        }
        self.staging.release(&mut self.events);
        self.small_staging.release(&mut self.events);
        self.graphs.drain().for_each(drop);
        for (_, event) in self.profiles.drain() {
            // SAFETY: owned by the server; the streams are idle.
            crate::driver::released("cuEventDestroy", unsafe { result::event::destroy(event.0) });
        }
        for (_, state) in self.streams.drain() {
            // The CUDA stream is synchronized and destroyed first, then its pools are freed.
            let StreamEntry {
                memory,
                capture,
                queue,
            } = state;
            drop(queue);
            drop(memory);
            drop(capture);
        }
        self.kernels.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resolve_cache_answers_only_its_exact_key() {
        let mut cache = ResolveCache::default();
        let range = CudaResource {
            ptr: 0x7f00_0000_1000,
            len: 64,
        };
        assert_eq!(cache.get((17, 0, 0)), None);
        cache.insert((17, 0, 0), range);
        assert_eq!(cache.get((17, 0, 0)), Some(range));
        // Another view of the same slice, or another slice, is not this entry.
        assert_eq!(cache.get((17, 16, 0)), None);
        assert_eq!(cache.get((18, 0, 0)), None);
        // A key mapped to the same slot replaces the entry: the old key misses from then on.
        let other = (1..u64::MAX)
            .find(|&id| {
                id != 17 && ResolveCache::slot((id, 0, 0)) == ResolveCache::slot((17, 0, 0))
            })
            .unwrap();
        let moved = CudaResource {
            ptr: 0x7f00_0000_2000,
            len: 8,
        };
        cache.insert((other, 0, 0), moved);
        assert_eq!(cache.get((other, 0, 0)), Some(moved));
        assert_eq!(cache.get((17, 0, 0)), None);
    }
}
