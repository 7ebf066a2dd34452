//! Collectives: reduction operations, a host-staged rendezvous for backends without a
//! collective library (CPU, wgpu, Vulkan), and (in [`world`]) the rendezvous and transport that
//! join processes into one world, which every backend uses.
//!
//! Size: the reduction operations, the argument checks and the host rendezvous share the group
//! and round types defined here; about a third of the file is their unit tests.

use core::hash::Hash;
use core::time::Duration;
use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

use crate::device::DeviceId;
use crate::elem::ElemType;
use crate::error::ServerError;
use crate::future::{DynFut, Receiver, Sender};
use crate::handle::Binding;
use crate::memory::SliceId;

mod error;
pub mod gather;
pub mod launch;
mod wire;
pub mod world;

pub use error::{CollectiveError, MismatchKind};
pub use gather::{Arrival, Gathered};
pub use world::{World, WorldConfig, init_world, init_world_from_env};

/// The environment variable that turns on the checked mode of collective libraries (NCCL):
/// `COMPUTE_COLLECTIVE_CHECK=1`. The host-staged backends always check.
pub const CHECK_VAR: &str = "COMPUTE_COLLECTIVE_CHECK";

/// 0: not read yet; 1: off; 2: on.
static CHECKED: AtomicU8 = AtomicU8::new(0);

/// Whether collectives run in the checked mode: participants exchange a small header (round,
/// element type, operation, size) before each round, so that a disagreement is an error on every
/// participant rather than undefined behaviour of the collective library. Read from
/// [`CHECK_VAR`] unless [`set_checked`] said otherwise.
pub fn checked() -> bool {
    match CHECKED.load(Ordering::Acquire) {
        0 => {
            let on = crate::env::flag(CHECK_VAR, false);
            let _ = CHECKED.compare_exchange(
                0,
                if on { 2 } else { 1 },
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            CHECKED.load(Ordering::Acquire) == 2
        }
        state => state == 2,
    }
}

/// Turn the checked mode on or off for the process (over [`CHECK_VAR`]). Every participant of a
/// group must run in the same mode.
pub fn set_checked(on: bool) {
    CHECKED.store(if on { 2 } else { 1 }, Ordering::Release);
}

/// How `all_reduce` combines the contributions of the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOperation {
    /// Element-wise sum.
    Sum,
    /// Element-wise mean (sum divided by the number of devices; integer division for integers).
    Mean,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

/// Reduce `inputs` (one byte buffer per device, same length) into one buffer of `dtype` elements.
pub fn reduce_host(
    inputs: &[Vec<u8>],
    dtype: ElemType,
    op: ReduceOperation,
) -> Result<Vec<u8>, ServerError> {
    let Some(first) = inputs.first() else {
        return Err(CollectiveError::NoContribution.into());
    };
    if let Some(bad) = inputs.iter().find(|i| i.len() != first.len()) {
        return Err(CollectiveError::ContributionSizes {
            first: first.len() as u64,
            other: bad.len() as u64,
        }
        .into());
    }
    if first.len() % dtype.size() != 0 {
        return Err(CollectiveError::Sizes {
            src: first.len() as u64,
            dst: first.len() as u64,
            dtype,
        }
        .into());
    }
    let n = inputs.len();
    // Accumulate floats in f64 and integers in i128, then convert back (integers wrap, as the
    // IR's integer arithmetic does).
    macro_rules! reduce_as {
        ($t:ty, $acc:ty, $to:expr, $from:expr) => {{
            let views: Vec<Vec<$t>> = inputs
                .iter()
                .map(|i| bytemuck::pod_collect_to_vec(i))
                .collect();
            // Input by input over the whole buffer (the order of the operations per element is
            // the group's, as before), with the operation chosen outside the inner loops.
            let mut acc: Vec<$acc> = views[0].iter().map(|&x| $to(x)).collect();
            for v in &views[1..] {
                let pairs = acc.iter_mut().zip(v.iter());
                match op {
                    ReduceOperation::Sum | ReduceOperation::Mean => {
                        pairs.for_each(|(a, &x)| *a += $to(x))
                    }
                    ReduceOperation::Max => pairs.for_each(|(a, &x)| {
                        let x: $acc = $to(x);
                        if x > *a {
                            *a = x;
                        }
                    }),
                    ReduceOperation::Min => pairs.for_each(|(a, &x)| {
                        let x: $acc = $to(x);
                        if x < *a {
                            *a = x;
                        }
                    }),
                }
            }
            if op == ReduceOperation::Mean {
                acc.iter_mut().for_each(|a| *a /= n as $acc);
            }
            let out: Vec<$t> = acc.into_iter().map($from).collect();
            Ok(bytemuck::cast_slice(&out).to_vec())
        }};
    }
    macro_rules! int {
        ($t:ty) => {
            reduce_as!($t, i128, |x: $t| x as i128, |a: i128| a as $t)
        };
    }
    macro_rules! float {
        ($t:ty, $to:expr, $from:expr) => {
            reduce_as!($t, f64, $to, $from)
        };
    }
    match dtype {
        ElemType::F32 => float!(f32, |x: f32| x as f64, |a: f64| a as f32),
        ElemType::F64 => float!(f64, |x: f64| x, |a: f64| a),
        ElemType::F16 => float!(half::f16, |x: half::f16| x.to_f64(), half::f16::from_f64),
        ElemType::BF16 => float!(half::bf16, |x: half::bf16| x.to_f64(), half::bf16::from_f64),
        ElemType::I8 => int!(i8),
        ElemType::I16 => int!(i16),
        ElemType::I32 => int!(i32),
        ElemType::I64 => int!(i64),
        ElemType::U8 => int!(u8),
        ElemType::U16 => int!(u16),
        ElemType::U32 => int!(u32),
        ElemType::U64 => int!(u64),
        ElemType::Bool => Err(ServerError::Unsupported("all_reduce over bool".into())),
    }
}

/// One device's part of a round.
struct Contribution {
    data: Vec<u8>,
    dtype: ElemType,
    op: ReduceOperation,
}

struct Round {
    contributions: HashMap<DeviceId, Contribution>,
    /// Every device arrived and one of them reduces (across processes, off the lock).
    reducing: bool,
    result: Option<Result<Arc<Vec<u8>>, ServerError>>,
    collected: usize,
}

/// A process-wide meeting point where the devices of a group exchange buffers through host memory.
///
/// Every device of the group calls [`HostRendezvous::all_reduce`] with its rank's data and a
/// per-device sequence number; the call blocks until every device of the group has contributed to
/// the same round, then returns the reduced buffer to each. Devices that disagree on the size,
/// element type or operation all get [`CollectiveError::Mismatch`].
///
/// When the process has joined a [`World`] of several processes, the last device of a round to
/// arrive carries the round's contributions to the world's all-reduce, so that the group spans
/// every process.
pub struct HostRendezvous {
    rounds: Mutex<HashMap<(Vec<DeviceId>, u64), Round>>,
    arrived: Condvar,
    /// The last round number each device issued in each group. It lives here, with the process,
    /// not in the device's server: a server replaced by `ComputeClient::init` carries on from
    /// the group's round instead of starting again at 1 while the other devices are further on
    /// (which would leave both sides waiting for a round the other never joins).
    issued: Mutex<HashMap<(Vec<DeviceId>, DeviceId), u64>>,
}

/// How long a device waits for the rest of its group before the collective fails, unless
/// [`world::TIMEOUT_VAR`] (or the joined world's configuration) says otherwise.
pub const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(60);

/// The bound of a wait for the other devices of a group: the joined world's timeout, else
/// [`world::TIMEOUT_VAR`] when it holds a valid number of milliseconds, else
/// [`RENDEZVOUS_TIMEOUT`].
pub fn rendezvous_timeout() -> Duration {
    if let Some(w) = world::world() {
        return w.config().timeout;
    }
    crate::env::positive::<u64>(world::TIMEOUT_VAR)
        .map_or(RENDEZVOUS_TIMEOUT, Duration::from_millis)
}

/// The first disagreement between the contributions of a round, in group order.
fn disagreement(
    group: &[DeviceId],
    seq: u64,
    contributions: &HashMap<DeviceId, Contribution>,
) -> Option<CollectiveError> {
    let mut members = group
        .iter()
        .filter_map(|d| contributions.get(d).map(|c| (d, c)));
    let (_, first) = members.next()?;
    for (device, c) in members {
        let mismatch = |kind, expected: String, found: String| CollectiveError::Mismatch {
            round: seq,
            kind,
            expected,
            found,
            participant: format!("device {device}"),
        };
        if c.dtype != first.dtype {
            return Some(mismatch(
                MismatchKind::DType,
                first.dtype.to_string(),
                c.dtype.to_string(),
            ));
        }
        if c.op != first.op {
            return Some(mismatch(
                MismatchKind::Operation,
                format!("{:?}", first.op),
                format!("{:?}", c.op),
            ));
        }
        if c.data.len() != first.data.len() {
            return Some(mismatch(
                MismatchKind::Size,
                format!("{} bytes", first.data.len()),
                format!("{} bytes", c.data.len()),
            ));
        }
    }
    None
}

impl HostRendezvous {
    /// The rendezvous shared by every runtime of this process.
    pub fn global() -> &'static HostRendezvous {
        static GLOBAL: std::sync::OnceLock<HostRendezvous> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(|| HostRendezvous {
            rounds: Mutex::new(HashMap::new()),
            arrived: Condvar::new(),
            issued: Mutex::new(HashMap::new()),
        })
    }

    /// The next round number `device` takes part in for `group` (the first is 1), counted for
    /// the process: every server of the device, a replaced one and its successor included,
    /// draws from the same counter. Call it once the round is sure to be contributed.
    pub fn next_round(&self, group: &[DeviceId], device: DeviceId) -> u64 {
        let mut group = group.to_vec();
        group.sort();
        group.dedup();
        let mut issued = self.issued.lock().unwrap_or_else(|p| p.into_inner());
        let round = issued.entry((group, device)).or_insert(0);
        *round += 1;
        *round
    }

    /// Note that `group` is set up, so that it gets its communicator number in the joined world
    /// (if any) in the order the process sets groups up, not in the order rounds first run.
    pub fn register(&self, group: &[DeviceId]) {
        if let Some(w) = world::world() {
            let mut group = group.to_vec();
            group.sort();
            group.dedup();
            w.communicator(&group);
        }
    }

    /// Contribute `data` for `device` to round `seq` of `group`, and wait for the reduced result.
    pub fn all_reduce(
        &self,
        group: &[DeviceId],
        seq: u64,
        device: DeviceId,
        data: Vec<u8>,
        dtype: ElemType,
        op: ReduceOperation,
    ) -> Result<Arc<Vec<u8>>, ServerError> {
        let mut group = group.to_vec();
        group.sort();
        group.dedup();
        if !group.contains(&device) {
            return Err(CollectiveError::NotInGroup { group, device }.into());
        }
        let timeout = rendezvous_timeout();
        let key = (group.clone(), seq);
        let mut rounds = self.rounds.lock().unwrap_or_else(|p| p.into_inner());
        let round = rounds.entry(key.clone()).or_insert_with(|| Round {
            contributions: HashMap::new(),
            reducing: false,
            result: None,
            collected: 0,
        });
        round
            .contributions
            .insert(device, Contribution { data, dtype, op });
        if round.contributions.len() == group.len() {
            let joined = world::world().filter(|w| w.size() > 1);
            if let Some(e) = disagreement(&group, seq, &round.contributions) {
                match joined {
                    // Tell the other processes (off the lock), whose round fails the same way.
                    Some(w) => {
                        round.reducing = true;
                        drop(rounds);
                        let e = w.fail_round(w.communicator(&group), seq, e);
                        rounds = self.rounds.lock().unwrap_or_else(|p| p.into_inner());
                        if let Some(round) = rounds.get_mut(&key) {
                            round.result = Some(Err(e.into()));
                        }
                    }
                    None => round.result = Some(Err(e.into())),
                }
            } else if let Some(w) = joined {
                // Across processes: reduce off the lock (the world bounds its own waits).
                round.reducing = true;
                let inputs: Vec<Vec<u8>> = group
                    .iter()
                    .map(|d| {
                        round
                            .contributions
                            .get_mut(d)
                            .map(|c| core::mem::take(&mut c.data))
                            .unwrap_or_default()
                    })
                    .collect();
                drop(rounds);
                let communicator = w.communicator(&group);
                let out = w.all_reduce(communicator, seq, &inputs, dtype, op);
                rounds = self.rounds.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(round) = rounds.get_mut(&key) {
                    round.result = Some(out.map(Arc::new));
                }
            } else {
                let inputs: Vec<Vec<u8>> = group
                    .iter()
                    .map(|d| {
                        round
                            .contributions
                            .get(d)
                            .map(|c| c.data.clone())
                            .unwrap_or_default()
                    })
                    .collect();
                round.result = Some(reduce_host(&inputs, dtype, op).map(Arc::new));
            }
            self.arrived.notify_all();
        }
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let round = rounds
                .get_mut(&key)
                .unwrap_or_else(|| unreachable!("a round lives until every member collected it"));
            if let Some(result) = round.result.clone() {
                round.collected += 1;
                if round.collected == group.len() {
                    rounds.remove(&key);
                }
                return result;
            }
            let now = std::time::Instant::now();
            if now >= deadline && !round.reducing {
                let absent: Vec<DeviceId> = group
                    .iter()
                    .copied()
                    .filter(|d| !round.contributions.contains_key(d))
                    .collect();
                round.contributions.remove(&device);
                if round.contributions.is_empty() {
                    rounds.remove(&key);
                }
                return Err(CollectiveError::Timeout {
                    waiting_for: format!(
                        "devices {absent:?} of the group {group:?} in all_reduce round {seq}"
                    ),
                    timeout_ms: timeout.as_millis() as u64,
                }
                .into());
            }
            // A round being reduced across processes ends within the world's own bounds.
            let wait = if round.reducing {
                Duration::from_millis(100)
            } else {
                deadline - now
            };
            rounds = self
                .arrived
                .wait_timeout(rounds, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Errors raised by collective rounds on the worker threads, oldest first.
type ErrorList = Mutex<VecDeque<ServerError>>;

/// Output slices of rounds not yet written, with how many rounds write each.
#[derive(Default)]
struct Pending {
    slices: Mutex<HashMap<SliceId, u32>>,
    /// Rounds queued and not yet released: lets `wait_for` skip the lock when none is.
    count: AtomicUsize,
    done: Condvar,
}

impl Pending {
    /// One more round writes `slice`.
    fn add(&self, slice: SliceId) {
        self.count.fetch_add(1, Ordering::AcqRel);
        *self
            .slices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(slice)
            .or_insert(0) += 1;
    }

    /// A round that writes `slice` has finished (or was never queued).
    fn release(&self, slice: SliceId) {
        let mut slices = self.slices.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = slices.get_mut(&slice) {
            self.count.fetch_sub(1, Ordering::AcqRel);
            *n -= 1;
            if *n == 0 {
                slices.remove(&slice);
            }
        }
        self.done.notify_all();
    }
}

/// A `sync_collective` waiting for every worker of a server to reach it.
struct Marker {
    /// Workers that have not reached the marker yet.
    remaining: AtomicUsize,
    done: Mutex<Option<Sender<Result<(), ServerError>>>>,
}

impl Marker {
    /// One worker reached the marker (or will never): the last one answers with the first error
    /// the rounds raised.
    fn reach(&self, errors: &ErrorList) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let first = errors.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
            if let Some(tx) = self.done.lock().unwrap_or_else(|p| p.into_inner()).take() {
                tx.send(first.map_or(Ok(()), Err));
            }
        }
    }
}

enum Job<R> {
    Round(SliceId, R),
    Marker(Arc<Marker>),
}

struct Worker<R> {
    sender: mpsc::Sender<Job<R>>,
    thread: std::thread::JoinHandle<()>,
}

/// The group a collective names, sorted and without repeats, checked once for every backend:
/// it contains `me`, and names only devices of `me`'s type below `count` (the devices of
/// `backend`).
pub fn check_group(
    devices: &[DeviceId],
    me: DeviceId,
    count: u32,
    backend: &str,
) -> Result<Vec<DeviceId>, ServerError> {
    let mut group = devices.to_vec();
    group.sort();
    group.dedup();
    if !group.contains(&me) {
        return Err(CollectiveError::NotInGroup { group, device: me }.into());
    }
    if let Some(&bad) = group
        .iter()
        .find(|d| d.type_id != me.type_id || d.index_id >= count)
    {
        return Err(CollectiveError::UnknownDevice {
            device: bad,
            count,
            backend: backend.to_string(),
        }
        .into());
    }
    Ok(group)
}

/// What a server checks the groups of its collectives against: its own device, and the devices
/// of its backend (counted when a group is checked, as the count may come from the environment).
#[derive(Clone, Copy, Debug)]
pub struct GroupScope {
    /// The server's device.
    pub me: DeviceId,
    /// How many devices the backend has.
    pub count: fn() -> u32,
    /// The backend's name in errors.
    pub backend: &'static str,
}

impl GroupScope {
    /// [`check_group`] in this scope: `devices` sorted, without repeats, checked.
    pub fn check(&self, devices: &[DeviceId]) -> Result<Vec<DeviceId>, ServerError> {
        check_group(devices, self.me, (self.count)(), self.backend)
    }
}

/// One device's part of an all-reduce, as
/// [`ServerCollective::all_reduce`](crate::ServerCollective::all_reduce) receives it.
#[derive(Debug, Clone)]
pub struct AllReduce {
    /// This device's contribution.
    pub src: Binding,
    /// Where this device's result goes.
    pub dst: Binding,
    /// The element type of `src` and `dst`.
    pub dtype: ElemType,
    /// The group's devices (this server's device among them), as the caller named them.
    pub devices: Vec<DeviceId>,
    /// How the contributions are combined.
    pub op: ReduceOperation,
}

impl AllReduce {
    /// [`check_all_reduce`] for this all-reduce over `group` (its devices, checked), which was
    /// `initialised` or not.
    ///
    /// # Errors
    /// See [`check_all_reduce`].
    pub fn check(&self, group: &[DeviceId], initialised: bool) -> Result<(), ServerError> {
        check_all_reduce(
            group,
            initialised,
            self.src.size(),
            self.dst.size(),
            self.dtype,
        )
    }
}

/// The arguments of an all-reduce over `group`, checked once for every backend: the group was
/// initialised (`initialised`), and input and output are the same whole number of elements.
pub fn check_all_reduce(
    group: &[DeviceId],
    initialised: bool,
    src: u64,
    dst: u64,
    dtype: ElemType,
) -> Result<(), ServerError> {
    if !initialised {
        return Err(CollectiveError::NotInitialised {
            group: group.to_vec(),
        }
        .into());
    }
    if src != dst || !src.is_multiple_of(dtype.size() as u64) {
        return Err(CollectiveError::Sizes { src, dst, dtype }.into());
    }
    Ok(())
}

/// The backend-independent collective state of one server of a host-staged backend (wgpu,
/// Vulkan): the initialised groups, the round numbers per group, the output slices that queued
/// rounds have not written yet, the worker threads that run the rounds and the errors they raised.
///
/// Rounds (of type `R`, the backend's staging of one device's part of a collective) run in issue
/// order on a worker thread per key `K` (the backend picks how rounds share workers: one per
/// group, or one per server), off the server lock, since a round waits for the other devices of
/// its group. Until a round has finished, [`HostCollectives::wait_for`] blocks later work that
/// touches its output slice.
pub struct HostCollectives<K, R> {
    scope: GroupScope,
    groups: BTreeSet<Vec<DeviceId>>,
    pending: Arc<Pending>,
    workers: HashMap<K, Worker<R>>,
    errors: Arc<ErrorList>,
}

impl<K, R> HostCollectives<K, R> {
    /// The collectives of a server whose groups are checked in `scope`.
    pub fn new(scope: GroupScope) -> Self {
        Self {
            scope,
            groups: BTreeSet::new(),
            pending: Arc::default(),
            workers: HashMap::new(),
            errors: Arc::default(),
        }
    }
}

impl<K: Eq + Hash + Clone, R: Send + 'static> HostCollectives<K, R> {
    /// `ensure_init_collective`: check the group `devices` in the server's scope, register it
    /// with [`HostRendezvous::register`] and remember it as initialised.
    pub fn init(&mut self, devices: &[DeviceId]) -> Result<(), ServerError> {
        let group = self.scope.check(devices)?;
        HostRendezvous::global().register(&group);
        self.groups.insert(group);
        Ok(())
    }

    /// Whether `group` was initialised.
    pub fn is_init(&self, group: &[DeviceId]) -> bool {
        self.groups.contains(group)
    }

    /// The group of `reduce`: its devices checked in the server's scope, then
    /// [`check_all_reduce`] (initialised here, sizes that agree).
    ///
    /// # Errors
    /// See [`check_group`] and [`check_all_reduce`].
    pub fn check_all_reduce(&self, reduce: &AllReduce) -> Result<Vec<DeviceId>, ServerError> {
        let group = self.scope.check(&reduce.devices)?;
        reduce.check(&group, self.is_init(&group))?;
        Ok(group)
    }

    /// The next round number of `device` in `group` (the first is 1): see
    /// [`HostRendezvous::next_round`], which keeps the count for the process.
    pub fn next_round(&self, group: &[DeviceId], device: DeviceId) -> u64 {
        HostRendezvous::global().next_round(group, device)
    }

    /// Block until no queued round writes `slice`.
    pub fn wait_for(&self, slice: SliceId) {
        // Rounds are counted on the server's thread (in `submit`) before any later call can
        // reach here, so a zero count means no round is pending for any slice.
        if self.pending.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut slices = self
            .pending
            .slices
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        while slices.get(&slice).is_some_and(|&n| n > 0) {
            slices = self
                .pending
                .done
                .wait(slices)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Start the worker of `key` unless it runs already: a thread called `name` that runs each
    /// round queued on it with the function `start` returns (called once, on this thread).
    pub fn start_worker<F>(
        &mut self,
        key: &K,
        name: &str,
        start: impl FnOnce() -> F,
    ) -> Result<(), ServerError>
    where
        F: FnMut(R) -> Result<(), ServerError> + Send + 'static,
    {
        if self.workers.contains_key(key) {
            return Ok(());
        }
        let (sender, receiver) = mpsc::channel();
        let run_round = start();
        let pending = self.pending.clone();
        let errors = self.errors.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || run(receiver, run_round, &pending, &errors))
            .map_err(|e| ServerError::Driver(format!("cannot start the collective worker: {e}")))?;
        self.workers.insert(key.clone(), Worker { sender, thread });
        Ok(())
    }

    /// Queue `round`, which writes `slice`, on the worker of `key` (started as
    /// [`HostCollectives::start_worker`] does if it does not run yet).
    pub fn submit<F>(
        &mut self,
        key: &K,
        slice: SliceId,
        round: R,
        name: &str,
        start: impl FnOnce() -> F,
    ) -> Result<(), ServerError>
    where
        F: FnMut(R) -> Result<(), ServerError> + Send + 'static,
    {
        self.pending.add(slice);
        let sent = self.start_worker(key, name, start).and_then(|()| {
            self.workers
                .get(key)
                .unwrap_or_else(|| unreachable!("started just above"))
                .sender
                .send(Job::Round(slice, round))
                .map_err(|_| ServerError::Driver("the collective worker stopped".into()))
        });
        if let Err(e) = sent {
            self.pending.release(slice);
            return Err(e);
        }
        Ok(())
    }

    /// A receiver that completes once every round queued so far (on every worker) has finished,
    /// with the first error they raised.
    pub fn marker(&mut self) -> Receiver<Result<(), ServerError>> {
        let (tx, rx) = crate::future::oneshot();
        let marker = Arc::new(Marker {
            // One count per worker, and one for this call (so none answers before all are sent).
            remaining: AtomicUsize::new(self.workers.len() + 1),
            done: Mutex::new(Some(tx)),
        });
        for worker in self.workers.values() {
            if let Err(mpsc::SendError(Job::Marker(m))) =
                worker.sender.send(Job::Marker(marker.clone()))
            {
                self.errors
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_back(ServerError::Driver("a collective worker stopped".into()));
                m.reach(&self.errors);
            }
        }
        marker.reach(&self.errors);
        rx
    }

    /// `sync_collective`: a future of [`marker`](Self::marker), an error when the workers went
    /// away without answering.
    pub fn sync(&mut self) -> DynFut<Result<(), ServerError>> {
        let rx = self.marker();
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|| Err(ServerError::Driver("the collective worker stopped".into())))
        })
    }

    /// Stop the workers after the rounds queued so far, and wait for them.
    pub fn shutdown(&mut self) {
        for (_, worker) in self.workers.drain() {
            drop(worker.sender);
            let _ = worker.thread.join();
        }
    }
}

fn run<R>(
    receiver: mpsc::Receiver<Job<R>>,
    mut run_round: impl FnMut(R) -> Result<(), ServerError>,
    pending: &Pending,
    errors: &ErrorList,
) {
    while let Ok(job) = receiver.recv() {
        match job {
            Job::Round(slice, round) => {
                if let Err(e) = run_round(round) {
                    errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_back(e);
                }
                pending.release(slice);
            }
            Job::Marker(marker) => marker.reach(errors),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_and_all_reduce_checks_give_structured_errors() {
        let (a, b, far) = (
            DeviceId::new(5, 0),
            DeviceId::new(5, 1),
            DeviceId::new(5, 9),
        );
        assert_eq!(check_group(&[b, a, b], a, 2, "test").unwrap(), vec![a, b]);
        assert!(matches!(
            check_group(&[b], a, 2, "test"),
            Err(ServerError::Collective(CollectiveError::NotInGroup { device, .. })) if device == a
        ));
        assert!(matches!(
            check_group(&[a, far], a, 2, "test"),
            Err(ServerError::Collective(CollectiveError::UnknownDevice { device, count: 2, .. })) if device == far
        ));
        assert!(check_all_reduce(&[a, b], true, 16, 16, ElemType::F32).is_ok());
        assert!(matches!(
            check_all_reduce(&[a, b], false, 16, 16, ElemType::F32),
            Err(ServerError::Collective(
                CollectiveError::NotInitialised { .. }
            ))
        ));
        assert!(matches!(
            check_all_reduce(&[a, b], true, 16, 8, ElemType::F32),
            Err(ServerError::Collective(CollectiveError::Sizes {
                src: 16,
                dst: 8,
                ..
            }))
        ));
        assert!(matches!(
            check_all_reduce(&[a, b], true, 6, 6, ElemType::F32),
            Err(ServerError::Collective(CollectiveError::Sizes {
                src: 6,
                ..
            }))
        ));
    }

    #[test]
    fn host_collectives_order_rounds_and_report_errors() {
        use crate::memory::SliceHandle;
        use std::sync::atomic::AtomicU32;

        type Round = (u32, Result<(), ServerError>);
        // Devices of a type no other test uses: the round counters are the process's.
        let (d0, d1) = (DeviceId::new(901, 0), DeviceId::new(901, 1));
        let scope = GroupScope {
            me: d0,
            count: || 2,
            backend: "test",
        };
        let mut c: HostCollectives<u8, Round> = HostCollectives::new(scope);
        let (a, b) = (vec![d0], vec![d1]);
        assert!(!c.is_init(&a));
        c.init(&a).unwrap();
        assert!(c.is_init(&a) && !c.is_init(&b));
        assert_eq!(
            (
                c.next_round(&a, d0),
                c.next_round(&a, d0),
                c.next_round(&b, d1)
            ),
            (1, 2, 1)
        );
        // A second state for the same device (a replaced server) carries on from the count.
        let fresh: HostCollectives<u8, Round> = HostCollectives::new(scope);
        assert_eq!(fresh.next_round(&a, d0), 3);

        // Rounds run in issue order, off this thread; wait_for blocks until the round that
        // writes the slice has finished.
        let done = Arc::new(AtomicU32::new(0));
        let slice = SliceHandle::detached().id();
        let other = SliceHandle::detached().id();
        let start = |done: Arc<AtomicU32>| {
            move || {
                move |(n, outcome): Round| {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    assert_eq!(
                        done.fetch_add(1, Ordering::SeqCst),
                        n,
                        "rounds out of order"
                    );
                    outcome
                }
            }
        };
        c.submit(
            &0,
            slice,
            (0, Ok(())),
            "test-collective",
            start(done.clone()),
        )
        .unwrap();
        let failure = ServerError::Driver("round 1 failed".into());
        c.submit(
            &0,
            other,
            (1, Err(failure.clone())),
            "test-collective",
            start(done.clone()),
        )
        .unwrap();
        c.wait_for(slice);
        assert!(
            done.load(Ordering::SeqCst) >= 1,
            "wait_for returned before its round ran"
        );
        c.wait_for(other);
        assert_eq!(done.load(Ordering::SeqCst), 2);

        // The marker answers with the first error, once; the next one is clean.
        assert_eq!(crate::future::block_on(c.marker()), Some(Err(failure)));
        assert_eq!(crate::future::block_on(c.marker()), Some(Ok(())));
        c.shutdown();
        // No worker left: a marker still answers.
        assert_eq!(crate::future::block_on(c.marker()), Some(Ok(())));
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    #[test]
    fn reduce_ops() {
        let a = f32s(&[1.0, 2.0]);
        let b = f32s(&[3.0, -6.0]);
        let sum =
            reduce_host(&[a.clone(), b.clone()], ElemType::F32, ReduceOperation::Sum).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&sum), &[4.0, -4.0]);
        let mean = reduce_host(
            &[a.clone(), b.clone()],
            ElemType::F32,
            ReduceOperation::Mean,
        )
        .unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&mean), &[2.0, -2.0]);
        let max = reduce_host(&[a, b], ElemType::F32, ReduceOperation::Max).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&max), &[3.0, 2.0]);
        let ints = reduce_host(
            &[
                bytemuck::cast_slice(&[7i32]).to_vec(),
                bytemuck::cast_slice(&[2i32]).to_vec(),
            ],
            ElemType::I32,
            ReduceOperation::Mean,
        )
        .unwrap();
        assert_eq!(bytemuck::pod_collect_to_vec::<u8, i32>(&ints), vec![4]);
        assert!(
            reduce_host(
                &[vec![0; 4], vec![0; 8]],
                ElemType::F32,
                ReduceOperation::Sum
            )
            .is_err()
        );
    }

    #[test]
    fn rendezvous_across_threads() {
        let group = vec![
            DeviceId::new(9, 0),
            DeviceId::new(9, 1),
            DeviceId::new(9, 2),
        ];
        let handles: Vec<_> = group
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let group = group.clone();
                std::thread::spawn(move || {
                    HostRendezvous::global()
                        .all_reduce(
                            &group,
                            0,
                            d,
                            f32s(&[i as f32]),
                            ElemType::F32,
                            ReduceOperation::Sum,
                        )
                        .unwrap()
                })
            })
            .collect();
        for h in handles {
            let out = h.join().unwrap();
            assert_eq!(bytemuck::pod_collect_to_vec::<u8, f32>(&out), vec![3.0]);
        }
    }

    #[test]
    fn rendezvous_rejects_disagreement_on_every_participant() {
        let group = vec![DeviceId::new(8, 0), DeviceId::new(8, 1)];
        let cases = [
            (
                (ElemType::F32, ReduceOperation::Sum, 8),
                MismatchKind::DType,
            ),
            (
                (ElemType::I32, ReduceOperation::Min, 8),
                MismatchKind::Operation,
            ),
            ((ElemType::I32, ReduceOperation::Max, 4), MismatchKind::Size),
        ];
        for (seq, ((dtype, op, len), kind)) in cases.into_iter().enumerate() {
            let threads: Vec<_> = [(ElemType::I32, ReduceOperation::Max, 8), (dtype, op, len)]
                .into_iter()
                .enumerate()
                .map(|(i, (dtype, op, len))| {
                    let group = group.clone();
                    std::thread::spawn(move || {
                        HostRendezvous::global().all_reduce(
                            &group,
                            seq as u64,
                            group[i],
                            vec![1; len],
                            dtype,
                            op,
                        )
                    })
                })
                .collect();
            for t in threads {
                let got = t.join().unwrap();
                assert!(
                    matches!(
                        &got,
                        Err(ServerError::Collective(CollectiveError::Mismatch { kind: k, round, .. }))
                            if *k == kind && *round == seq as u64
                    ),
                    "{kind}: {got:?}"
                );
            }
        }
        // The group still works.
        let threads: Vec<_> = (0..2)
            .map(|i| {
                let group = group.clone();
                std::thread::spawn(move || {
                    HostRendezvous::global().all_reduce(
                        &group,
                        9,
                        group[i],
                        bytemuck::cast_slice(&[i as i32 + 1]).to_vec(),
                        ElemType::I32,
                        ReduceOperation::Max,
                    )
                })
            })
            .collect();
        for t in threads {
            let out = t.join().unwrap().unwrap();
            assert_eq!(bytemuck::pod_collect_to_vec::<u8, i32>(&out), vec![2]);
        }
    }
}
