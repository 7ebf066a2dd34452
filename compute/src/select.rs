//! Run-time backend selection: [`Backend`], [`Backend::best`], and [`RunOn`] to run code generic
//! over `R: Runtime` on the chosen backend.

use core::fmt;

use compute_core::{ComputeClient, Runtime};

/// Env var naming the backend [`Backend::best`] must pick (`cpu`, `wgpu`, `vulkan` or `cuda`).
pub const BACKEND_ENV: &str = "COMPUTE_BACKEND";

/// A backend of the runtime. Every variant exists whatever the features; [`is_compiled`]
/// says whether this build has it, [`availability`] whether it can run here.
///
/// [`is_compiled`]: Backend::is_compiled
/// [`availability`]: Backend::availability
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// NVIDIA GPUs through CUDA (feature `cuda`).
    Cuda,
    /// Vulkan devices through ash (feature `vulkan`).
    Vulkan,
    /// Vulkan devices through wgpu (feature `wgpu`).
    Wgpu,
    /// The host CPU (feature `cpu`, the default).
    Cpu,
}

/// Code written once, generic over `R: Runtime`, to run on a backend chosen at run time with
/// [`Backend::run`] or [`Choice::run`].
///
/// The output type does not depend on `R`, so the caller gets the same type whichever backend ran.
pub trait RunOn {
    /// What the job returns.
    type Output;

    /// Run the job with a client of the chosen backend's default device.
    fn run<R: Runtime>(self, client: ComputeClient<R>) -> Self::Output;
}

/// One compiled-in backend and whether it can run here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendStatus {
    /// The backend.
    pub backend: Backend,
    /// `Ok` when its driver is present with at least one device, else the reason.
    pub availability: Result<(), String>,
}

/// The backend [`Backend::best`] picked, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The backend picked.
    pub backend: Backend,
    /// Why it was picked: the override, or the backends skipped before it and their reasons.
    pub reason: String,
}

impl Choice {
    /// Run `job` on the chosen backend's default device (see [`Backend::run`]).
    pub fn run<J: RunOn>(&self, job: J) -> Result<J::Output, BackendError> {
        self.backend.run(job)
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.backend, self.reason)
    }
}

/// Why no backend could be picked or started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// The override names no backend.
    UnknownName {
        /// The name given.
        name: String,
        /// The backends compiled into this build.
        compiled: Vec<Backend>,
    },
    /// The backend exists but this build does not have it (its feature of `compute` is off).
    NotCompiled {
        /// The backend asked for.
        backend: Backend,
        /// The backends compiled into this build.
        compiled: Vec<Backend>,
    },
    /// The backend is compiled in but cannot run here.
    Unavailable {
        /// The backend asked for.
        backend: Backend,
        /// Why it cannot run.
        reason: String,
        /// Every compiled-in backend and its availability.
        status: Vec<BackendStatus>,
    },
    /// No compiled-in backend can run here.
    NoneAvailable {
        /// Every compiled-in backend and why it cannot run.
        status: Vec<BackendStatus>,
    },
    /// The backend's server could not be started on its default device.
    Load {
        /// The backend.
        backend: Backend,
        /// The server's error.
        error: String,
    },
}

fn list(backends: &[Backend]) -> String {
    if backends.is_empty() {
        return "none".to_string();
    }
    backends
        .iter()
        .map(|b| b.name())
        .collect::<Vec<_>>()
        .join(", ")
}

fn list_status(status: &[BackendStatus]) -> String {
    if status.is_empty() {
        return "no backend compiled in".to_string();
    }
    status
        .iter()
        .map(|s| match &s.availability {
            Ok(()) => format!("{} available", s.backend),
            Err(reason) => format!("{} unavailable: {reason}", s.backend),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownName { name, compiled } => write!(
                f,
                "unknown backend `{name}`: the choices are {} (compiled into this build: {})",
                list(&Backend::PREFERENCE),
                list(compiled)
            ),
            Self::NotCompiled { backend, compiled } => write!(
                f,
                "backend `{backend}` is not compiled into this build (enable the `{backend}` \
                 feature of `compute`); the choices are: {}",
                list(compiled)
            ),
            Self::Unavailable {
                backend,
                reason,
                status,
            } => write!(
                f,
                "backend `{backend}` cannot run here ({reason}); the choices are: {}",
                list_status(status)
            ),
            Self::NoneAvailable { status } => {
                write!(f, "no backend can run here: {}", list_status(status))
            }
            Self::Load { backend, error } => {
                write!(
                    f,
                    "cannot start the {backend} backend's default device: {error}"
                )
            }
        }
    }
}

impl std::error::Error for BackendError {}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl core::str::FromStr for Backend {
    type Err = BackendError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Backend::from_name(name).ok_or_else(|| BackendError::UnknownName {
            name: name.to_string(),
            compiled: Backend::compiled(),
        })
    }
}

fn load_and_run<R: Runtime, J: RunOn>(backend: Backend, job: J) -> Result<J::Output, BackendError> {
    let client =
        ComputeClient::<R>::try_load(&R::Device::default()).map_err(|e| BackendError::Load {
            backend,
            error: e.to_string(),
        })?;
    Ok(job.run(client))
}

impl Backend {
    /// Every backend, in the order [`best`](Self::best) tries them.
    pub const PREFERENCE: [Backend; 4] =
        [Backend::Cuda, Backend::Vulkan, Backend::Wgpu, Backend::Cpu];

    /// The backend's name, as [`Runtime::name`] and the cargo feature spell it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cuda => "cuda",
            Backend::Vulkan => "vulkan",
            Backend::Wgpu => "wgpu",
            Backend::Cpu => "cpu",
        }
    }

    /// The backend called `name` (ASCII case and surrounding spaces ignored).
    pub fn from_name(name: &str) -> Option<Backend> {
        let name = name.trim();
        Self::PREFERENCE
            .into_iter()
            .find(|b| b.name().eq_ignore_ascii_case(name))
    }

    /// Whether this build has the backend (its feature of `compute` is on).
    pub fn is_compiled(self) -> bool {
        match self {
            Backend::Cuda => cfg!(feature = "cuda"),
            Backend::Vulkan => cfg!(feature = "vulkan"),
            Backend::Wgpu => cfg!(feature = "wgpu"),
            Backend::Cpu => cfg!(feature = "cpu"),
        }
    }

    /// The backends compiled into this build, in preference order.
    pub fn compiled() -> Vec<Backend> {
        Self::PREFERENCE
            .into_iter()
            .filter(|b| b.is_compiled())
            .collect()
    }

    /// Whether the backend can run here: compiled in, its driver present, at least one device.
    /// The reason when not. Probes the driver (loads its library) on every call.
    pub fn availability(self) -> Result<(), String> {
        match self {
            #[cfg(feature = "cuda")]
            Backend::Cuda => compute_cuda::CudaRuntime::availability(),
            #[cfg(feature = "vulkan")]
            Backend::Vulkan => compute_vulkan::VulkanRuntime::availability(),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => compute_wgpu::WgpuRuntime::availability(),
            #[cfg(feature = "cpu")]
            Backend::Cpu => compute_cpu::CpuRuntime::availability(),
            #[allow(unreachable_patterns)]
            other => Err(format!(
                "not compiled into this build (enable the `{other}` feature of `compute`)"
            )),
        }
    }

    /// Every compiled-in backend with its availability, in preference order.
    pub fn status() -> Vec<BackendStatus> {
        Self::compiled()
            .into_iter()
            .map(|backend| BackendStatus {
                backend,
                availability: backend.availability(),
            })
            .collect()
    }

    /// The backend to run on: the one `COMPUTE_BACKEND` names, else the first available of cuda,
    /// vulkan, wgpu, cpu among those compiled in. An unknown, not compiled-in or unavailable
    /// name is an error listing the choices (the override never falls back silently).
    pub fn best() -> Result<Choice, BackendError> {
        let requested = compute_core::env::text(BACKEND_ENV);
        Self::choose(requested.as_deref())
    }

    /// [`best`](Self::best) with the override given rather than read from the environment
    /// (`None` or an empty name: no override).
    pub fn choose(requested: Option<&str>) -> Result<Choice, BackendError> {
        if let Some(name) = requested.map(str::trim).filter(|n| !n.is_empty()) {
            let backend = name.parse::<Backend>()?;
            if !backend.is_compiled() {
                return Err(BackendError::NotCompiled {
                    backend,
                    compiled: Self::compiled(),
                });
            }
            return match backend.availability() {
                Ok(()) => Ok(Choice {
                    backend,
                    reason: format!("{BACKEND_ENV}={name}"),
                }),
                Err(reason) => Err(BackendError::Unavailable {
                    backend,
                    reason,
                    status: Self::status(),
                }),
            };
        }
        let mut skipped = Vec::new();
        let mut status = Vec::new();
        for backend in Self::compiled() {
            let availability = backend.availability();
            match &availability {
                Ok(()) => {
                    let mut reason =
                        format!("first available of {} compiled in", list(&Self::compiled()));
                    if !skipped.is_empty() {
                        reason.push_str("; skipped ");
                        reason.push_str(&skipped.join("; "));
                    }
                    return Ok(Choice { backend, reason });
                }
                Err(why) => skipped.push(format!("{backend}: {why}")),
            }
            status.push(BackendStatus {
                backend,
                availability,
            });
        }
        Err(BackendError::NoneAvailable { status })
    }

    /// Run `job` on this backend's default device (its client is loaded, or its server started
    /// on first use). An error when the backend is not compiled in or its server cannot start.
    pub fn run<J: RunOn>(self, job: J) -> Result<J::Output, BackendError> {
        match self {
            #[cfg(feature = "cuda")]
            Backend::Cuda => load_and_run::<compute_cuda::CudaRuntime, J>(self, job),
            #[cfg(feature = "vulkan")]
            Backend::Vulkan => load_and_run::<compute_vulkan::VulkanRuntime, J>(self, job),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => load_and_run::<compute_wgpu::WgpuRuntime, J>(self, job),
            #[cfg(feature = "cpu")]
            Backend::Cpu => load_and_run::<compute_cpu::CpuRuntime, J>(self, job),
            #[allow(unreachable_patterns)]
            backend => {
                let _ = job;
                Err(BackendError::NotCompiled {
                    backend,
                    compiled: Self::compiled(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for b in Backend::PREFERENCE {
            assert_eq!(Backend::from_name(b.name()), Some(b));
            assert_eq!(b.name().parse::<Backend>(), Ok(b));
        }
        assert_eq!(Backend::from_name(" CUDA "), Some(Backend::Cuda));
        assert_eq!(Backend::from_name("metal"), None);
    }

    #[test]
    fn unknown_override_lists_the_choices() {
        let err = Backend::choose(Some("metal")).unwrap_err();
        assert_eq!(
            err,
            BackendError::UnknownName {
                name: "metal".into(),
                compiled: Backend::compiled()
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("unknown backend `metal`") && text.contains("cuda, vulkan, wgpu, cpu"),
            "{text}"
        );
    }

    #[test]
    fn compiled_follows_features() {
        assert_eq!(Backend::Cpu.is_compiled(), cfg!(feature = "cpu"));
        assert_eq!(Backend::Cuda.is_compiled(), cfg!(feature = "cuda"));
        let compiled = Backend::compiled();
        let order: Vec<usize> = compiled
            .iter()
            .map(|b| Backend::PREFERENCE.iter().position(|p| p == b).unwrap())
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{compiled:?}");
    }

    #[test]
    fn not_compiled_backend_is_an_error_naming_the_feature() {
        for b in Backend::PREFERENCE.into_iter().filter(|b| !b.is_compiled()) {
            let err = Backend::choose(Some(b.name())).unwrap_err();
            assert!(
                matches!(err, BackendError::NotCompiled { backend, .. } if backend == b),
                "{err:?}"
            );
            assert!(err.to_string().contains("feature of `compute`"));
            assert!(b.availability().unwrap_err().contains("not compiled"));
        }
    }

    #[cfg(feature = "cpu")]
    #[test]
    fn cpu_override_is_honoured_and_runs_generic_code() {
        struct Name;
        impl RunOn for Name {
            type Output = &'static str;
            fn run<R: Runtime>(self, client: ComputeClient<R>) -> &'static str {
                let h = client.create(compute_core::Bytes::from_elem_slice(&[7u32, 8]));
                assert_eq!(client.read_one(h).unwrap().to_elems::<u32>(), [7, 8]);
                R::name()
            }
        }
        let choice = Backend::choose(Some("cpu")).unwrap();
        assert_eq!(choice.backend, Backend::Cpu);
        assert_eq!(choice.reason, "COMPUTE_BACKEND=cpu");
        assert_eq!(choice.run(Name).unwrap(), "cpu");
        // Without an override, some compiled-in backend is picked (the CPU is always available).
        let best = Backend::choose(None).unwrap();
        assert!(
            best.reason.starts_with("first available of"),
            "{}",
            best.reason
        );
    }

    /// `best()` reads `COMPUTE_BACKEND`: run this test binary again with the variable set.
    #[cfg(feature = "cpu")]
    #[test]
    fn best_reads_the_env_var() {
        if std::env::var_os("COMPUTE_FACADE_CHILD").is_some() {
            let expect = std::env::var(BACKEND_ENV).unwrap();
            match Backend::best() {
                Ok(c) => assert_eq!(c.backend.name(), expect),
                Err(e) => assert!(expect == "metal" && e.to_string().contains("metal")),
            }
            return;
        }
        let exe = std::env::current_exe().unwrap();
        for value in ["cpu", "metal"] {
            let out = std::process::Command::new(&exe)
                .args(["--exact", "select::tests::best_reads_the_env_var"])
                .env("COMPUTE_FACADE_CHILD", "1")
                .env(BACKEND_ENV, value)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{value}: {stdout}");
            assert!(
                stdout.contains("1 passed"),
                "{value}: the child ran no test: {stdout}"
            );
        }
    }
}
