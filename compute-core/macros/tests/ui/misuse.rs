use compute_core::kernel::kernel;

#[kernel(cube_dim = 64)]
fn writes_an_input(x: &[f32]) {
    x[ABSOLUTE_POS] = 1.0;
}

#[kernel(cube_dim = 64)]
fn breaks_an_unrolled_loop(out: &mut [u32]) {
    #[unroll]
    for i in 0..4 {
        if ABSOLUTE_POS == i {
            break;
        }
    }
}

#[kernel(cube_dim = 64)]
fn unrolls_a_runtime_bound(out: &mut [u32], n: u32) {
    #[unroll]
    for i in 0..n {
        out[i] = 0;
    }
}

#[kernel]
fn no_cube_dim(out: &mut [u32]) {
    out[0] = 1;
}

#[kernel(cube_dim = 64)]
fn returns_a_value(out: &mut [u32]) -> u32 {
    out[0] = 1;
}

#[kernel(cube_dim = 64)]
fn assigns_an_immutable(out: &mut [u32]) {
    let x = 1u32;
    x = 2;
    out[0] = x;
}

fn main() {}
