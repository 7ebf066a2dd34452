//! Cached descriptor sets: launches of a pipeline over the same buffer ranges bind the same set,
//! written once, so a steady-state launch costs one `vkCmdBindDescriptorSets`.
//!
//! Sets come from pools that live as long as any batch or graph that bound one of their sets
//! (`Arc`). The cache is dropped whole when a storage block is freed (a stale set would point at
//! it) or when it grows past its limit.

use std::sync::Arc;

use ash::vk;
use compute_core::ServerError;
use hashbrown::HashMap;

use crate::context::Context;

/// Sets per descriptor pool.
const SETS_PER_POOL: u32 = 1024;
/// Storage buffer descriptors per descriptor pool.
const DESCRIPTORS_PER_POOL: u32 = 16 * SETS_PER_POOL;
/// Cached sets before the cache starts over.
const MAX_CACHED: usize = 64 * 1024;

/// One descriptor pool, destroyed when the last batch or graph using its sets lets go.
pub(crate) struct DescriptorPool {
    ctx: Arc<Context>,
    pool: vk::DescriptorPool,
}

impl Drop for DescriptorPool {
    fn drop(&mut self) {
        // SAFETY: every holder of a set of this pool keeps the pool alive until its work
        // completed.
        unsafe { self.ctx.device.destroy_descriptor_pool(self.pool, None) };
    }
}

/// A bound range, as the cache compares it.
pub(crate) type Range = (vk::Buffer, u64, u64);

struct Entry {
    pipeline: u64,
    ranges: Vec<Range>,
    set: vk::DescriptorSet,
    pool: Arc<DescriptorPool>,
}

/// The cache of one server.
pub(crate) struct DescriptorCache {
    ctx: Arc<Context>,
    entries: HashMap<u64, Vec<Entry>>,
    /// The set returned last (repeated launches skip hashing and the bucket search).
    last: Option<Entry>,
    count: usize,
    pools: Vec<Arc<DescriptorPool>>,
    left_in_pool: u32,
}

fn key(pipeline: u64, ranges: &[Range]) -> u64 {
    // FNV-1a over the words: cheap and good enough to spread buckets (entries are compared).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |x: u64| {
        h ^= x;
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    mix(pipeline);
    for &(b, o, r) in ranges {
        mix(ash::vk::Handle::as_raw(b));
        mix(o);
        mix(r);
    }
    h
}

impl DescriptorCache {
    pub(crate) fn new(ctx: &Arc<Context>) -> Self {
        Self {
            ctx: ctx.clone(),
            entries: HashMap::new(),
            last: None,
            count: 0,
            pools: Vec::new(),
            left_in_pool: 0,
        }
    }

    /// The set of `pipeline` (with `layout`) over `ranges` (binding `k` for range `k`), and the
    /// pool it lives in.
    pub(crate) fn get(
        &mut self,
        pipeline: u64,
        layout: vk::DescriptorSetLayout,
        ranges: &[Range],
    ) -> Result<(vk::DescriptorSet, &Arc<DescriptorPool>), ServerError> {
        let same_as_last = self
            .last
            .as_ref()
            .is_some_and(|e| e.pipeline == pipeline && e.ranges == ranges);
        if !same_as_last {
            let (set, pool) = self.lookup(pipeline, layout, ranges)?;
            let pool = pool.clone();
            let mut kept = self.last.take().map(|e| e.ranges).unwrap_or_default();
            kept.clear();
            kept.extend_from_slice(ranges);
            self.last = Some(Entry {
                pipeline,
                ranges: kept,
                set,
                pool,
            });
        }
        let last = self
            .last
            .as_ref()
            .unwrap_or_else(|| unreachable!("matched or set above"));
        Ok((last.set, &last.pool))
    }

    /// [`get`](Self::get) through the map.
    fn lookup(
        &mut self,
        pipeline: u64,
        layout: vk::DescriptorSetLayout,
        ranges: &[Range],
    ) -> Result<(vk::DescriptorSet, &Arc<DescriptorPool>), ServerError> {
        let k = key(pipeline, ranges);
        let found = self.entries.get(&k).and_then(|bucket| {
            bucket
                .iter()
                .position(|e| e.pipeline == pipeline && e.ranges == ranges)
        });
        if found.is_none() {
            let (set, pool) = self.allocate(layout)?;
            let infos: Vec<vk::DescriptorBufferInfo> = ranges
                .iter()
                .map(|&(b, o, r)| {
                    vk::DescriptorBufferInfo::default()
                        .buffer(b)
                        .offset(o)
                        .range(r)
                })
                .collect();
            let writes: Vec<vk::WriteDescriptorSet> = infos
                .iter()
                .enumerate()
                .map(|(i, info)| {
                    vk::WriteDescriptorSet::default()
                        .dst_set(set)
                        .dst_binding(i as u32)
                        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                        .buffer_info(core::slice::from_ref(info))
                })
                .collect();
            // SAFETY: the set is fresh (not in use); the buffers are live blocks.
            unsafe { self.ctx.device.update_descriptor_sets(&writes, &[]) };
            self.entries.entry(k).or_default().push(Entry {
                pipeline,
                ranges: ranges.to_vec(),
                set,
                pool,
            });
            self.count += 1;
        }
        let bucket = self
            .entries
            .get(&k)
            .unwrap_or_else(|| unreachable!("found or inserted above"));
        let entry = match found {
            Some(i) => &bucket[i],
            None => bucket
                .last()
                .unwrap_or_else(|| unreachable!("inserted above")),
        };
        Ok((entry.set, &entry.pool))
    }

    fn allocate(
        &mut self,
        layout: vk::DescriptorSetLayout,
    ) -> Result<(vk::DescriptorSet, Arc<DescriptorPool>), ServerError> {
        for attempt in 0..2 {
            if self.left_in_pool == 0 || attempt == 1 {
                let sizes = [vk::DescriptorPoolSize::default()
                    .ty(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(DESCRIPTORS_PER_POOL)];
                let info = vk::DescriptorPoolCreateInfo::default()
                    .max_sets(SETS_PER_POOL)
                    .pool_sizes(&sizes);
                // SAFETY: a valid create info.
                let pool = unsafe { self.ctx.device.create_descriptor_pool(&info, None) }.map_err(
                    |e| ServerError::Driver(format!("vkCreateDescriptorPool failed: {e}")),
                )?;
                self.pools.push(Arc::new(DescriptorPool {
                    ctx: self.ctx.clone(),
                    pool,
                }));
                self.left_in_pool = SETS_PER_POOL;
            }
            let pool = self
                .pools
                .last()
                .unwrap_or_else(|| unreachable!("a pool was made above"))
                .clone();
            let layouts = [layout];
            let info = vk::DescriptorSetAllocateInfo::default()
                .descriptor_pool(pool.pool)
                .set_layouts(&layouts);
            // SAFETY: the pool is only used from the server's thread (under its lock).
            match unsafe { self.ctx.device.allocate_descriptor_sets(&info) } {
                Ok(sets) => {
                    self.left_in_pool -= 1;
                    return Ok((sets[0], pool));
                }
                Err(vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL)
                    if attempt == 0 => {}
                Err(e) => {
                    return Err(ServerError::Driver(format!(
                        "vkAllocateDescriptorSets failed: {e}"
                    )));
                }
            }
        }
        unreachable!("the second attempt returns")
    }

    /// Whether the cache reached its limit (the server then clears it).
    pub(crate) fn is_full(&self) -> bool {
        self.count >= MAX_CACHED
    }

    /// Forget every set; the pools go to the caller, to be released once the work that may use
    /// their sets has completed.
    pub(crate) fn clear(&mut self) -> Vec<Arc<DescriptorPool>> {
        self.entries.clear();
        self.last = None;
        self.count = 0;
        self.left_in_pool = 0;
        core::mem::take(&mut self.pools)
    }
}
