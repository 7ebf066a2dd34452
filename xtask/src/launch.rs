//! `cargo xtask launch -n N [--timeout-ms MS] [--deadline-s S] -- PROGRAM [ARGS]`: start N local
//! processes of PROGRAM as one world (compute-core's launcher: `RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `MASTER_ADDR=127.0.0.1`, a free `MASTER_PORT`, `COMPUTE_RENDEZVOUS_TIMEOUT_MS`),
//! print their output prefixed by rank, and exit 0 only when every rank exited 0.

use std::time::Duration;

use compute_core::collective::launch::{Launch, launch};

/// The parsed command line.
#[derive(Debug, PartialEq, Eq)]
pub struct Args {
    /// Processes.
    pub processes: usize,
    /// Rendezvous timeout in milliseconds.
    pub timeout_ms: u64,
    /// Seconds before the launcher kills the ranks still running.
    pub deadline_s: u64,
    /// The program and its arguments.
    pub command: Vec<String>,
}

/// Parse `launch`'s arguments.
pub fn parse(args: &[String]) -> Result<Args, String> {
    let mut out = Args {
        processes: 0,
        timeout_ms: 30_000,
        deadline_s: 600,
        command: Vec::new(),
    };
    let mut i = 0;
    while i < args.len() {
        let value = |i: usize| {
            args.get(i + 1)
                .ok_or_else(|| format!("{} needs a value", args[i]))
        };
        let number = |i: usize| -> Result<u64, String> {
            let v = value(i)?;
            v.parse::<u64>()
                .map_err(|_| format!("{} {v}: not a number", args[i]))
        };
        match args[i].as_str() {
            "-n" | "--processes" => {
                out.processes = number(i)? as usize;
                i += 2;
            }
            "--timeout-ms" => {
                out.timeout_ms = number(i)?;
                i += 2;
            }
            "--deadline-s" => {
                out.deadline_s = number(i)?;
                i += 2;
            }
            "--" => {
                out.command = args[i + 1..].to_vec();
                break;
            }
            other => return Err(format!("unknown launch option {other}")),
        }
    }
    if out.processes == 0 {
        return Err("launch needs -n N (at least 1 process)".into());
    }
    if out.timeout_ms == 0 || out.deadline_s == 0 {
        return Err("--timeout-ms and --deadline-s must be above 0".into());
    }
    if out.command.is_empty() {
        return Err("launch needs `-- PROGRAM [ARGS]`".into());
    }
    Ok(out)
}

/// Run `launch`; returns the exit code.
pub fn run(args: &[String]) -> i32 {
    let args = match parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("xtask: {e}");
            return 2;
        }
    };
    let rest: Vec<&str> = args.command[1..].iter().map(String::as_str).collect();
    let mut spec = Launch::new(args.processes, &args.command[0], &rest);
    spec.rendezvous_timeout = Duration::from_millis(args.timeout_ms);
    spec.deadline = Duration::from_secs(args.deadline_s);
    spec.echo = true;
    match launch(&spec) {
        Ok(outcome) => {
            eprint!(
                "xtask: {} processes on 127.0.0.1:{}\n{}",
                args.processes,
                outcome.port,
                outcome.summary()
            );
            if outcome.success() {
                0
            } else {
                eprintln!("xtask: launch FAILED: a rank did not exit 0");
                1
            }
        }
        Err(e) => {
            eprintln!("xtask: launch FAILED: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses() {
        assert_eq!(
            parse(&args(&[
                "-n",
                "4",
                "--timeout-ms",
                "500",
                "--",
                "bin",
                "a",
                "-n"
            ]))
            .unwrap(),
            Args {
                processes: 4,
                timeout_ms: 500,
                deadline_s: 600,
                command: args(&["bin", "a", "-n"]),
            }
        );
        assert!(parse(&args(&["--", "bin"])).is_err());
        assert!(parse(&args(&["-n", "x", "--", "bin"])).is_err());
        assert!(parse(&args(&["-n", "2"])).is_err());
        assert!(parse(&args(&["-n", "2", "--frob", "--", "bin"])).is_err());
    }

    #[test]
    fn launches_and_reports_exit_codes() {
        // `sh` stands in for a rank: it sees the variables the launcher sets.
        let ok = args(&[
            "-n",
            "3",
            "--",
            "sh",
            "-c",
            "test \"$WORLD_SIZE\" = 3 && test \"$RANK\" -lt 3 && test -n \"$MASTER_PORT\"",
        ]);
        assert_eq!(run(&ok), 0);
        let bad = args(&["-n", "2", "--", "sh", "-c", "test \"$RANK\" = 0"]);
        assert_eq!(run(&bad), 1);
    }
}
