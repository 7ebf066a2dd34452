//! Running child `cargo` commands from the workspace root, streaming their
//! output to the terminal while capturing it for parsing.

use std::env;
use std::ffi::OsString;
use std::io::{self, IsTerminal, Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;

use crate::paths::workspace_root;

/// The output of a finished child cargo.
#[derive(Debug)]
pub struct Captured {
    /// How the child ended.
    pub status: ExitStatus,
    /// Everything the child wrote to stdout (lossy UTF-8).
    pub stdout: String,
    /// Everything the child wrote to stderr (lossy UTF-8); empty when
    /// stderr was passed straight through.
    pub stderr: String,
}

impl Captured {
    /// A short description of why the child failed: cargo's own
    /// `process didn't exit successfully: ...` line when there is one
    /// (it names the signal of a crashed test binary), else the exit status.
    pub fn failure_detail(&self) -> String {
        failure_detail(&self.stderr, &self.status.to_string())
    }
}

/// Pure part of [`Captured::failure_detail`].
fn failure_detail(stderr: &str, status: &str) -> String {
    stderr
        .lines()
        .map(str::trim)
        .find(|line| line.contains("didn't exit successfully"))
        .map(|line| {
            // Keep only the tail: the full command line of the test
            // binary is long and not useful here.
            match line.rfind(" (") {
                Some(at) if line.ends_with(')') => {
                    format!("{status}; {}", &line[at + 2..line.len() - 1])
                }
                _ => format!("{status}; {line}"),
            }
        })
        .unwrap_or_else(|| status.to_string())
}

/// One child cargo invocation.
#[derive(Debug, Clone)]
pub struct Cargo {
    args: Vec<String>,
    envs: Vec<(String, OsString)>,
}

impl Cargo {
    /// A cargo command with the given arguments (without the `cargo`).
    pub fn new<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            args: args.into_iter().map(Into::into).collect(),
            envs: Vec::new(),
        }
    }

    /// The same command with the environment variable `key` set to `value`.
    pub fn env(mut self, key: &str, value: impl Into<OsString>) -> Self {
        self.envs.push((key.to_owned(), value.into()));
        self
    }

    /// The command line, for messages.
    pub fn display(&self) -> String {
        let mut line = String::new();
        for (k, v) in &self.envs {
            line.push_str(&format!("{k}={} ", v.to_string_lossy()));
        }
        line.push_str("cargo");
        for arg in &self.args {
            line.push(' ');
            line.push_str(arg);
        }
        line
    }

    /// Run it, copying stdout and stderr to ours as they arrive and
    /// capturing both.
    pub fn tee(&self) -> io::Result<Captured> {
        let mut child = self
            .command()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let out = child.stdout.take().expect("stdout was piped");
        let err = child.stderr.take().expect("stderr was piped");
        let out_pump = thread::spawn(move || pump(out, io::stdout()));
        let err_pump = thread::spawn(move || pump(err, io::stderr()));
        let status = child.wait()?;
        let stdout = join_pump(out_pump)?;
        let stderr = join_pump(err_pump)?;
        Ok(Captured {
            status,
            stdout,
            stderr,
        })
    }

    /// Run it, capturing stdout silently and passing stderr (cargo's build
    /// progress) straight through.
    pub fn capture_stdout(&self) -> io::Result<Captured> {
        let output = self
            .command()
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .output()?;
        Ok(Captured {
            status: output.status,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::new(),
        })
    }

    fn command(&self) -> Command {
        let program = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
        let mut command = Command::new(program);
        command
            .args(&self.args)
            .current_dir(workspace_root())
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        for (k, v) in &self.envs {
            command.env(k, v);
        }
        // Our pipes hide the terminal from the child; keep cargo's colours
        // when the user is looking at one.
        if env::var_os("CARGO_TERM_COLOR").is_none() && io::stderr().is_terminal() {
            command.env("CARGO_TERM_COLOR", "always");
        }
        command
    }
}

/// Copy `from` to `to` chunk by chunk (so partial lines show up at once),
/// returning everything read. A broken terminal does not stop the capture.
fn pump<R: Read, W: Write>(mut from: R, mut to: W) -> io::Result<Vec<u8>> {
    let mut all = Vec::new();
    let mut buf = [0u8; 8192];
    let mut echo = true;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        all.extend_from_slice(&buf[..n]);
        if echo && (to.write_all(&buf[..n]).is_err() || to.flush().is_err()) {
            echo = false;
        }
    }
    Ok(all)
}

fn join_pump(handle: thread::JoinHandle<io::Result<Vec<u8>>>) -> io::Result<String> {
    let bytes = handle
        .join()
        .map_err(|_| io::Error::other("output pump thread panicked"))??;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `--no-default-features` plus `--features a,b` when `features` is not
/// empty.
pub fn feature_args(features: &[String]) -> Vec<String> {
    let mut args = vec!["--no-default-features".to_string()];
    if !features.is_empty() {
        args.push("--features".to_string());
        args.push(features.join(","));
    }
    args
}

#[cfg(test)]
mod tests {

    #[test]
    fn env_shows_in_the_command_line() {
        let c = Cargo::new(["test", "-p", "x"]).env("COMPUTE_CPU_JIT", "0");
        assert_eq!(c.display(), "COMPUTE_CPU_JIT=0 cargo test -p x");
        let cmd = c.command();
        let envs: Vec<_> = cmd.get_envs().collect();
        assert!(envs.contains(&(
            std::ffi::OsStr::new("COMPUTE_CPU_JIT"),
            Some(std::ffi::OsStr::new("0"))
        )));
    }

    use super::*;

    #[test]
    fn feature_args_with_and_without_features() {
        assert_eq!(feature_args(&[]), vec!["--no-default-features"]);
        assert_eq!(
            feature_args(&["cpu".into(), "wgpu".into()]),
            vec!["--no-default-features", "--features", "cpu,wgpu"]
        );
    }

    #[test]
    fn display_joins_args() {
        let cargo = Cargo::new(["test", "-p", "compute-tests"]);
        assert_eq!(cargo.display(), "cargo test -p compute-tests");
    }

    #[test]
    fn failure_detail_prefers_cargo_crash_line() {
        let stderr = "     Running tests/conformance.rs (target/debug/deps/conformance-abc)\n\
            error: test failed, to rerun pass `--test conformance`\n\n\
            Caused by:\n  process didn't exit successfully: `/w/target/debug/deps/conformance-abc cpu::` \
            (signal: 11, SIGSEGV: invalid memory reference)\n";
        assert_eq!(
            failure_detail(stderr, "exit status: 101"),
            "exit status: 101; signal: 11, SIGSEGV: invalid memory reference"
        );
        assert_eq!(
            failure_detail("error: could not compile `x`\n", "exit status: 101"),
            "exit status: 101"
        );
    }

    #[test]
    fn pump_copies_and_captures() {
        let input: &[u8] = b"line one\npartial";
        let mut sink = Vec::new();
        let got = pump(input, &mut sink).unwrap();
        assert_eq!(got, b"line one\npartial");
        assert_eq!(sink, b"line one\npartial");
    }
}
