//! Profiling: a profile is the device time between two CUDA timing events recorded on the
//! stream at `profile_start` and `profile_end`.

use compute_core::backend::ServerKit;
use compute_core::profile::ProfileToken;
use compute_core::server::ProfileFuture;
use compute_core::{
    ProfileDuration, ProfileError, ServerError, ServerProfile, StreamId, TimingMethod,
};
use cudarc::driver::{result, sys};

use crate::driver::{Check, Raw};
use crate::server::{CudaServer, ready};

impl ServerProfile for CudaServer {
    /// `profile_start`: a timing event recorded on `stream`.
    fn profile_start(&mut self, stream: StreamId) -> Result<ProfileToken, ProfileError> {
        self.settle()?;
        self.ensure_not_capturing(stream, "profile")?;
        let raw = self.stream(stream)?.queue.raw;
        let event =
            Raw(result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .check("cuEventCreate")?);
        // SAFETY: event and stream are alive.
        unsafe { result::event::record(event.0, raw.0) }.check("cuEventRecord")?;
        let id = self.next_profile;
        self.next_profile += 1;
        self.profiles.insert(id, event);
        Ok(ProfileToken { id })
    }

    /// `profile_end`: a second timing event; the future waits for it and reads the elapsed time.
    fn profile_end(&mut self, token: ProfileToken, stream: StreamId) -> ProfileFuture {
        let Some(start) = self.profiles.remove(&token.id) else {
            return ready(Err(ProfileError::Unavailable(format!(
                "profile token {} was not started on this server",
                token.id
            ))));
        };
        let end = (|| {
            self.settle()?;
            let raw = self.stream(stream)?.queue.raw;
            let end = Raw(result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .check("cuEventCreate")?);
            // SAFETY: event and stream are alive.
            unsafe { result::event::record(end.0, raw.0) }.check("cuEventRecord")?;
            Ok::<_, ServerError>(end)
        })();
        let context = self.context.clone();
        Box::pin(async move {
            let (start, end) = (start, end);
            let outcome = end.and_then(|end| {
                context.bind()?;
                // SAFETY: both events were recorded and are owned by this future.
                let waited = unsafe { result::event::synchronize(end.0) }.check("profile end");
                let elapsed = waited.and_then(|()| {
                    // SAFETY: both events were recorded and have completed.
                    unsafe { result::event::elapsed(start.0, end.0) }.check("cuEventElapsedTime")
                });
                // SAFETY: owned here, destroyed once.
                crate::driver::released("cuEventDestroy", unsafe { result::event::destroy(end.0) });
                elapsed
            });
            // SAFETY: owned here, destroyed once.
            crate::driver::released("cuEventDestroy", unsafe { result::event::destroy(start.0) });
            let ms = outcome?;
            Ok(ProfileDuration {
                duration: core::time::Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3),
                timing: TimingMethod::Device,
            })
        })
    }
}
