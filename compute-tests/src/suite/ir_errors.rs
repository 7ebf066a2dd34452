//! Kernel IR: `build()` validation — types, scopes, unknown handles, writes to read-only
//! buffers, loop statements outside loops, declarations — returns an error whose message names
//! the kernel, the operation and the variable; shared memory over the device limit is an error
//! at launch. The builder is backend-independent, but the suite runs it per backend like every
//! other test, together with the launch-time check.

use compute_core::kernel::{BuildError, KernelBuilder};
use compute_core::{ComputeClient, ElemType, KernelArguments, Runtime, ServerError};

use super::ir_util::{launch, zeros};

/// Assert that `k` fails to build with an error matching `kind` whose message contains every
/// string of `names`.
fn expect_error(
    k: KernelBuilder,
    case: &str,
    kind: fn(&BuildError) -> bool,
    names: &[&str],
) -> BuildError {
    let err = match k.build() {
        Ok(_) => panic!("{case}: the kernel built, expected a validation error"),
        Err(e) => e,
    };
    assert!(kind(&err), "{case}: wrong kind of error: {err:?}");
    let msg = err.to_string();
    for name in names {
        assert!(
            msg.contains(name),
            "{case}: the message {msg:?} does not name `{name}`"
        );
    }
    err
}

/// Type errors name the operation and the offending values: mixed operand types, a float-only
/// function on an integer, a non-bool condition, storing the wrong item, assigning the wrong
/// type to a variable, mismatched range bounds, an impossible bit cast, an extract past the
/// width.
pub fn ir_errors_type_errors_name_values<R: Runtime>(_client: ComputeClient<R>) {
    let is_type = |e: &BuildError| matches!(e, BuildError::Type { .. });

    let mut k = KernelBuilder::new("mixed_add", [1, 1, 1]);
    let alpha = k.scalar("alpha", ElemType::F32);
    let count = k.scalar("count", ElemType::U32);
    k.add(alpha, count);
    expect_error(
        k,
        "f32 + u32",
        is_type,
        &["mixed_add", "add", "alpha", "count", "f32", "u32"],
    );

    let mut k = KernelBuilder::new("int_sqrt", [1, 1, 1]);
    let n = k.scalar("n", ElemType::U32);
    k.sqrt(n);
    expect_error(
        k,
        "sqrt of u32",
        is_type,
        &["int_sqrt", "sqrt", "`n`", "u32"],
    );

    let mut k = KernelBuilder::new("bad_if", [1, 1, 1]);
    let flag = k.scalar("flag", ElemType::U32);
    k.if_(flag, |_| {});
    expect_error(k, "if on u32", is_type, &["bad_if", "if", "flag", "bool"]);

    let mut k = KernelBuilder::new("bad_store", [1, 1, 1]);
    let ids = k.output("ids", ElemType::U32, 1);
    let weight = k.scalar("weight", ElemType::F32);
    k.store(ids, 0u32, weight);
    expect_error(
        k,
        "store f32 into u32",
        is_type,
        &["bad_store", "store", "ids", "weight"],
    );

    let mut k = KernelBuilder::new("bad_vec_store", [1, 1, 1]);
    let v4 = k.output("v4", ElemType::F32, 4);
    let x = k.scalar("x", ElemType::F32);
    k.store(v4, 0u32, x);
    expect_error(
        k,
        "store f32 into f32x4",
        is_type,
        &["store", "v4", "f32x4"],
    );

    let mut k = KernelBuilder::new("bad_assign", [1, 1, 1]);
    let counter = k.var_named("counter", 0u32);
    let half = k.scalar("half", ElemType::F32);
    k.assign(counter, half);
    expect_error(
        k,
        "assign f32 to u32",
        is_type,
        &["bad_assign", "assign", "counter", "half"],
    );

    let mut k = KernelBuilder::new("bad_range", [1, 1, 1]);
    let start = k.scalar("start", ElemType::U32);
    let end = k.scalar("end", ElemType::I32);
    k.range(start, end, 1u32, |_, _| {});
    expect_error(
        k,
        "range u32..i32",
        is_type,
        &["bad_range", "range", "start", "end"],
    );

    let mut k = KernelBuilder::new("float_range", [1, 1, 1]);
    let lo = k.scalar("lo", ElemType::F32);
    k.range(lo, 1.0f32, 1.0f32, |_, _| {});
    expect_error(k, "range over f32", is_type, &["range", "lo"]);

    let mut k = KernelBuilder::new("bad_bitcast", [1, 1, 1]);
    let word = k.scalar("word", ElemType::F32);
    k.bitcast(word, ElemType::F64);
    expect_error(
        k,
        "bitcast f32 -> f64",
        is_type,
        &["bad_bitcast", "bitcast", "word"],
    );

    let mut k = KernelBuilder::new("bad_extract", [1, 1, 1]);
    let s = k.scalar("s", ElemType::F32);
    let v = k.splat(s, 2);
    k.extract(v, 2);
    expect_error(
        k,
        "extract component 2 of f32x2",
        is_type,
        &["bad_extract", "extract", "f32x2"],
    );

    let mut k = KernelBuilder::new("float_bitand", [1, 1, 1]);
    let f = k.scalar("f", ElemType::F32);
    k.bit_and(f, f);
    expect_error(k, "bit_and on f32", is_type, &["bit_and", "`f`"]);

    let mut k = KernelBuilder::new("bool_add", [1, 1, 1]);
    let b = k.scalar("b", ElemType::Bool);
    k.add(b, b);
    expect_error(k, "add on bool", is_type, &["add", "`b`", "bool"]);

    let mut k = KernelBuilder::new("plane_all_u32", [32, 1, 1]);
    let p = k.scalar("p", ElemType::U32);
    k.plane_all(p);
    expect_error(k, "plane_all of u32", is_type, &["plane_all", "`p`"]);

    let mut k = KernelBuilder::new("float_index", [1, 1, 1]);
    let buf = k.input("buf", ElemType::U32, 1);
    let at = k.scalar("at", ElemType::F32);
    k.load(buf, at);
    expect_error(
        k,
        "load at a float index",
        is_type,
        &["float_index", "load", "at"],
    );
}

/// Stores and atomics to a buffer declared read-only name the operation and the buffer; atomics
/// on a local array or an unsupported type name the array.
pub fn ir_errors_read_only_and_atomics<R: Runtime>(_client: ComputeClient<R>) {
    let is_ro = |e: &BuildError| matches!(e, BuildError::ReadOnly { .. });
    let is_type = |e: &BuildError| matches!(e, BuildError::Type { .. });

    let mut k = KernelBuilder::new("write_input", [1, 1, 1]);
    let weights = k.input("weights", ElemType::F32, 1);
    k.store(weights, 0u32, 1.0f32);
    let e = expect_error(
        k,
        "store to input",
        is_ro,
        &["write_input", "store", "weights"],
    );
    assert_eq!(
        e,
        BuildError::ReadOnly {
            kernel: "write_input".into(),
            op: "store".into(),
            buffer: "weights".into(),
        }
    );

    let mut k = KernelBuilder::new("atomic_input", [1, 1, 1]);
    let counts = k.input("counts", ElemType::U32, 1);
    k.atomic_add(counts, 0u32, 1u32);
    expect_error(
        k,
        "atomic_add on input",
        is_ro,
        &["atomic_input", "atomic_add", "counts"],
    );

    let mut k = KernelBuilder::new("cas_input", [1, 1, 1]);
    let locks = k.input("locks", ElemType::U32, 1);
    k.atomic_compare_exchange(locks, 0u32, 0u32, 1u32);
    expect_error(
        k,
        "compare-exchange on input",
        is_ro,
        &["atomic_compare_exchange", "locks"],
    );

    // An atomic load of a read-only buffer is allowed.
    let mut k = KernelBuilder::new("atomic_load_input", [1, 1, 1]);
    let ro = k.input("ro", ElemType::U32, 1);
    k.atomic_load(ro, 0u32);
    assert!(
        k.build().is_ok(),
        "atomic_load of a read-only buffer must build"
    );

    let mut k = KernelBuilder::new("atomic_local", [1, 1, 1]);
    let scratch = k.local_array("scratch", ElemType::U32, 1, 4);
    k.atomic_add(scratch, 0u32, 1u32);
    expect_error(
        k,
        "atomic on a local array",
        is_type,
        &["atomic_local", "atomic_add", "scratch"],
    );

    let mut k = KernelBuilder::new("atomic_f16", [1, 1, 1]);
    let halves = k.shared("halves", ElemType::F16, 1, 4);
    let one = k.lit(half::f16::ONE.into());
    k.atomic_add(halves, 0u32, one);
    expect_error(k, "atomic on f16", is_type, &["atomic_add", "halves"]);

    let mut k = KernelBuilder::new("atomic_vector", [1, 1, 1]);
    let vec4 = k.output("vec4", ElemType::U32, 4);
    let s = k.splat(1u32, 4);
    k.atomic_add(vec4, 0u32, s);
    expect_error(k, "atomic on u32x4", is_type, &["atomic_add", "vec4"]);

    let mut k = KernelBuilder::new("atomic_mismatch", [1, 1, 1]);
    let tally = k.output("tally", ElemType::U32, 1);
    let delta = k.scalar("delta", ElemType::I32);
    k.atomic_add(tally, 0u32, delta);
    expect_error(
        k,
        "atomic_add i32 into u32",
        is_type,
        &["atomic_add", "tally", "delta"],
    );
}

/// Values and variables used outside their scope, and handles of another builder, are reported
/// with the operation and the name; `break`/`continue` outside a loop name the statement.
pub fn ir_errors_scope_and_control<R: Runtime>(_client: ComputeClient<R>) {
    let is_scope = |e: &BuildError| matches!(e, BuildError::OutOfScope { .. });
    let is_unknown = |e: &BuildError| matches!(e, BuildError::Unknown { .. });
    let is_loop = |e: &BuildError| matches!(e, BuildError::NotInLoop { .. });

    let mut k = KernelBuilder::new("leaky_var", [1, 1, 1]);
    let out = k.output("out", ElemType::U32, 1);
    let mut inner = None;
    k.if_(true, |k| inner = Some(k.var_named("acc", 1u32)));
    let acc = inner.expect("the closure ran");
    let v = k.get(acc);
    k.store(out, 0u32, v);
    expect_error(
        k,
        "variable used after its block",
        is_scope,
        &["leaky_var", "get", "acc"],
    );

    let mut k = KernelBuilder::new("leaky_value", [1, 1, 1]);
    let out = k.output("out", ElemType::U32, 1);
    let mut inner = None;
    k.range(0u32, 4u32, 1u32, |_, i| inner = Some(i));
    let i = inner.expect("the closure ran");
    k.store(out, 0u32, i);
    expect_error(
        k,
        "loop counter used after the loop",
        is_scope,
        &["leaky_value", "store"],
    );

    let mut other = KernelBuilder::new("other", [1, 1, 1]);
    let foreign = other.scalar("foreign", ElemType::U32);
    let mut k = KernelBuilder::new("uses_foreign", [1, 1, 1]);
    let out = k.output("out", ElemType::U32, 1);
    k.store(out, 0u32, foreign);
    expect_error(
        k,
        "value of another builder",
        is_unknown,
        &["uses_foreign", "store", "another builder"],
    );

    let other_buf = other.output("theirs", ElemType::U32, 1);
    let mut k = KernelBuilder::new("foreign_buffer", [1, 1, 1]);
    let _mine = k.output("mine", ElemType::U32, 1);
    let _mine2 = k.output("mine2", ElemType::U32, 1);
    k.len(other_buf);
    // `theirs` is buffer #0 of another builder: no builder may read it as its own #0.
    let mut k2 = KernelBuilder::new("foreign_buffer2", [1, 1, 1]);
    k2.store(other_buf, 0u32, 1u32);
    expect_error(
        k2,
        "buffer of another builder",
        is_unknown,
        &["foreign_buffer2", "store", "buffer"],
    );
    expect_error(
        k,
        "len of another builder's buffer",
        is_unknown,
        &["foreign_buffer", "len"],
    );

    let mut k = KernelBuilder::new("stray_break", [1, 1, 1]);
    k.break_();
    expect_error(
        k,
        "break outside a loop",
        is_loop,
        &["stray_break", "break"],
    );

    let mut k = KernelBuilder::new("stray_continue", [1, 1, 1]);
    k.if_(true, |k| k.continue_());
    expect_error(
        k,
        "continue outside a loop",
        is_loop,
        &["stray_continue", "continue"],
    );

    // Inside a loop both are fine.
    let mut k = KernelBuilder::new("loop_ok", [1, 1, 1]);
    k.loop_(|k| {
        k.if_(false, |k| k.continue_());
        k.break_();
    });
    assert!(k.build().is_ok(), "break/continue inside a loop must build");
}

/// Declarations that cannot be honoured name the declaration: a vector width that is not 1, 2,
/// 4, 8 or 16; a name declared twice; a cube dimension with a zero axis.
pub fn ir_errors_declarations<R: Runtime>(_client: ComputeClient<R>) {
    let is_decl = |e: &BuildError| matches!(e, BuildError::Declaration { .. });

    let mut k = KernelBuilder::new("width3", [1, 1, 1]);
    k.input("v3", ElemType::F32, 3);
    expect_error(k, "vector width 3", is_decl, &["width3", "v3", "3"]);

    let mut k = KernelBuilder::new("shared_width", [1, 1, 1]);
    k.shared("tile", ElemType::F32, 32, 4);
    expect_error(k, "shared width 32", is_decl, &["tile", "32"]);

    let mut k = KernelBuilder::new("twice", [1, 1, 1]);
    k.input("dup", ElemType::F32, 1);
    k.scalar("dup", ElemType::U32);
    expect_error(k, "duplicate name", is_decl, &["twice", "dup"]);

    let k = KernelBuilder::new("flat", [4, 0, 1]);
    expect_error(k, "zero cube axis", is_decl, &["flat"]);
}

/// A kernel whose shared memory exceeds the device's limit builds, but its launch is reported
/// as an error naming the kernel; one within the limit launches.
pub fn ir_errors_shared_memory_limit_at_launch<R: Runtime>(client: ComputeClient<R>) {
    let limit = client.properties().hardware.max_shared_memory_bytes;
    let entries = (limit / 4 + 16) as u32;
    let mut k = KernelBuilder::new("too_much_shared", [1, 1, 1]);
    let out = k.output("out", ElemType::U32, 1);
    let sh = k.shared("huge", ElemType::U32, 1, entries);
    k.store(sh, 0u32, 5u32);
    let v = k.load(sh, 0u32);
    k.store(out, 0u32, v);
    let def = k
        .build()
        .expect("shared memory size is checked at launch, not by build()");
    let h = zeros::<R, u32>(&client, 1);
    launch(
        &client,
        &def,
        [1, 1, 1],
        KernelArguments::new().buffer(h.clone().binding()),
    );
    let err = client
        .flush()
        .expect_err("a launch over the shared memory limit must fail");
    assert!(
        matches!(
            err,
            ServerError::Launch(compute_core::error::LaunchError::SharedMemory { .. })
        ),
        "over-limit shared memory: {err:?}"
    );
    assert!(
        err.to_string().contains("too_much_shared"),
        "the error must name the kernel: {err}"
    );
    // Within the limit: runs.
    let mut k = KernelBuilder::new("fits_shared", [1, 1, 1]);
    let out = k.output("out", ElemType::U32, 1);
    let sh = k.shared("fits", ElemType::U32, 1, (limit / 4 / 2) as u32);
    k.store(sh, 0u32, 5u32);
    let v = k.load(sh, 0u32);
    k.store(out, 0u32, v);
    let def = k.build().expect("valid kernel");
    let h = zeros::<R, u32>(&client, 1);
    launch(
        &client,
        &def,
        [1, 1, 1],
        KernelArguments::new().buffer(h.clone().binding()),
    );
    assert_eq!(
        client
            .read_one(h)
            .expect("in-limit launch")
            .to_elems::<u32>(),
        vec![5]
    );
}
