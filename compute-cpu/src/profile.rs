//! Profiling: the CPU's device time is host time from `profile_start` to the stream's sync
//! marker after `profile_end`.

use compute_core::profile::{ProfileToken, host_profile, start_profile};
use compute_core::server::ProfileFuture;
use compute_core::{ComputeServer, ProfileError, ServerProfile, StreamId};

use crate::server::CpuServer;

impl ServerProfile for CpuServer {
    fn profile_start(&mut self, stream: StreamId) -> Result<ProfileToken, ProfileError> {
        start_profile(self, stream, |s| &mut s.profiles, |_| Ok(None))
    }

    fn profile_end(&mut self, token: ProfileToken, stream: StreamId) -> ProfileFuture {
        match self.profiles.end(token) {
            Ok((start, _)) => host_profile(start, self.sync(stream)),
            Err(e) => Box::pin(core::future::ready(Err(e))),
        }
    }
}
