//! The facade crate `compute`: run-time backend selection and generic code run through
//! [`Backend::run`].

use compute::{Backend, BackendError, RunOn};
use compute_core::{Bytes, ComputeClient, CubeCount, KernelArguments, Runtime};

use crate::kernels;

/// The facade's backend for the runtime under test.
fn backend_of<R: Runtime>() -> Backend {
    Backend::from_name(R::name())
        .unwrap_or_else(|| panic!("runtime `{}` has no facade backend", R::name()))
}

/// A generic job: `a + b` through the add kernel, returning which runtime ran it and the result.
struct AddJob {
    a: Vec<f32>,
    b: Vec<f32>,
}

impl RunOn for AddJob {
    type Output = (&'static str, Vec<f32>);

    fn run<R: Runtime>(self, client: ComputeClient<R>) -> Self::Output {
        let n = self.a.len();
        let ha = client.create(Bytes::from_elem_slice(&self.a));
        let hb = client.create(Bytes::from_elem_slice(&self.b));
        let out = client.empty(n * 4);
        client.launch(
            kernels::add_f32(1).into(),
            CubeCount::cover(n, kernels::CUBE_DIM),
            KernelArguments::new()
                .buffer(ha.binding())
                .buffer(hb.binding())
                .buffer(out.clone().binding()),
        );
        let values = client
            .read_one(out)
            .expect("read the sum")
            .to_elems::<f32>();
        (R::name(), values)
    }
}

/// `COMPUTE_BACKEND=<this backend>` picks it, with the override as the reason; an unknown name
/// is an error listing the choices.
pub fn facade_best_honours_the_override<R: Runtime>(client: ComputeClient<R>) {
    let _ = client;
    let backend = backend_of::<R>();
    let choice = Backend::choose(Some(R::name())).expect("the backend under test is available");
    assert_eq!(choice.backend, backend);
    assert_eq!(choice.reason, format!("COMPUTE_BACKEND={}", R::name()));
    let upper = R::name().to_ascii_uppercase();
    assert_eq!(Backend::choose(Some(&upper)).unwrap().backend, backend);
    assert!(Backend::compiled().contains(&backend));
    assert_eq!(backend.availability(), Ok(()));
    let err = Backend::choose(Some("no-such-backend")).unwrap_err();
    assert!(
        matches!(&err, BackendError::UnknownName { name, .. } if name == "no-such-backend"),
        "{err:?}"
    );
    let text = err.to_string();
    for name in ["cuda", "vulkan", "wgpu", "cpu"] {
        assert!(text.contains(name), "the error lists {name}: {text}");
    }
}

/// Code generic over `R: Runtime` run through the facade's dispatch lands on this backend and
/// gives exact results, the same as run on the typed client.
pub fn facade_dispatch_runs_generic_code<R: Runtime>(client: ComputeClient<R>) {
    let n = 3000;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 1000.0 - i as f32).collect();
    let expected: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let job = || AddJob {
        a: a.clone(),
        b: b.clone(),
    };
    let (ran_on, values) = Backend::choose(Some(R::name()))
        .expect("the backend under test is available")
        .run(job())
        .expect("the dispatch loads the default device");
    assert_eq!(ran_on, R::name());
    assert_eq!(values, expected);
    let (typed_on, typed) = job().run(client);
    assert_eq!(typed_on, R::name());
    assert_eq!(typed, values);
}
