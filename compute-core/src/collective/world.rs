//! Collectives across processes: a rendezvous read from the environment that launchers set
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), a small TCP key/value store
//! run by rank 0, and a host-staged all-reduce over TCP.
//!
//! Every rank connects to rank 0 (`MASTER_ADDR:MASTER_PORT`). The connection a rank opens when
//! it joins carries its store requests; each communicator opens one more connection per rank, and
//! a round of a communicator is a star through rank 0 (a tree of depth one): every rank sends its
//! contributions with a header (round number, element type, operation, sizes), rank 0 checks the
//! headers agree, reduces, and sends the result, or the error, to every rank.
//!
//! Failures never hang: every socket wait has a deadline (`COMPUTE_RENDEZVOUS_TIMEOUT_MS`, default
//! 60 s). A rank that does not arrive makes rank 0 time out and tell the others; a rank that dies
//! closes its sockets, which rank 0 sees at once and reports to the others; rank 0 dying closes
//! every rank's socket. Rank 0 waits at most the timeout for a rank; the others wait at most twice
//! the timeout for rank 0's answer (so that they get its verdict rather than a timeout of their
//! own). A communicator that failed stays failed: its later rounds return the same error.
//!
//! Size: the environment rendezvous, the TCP store and the TCP all-reduce form one protocol;
//! their framing and timeouts are shared, and a third of the file is its tests.

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use hashbrown::HashMap;

use super::error::{CollectiveError, MismatchKind};
use super::wire::{self, Failure, Reader, Writer};
use crate::collective::{ReduceOperation, reduce_host};
use crate::device::DeviceId;
use crate::elem::ElemType;
use crate::error::ServerError;

/// The rank of this process in the world.
pub const RANK_VAR: &str = "RANK";
/// The number of processes in the world.
pub const WORLD_SIZE_VAR: &str = "WORLD_SIZE";
/// The rank of this process among those of its machine (picks its device).
pub const LOCAL_RANK_VAR: &str = "LOCAL_RANK";
/// The address of rank 0, where its store listens.
pub const MASTER_ADDR_VAR: &str = "MASTER_ADDR";
/// The port of rank 0's store.
pub const MASTER_PORT_VAR: &str = "MASTER_PORT";
/// How long any rendezvous wait lasts before it fails, in milliseconds.
pub const TIMEOUT_VAR: &str = "COMPUTE_RENDEZVOUS_TIMEOUT_MS";
/// The port recorded for a world of one process when [`MASTER_PORT_VAR`] is not set (such a world
/// opens no socket).
pub const DEFAULT_PORT: u16 = 29500;
/// The timeout when [`TIMEOUT_VAR`] is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Where this process stands in a world of processes, as a launcher describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorldConfig {
    /// This process's rank, below `world_size`.
    pub rank: usize,
    /// The number of processes.
    pub world_size: usize,
    /// This process's rank on its machine (`LOCAL_RANK`; `RANK` when unset).
    pub local_rank: usize,
    /// Rank 0's address.
    pub master_addr: String,
    /// Rank 0's store port.
    pub master_port: u16,
    /// The bound of every wait.
    pub timeout: Duration,
}

fn missing(name: &str, hint: &str) -> CollectiveError {
    CollectiveError::MissingVariable {
        name: name.into(),
        hint: hint.into(),
    }
}

fn invalid(name: &str, value: &str, reason: impl Into<String>) -> CollectiveError {
    CollectiveError::InvalidVariable {
        name: name.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

fn parse_number<T: core::str::FromStr>(
    name: &str,
    value: &str,
    what: &str,
) -> Result<T, CollectiveError> {
    value
        .trim()
        .parse::<T>()
        .map_err(|_| invalid(name, value, format!("expected {what}")))
}

impl WorldConfig {
    /// Read the configuration from the process environment.
    pub fn from_env() -> Result<Self, CollectiveError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Whether the environment describes a world (`WORLD_SIZE` is set).
    pub fn in_env() -> bool {
        std::env::var_os(WORLD_SIZE_VAR).is_some()
    }

    /// Read the configuration through `get` (a variable's value, `None` when unset).
    ///
    /// `RANK` and `WORLD_SIZE` are required; `MASTER_ADDR` and `MASTER_PORT` are required for a
    /// world of more than one process; `LOCAL_RANK` defaults to `RANK`; the timeout to
    /// [`DEFAULT_TIMEOUT`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, CollectiveError> {
        let world_size = get(WORLD_SIZE_VAR)
            .ok_or_else(|| missing(WORLD_SIZE_VAR, "the number of processes"))?;
        let world_size_n: usize = parse_number(WORLD_SIZE_VAR, &world_size, "a positive integer")?;
        if world_size_n == 0 {
            return Err(invalid(
                WORLD_SIZE_VAR,
                &world_size,
                "a world has at least one process",
            ));
        }
        let rank = get(RANK_VAR).ok_or_else(|| missing(RANK_VAR, "this process's rank"))?;
        let rank_n: usize = parse_number(RANK_VAR, &rank, "a non-negative integer")?;
        if rank_n >= world_size_n {
            return Err(invalid(
                RANK_VAR,
                &rank,
                format!("a rank is below WORLD_SIZE={world_size_n}"),
            ));
        }
        let local_rank = match get(LOCAL_RANK_VAR) {
            Some(v) => parse_number(LOCAL_RANK_VAR, &v, "a non-negative integer")?,
            None => rank_n,
        };
        let (master_addr, master_port) = match (get(MASTER_ADDR_VAR), get(MASTER_PORT_VAR)) {
            (addr, port) if world_size_n > 1 => {
                let addr = addr.ok_or_else(|| missing(MASTER_ADDR_VAR, "rank 0's address"))?;
                let port = port.ok_or_else(|| missing(MASTER_PORT_VAR, "rank 0's store port"))?;
                (addr, port)
            }
            (addr, port) => (
                addr.unwrap_or_else(|| "127.0.0.1".into()),
                // A world of one process opens no socket: the port is only recorded.
                port.unwrap_or_else(|| DEFAULT_PORT.to_string()),
            ),
        };
        if master_addr.trim().is_empty() {
            return Err(invalid(MASTER_ADDR_VAR, &master_addr, "an empty address"));
        }
        let master_port_n: u16 = parse_number(MASTER_PORT_VAR, &master_port, "a port, 1 to 65535")?;
        if master_port_n == 0 {
            return Err(invalid(
                MASTER_PORT_VAR,
                &master_port,
                "port 0 cannot be told to the other ranks; pick a free port",
            ));
        }
        let timeout = match get(TIMEOUT_VAR) {
            Some(v) => {
                let ms: u64 = parse_number(TIMEOUT_VAR, &v, "milliseconds")?;
                if ms == 0 {
                    return Err(invalid(TIMEOUT_VAR, &v, "a timeout of 0 ms"));
                }
                Duration::from_millis(ms)
            }
            None => DEFAULT_TIMEOUT,
        };
        Ok(Self {
            rank: rank_n,
            world_size: world_size_n,
            local_rank,
            master_addr: master_addr.trim().to_string(),
            master_port: master_port_n,
            timeout,
        })
    }

    fn timeout_ms(&self) -> u64 {
        self.timeout.as_millis() as u64
    }

    fn addresses(&self) -> Result<Vec<SocketAddr>, CollectiveError> {
        let list: Vec<SocketAddr> = (self.master_addr.as_str(), self.master_port)
            .to_socket_addrs()
            .map_err(|e| CollectiveError::Io {
                what: format!("resolving {MASTER_ADDR_VAR}={}", self.master_addr),
                reason: e.to_string(),
            })?
            .collect();
        if list.is_empty() {
            return Err(invalid(
                MASTER_ADDR_VAR,
                &self.master_addr,
                "resolves to no address",
            ));
        }
        Ok(list)
    }
}

// Message tags.
const HELLO_MEMBER: u8 = 1;
const HELLO_COMM: u8 = 2;
const WELCOME: u8 = 3;
const ERROR: u8 = 4;
const SET: u8 = 5;
const OK: u8 = 6;
const GET: u8 = 7;
const VALUE: u8 = 8;
const ADD: u8 = 9;
const COUNT: u8 = 10;
const WAIT: u8 = 11;
const ROUND: u8 = 12;
const RESULT: u8 = 13;
const FAILED: u8 = 14;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Rank 0's state: the store, who joined, the connections communicators opened.
struct Hub {
    config: WorldConfig,
    state: Mutex<HubState>,
    changed: Condvar,
}

#[derive(Default)]
struct HubState {
    values: HashMap<String, Vec<u8>>,
    counters: HashMap<String, u64>,
    joined: Vec<bool>,
    /// The ranks that were told the world failed.
    told: Vec<bool>,
    complete: bool,
    failed: Option<CollectiveError>,
    comm_conns: HashMap<(u64, usize), TcpStream>,
    /// Store waits answered to the other ranks, by key (a barrier at rank 0 returns once every
    /// rank has its answer, so that rank 0 may exit after it).
    answered: HashMap<String, u64>,
    /// Communicators whose round failed at rank 0: a rank that opens one late is told at once.
    failed_comms: HashMap<u64, CollectiveError>,
}

impl Hub {
    fn fail(&self, state: &mut HubState, e: CollectiveError) -> CollectiveError {
        let e = state.failed.get_or_insert(e).clone();
        self.changed.notify_all();
        e
    }

    /// Admit rank `rank` that says the world has `size` processes.
    fn admit(&self, rank: usize, size: usize) -> Result<(), CollectiveError> {
        let mut s = lock(&self.state);
        if let Some(e) = &s.failed {
            return Err(e.clone());
        }
        if size != self.config.world_size {
            let e = CollectiveError::WorldSize {
                rank,
                expected: self.config.world_size,
                found: size,
            };
            return Err(self.fail(&mut s, e));
        }
        if rank == 0 || rank >= size || s.joined[rank] {
            return Err(self.fail(&mut s, CollectiveError::DuplicateRank { rank }));
        }
        s.joined[rank] = true;
        if s.joined.iter().all(|&j| j) {
            s.complete = true;
            self.changed.notify_all();
        }
        Ok(())
    }

    /// Wait (until `deadline`) for every rank to join, or for the world to fail.
    fn wait_complete(&self, deadline: Instant) -> Result<(), CollectiveError> {
        let mut s = lock(&self.state);
        loop {
            if let Some(e) = &s.failed {
                return Err(e.clone());
            }
            if s.complete {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let absent: Vec<usize> = (0..s.joined.len()).filter(|&r| !s.joined[r]).collect();
                let e = CollectiveError::Timeout {
                    waiting_for: format!(
                        "ranks {absent:?} of a world of {} to join",
                        self.config.world_size
                    ),
                    timeout_ms: self.config.timeout_ms(),
                };
                return Err(self.fail(&mut s, e));
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// After a failed join, keep the store up (until `deadline`) until every other rank has
    /// been told why, so that each gets rank 0's verdict rather than a closed connection.
    fn linger(&self, deadline: Instant) {
        let _ = self.wait_for(
            deadline.saturating_duration_since(Instant::now()),
            "",
            |s| s.told.iter().skip(1).all(|&t| t).then_some(()),
        );
    }

    fn set(&self, key: String, value: Vec<u8>) {
        lock(&self.state).values.insert(key, value);
        self.changed.notify_all();
    }

    fn add(&self, key: String, delta: u64) -> u64 {
        let mut s = lock(&self.state);
        let n = s.counters.entry(key).or_insert(0);
        *n = n.wrapping_add(delta);
        let n = *n;
        self.changed.notify_all();
        n
    }

    /// Wait until `found` gives a value, or `wait` has passed.
    fn wait_for<T>(
        &self,
        wait: Duration,
        what: &str,
        found: impl Fn(&HubState) -> Option<T>,
    ) -> Result<T, CollectiveError> {
        let deadline = Instant::now() + wait;
        let mut s = lock(&self.state);
        loop {
            if let Some(v) = found(&s) {
                return Ok(v);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CollectiveError::Timeout {
                    waiting_for: what.into(),
                    timeout_ms: wait.as_millis() as u64,
                });
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn get(&self, key: &str, wait: Duration) -> Result<Vec<u8>, CollectiveError> {
        self.wait_for(wait, &format!("store key {key:?}"), |s| {
            s.values.get(key).cloned()
        })
    }

    fn wait_count(&self, key: &str, target: u64, wait: Duration) -> Result<u64, CollectiveError> {
        self.wait_for(
            wait,
            &format!("store counter {key:?} to reach {target}"),
            |s| s.counters.get(key).copied().filter(|&n| n >= target),
        )
    }
}

/// Accept connections for rank 0's hub, each on a thread of its own.
fn accept_loop(hub: Arc<Hub>, listener: TcpListener) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let hub = hub.clone();
        let _ = std::thread::Builder::new()
            .name("compute-world conn".into())
            .spawn(move || serve(&hub, conn));
    }
}

fn send_error(conn: &mut TcpStream, e: &CollectiveError, deadline: Instant) {
    let _ = wire::write_frame(conn, &wire::put_error(Writer::new(ERROR), e).0, deadline);
}

/// Serve one connection at rank 0: a member joining (then its store requests), or a
/// communicator's connection (handed to the hub).
fn serve(hub: &Hub, mut conn: TcpStream) {
    let _ = conn.set_nodelay(true);
    let timeout = hub.config.timeout;
    let Ok(hello) = wire::read_frame(&mut conn, Instant::now() + timeout) else {
        return;
    };
    let mut r = Reader::new(&hello);
    let parsed = (|| Ok::<_, CollectiveError>((r.u8()?, r.usize()?, r.usize()?)))();
    let Ok((tag, rank, size)) = parsed else {
        return;
    };
    match tag {
        HELLO_MEMBER => {
            let admitted = hub
                .admit(rank, size)
                .and_then(|()| hub.wait_complete(Instant::now() + 2 * timeout));
            if let Err(e) = admitted {
                send_error(&mut conn, &e, Instant::now() + timeout);
                if let Some(told) = lock(&hub.state).told.get_mut(rank) {
                    *told = true;
                }
                hub.changed.notify_all();
                return;
            }
            if wire::write_frame(&mut conn, &[WELCOME], Instant::now() + timeout).is_err() {
                return;
            }
            serve_store(hub, conn);
        }
        HELLO_COMM => {
            let Ok(key) = r.u64() else { return };
            if rank == 0 || rank >= hub.config.world_size || size != hub.config.world_size {
                let e = CollectiveError::Protocol(format!(
                    "communicator connection from rank {rank} of {size}"
                ));
                send_error(&mut conn, &e, Instant::now() + timeout);
                return;
            }
            let mut state = lock(&hub.state);
            if let Some(e) = state.failed_comms.get(&key).cloned() {
                drop(state);
                send_error(&mut conn, &e, Instant::now() + timeout);
                return;
            }
            state.comm_conns.insert((key, rank), conn);
            drop(state);
            hub.changed.notify_all();
        }
        _ => {}
    }
}

/// Answer one member's store requests until its connection closes.
fn serve_store(hub: &Hub, mut conn: TcpStream) {
    // A member may stay quiet for as long as it lives: wait in long steps, until it leaves.
    const IDLE: Duration = Duration::from_secs(3600);
    loop {
        let body = match wire::read_frame(&mut conn, Instant::now() + IDLE) {
            Ok(b) => b,
            Err(Failure::Timeout) => continue,
            Err(Failure::Closed(_)) => return,
        };
        let mut r = Reader::new(&body);
        let mut waited: Option<String> = None;
        let reply = (|| {
            Ok::<Writer, CollectiveError>(match r.u8()? {
                SET => {
                    let key = r.string()?;
                    hub.set(key, r.bytes()?.to_vec());
                    Writer::new(OK)
                }
                GET => {
                    let key = r.string()?;
                    let wait = Duration::from_millis(r.u64()?);
                    Writer::new(VALUE).bytes(&hub.get(&key, wait)?)
                }
                ADD => {
                    let key = r.string()?;
                    Writer::new(COUNT).u64(hub.add(key, r.u64()?))
                }
                WAIT => {
                    let key = r.string()?;
                    let target = r.u64()?;
                    let wait = Duration::from_millis(r.u64()?);
                    let count = hub.wait_count(&key, target, wait)?;
                    waited = Some(key);
                    Writer::new(COUNT).u64(count)
                }
                other => {
                    return Err(CollectiveError::Protocol(format!(
                        "unknown request {other}"
                    )));
                }
            })
        })();
        let reply = reply.unwrap_or_else(|e| wire::put_error(Writer::new(ERROR), &e));
        if wire::write_frame(&mut conn, &reply.0, Instant::now() + hub.config.timeout).is_err() {
            return;
        }
        if let Some(key) = waited {
            *lock(&hub.state).answered.entry(key).or_insert(0) += 1;
            hub.changed.notify_all();
        }
    }
}

/// Connect to rank 0, retrying (it may not listen yet) until `deadline`.
fn connect(config: &WorldConfig, deadline: Instant) -> Result<TcpStream, CollectiveError> {
    let addrs = config.addresses()?;
    let mut last = String::new();
    // Bounded by the deadline; each attempt waits at most a second.
    while Instant::now() < deadline {
        for addr in &addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(addr, left.min(Duration::from_secs(1))) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Err(e) => last = e.to_string(),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(CollectiveError::Timeout {
        waiting_for: format!(
            "rank 0's store at {}:{} (last attempt: {last})",
            config.master_addr, config.master_port
        ),
        timeout_ms: config.timeout_ms(),
    })
}

/// Map a socket failure with rank 0 (`who` waited for) to an error.
fn from_root(f: Failure, who: &str, config: &WorldConfig) -> CollectiveError {
    match f {
        Failure::Timeout => CollectiveError::Timeout {
            waiting_for: who.into(),
            timeout_ms: config.timeout_ms(),
        },
        Failure::Closed(reason) => CollectiveError::PeerLost { rank: 0, reason },
    }
}

/// Decode a reply from rank 0: the body after `expect`, or the error it sent.
fn reply<'a>(body: &'a [u8], expect: u8) -> Result<Reader<'a>, CollectiveError> {
    let mut r = Reader::new(body);
    match r.u8()? {
        t if t == expect => Ok(r),
        ERROR => Err(wire::get_error(&mut r)?),
        other => Err(CollectiveError::Protocol(format!(
            "reply {other}, expected {expect}"
        ))),
    }
}

/// One communicator's connections and state in this process.
#[derive(Default)]
struct Comm {
    /// Rank 0: the other ranks' connections, by rank (index 0 unused).
    peers: Vec<Option<TcpStream>>,
    /// Other ranks: the connection to rank 0.
    root: Option<TcpStream>,
    /// The error that broke the communicator.
    failed: Option<CollectiveError>,
}

/// This process's membership of a world of processes.
pub struct World {
    config: WorldConfig,
    /// Rank 0: the store and the hub.
    hub: Option<Arc<Hub>>,
    /// Other ranks: the connection for store requests.
    member: Option<Mutex<TcpStream>>,
    comms: Mutex<HashMap<u64, Arc<Mutex<Comm>>>>,
    groups: Mutex<Vec<Vec<DeviceId>>>,
}

impl core::fmt::Debug for World {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("World")
            .field("config", &self.config)
            .finish()
    }
}

impl World {
    /// Join the world `config` describes: rank 0 starts the store and waits for every rank; the
    /// others connect to it. Fails (never hangs) when a rank does not arrive within the timeout,
    /// or joins with another world size or a rank taken already.
    pub fn join(config: WorldConfig) -> Result<World, CollectiveError> {
        let start = Instant::now();
        let mut world = World {
            config: config.clone(),
            hub: None,
            member: None,
            comms: Mutex::new(HashMap::new()),
            groups: Mutex::new(Vec::new()),
        };
        if config.rank == 0 {
            let hub = Arc::new(Hub {
                config: config.clone(),
                state: Mutex::new(HubState {
                    joined: (0..config.world_size).map(|r| r == 0).collect(),
                    told: vec![false; config.world_size],
                    complete: config.world_size == 1,
                    ..HubState::default()
                }),
                changed: Condvar::new(),
            });
            if config.world_size > 1 {
                let addrs = config.addresses()?;
                let listener = TcpListener::bind(&addrs[..]).map_err(|e| CollectiveError::Io {
                    what: format!(
                        "rank 0 binding its store at {}:{}",
                        config.master_addr, config.master_port
                    ),
                    reason: e.to_string(),
                })?;
                let accept_hub = hub.clone();
                std::thread::Builder::new()
                    .name("compute-world store".into())
                    .spawn(move || accept_loop(accept_hub, listener))
                    .map_err(|e| CollectiveError::Io {
                        what: "starting the store thread".into(),
                        reason: e.to_string(),
                    })?;
                if let Err(e) = hub.wait_complete(start + config.timeout) {
                    hub.linger(Instant::now() + config.timeout);
                    return Err(e);
                }
            }
            world.hub = Some(hub);
        } else {
            let mut conn = connect(&config, start + config.timeout)?;
            let hello = Writer::new(HELLO_MEMBER)
                .u64(config.rank as u64)
                .u64(config.world_size as u64);
            wire::write_frame(&mut conn, &hello.0, start + config.timeout)
                .map_err(|f| from_root(f, "rank 0 to take the join request", &config))?;
            let body = wire::read_frame(&mut conn, start + 2 * config.timeout)
                .map_err(|f| from_root(f, "rank 0 to admit the world", &config))?;
            reply(&body, WELCOME)?;
            world.member = Some(Mutex::new(conn));
        }
        Ok(world)
    }

    /// The configuration this process joined with.
    pub fn config(&self) -> &WorldConfig {
        &self.config
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.config.rank
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        self.config.world_size
    }

    /// A request to rank 0's store (from another rank), answered with a body after `expect`.
    fn request(
        &self,
        body: Writer,
        expect: u8,
        wait: Duration,
    ) -> Result<Vec<u8>, CollectiveError> {
        let Some(member) = &self.member else {
            return Err(CollectiveError::Protocol(
                "rank 0 has no store connection".into(),
            ));
        };
        let mut conn = lock(member);
        let now = Instant::now();
        wire::write_frame(&mut conn, &body.0, now + self.config.timeout)
            .map_err(|f| from_root(f, "rank 0's store to take a request", &self.config))?;
        let answer = wire::read_frame(&mut conn, now + wait + self.config.timeout)
            .map_err(|f| from_root(f, "rank 0's store to answer", &self.config))?;
        let mut r = reply(&answer, expect)?;
        Ok(match expect {
            VALUE => r.bytes()?.to_vec(),
            COUNT => r.u64()?.to_le_bytes().to_vec(),
            _ => Vec::new(),
        })
    }

    /// Store `value` under `key` in rank 0's store.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), CollectiveError> {
        match &self.hub {
            Some(hub) => {
                hub.set(key.into(), value.to_vec());
                Ok(())
            }
            None => self
                .request(Writer::new(SET).str(key).bytes(value), OK, Duration::ZERO)
                .map(drop),
        }
    }

    /// The value of `key`, waiting (up to the timeout) for a rank to set it.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, CollectiveError> {
        let wait = self.config.timeout;
        match &self.hub {
            Some(hub) => hub.get(key, wait),
            None => self.request(
                Writer::new(GET).str(key).u64(wait.as_millis() as u64),
                VALUE,
                wait,
            ),
        }
    }

    /// Add `delta` to the counter `key` and return its new value.
    pub fn add(&self, key: &str, delta: u64) -> Result<u64, CollectiveError> {
        match &self.hub {
            Some(hub) => Ok(hub.add(key.into(), delta)),
            None => self
                .request(Writer::new(ADD).str(key).u64(delta), COUNT, Duration::ZERO)
                .map(|b| count_of(&b)),
        }
    }

    fn wait_count(&self, key: &str, target: u64) -> Result<u64, CollectiveError> {
        let wait = self.config.timeout;
        match &self.hub {
            Some(hub) => hub.wait_count(key, target, wait),
            None => self
                .request(
                    Writer::new(WAIT)
                        .str(key)
                        .u64(target)
                        .u64(wait.as_millis() as u64),
                    COUNT,
                    wait,
                )
                .map(|b| count_of(&b)),
        }
    }

    /// Wait until every rank has reached the barrier `name` (each name used once per rank).
    /// Rank 0 returns only once every other rank has been answered, so a barrier is a safe last
    /// call before the processes exit (rank 0's store goes with its process).
    pub fn barrier(&self, name: &str) -> Result<(), CollectiveError> {
        let key = format!("barrier/{name}");
        self.add(&key, 1)?;
        self.wait_count(&key, self.size() as u64)?;
        if let Some(hub) = &self.hub {
            let others = self.size() as u64 - 1;
            hub.wait_for(
                self.config.timeout,
                &format!("every rank to leave the barrier {name:?}"),
                |s| (s.answered.get(&key).copied().unwrap_or(0) >= others).then_some(()),
            )?;
        }
        Ok(())
    }

    /// The communicator number of a group of this process's devices: groups are numbered in
    /// the order this process first sets them up, so every process must set up its groups in
    /// the same order (a group's devices may differ between processes).
    pub fn communicator(&self, group: &[DeviceId]) -> u64 {
        let mut groups = lock(&self.groups);
        if let Some(i) = groups.iter().position(|g| g == group) {
            return i as u64;
        }
        groups.push(group.to_vec());
        (groups.len() - 1) as u64
    }

    fn comm(&self, communicator: u64) -> Arc<Mutex<Comm>> {
        lock(&self.comms).entry(communicator).or_default().clone()
    }

    /// Round `round` of an all-reduce of `communicator` over every process: `contributions` are
    /// this process's (one per local device, equal sizes), and the result reduces those of
    /// every process (a mean divides by the number of contributions in the world).
    pub fn all_reduce(
        &self,
        communicator: u64,
        round: u64,
        contributions: &[Vec<u8>],
        dtype: ElemType,
        op: ReduceOperation,
    ) -> Result<Vec<u8>, ServerError> {
        let Some(first) = contributions.first() else {
            return Err(CollectiveError::NoContribution.into());
        };
        if dtype == ElemType::Bool {
            return Err(ServerError::Unsupported("all_reduce over bool".into()));
        }
        if let Some(bad) = contributions.iter().find(|c| c.len() != first.len()) {
            return Err(CollectiveError::Mismatch {
                round,
                kind: MismatchKind::Size,
                expected: format!("{} bytes", first.len()),
                found: format!("{} bytes", bad.len()),
                participant: "another device of this process".into(),
            }
            .into());
        }
        if self.size() == 1 {
            return reduce_host(contributions, dtype, op);
        }
        let comm = self.comm(communicator);
        let mut comm = lock(&comm);
        if let Some(e) = &comm.failed {
            return Err(e.clone().into());
        }
        let header = Header {
            round,
            dtype,
            op,
            len: first.len(),
        };
        let out = if self.rank() == 0 {
            self.root_round(&mut comm, communicator, header, Ok(contributions))
        } else {
            self.member_round(&mut comm, communicator, header, Ok(contributions))
        };
        if let Err(e) = &out {
            comm.failed = Some(e.clone());
        }
        Ok(out?)
    }

    /// Round `round` of `communicator` failed in this process (its devices disagree, say): tell
    /// the other processes, whose round fails with `error` too instead of waiting for this one.
    /// Returns the error this process's devices report (`error`, or the communicator's earlier
    /// failure).
    pub fn fail_round(
        &self,
        communicator: u64,
        round: u64,
        error: CollectiveError,
    ) -> CollectiveError {
        if self.size() == 1 {
            return error;
        }
        let comm = self.comm(communicator);
        let mut comm = lock(&comm);
        if let Some(e) = &comm.failed {
            return e.clone();
        }
        let header = Header {
            round,
            dtype: ElemType::U8,
            op: ReduceOperation::Sum,
            len: 0,
        };
        let _ = if self.rank() == 0 {
            self.root_round(&mut comm, communicator, header, Err(&error))
        } else {
            self.member_round(&mut comm, communicator, header, Err(&error))
        };
        comm.failed = Some(error.clone());
        error
    }

    fn member_round(
        &self,
        comm: &mut Comm,
        communicator: u64,
        header: Header,
        local: Result<&[Vec<u8>], &CollectiveError>,
    ) -> Result<Vec<u8>, CollectiveError> {
        let config = &self.config;
        let start = Instant::now();
        if comm.root.is_none() {
            let mut conn = connect(config, start + config.timeout)?;
            let hello = Writer::new(HELLO_COMM)
                .u64(config.rank as u64)
                .u64(config.world_size as u64)
                .u64(communicator);
            wire::write_frame(&mut conn, &hello.0, start + config.timeout)
                .map_err(|f| from_root(f, "rank 0 to take a communicator", config))?;
            comm.root = Some(conn);
        }
        let Some(conn) = comm.root.as_mut() else {
            unreachable!("connected just above")
        };
        let w = match local {
            Ok(contributions) => {
                let mut w = Writer::new(ROUND)
                    .u64(header.round)
                    .u8(wire::elem_code(header.dtype))
                    .u8(wire::op_code(header.op))
                    .u64(contributions.len() as u64);
                for c in contributions {
                    w = w.bytes(c);
                }
                w
            }
            Err(e) => wire::put_error(Writer::new(FAILED).u64(header.round), e),
        };
        let what = format!(
            "rank 0 to answer round {} of communicator {communicator}",
            header.round
        );
        wire::write_frame(conn, &w.0, start + config.timeout)
            .map_err(|f| from_root(f, &what, config))?;
        let body = wire::read_frame(conn, start + 2 * config.timeout)
            .map_err(|f| from_root(f, &what, config))?;
        let mut r = reply(&body, RESULT)?;
        Ok(r.bytes()?.to_vec())
    }

    fn root_round(
        &self,
        comm: &mut Comm,
        communicator: u64,
        header: Header,
        local: Result<&[Vec<u8>], &CollectiveError>,
    ) -> Result<Vec<u8>, CollectiveError> {
        let Some(hub) = &self.hub else {
            unreachable!("rank 0 has the hub")
        };
        let deadline = Instant::now() + self.config.timeout;
        let n = self.size();
        let outcome = (|| {
            if comm.peers.is_empty() {
                let wait = deadline.saturating_duration_since(Instant::now());
                let what = format!("every rank to open communicator {communicator}");
                let mut taken = hub.wait_for(wait, &what, |s| {
                    (1..n)
                        .all(|r| s.comm_conns.contains_key(&(communicator, r)))
                        .then_some(())
                });
                if let Err(CollectiveError::Timeout { .. }) = &taken {
                    let s = lock(&hub.state);
                    let absent: Vec<usize> = (1..n)
                        .filter(|&r| !s.comm_conns.contains_key(&(communicator, r)))
                        .collect();
                    taken = Err(CollectiveError::Timeout {
                        waiting_for: format!(
                            "ranks {absent:?} to open communicator {communicator}"
                        ),
                        timeout_ms: self.config.timeout_ms(),
                    });
                }
                taken?;
                let mut s = lock(&hub.state);
                comm.peers = (0..n)
                    .map(|r| s.comm_conns.remove(&(communicator, r)))
                    .collect();
            }
            let mut inputs: Vec<Vec<u8>> = local.map_err(Clone::clone)?.to_vec();
            for rank in 1..n {
                let Some(conn) = comm.peers[rank].as_mut() else {
                    return Err(CollectiveError::PeerLost {
                        rank,
                        reason: "its connection failed before".into(),
                    });
                };
                let body = wire::read_frame(conn, deadline).map_err(|f| match f {
                    Failure::Timeout => CollectiveError::Timeout {
                        waiting_for: format!(
                            "rank {rank} in round {} of communicator {communicator}",
                            header.round
                        ),
                        timeout_ms: self.config.timeout_ms(),
                    },
                    Failure::Closed(reason) => CollectiveError::PeerLost { rank, reason },
                })?;
                let mut r = Reader::new(&body);
                match r.u8()? {
                    ROUND => {}
                    FAILED => {
                        let _round = r.u64()?;
                        return Err(wire::get_error(&mut r)?);
                    }
                    _ => {
                        return Err(CollectiveError::Protocol(format!(
                            "rank {rank} sent something else than a round"
                        )));
                    }
                }
                let theirs = Header {
                    round: r.u64()?,
                    dtype: wire::elem_from(r.u8()?)?,
                    op: wire::op_from(r.u8()?)?,
                    len: 0,
                };
                let count = r.usize()?;
                let mut list = Vec::with_capacity(count.min(1024));
                for _ in 0..count {
                    list.push(r.bytes()?.to_vec());
                }
                let participant = format!("rank {rank}");
                header.check(&theirs, &list, &participant)?;
                inputs.extend(list);
            }
            reduce_host(&inputs, header.dtype, header.op)
                .map_err(|e| CollectiveError::Protocol(format!("reducing: {e}")))
        })();
        let reply = match &outcome {
            Ok(data) => Writer::new(RESULT).bytes(data),
            Err(e) => {
                let mut s = lock(&hub.state);
                s.failed_comms.insert(communicator, e.clone());
                // The ranks that did open the communicator hear the verdict too.
                if comm.peers.is_empty() {
                    comm.peers = (0..n)
                        .map(|r| s.comm_conns.remove(&(communicator, r)))
                        .collect();
                }
                wire::put_error(Writer::new(ERROR), e)
            }
        };
        let send_by = Instant::now() + self.config.timeout;
        for peer in comm.peers.iter_mut().skip(1) {
            if let Some(conn) = peer
                && wire::write_frame(conn, &reply.0, send_by).is_err()
            {
                *peer = None;
            }
        }
        outcome
    }
}

fn count_of(bytes: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(v)
}

/// What the participants of a round must agree on.
#[derive(Debug, Clone, Copy)]
struct Header {
    round: u64,
    dtype: ElemType,
    op: ReduceOperation,
    len: usize,
}

impl Header {
    fn check(
        &self,
        theirs: &Header,
        list: &[Vec<u8>],
        participant: &str,
    ) -> Result<(), CollectiveError> {
        let mismatch = |kind, expected: String, found: String| CollectiveError::Mismatch {
            round: self.round,
            kind,
            expected,
            found,
            participant: participant.into(),
        };
        if theirs.round != self.round {
            return Err(mismatch(
                MismatchKind::Round,
                self.round.to_string(),
                theirs.round.to_string(),
            ));
        }
        if theirs.dtype != self.dtype {
            return Err(mismatch(
                MismatchKind::DType,
                self.dtype.to_string(),
                theirs.dtype.to_string(),
            ));
        }
        if theirs.op != self.op {
            return Err(mismatch(
                MismatchKind::Operation,
                format!("{:?}", self.op),
                format!("{:?}", theirs.op),
            ));
        }
        if list.is_empty() {
            return Err(CollectiveError::Protocol(format!(
                "{participant} contributed nothing"
            )));
        }
        if let Some(bad) = list.iter().find(|c| c.len() != self.len) {
            return Err(mismatch(
                MismatchKind::Size,
                format!("{} bytes", self.len),
                format!("{} bytes", bad.len()),
            ));
        }
        Ok(())
    }
}

static WORLD: OnceLock<World> = OnceLock::new();
static JOINING: Mutex<()> = Mutex::new(());

/// Join the world `config` describes, for the whole process: from then on, every collective
/// group of the host-staged backends (and of CUDA) spans every process of the world, the group
/// given to a call naming this process's devices in it. Join before setting up collectives.
///
/// Joining again with the same configuration returns the same world; with another, an error.
pub fn init_world(config: WorldConfig) -> Result<&'static World, CollectiveError> {
    let _joining = lock(&JOINING);
    if let Some(world) = WORLD.get() {
        return if world.config == config {
            Ok(world)
        } else {
            Err(CollectiveError::AlreadyJoined(format!(
                "{:?}",
                world.config
            )))
        };
    }
    let world = World::join(config)?;
    Ok(WORLD.get_or_init(|| world))
}

/// [`init_world`] with the configuration of the environment ([`WorldConfig::from_env`]).
pub fn init_world_from_env() -> Result<&'static World, CollectiveError> {
    init_world(WorldConfig::from_env()?)
}

/// The world this process joined, if any.
pub fn world() -> Option<&'static World> {
    WORLD.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rank: usize, size: usize, port: u16, timeout_ms: u64) -> WorldConfig {
        WorldConfig {
            rank,
            world_size: size,
            local_rank: rank,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            timeout: Duration::from_millis(timeout_ms),
        }
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    /// Run `body(world)` on `size` threads, one rank each, and return what each returned.
    fn ranks<T: Send + 'static>(
        size: usize,
        timeout_ms: u64,
        body: impl Fn(Result<World, CollectiveError>) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let port = super::super::launch::free_port().unwrap();
        let body = Arc::new(body);
        let threads: Vec<_> = (0..size)
            .map(|r| {
                let body = body.clone();
                std::thread::spawn(move || body(World::join(config(r, size, port, timeout_ms))))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn env_variables() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let ok = WorldConfig::from_lookup(env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("COMPUTE_RENDEZVOUS_TIMEOUT_MS", "1500"),
        ]))
        .unwrap();
        assert_eq!(ok, {
            let mut c = config(1, 4, 29500, 1500);
            c.local_rank = 1;
            c
        });
        let single = WorldConfig::from_lookup(env(&[("RANK", "0"), ("WORLD_SIZE", "1")])).unwrap();
        assert_eq!((single.world_size, single.timeout), (1, DEFAULT_TIMEOUT));
        let err = |pairs| WorldConfig::from_lookup(env(pairs)).unwrap_err();
        assert!(matches!(
            err(&[("RANK", "0")]),
            CollectiveError::MissingVariable { name, .. } if name == "WORLD_SIZE"
        ));
        assert!(matches!(
            err(&[("WORLD_SIZE", "2")]),
            CollectiveError::MissingVariable { name, .. } if name == "RANK"
        ));
        assert!(matches!(
            err(&[("RANK", "2"), ("WORLD_SIZE", "2")]),
            CollectiveError::InvalidVariable { name, .. } if name == "RANK"
        ));
        assert!(matches!(
            err(&[("RANK", "0"), ("WORLD_SIZE", "two")]),
            CollectiveError::InvalidVariable { name, value, .. } if name == "WORLD_SIZE" && value == "two"
        ));
        assert!(matches!(
            err(&[("RANK", "0"), ("WORLD_SIZE", "0")]),
            CollectiveError::InvalidVariable { name, .. } if name == "WORLD_SIZE"
        ));
        assert!(matches!(
            err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")]),
            CollectiveError::MissingVariable { name, .. } if name == "MASTER_ADDR"
        ));
        assert!(matches!(
            err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]),
            CollectiveError::MissingVariable { name, .. } if name == "MASTER_PORT"
        ));
        assert!(matches!(
            err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "0")]),
            CollectiveError::InvalidVariable { name, .. } if name == "MASTER_PORT"
        ));
        assert!(matches!(
            err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "70000")]),
            CollectiveError::InvalidVariable { name, .. } if name == "MASTER_PORT"
        ));
        assert!(matches!(
            err(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("COMPUTE_RENDEZVOUS_TIMEOUT_MS", "0")]),
            CollectiveError::InvalidVariable { name, .. } if name == TIMEOUT_VAR
        ));
    }

    #[test]
    fn store_and_all_reduce_across_three_ranks() {
        let out = ranks(3, 5000, |world| {
            let world = world.unwrap();
            let r = world.rank();
            world.set(&format!("key/{r}"), &[r as u8; 3]).unwrap();
            let next = world.get(&format!("key/{}", (r + 1) % 3)).unwrap();
            assert_eq!(next, vec![((r + 1) % 3) as u8; 3]);
            world.barrier("after-set").unwrap();
            // Rank 1 contributes two local devices: the mean divides by four.
            let mine: Vec<Vec<u8>> = match r {
                1 => vec![f32s(&[1.0, 10.0]), f32s(&[2.0, 20.0])],
                _ => vec![f32s(&[r as f32 + 3.0, 30.0])],
            };
            let sum = world
                .all_reduce(7, 1, &mine, ElemType::F32, ReduceOperation::Sum)
                .unwrap();
            let mean = world
                .all_reduce(7, 2, &mine, ElemType::F32, ReduceOperation::Mean)
                .unwrap();
            let max = world
                .all_reduce(7, 3, &mine, ElemType::F32, ReduceOperation::Max)
                .unwrap();
            (
                bytemuck::pod_collect_to_vec::<u8, f32>(&sum),
                bytemuck::pod_collect_to_vec::<u8, f32>(&mean),
                bytemuck::pod_collect_to_vec::<u8, f32>(&max),
            )
        });
        for (sum, mean, max) in out {
            assert_eq!(sum, vec![1.0 + 2.0 + 3.0 + 5.0, 90.0]);
            assert_eq!(mean, vec![11.0 / 4.0, 22.5]);
            assert_eq!(max, vec![5.0, 30.0]);
        }
    }

    #[test]
    fn mismatched_dtype_op_and_size_fail_every_rank() {
        for (dtypes, ops, lens, kind) in [
            (
                [ElemType::F32, ElemType::I32],
                [ReduceOperation::Sum; 2],
                [8, 8],
                MismatchKind::DType,
            ),
            (
                [ElemType::F32; 2],
                [ReduceOperation::Sum, ReduceOperation::Max],
                [8, 8],
                MismatchKind::Operation,
            ),
            (
                [ElemType::F32; 2],
                [ReduceOperation::Sum; 2],
                [8, 12],
                MismatchKind::Size,
            ),
        ] {
            let out = ranks(2, 5000, move |world| {
                let world = world.unwrap();
                let r = world.rank();
                let first = world.all_reduce(0, 1, &[vec![0; lens[r]]], dtypes[r], ops[r]);
                // The communicator stays failed: the next round fails the same way, at once.
                let again =
                    world.all_reduce(0, 2, &[vec![0; 8]], ElemType::F32, ReduceOperation::Sum);
                (first, again)
            });
            for (first, again) in out {
                let Err(ServerError::Collective(CollectiveError::Mismatch {
                    kind: k,
                    round: 1,
                    ..
                })) = &first
                else {
                    panic!("expected a {kind} mismatch, got {first:?}");
                };
                assert_eq!(*k, kind);
                assert_eq!(again, first);
            }
        }
    }

    #[test]
    fn a_round_failed_in_one_process_fails_every_process() {
        for failing in [0, 2] {
            let local = CollectiveError::Mismatch {
                round: 1,
                kind: MismatchKind::DType,
                expected: "f32".into(),
                found: "i32".into(),
                participant: "device 0:1".into(),
            };
            let expected = local.clone();
            let out = ranks(3, 3000, move |world| {
                let world = world.unwrap();
                let start = Instant::now();
                let got = if world.rank() == failing {
                    Err(ServerError::from(world.fail_round(5, 1, local.clone())))
                } else {
                    world.all_reduce(5, 1, &[f32s(&[1.0])], ElemType::F32, ReduceOperation::Sum)
                };
                (got, start.elapsed())
            });
            for (got, took) in out {
                assert_eq!(got, Err(ServerError::Collective(expected.clone())));
                assert!(took < Duration::from_secs(2), "took {took:?}");
            }
        }
    }

    #[test]
    fn a_lost_rank_fails_the_others() {
        let out = ranks(3, 3000, |world| {
            let world = world.unwrap();
            let data = vec![f32s(&[1.0])];
            world
                .all_reduce(0, 1, &data, ElemType::F32, ReduceOperation::Sum)
                .unwrap();
            if world.rank() == 2 {
                drop(world);
                return None;
            }
            let start = Instant::now();
            let second = world.all_reduce(0, 2, &data, ElemType::F32, ReduceOperation::Sum);
            Some((second, start.elapsed()))
        });
        for (second, took) in out.into_iter().flatten() {
            assert!(
                matches!(
                    second,
                    Err(ServerError::Collective(CollectiveError::PeerLost {
                        rank: 2,
                        ..
                    }))
                ),
                "{second:?}"
            );
            assert!(took < Duration::from_secs(3), "took {took:?}");
        }
    }

    #[test]
    fn a_rank_that_stays_away_from_a_round_times_the_others_out() {
        let out = ranks(3, 600, |world| {
            let world = world.unwrap();
            let data = vec![f32s(&[2.0])];
            if world.rank() == 1 {
                // Alive, joined, but never contributes: hold the sockets open past the timeout.
                std::thread::sleep(Duration::from_millis(2500));
                return None;
            }
            let start = Instant::now();
            let got = world.all_reduce(3, 1, &data, ElemType::F32, ReduceOperation::Sum);
            Some((got, start.elapsed()))
        });
        for (got, took) in out.into_iter().flatten() {
            assert!(
                matches!(
                    &got,
                    Err(ServerError::Collective(CollectiveError::Timeout { waiting_for, timeout_ms: 600 }))
                        if waiting_for.contains("rank 1") || waiting_for.contains("[1]")
                ),
                "{got:?}"
            );
            assert!(took < Duration::from_millis(2000), "took {took:?}");
        }
    }

    #[test]
    fn a_rank_that_never_arrives_times_every_rank_out() {
        let port = super::super::launch::free_port().unwrap();
        let start = Instant::now();
        let joined: Vec<_> = (0..2)
            .map(|r| std::thread::spawn(move || World::join(config(r, 3, port, 400))))
            .collect();
        for j in joined {
            let e = j.join().unwrap().unwrap_err();
            assert!(
                matches!(&e, CollectiveError::Timeout { waiting_for, .. } if waiting_for.contains("[2]")),
                "{e:?}"
            );
        }
        assert!(start.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn a_wrong_world_size_fails_every_rank() {
        let port = super::super::launch::free_port().unwrap();
        let sizes = [2, 3];
        let joined: Vec<_> = (0..2)
            .map(|r| std::thread::spawn(move || World::join(config(r, sizes[r], port, 2000))))
            .collect();
        for j in joined {
            let e = j.join().unwrap().unwrap_err();
            assert_eq!(
                e,
                CollectiveError::WorldSize {
                    rank: 1,
                    expected: 2,
                    found: 3
                }
            );
        }
    }
}
