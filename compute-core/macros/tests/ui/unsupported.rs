use compute_core::kernel::kernel;

#[kernel(cube_dim = 64)]
fn uses_match(out: &mut [u32]) {
    let i = ABSOLUTE_POS;
    out[i] = match i {
        0 => 1,
        _ => 2,
    };
}

#[kernel(cube_dim = 64)]
fn if_as_value(out: &mut [u32]) {
    let i = ABSOLUTE_POS;
    out[i] = if i < 4 { 1 } else { 2 };
}

#[kernel(cube_dim = 64)]
fn calls_a_function(out: &mut [f32]) {
    out[ABSOLUTE_POS] = helper(1.0);
}

#[kernel(cube_dim = 64)]
fn rounds(out: &mut [f32]) {
    out[ABSOLUTE_POS] = out[ABSOLUTE_POS].round();
}

fn main() {}
