//! Every `COMPUTE_*` environment setting of the runtime, in one table, read by one parser.
//!
//! Backends read settings through [`flag`], [`number`] and [`text`], never with `std::env`
//! directly, so that each setting is documented once ([`SETTINGS`], listed in the README) and a
//! value that does not parse is reported (once, on stderr, naming the setting and what it
//! accepts) instead of being ignored in silence. The library never sets environment variables.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Mutex;

/// One environment setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The variable's name.
    pub name: &'static str,
    /// What it changes.
    pub meaning: &'static str,
    /// What happens when it is not set.
    pub default: &'static str,
    /// The values it accepts.
    pub accepted: &'static str,
}

const fn setting(
    name: &'static str,
    meaning: &'static str,
    default: &'static str,
    accepted: &'static str,
) -> Setting {
    Setting {
        name,
        meaning,
        default,
        accepted,
    }
}

/// Every setting the runtime, its tests and its tools read.
pub const SETTINGS: &[Setting] = &[
    setting(
        "COMPUTE_COPY_THREADS",
        "threads of the host copy team (large host copies, CUDA staging)",
        "the number of cores, at most 16",
        "a number from 1 to 64",
    ),
    setting(
        "COMPUTE_CPU_DEVICES",
        "number of logical CPU devices",
        "2",
        "a positive number",
    ),
    setting(
        "COMPUTE_CPU_JIT",
        "compile CPU kernels to machine code (cranelift); 0 runs the interpreter",
        "on",
        "0 or 1",
    ),
    setting(
        "COMPUTE_CPU_JIT_LOG",
        "log each CPU kernel's JIT compile time and each fallback to the interpreter on stderr",
        "off",
        "0 or 1",
    ),
    setting(
        "COMPUTE_CPU_SIMD",
        "the instruction set of both CPU paths: baseline forces plain SSE2 / no optional features (to test CPUs without AVX2)",
        "what the CPU reports (AVX2, FMA, AVX-512F, NEON)",
        "baseline",
    ),
    setting(
        "COMPUTE_CPU_SPLIT",
        "pieces per worker thread a CPU launch's cubes are split into (load balance against per-piece cost)",
        "4",
        "a number from 1 to 256",
    ),
    setting(
        "COMPUTE_WGPU_DEVICES",
        "number of logical wgpu devices (spread over the adapters)",
        "the number of adapters, at least 2",
        "a positive number",
    ),
    setting(
        "COMPUTE_WGPU_MAX_BATCH",
        "dispatches per wgpu command buffer (fixed instead of adaptive)",
        "adaptive (grows from a small first batch)",
        "a positive number",
    ),
    setting(
        "COMPUTE_WGPU_INLINE_SUBMIT",
        "submit waited-for wgpu batches on the caller's thread",
        "off",
        "0 or 1",
    ),
    setting(
        "COMPUTE_VULKAN_DEVICES",
        "number of logical Vulkan devices (round robin over the physical ones)",
        "one per physical device",
        "a positive number",
    ),
    setting(
        "COMPUTE_VULKAN_MAX_BATCH",
        "dispatches per Vulkan command buffer (fixed instead of adaptive)",
        "adaptive",
        "a positive number",
    ),
    setting(
        "COMPUTE_VULKAN_INLINE_SUBMIT",
        "submit waited-for Vulkan batches on the caller's thread",
        "on",
        "0 or 1",
    ),
    setting(
        "COMPUTE_VULKAN_VALIDATION",
        "run under the Khronos validation layer; any message fails the call",
        "off",
        "0 or 1",
    ),
    setting(
        "COMPUTE_VULKAN_CACHE_DIR",
        "directory of the Vulkan pipeline cache",
        "$XDG_CACHE_HOME/compute-vulkan, else ~/.cache/compute-vulkan",
        "a directory path; off or empty turns the cache off",
    ),
    setting(
        "COMPUTE_CUDA_CACHE_DIR",
        "directory of the CUDA kernel (NVRTC) cache",
        "$XDG_CACHE_HOME/compute-cuda, else ~/.cache/compute-cuda",
        "a directory path; off or empty turns the cache off",
    ),
    setting(
        "COMPUTE_CUDA_STAGING",
        "the staging plan of CUDA pageable writes (for tuning)",
        "the built-in plan",
        "divisor,min_kib,max_kib,ring[,direct_kib[,streaming_kib[,demote_kib[,part_kib[,fill_kib]]]]]",
    ),
    setting(
        "COMPUTE_CUDA_HAND_OVER",
        "the copy team starts the DMA of staged CUDA writes (off for A/B runs)",
        "on",
        "0 or 1",
    ),
    setting(
        "COMPUTE_RENDEZVOUS_TIMEOUT_MS",
        "bound on every wait of the multi-process rendezvous and host collectives (with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); a bad value is an error of init_world_from_env",
        "60000",
        "a positive number of milliseconds",
    ),
    setting(
        "COMPUTE_COLLECTIVE_CHECK",
        "exchange a small header (round, dtype, operation, size) before every NCCL collective, so a mismatch is an error on every rank",
        "off",
        "0/1, false/true, off/on",
    ),
    setting(
        "COMPUTE_SKIP_LOG",
        "file where tests append the ones that could only run a reduced form (cargo xtask test-all sets it and reports them as skipped)",
        "unset: reduced runs are only noted on stderr",
        "a file path",
    ),
    setting(
        "COMPUTE_BACKEND",
        "the backend compute::Backend::best() picks, instead of the first available",
        "the first available of cuda, vulkan, wgpu, cpu",
        "cpu, wgpu, vulkan or cuda",
    ),
    setting(
        "COMPUTE_FACADE_CHILD",
        "internal to the facade's tests: marks the child process that checks the override",
        "unset",
        "any value (set by the test itself)",
    ),
    setting(
        "COMPUTE_CHILD_TEST",
        "internal to the tests that need a fresh process (disk caches): names the test the child runs",
        "unset",
        "a test name (set by compute_core::env::run_test_in_child)",
    ),
    setting(
        "COMPUTE_REQUIRE_BACKENDS",
        "cargo xtask: backends whose absence fails the run (CI sets it)",
        "none",
        "a comma-separated list of cpu, wgpu, vulkan, cuda",
    ),
    setting(
        "COMPUTE_BACKENDS",
        "cargo xtask: the backends to test or bench",
        "every backend that can run here",
        "a comma-separated list of cpu, wgpu, vulkan, cuda",
    ),
];

/// The table entry of `name`.
///
/// # Panics
/// Panics when `name` is not in [`SETTINGS`]: every setting must be documented there.
pub fn setting_of(name: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} is not in compute_core::env::SETTINGS"))
}

/// Report a value that does not parse, once per setting.
fn reject(name: &str, value: &str) {
    static REPORTED: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut reported = REPORTED.lock().unwrap_or_else(|p| p.into_inner());
    if reported
        .get_or_insert_with(HashSet::new)
        .insert(name.to_owned())
    {
        let s = setting_of(name);
        eprintln!(
            "compute: ignoring {name}={value:?}: it accepts {}; using the default ({})",
            s.accepted, s.default
        );
    }
}

/// The raw value of a documented setting, `None` when unset or empty.
pub fn text(name: &str) -> Option<String> {
    setting_of(name);
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A setting parsed by `parse`; a value it refuses is reported once and treated as unset.
pub fn parsed<T>(name: &str, parse: impl FnOnce(&str) -> Option<T>) -> Option<T> {
    let value = text(name)?;
    let parsed = parse(value.trim());
    if parsed.is_none() {
        reject(name, &value);
    }
    parsed
}

/// An on/off setting (`0`/`1`, `false`/`true`, `off`/`on`); `default` when unset or invalid.
pub fn flag(name: &str, default: bool) -> bool {
    parsed(name, |v| match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => None,
    })
    .unwrap_or(default)
}

/// A positive number; `None` when unset, and when invalid or zero (reported once).
pub fn positive<T: core::str::FromStr + PartialOrd + Default>(name: &str) -> Option<T> {
    parsed(name, |v| v.parse::<T>().ok().filter(|n| *n > T::default()))
}

/// The cache directory of a backend: the setting `name` when set (`off` or an empty value
/// turns the cache off: `None`), else `$XDG_CACHE_HOME/<dir>`, else `~/.cache/<dir>`; `None`
/// when none of them is known.
pub fn cache_dir(name: &str, dir: &str) -> Option<PathBuf> {
    setting_of(name);
    match std::env::var(name) {
        Ok(v) if v.trim().is_empty() || v.trim() == "off" => return None,
        Ok(v) => return Some(PathBuf::from(v)),
        Err(_) => {}
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join(dir))
}

/// Record that the running test could not run its real form (too few devices, no driver), and
/// why: a line `TEST<TAB>REASON` is appended to the file `COMPUTE_SKIP_LOG` names, which
/// `cargo xtask test-all` reads to count the test as skipped instead of passed. `TEST` is the
/// libtest name, taken from the test thread's name. Always noted on stderr too.
pub fn report_reduced(reason: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("<unnamed test>");
    eprintln!("{test}: reduced run, reported as skipped: {reason}");
    let Some(path) = text("COMPUTE_SKIP_LOG") else {
        return;
    };
    let line = format!("{test}\t{}\n", reason.replace(['\t', '\n'], " "));
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!("compute: cannot append to COMPUTE_SKIP_LOG={path}: {e}");
    }
}

/// The variable [`run_test_in_child`] sets in the child, so that the test knows it is the child.
pub const CHILD_TEST_VAR: &str = "COMPUTE_CHILD_TEST";

/// Run the test `name` of the current test binary again, alone, in a child process, with `env`
/// added and [`CHILD_TEST_VAR`] set to `name`; return its standard output, or why it failed.
/// For tests that need a fresh process (disk caches, process-wide state): the test checks
/// [`is_child_test`] to know which side it is on.
pub fn run_test_in_child(name: &str, env: &[(&str, &std::ffi::OsStr)]) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut command = std::process::Command::new(exe);
    command
        .args([name, "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD_TEST_VAR, name);
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command
        .output()
        .map_err(|e| format!("starting the child: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "the child test {name} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(stdout)
}

/// Run the test `name` in a child process (see [`run_test_in_child`]) and read the counts it
/// printed on a line `{prefix}key=value key=value ...`: the values by key.
pub fn child_test_counts(
    name: &str,
    env: &[(&str, &std::ffi::OsStr)],
    prefix: &str,
) -> Result<std::collections::BTreeMap<String, u64>, String> {
    let out = run_test_in_child(name, env)?;
    let line = out
        .lines()
        .find_map(|l| l.split_once(prefix).map(|(_, rest)| rest))
        .ok_or_else(|| format!("no line with {prefix:?} from the child:\n{out}"))?;
    line.split_whitespace()
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("{kv:?} in {line:?} is not key=value"))?;
            let v = v.parse().map_err(|e| format!("{kv:?} in {line:?}: {e}"))?;
            Ok((k.to_string(), v))
        })
        .collect()
}

/// A new, empty directory under the system's temporary directory, for a test (named by
/// `label`, the process and the time, so that concurrent runs do not share it).
pub fn scratch_dir(label: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("{label}-{}-{nanos}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        panic!("cannot create the scratch directory {}: {e}", dir.display());
    }
    dir
}

/// Whether this process is the child [`run_test_in_child`] started for test `name`.
pub fn is_child_test(name: &str) -> bool {
    std::env::var(CHILD_TEST_VAR).is_ok_and(|v| v == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_is_documented_once() {
        let mut names = HashSet::new();
        for s in SETTINGS {
            assert!(s.name.starts_with("COMPUTE_"), "{}", s.name);
            assert!(names.insert(s.name), "{} is listed twice", s.name);
            assert!(!s.meaning.is_empty() && !s.default.is_empty() && !s.accepted.is_empty());
        }
    }

    #[test]
    fn the_readme_lists_every_setting_as_the_table_says() {
        let readme = include_str!("../../README.md");
        for s in SETTINGS {
            let row = format!(
                "| `{}` | {} | {} | {} |",
                s.name, s.meaning, s.default, s.accepted
            );
            assert!(
                readme.lines().any(|line| line.trim() == row),
                "README.md lacks the row {row}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "not in compute_core::env::SETTINGS")]
    fn an_undocumented_setting_is_a_bug() {
        let _ = text("COMPUTE_NOT_A_SETTING");
    }
}
