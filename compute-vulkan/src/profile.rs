//! Profiles: two timestamp queries around the profiled work when the device has timestamps, the
//! host clock around a sync otherwise.

use std::sync::Arc;

use ash::vk;
use compute_core::profile::{ProfileToken, device_profile, end_profile, start_profile};
use compute_core::server::ProfileFuture;
use compute_core::{ProfileError, ServerError, ServerProfile, StreamId};

use crate::batch::stage;
use crate::context::Context;
use crate::server::{VulkanServer, ready};

pub(crate) struct QueryPool {
    ctx: Arc<Context>,
    pool: vk::QueryPool,
}

impl Drop for QueryPool {
    fn drop(&mut self) {
        // SAFETY: dropped after the submission writing it completed (or never submitted).
        unsafe { self.ctx.device.destroy_query_pool(self.pool, None) };
    }
}

impl VulkanServer {
    fn profile_queries(&mut self) -> Result<QueryPool, ServerError> {
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(2);
        // SAFETY: a valid create info.
        let pool = unsafe { self.ctx.device.create_query_pool(&info, None) }
            .map_err(|e| ServerError::Driver(format!("vkCreateQueryPool failed: {e}")))?;
        Ok(QueryPool {
            ctx: self.ctx.clone(),
            pool,
        })
    }

    fn timestamp(&mut self, pool: vk::QueryPool, index: u32) -> Result<(), ServerError> {
        // The pool has 2 queries and is kept until the profile is read.
        let mut rec = self.recorder.command(stage::ALL);
        if index == 0 {
            rec.reset_queries(pool, 0, 2);
        }
        rec.timestamp(pool, index);
        Ok(())
    }
}

impl ServerProfile for VulkanServer {
    /// [`ServerProfile::profile_start`](compute_core::ServerProfile::profile_start).
    fn profile_start(&mut self, stream: StreamId) -> Result<ProfileToken, ProfileError> {
        start_profile(self, stream, |s| &mut s.profiles, Self::start_timestamps)
    }

    /// [`ServerProfile::profile_end`](compute_core::ServerProfile::profile_end).
    fn profile_end(&mut self, token: ProfileToken, stream: StreamId) -> ProfileFuture {
        end_profile(
            self,
            |s| &mut s.profiles,
            token,
            stream,
            Self::finish_timestamps,
        )
    }
}

impl VulkanServer {
    /// The opening timestamp of a profile, when the device has timestamp queries.
    fn start_timestamps(&mut self) -> Result<Option<QueryPool>, ProfileError> {
        if !self.properties.features.device_timestamps {
            return Ok(None);
        }
        let pool = self.profile_queries()?;
        self.timestamp(pool.pool, 0)?;
        Ok(Some(pool))
    }

    /// The device-timed end of a profile: the closing timestamp, then the two read back.
    fn finish_timestamps(&mut self, queries: QueryPool) -> ProfileFuture {
        let recorded = (|| {
            self.timestamp(queries.pool, 1)?;
            self.submit_or_last()
        })();
        let value = match recorded {
            Ok(v) => v,
            Err(e) => {
                // The pool may be referenced by the open batch.
                self.recorder.keep_until_done(queries);
                return ready(Err(e.into()));
            }
        };
        let ctx = self.ctx.clone();
        let errors = self.errors.clone();
        let period = f64::from(self.info.timestamp_period_ns);
        let bits = ctx.timestamp_valid_bits;
        Box::pin(async move {
            ctx.wait(value)?;
            let mut stamps = [0u64; 2];
            // SAFETY: both queries were written by the completed submission.
            unsafe {
                ctx.device.get_query_pool_results(
                    queries.pool,
                    0,
                    &mut stamps,
                    vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
                )
            }
            .map_err(|e| ServerError::Driver(format!("vkGetQueryPoolResults failed: {e}")))?;
            drop(queries);
            if let Some(e) = compute_core::error::take_first(&mut errors.lock()) {
                return Err(e.into());
            }
            let mask = if bits >= 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
            let ticks = (stamps[1] & mask).wrapping_sub(stamps[0] & mask) & mask;
            Ok(device_profile(ticks, period))
        })
    }
}
