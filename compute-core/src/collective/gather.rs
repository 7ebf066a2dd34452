//! Gathering the per-device calls of a collective into rounds, for a driver that must be given
//! every device a thread drives in one group call.
//!
//! A client issues a collective one device at a time (`all_reduce` on the client of device 0,
//! then on the client of device 1, often from one thread). NCCL may block inside each device's
//! call until the other devices' calls arrive, so one thread driving several devices must hand
//! them all to NCCL inside one `ncclGroupStart`/`ncclGroupEnd`. [`Gathered`] is the meeting point
//! that makes this correct by construction, whatever the threads: each device's call *arrives*
//! with its part; the arrival that completes a round (every device of the group in this process)
//! issues the whole round at once, under the gatherer's lock, so rounds are issued in order and a
//! later round never overtakes an earlier one. Nobody blocks on arrival: a device that needs the
//! round's result [`wait`](Gathered::wait)s for it to be issued, at most a timeout (the wait that
//! would otherwise hang, when one thread waits on a device before it issued the others' calls,
//! fails with [`CollectiveError::Timeout`] instead).

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hashbrown::HashMap;

use super::CollectiveError;
use crate::device::DeviceId;
use crate::error::ServerError;

/// What an arrival did.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival {
    /// The call joined `round`, which waits for other devices of the group.
    Waiting {
        /// The round, per group from 1.
        round: u64,
    },
    /// The call completed `round`, which was issued.
    Issued {
        /// The round, per group from 1.
        round: u64,
    },
}

/// A group and a round of it.
type RoundKey = (Vec<DeviceId>, u64);
/// A group and a device of it.
type MemberKey = (Vec<DeviceId>, DeviceId);

struct State<T> {
    /// The last round each device joined, per group.
    joined: HashMap<MemberKey, u64>,
    /// The last round issued (or failed) per group.
    done: HashMap<Vec<DeviceId>, u64>,
    /// The calls of each round still waiting, in arrival order.
    open: HashMap<RoundKey, Vec<(DeviceId, T)>>,
    /// A failure of an issued round not yet returned to a device of it.
    failures: HashMap<MemberKey, ServerError>,
}

/// The meeting point of one collective's per-device calls (see the [module docs](self)).
pub struct Gathered<T> {
    state: Mutex<State<T>>,
    issued: Condvar,
}

impl<T> Default for Gathered<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Gathered<T> {
    /// A gatherer with no round.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State {
                joined: HashMap::new(),
                done: HashMap::new(),
                open: HashMap::new(),
                failures: HashMap::new(),
            }),
            issued: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `device`'s call of its next round of `group` (sorted, without repeats, every device of
    /// the group in this process). When it completes the round, `issue` is given the round
    /// number and every call of the round in `group` order, and issues them (under the
    /// gatherer's lock: rounds are issued one at a time, in order).
    ///
    /// # Errors
    /// [`CollectiveError::NotInGroup`] when `device` is not in `group`; the error of `issue`
    /// (which the other devices of the round get from their next [`wait`](Self::wait)).
    pub fn arrive(
        &self,
        group: &[DeviceId],
        device: DeviceId,
        call: T,
        issue: impl FnOnce(u64, Vec<(DeviceId, T)>) -> Result<(), ServerError>,
    ) -> Result<Arrival, ServerError> {
        if !group.contains(&device) {
            return Err(CollectiveError::NotInGroup {
                group: group.to_vec(),
                device,
            }
            .into());
        }
        let mut state = self.lock();
        let joined = state.joined.entry((group.to_vec(), device)).or_insert(0);
        *joined += 1;
        let round = *joined;
        let calls = state.open.entry((group.to_vec(), round)).or_default();
        calls.push((device, call));
        if calls.len() < group.len() {
            return Ok(Arrival::Waiting { round });
        }
        let mut calls = state
            .open
            .remove(&(group.to_vec(), round))
            .unwrap_or_default();
        calls.sort_by_key(|(d, _)| group.iter().position(|g| g == d));
        let members: Vec<DeviceId> = calls.iter().map(|(d, _)| *d).collect();
        let outcome = issue(round, calls);
        if let Err(e) = &outcome {
            for other in members.into_iter().filter(|d| *d != device) {
                state
                    .failures
                    .entry((group.to_vec(), other))
                    .or_insert_with(|| e.clone());
            }
        }
        state.done.insert(group.to_vec(), round);
        drop(state);
        self.issued.notify_all();
        outcome.map(|()| Arrival::Issued { round })
    }

    /// Whether `device` joined a round of `group` that is not issued yet.
    pub fn pending(&self, group: &[DeviceId], device: DeviceId) -> bool {
        let state = self.lock();
        Self::waiting_round(&state, group, device).is_some()
    }

    fn waiting_round(state: &State<T>, group: &[DeviceId], device: DeviceId) -> Option<u64> {
        let joined = state
            .joined
            .get(&(group.to_vec(), device))
            .copied()
            .unwrap_or(0);
        let done = state.done.get(group).copied().unwrap_or(0);
        (joined > done).then_some(joined)
    }

    /// Block until every round of `group` that `device` joined is issued, at most `timeout`.
    ///
    /// # Errors
    /// The failure of an issued round `device` was part of (once); [`CollectiveError::Timeout`]
    /// when a round is still waiting for other devices after `timeout`.
    pub fn wait(
        &self,
        group: &[DeviceId],
        device: DeviceId,
        timeout: Duration,
    ) -> Result<(), ServerError> {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        loop {
            let Some(round) = Self::waiting_round(&state, group, device) else {
                return match state.failures.remove(&(group.to_vec(), device)) {
                    Some(e) => Err(e),
                    None => Ok(()),
                };
            };
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<String> = {
                    let arrived: Vec<DeviceId> = state
                        .open
                        .get(&(group.to_vec(), round))
                        .map(|calls| calls.iter().map(|(d, _)| *d).collect())
                        .unwrap_or_default();
                    group
                        .iter()
                        .filter(|d| !arrived.contains(d))
                        .map(|d| d.to_string())
                        .collect()
                };
                return Err(CollectiveError::Timeout {
                    waiting_for: format!(
                        "round {round} of the collective over {group:?} on device {device}: \
                         devices {} have not issued it (a thread that drives several devices \
                         issues the collective on each of them before it waits on one)",
                        missing.join(", ")
                    ),
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                }
                .into());
            }
            state = self
                .issued
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::MismatchKind;

    fn dev(i: u32) -> DeviceId {
        DeviceId::new(7, i)
    }

    type Log = std::sync::Arc<Mutex<Vec<(u64, Vec<(DeviceId, &'static str)>)>>>;

    fn issue_into(
        log: &Log,
    ) -> impl FnOnce(u64, Vec<(DeviceId, &'static str)>) -> Result<(), ServerError> + '_ {
        move |round, calls| {
            log.lock().unwrap().push((round, calls));
            Ok(())
        }
    }

    #[test]
    fn one_thread_driving_three_devices_issues_each_round_once_complete() {
        let g = Gathered::new();
        let group = [dev(0), dev(1), dev(2)];
        let log: Log = Default::default();
        // Round 1 in the order 2, 0, 1; device 0 already joins round 2 before round 1 is done.
        assert_eq!(
            g.arrive(&group, dev(2), "a2", issue_into(&log)).unwrap(),
            Arrival::Waiting { round: 1 }
        );
        assert_eq!(
            g.arrive(&group, dev(0), "a0", issue_into(&log)).unwrap(),
            Arrival::Waiting { round: 1 }
        );
        assert_eq!(
            g.arrive(&group, dev(0), "b0", issue_into(&log)).unwrap(),
            Arrival::Waiting { round: 2 }
        );
        assert!(
            log.lock().unwrap().is_empty(),
            "nothing issued before the round is whole"
        );
        assert!(g.pending(&group, dev(0)) && g.pending(&group, dev(2)));
        assert_eq!(
            g.arrive(&group, dev(1), "a1", issue_into(&log)).unwrap(),
            Arrival::Issued { round: 1 }
        );
        // Issued once, every call in group order.
        assert_eq!(
            log.lock().unwrap().as_slice(),
            &[(1, vec![(dev(0), "a0"), (dev(1), "a1"), (dev(2), "a2")])]
        );
        assert!(!g.pending(&group, dev(2)));
        assert!(g.pending(&group, dev(0)), "device 0 is in round 2");
        g.wait(&group, dev(1), Duration::ZERO).unwrap();
        g.arrive(&group, dev(1), "b1", issue_into(&log)).unwrap();
        assert_eq!(
            g.arrive(&group, dev(2), "b2", issue_into(&log)).unwrap(),
            Arrival::Issued { round: 2 }
        );
        assert_eq!(log.lock().unwrap().len(), 2);
        assert_eq!(log.lock().unwrap()[1].0, 2);
        g.wait(&group, dev(0), Duration::ZERO).unwrap();
    }

    #[test]
    fn two_groups_in_opposite_orders_do_not_wait_for_each_other() {
        let g = Gathered::new();
        let (a, b) = ([dev(0), dev(1)], [dev(0), dev(1), dev(2)]);
        let log: Log = Default::default();
        g.arrive(&a, dev(0), "a0", issue_into(&log)).unwrap();
        g.arrive(&b, dev(1), "b1", issue_into(&log)).unwrap();
        g.arrive(&b, dev(2), "b2", issue_into(&log)).unwrap();
        g.arrive(&b, dev(0), "b0", issue_into(&log)).unwrap();
        g.arrive(&a, dev(1), "a1", issue_into(&log)).unwrap();
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!(
            log[0].1,
            vec![(dev(0), "b0"), (dev(1), "b1"), (dev(2), "b2")]
        );
        assert_eq!(log[1].1, vec![(dev(0), "a0"), (dev(1), "a1")]);
    }

    #[test]
    fn waiting_on_a_device_before_the_others_issued_times_out_with_the_missing_devices() {
        let g = Gathered::<()>::new();
        let group = [dev(0), dev(1)];
        g.arrive(&group, dev(0), (), |_, _| Ok(())).unwrap();
        let started = Instant::now();
        let e = g
            .wait(&group, dev(0), Duration::from_millis(30))
            .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(30));
        match e {
            ServerError::Collective(CollectiveError::Timeout {
                waiting_for,
                timeout_ms,
            }) => {
                assert_eq!(timeout_ms, 30);
                assert!(waiting_for.contains("round 1"), "{waiting_for}");
                assert!(waiting_for.contains(&dev(1).to_string()), "{waiting_for}");
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        // A device outside the group is refused.
        assert!(matches!(
            g.arrive(&group, dev(5), (), |_, _| Ok(())),
            Err(ServerError::Collective(CollectiveError::NotInGroup { .. }))
        ));
    }

    #[test]
    fn a_wait_on_another_thread_returns_once_the_round_is_issued() {
        let g = std::sync::Arc::new(Gathered::<u32>::new());
        let group = [dev(0), dev(1)];
        g.arrive(&group, dev(0), 0, |_, _| Ok(())).unwrap();
        let waiter = {
            let g = g.clone();
            std::thread::spawn(move || g.wait(&group, dev(0), Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(20));
        g.arrive(&group, dev(1), 1, |_, calls| {
            assert_eq!(calls, vec![(dev(0), 0), (dev(1), 1)]);
            Ok(())
        })
        .unwrap();
        waiter.join().unwrap().unwrap();
    }

    #[test]
    fn a_failed_issue_reaches_every_device_of_the_round_once() {
        let g = Gathered::<u64>::new();
        let group = [dev(0), dev(1)];
        g.arrive(&group, dev(0), 16, |_, _| Ok(())).unwrap();
        let mismatch = |round| {
            ServerError::from(CollectiveError::Mismatch {
                round,
                kind: MismatchKind::Size,
                expected: "16".into(),
                found: "32".into(),
                participant: "device 1".into(),
            })
        };
        let e = g
            .arrive(&group, dev(1), 32, |round, _| Err(mismatch(round)))
            .unwrap_err();
        assert_eq!(e, mismatch(1));
        assert_eq!(g.wait(&group, dev(0), Duration::ZERO), Err(mismatch(1)));
        // Reported once; the completer got it from its own call.
        assert_eq!(g.wait(&group, dev(0), Duration::ZERO), Ok(()));
        assert_eq!(g.wait(&group, dev(1), Duration::ZERO), Ok(()));
        // The next round starts clean.
        g.arrive(&group, dev(0), 8, |_, _| Ok(())).unwrap();
        assert_eq!(
            g.arrive(&group, dev(1), 8, |_, _| Ok(())),
            Ok(Arrival::Issued { round: 2 })
        );
    }
}
