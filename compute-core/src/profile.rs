//! Profiling results.

use core::time::Duration;

use serde::{Deserialize, Serialize};

/// Where a duration was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TimingMethod {
    /// Device timestamps (CUDA events, timestamp queries): device time only.
    Device,
    /// The host's clock around a full sync: includes launch and synchronisation costs.
    Host,
}

impl TimingMethod {
    /// How a backend times its profiles: with device timestamps where the device has them, with
    /// the host's clock around a sync where it has none.
    pub fn with_timestamps(device_timestamps: bool) -> Self {
        if device_timestamps {
            TimingMethod::Device
        } else {
            TimingMethod::Host
        }
    }
}

/// The duration of profiled work and how it was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileDuration {
    /// The measured time.
    pub duration: Duration,
    /// How it was measured.
    pub timing: TimingMethod,
}

/// A profile in progress on a stream, as returned by a server's `profile_start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProfileToken {
    /// Backend-defined id of the start mark.
    pub id: u64,
}

/// The profiles a server has started and not ended: for each token, the host time it started at
/// and the backend's device-timestamp state `Q` (none where the device has no timestamps).
#[derive(Debug)]
pub struct ProfileTable<Q> {
    next: u64,
    open: hashbrown::HashMap<u64, (std::time::Instant, Option<Q>)>,
}

impl<Q> Default for ProfileTable<Q> {
    fn default() -> Self {
        Self {
            next: 1,
            open: hashbrown::HashMap::new(),
        }
    }
}

impl<Q> ProfileTable<Q> {
    /// Start a profile now, with the device timestamps `queries` recorded for it.
    pub fn start(&mut self, queries: Option<Q>) -> ProfileToken {
        let id = self.next;
        self.next += 1;
        self.open.insert(id, (std::time::Instant::now(), queries));
        ProfileToken { id }
    }

    /// Drop every open profile (and its device timestamps), e.g. before the device goes away.
    pub fn clear(&mut self) {
        self.open.clear();
    }

    /// End the profile of `token`: its host start time and device timestamps.
    ///
    /// # Errors
    /// [`ProfileError::Unavailable`] for a token this table did not start (or already ended).
    pub fn end(
        &mut self,
        token: ProfileToken,
    ) -> Result<(std::time::Instant, Option<Q>), crate::ProfileError> {
        self.open.remove(&token.id).ok_or_else(|| {
            crate::ProfileError::Unavailable(format!(
                "profile token {} was not started on this server",
                token.id
            ))
        })
    }
}

/// The host-timed result of a profile started at `start`: the time until `done` (a sync of the
/// profiled stream) completes.
pub fn host_profile(
    start: std::time::Instant,
    done: crate::future::DynFut<Result<(), crate::ServerError>>,
) -> crate::future::DynFut<Result<ProfileDuration, crate::ProfileError>> {
    Box::pin(async move {
        done.await?;
        Ok(ProfileDuration {
            duration: start.elapsed(),
            timing: TimingMethod::Host,
        })
    })
}

/// `profile_start` by the rule every backend with a [`ProfileTable`] shares: refused while a
/// capture runs on `stream` (the kit's capture rule), then a profile started in the table
/// `table` picks out of `server`, with the device timestamps `device` records for it (`None`
/// where the device has no timestamp queries: [`end_profile`] then times it on the host).
///
/// # Errors
/// [`CaptureError::Running`](crate::CaptureError::Running), or the error of `device`.
pub fn start_profile<S: crate::backend::ServerKit, Q>(
    server: &mut S,
    stream: crate::StreamId,
    table: impl FnOnce(&mut S) -> &mut ProfileTable<Q>,
    device: impl FnOnce(&mut S) -> Result<Option<Q>, crate::ProfileError>,
) -> Result<ProfileToken, crate::ProfileError> {
    server.ensure_not_capturing(stream, "profile")?;
    let queries = device(server)?;
    Ok(table(server).start(queries))
}

/// `profile_end` by the rule every backend with a [`ProfileTable`] shares: end `token` in the
/// table `table` picks out of `server`; a profile started without device timestamps (`None`, a
/// device without timestamp queries) is timed on the host until a sync of `stream` completes,
/// one started with timestamps `Q` is finished by `device` (its closing timestamp and readback).
/// An unknown token is [`ProfileError::Unavailable`](crate::ProfileError::Unavailable).
pub fn end_profile<S: crate::ComputeServer, Q>(
    server: &mut S,
    table: impl FnOnce(&mut S) -> &mut ProfileTable<Q>,
    token: ProfileToken,
    stream: crate::StreamId,
    device: impl FnOnce(
        &mut S,
        Q,
    ) -> crate::future::DynFut<Result<ProfileDuration, crate::ProfileError>>,
) -> crate::future::DynFut<Result<ProfileDuration, crate::ProfileError>> {
    match table(server).end(token) {
        Ok((_, Some(queries))) => device(server, queries),
        Ok((start, None)) => host_profile(start, server.sync(stream)),
        Err(e) => Box::pin(core::future::ready(Err(e))),
    }
}

/// A device-timed result from a timestamp difference of `ticks` of `period_ns` nanoseconds. One
/// tick is the resolution: work that fits in it is reported as one tick.
pub fn device_profile(ticks: u64, period_ns: f64) -> ProfileDuration {
    let nanos = (ticks.max(1) as f64 * period_ns).max(1.0);
    ProfileDuration {
        duration: Duration::from_nanos(nanos.round() as u64),
        timing: TimingMethod::Device,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_tokens_are_unique_and_end_once() {
        let mut t: ProfileTable<u32> = ProfileTable::default();
        let a = t.start(Some(7));
        let b = t.start(None);
        assert_ne!(a, b);
        assert_eq!(t.end(b).unwrap().1, None);
        assert_eq!(t.end(a).unwrap().1, Some(7));
        assert!(matches!(t.end(a), Err(crate::ProfileError::Unavailable(_))));
    }

    #[test]
    fn device_durations_round_and_floor_at_one_tick() {
        assert_eq!(device_profile(0, 1.0).duration, Duration::from_nanos(1));
        assert_eq!(device_profile(10, 2.5).duration, Duration::from_nanos(25));
        assert_eq!(device_profile(3, 0.1).timing, TimingMethod::Device);
        assert_eq!(device_profile(3, 0.1).duration, Duration::from_nanos(1));
    }

    #[test]
    fn host_durations_wait_for_the_sync() {
        let start = std::time::Instant::now();
        let done: crate::future::DynFut<Result<(), crate::ServerError>> = Box::pin(async {
            std::thread::sleep(Duration::from_millis(5));
            Ok(())
        });
        let d = crate::future::block_on(host_profile(start, done)).unwrap();
        assert!(d.duration >= Duration::from_millis(5));
        assert_eq!(d.timing, TimingMethod::Host);
        let failed: crate::future::DynFut<Result<(), crate::ServerError>> =
            Box::pin(async { Err(crate::ServerError::Driver("x".into())) });
        assert!(crate::future::block_on(host_profile(start, failed)).is_err());
    }
}
