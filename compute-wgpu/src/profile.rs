//! Profiles: two timestamps written into the batch around the profiled work, resolved and read
//! back once it completed (device timing), or the host's clock around a sync where the device
//! has no timestamp queries.

use compute_core::profile::{ProfileToken, device_profile, end_profile, start_profile};
use compute_core::server::ProfileFuture;
use compute_core::{ProfileError, ServerError, ServerProfile, StreamId};

use crate::batch::Command;
use crate::poller::gone;
use crate::server::{WgpuServer, ready};
use crate::storage::WgpuResource;
use crate::transfer::map_read;

impl ServerProfile for WgpuServer {
    /// `profile_start`: a timestamp into the batch, when the device has timestamp queries.
    fn profile_start(&mut self, stream: StreamId) -> Result<ProfileToken, ProfileError> {
        start_profile(self, stream, |s| &mut s.profiles, Self::start_timestamps)
    }

    /// `profile_end`: the closing timestamp, resolved and read back; the host's clock around a
    /// sync without timestamp queries.
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

impl WgpuServer {
    /// The opening timestamp of a profile, into the batch, when the device has timestamp
    /// queries.
    fn start_timestamps(&mut self) -> Result<Option<wgpu::QuerySet>, ProfileError> {
        if !self.timestamps {
            return Ok(None);
        }
        let set = self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("compute-wgpu profile"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        self.push(Command::Timestamp {
            set: set.clone(),
            index: 0,
        });
        Ok(Some(set))
    }

    /// The device-timed end of a profile: the closing timestamp, then the two read back.
    fn finish_timestamps(&mut self, set: wgpu::QuerySet) -> ProfileFuture {
        let recorded = (|| {
            self.push(Command::Timestamp {
                set: set.clone(),
                index: 1,
            });
            let size = 2 * u64::from(wgpu::QUERY_SIZE);
            let resolve = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("compute-wgpu timestamps"),
                size,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            self.push(Command::Resolve {
                set,
                count: 2,
                dst: resolve.clone(),
            });
            let source = WgpuResource {
                buffer: resolve,
                offset: 0,
                size,
            };
            let (staging, _) = self.stage_read(&source, size)?;
            let index = self.submit_always()?;
            Ok::<_, ServerError>((staging, index))
        })();
        let (staging, index) = match recorded {
            Ok(r) => r,
            Err(e) => return ready(Err(e.into())),
        };
        let mapped = map_read(&staging);
        self.poller.wait(index, None);
        let period = f64::from(self.queue.get_timestamp_period());
        let errors = self.errors.clone();
        Box::pin(async move {
            mapped
                .await
                .ok_or_else(gone)?
                .map_err(|e| ServerError::Driver(format!("mapping the timestamps: {e}")))?;
            let ticks = {
                let view = staging
                    .slice(..)
                    .get_mapped_range()
                    .map_err(|e| ServerError::Driver(format!("reading the timestamps: {e}")))?;
                let stamps: [u64; 2] = bytemuck::pod_read_unaligned(&view[..16]);
                stamps[1].saturating_sub(stamps[0])
            };
            staging.unmap();
            if let Some(e) = compute_core::error::take_first(&mut errors.lock()) {
                return Err(e.into());
            }
            Ok(device_profile(ticks, period))
        })
    }
}
