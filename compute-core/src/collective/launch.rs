//! Start a world of local processes, as a launcher (torchrun, mpirun) would: N processes of one
//! program with the rendezvous variables set, on the loopback address, with a free port.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::world::{
    LOCAL_RANK_VAR, MASTER_ADDR_VAR, MASTER_PORT_VAR, RANK_VAR, TIMEOUT_VAR, WORLD_SIZE_VAR,
};

/// What to launch.
#[derive(Debug, Clone)]
pub struct Launch {
    /// How many processes (ranks).
    pub processes: usize,
    /// The program.
    pub program: PathBuf,
    /// Its arguments (the same for every rank).
    pub args: Vec<String>,
    /// The rendezvous timeout given to the ranks (`COMPUTE_RENDEZVOUS_TIMEOUT_MS`).
    pub rendezvous_timeout: Duration,
    /// How long the ranks may run before the launcher kills those still running.
    pub deadline: Duration,
    /// More variables, for every rank.
    pub env: Vec<(String, String)>,
    /// Variables for one rank only (`(rank, name, value)`), set after the others: a test can
    /// give one rank a wrong `WORLD_SIZE`, say.
    pub rank_env: Vec<(usize, String, String)>,
    /// Print every line the ranks write, prefixed with `[rank N]`, as it comes.
    pub echo: bool,
}

impl Launch {
    /// `processes` ranks of `program args`, a 10 s rendezvous timeout, a 120 s deadline.
    pub fn new(processes: usize, program: impl Into<PathBuf>, args: &[&str]) -> Self {
        Self {
            processes,
            program: program.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            rendezvous_timeout: Duration::from_secs(10),
            deadline: Duration::from_secs(120),
            env: Vec::new(),
            rank_env: Vec::new(),
            echo: false,
        }
    }
}

/// How one rank ended.
#[derive(Debug, Clone)]
pub struct RankOutcome {
    /// The rank.
    pub rank: usize,
    /// Its exit status (`None` when it could not be waited for).
    pub status: Option<ExitStatus>,
    /// Whether the launcher killed it at the deadline.
    pub killed_at_deadline: bool,
    /// What it wrote on stdout.
    pub stdout: String,
    /// What it wrote on stderr.
    pub stderr: String,
}

impl RankOutcome {
    /// Whether it exited with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// The outcome of a launch.
#[derive(Debug, Clone)]
pub struct LaunchOutcome {
    /// The port rank 0's store listened on.
    pub port: u16,
    /// One outcome per rank, by rank.
    pub ranks: Vec<RankOutcome>,
}

impl LaunchOutcome {
    /// Whether every rank exited with status 0.
    pub fn success(&self) -> bool {
        self.ranks.iter().all(RankOutcome::success)
    }

    /// A one-line-per-rank summary (status, and the last lines of its stderr for a failure).
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for r in &self.ranks {
            let status = match (r.status, r.killed_at_deadline) {
                (_, true) => "killed at the deadline".to_string(),
                (Some(s), false) => s.to_string(),
                (None, false) => "not waited for".to_string(),
            };
            out.push_str(&format!("rank {}: {status}\n", r.rank));
            if !r.success() {
                let lines: Vec<&str> = r.stderr.lines().collect();
                for line in &lines[lines.len().saturating_sub(5)..] {
                    out.push_str(&format!("  {line}\n"));
                }
            }
        }
        out
    }
}

/// A free loopback port: bound on port 0 (the system picks an unused one), then released for rank
/// 0 to bind.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn drain(
    source: impl Read + Send + 'static,
    rank: usize,
    echo: bool,
    sink: Arc<Mutex<String>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(source);
        let mut line = String::new();
        // Ends at the end of the stream (the process exited or was killed).
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
            if echo {
                eprint!("[rank {rank}] {line}");
            }
            sink.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_str(&line);
            line.clear();
        }
    })
}

fn kill_all(children: &mut [Option<Child>]) {
    for child in children.iter_mut().flatten() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Start the ranks, wait for all of them (killing those still running at the deadline), and
/// return how each ended. Fails only when a process cannot be started.
pub fn launch(spec: &Launch) -> std::io::Result<LaunchOutcome> {
    let port = free_port()?;
    let mut children: Vec<Option<Child>> = Vec::with_capacity(spec.processes);
    let mut outputs = Vec::new();
    for rank in 0..spec.processes {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env(RANK_VAR, rank.to_string())
            .env(WORLD_SIZE_VAR, spec.processes.to_string())
            .env(LOCAL_RANK_VAR, rank.to_string())
            .env("LOCAL_WORLD_SIZE", spec.processes.to_string())
            .env(MASTER_ADDR_VAR, "127.0.0.1")
            .env(MASTER_PORT_VAR, port.to_string())
            .env(TIMEOUT_VAR, spec.rendezvous_timeout.as_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        for (_, k, v) in spec.rank_env.iter().filter(|(r, _, _)| *r == rank) {
            cmd.env(k, v);
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                kill_all(&mut children);
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("starting rank {rank} ({}): {e}", spec.program.display()),
                ));
            }
        };
        let out = Arc::new(Mutex::new(String::new()));
        let err = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        if let Some(s) = child.stdout.take() {
            readers.push(drain(s, rank, spec.echo, out.clone()));
        }
        if let Some(s) = child.stderr.take() {
            readers.push(drain(s, rank, spec.echo, err.clone()));
        }
        outputs.push((out, err, readers));
        children.push(Some(child));
    }
    let deadline = Instant::now() + spec.deadline;
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; spec.processes];
    let mut killed = vec![false; spec.processes];
    // Bounded by the deadline.
    loop {
        for (rank, slot) in children.iter_mut().enumerate() {
            if let Some(child) = slot
                && let Ok(Some(status)) = child.try_wait()
            {
                statuses[rank] = Some(status);
                *slot = None;
            }
        }
        if children.iter().all(Option::is_none) {
            break;
        }
        if Instant::now() >= deadline {
            for (rank, slot) in children.iter_mut().enumerate() {
                if let Some(child) = slot.as_mut() {
                    let _ = child.kill();
                    statuses[rank] = child.wait().ok();
                    killed[rank] = true;
                    *slot = None;
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut ranks = Vec::with_capacity(spec.processes);
    for (rank, (out, err, readers)) in outputs.into_iter().enumerate() {
        for r in readers {
            let _ = r.join();
        }
        let take = |s: Arc<Mutex<String>>| s.lock().unwrap_or_else(|p| p.into_inner()).clone();
        ranks.push(RankOutcome {
            rank,
            status: statuses[rank],
            killed_at_deadline: killed[rank],
            stdout: take(out),
            stderr: take(err),
        });
    }
    Ok(LaunchOutcome { port, ranks })
}
