//! Kernel IR: element types, vector widths, read-only and read-write buffers, scalars.
//!
//! Loads and stores must preserve bits exactly; comparisons here are exact.

use compute_core::kernel::{Access, KernelBuilder, ScalarValue};
use compute_core::{Bytes, ComputeClient, Elem, ElemType, KernelArguments, Runtime};
use half::{bf16, f16};

use super::ir_util::{
    HostFloat, assert_same, build, download, feature_gate, launch, upload, zeros,
};

/// Bytes of one sample value of `elem` for entry `i` (bools are 0 or 1, floats finite).
fn sample_bytes(elem: ElemType, i: usize) -> Vec<u8> {
    let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555;
    match elem {
        ElemType::Bool => vec![(x >> 7) as u8 & 1],
        ElemType::F16 => f16::from_f32(i as f32 * 0.75 - 40.0)
            .to_bits()
            .to_le_bytes()
            .to_vec(),
        ElemType::BF16 => bf16::from_f32(i as f32 * -1.5 + 3.0)
            .to_bits()
            .to_le_bytes()
            .to_vec(),
        ElemType::F32 => (i as f32 * 0.37 - 11.0).to_le_bytes().to_vec(),
        ElemType::F64 => (i as f64 * -1.0e-3 + 7.25).to_le_bytes().to_vec(),
        _ => x.to_le_bytes()[..elem.size()].to_vec(),
    }
}

/// The scalar argument of type `elem` the copy kernel appends, and its bytes.
fn sample_scalar(elem: ElemType) -> (ScalarValue, Vec<u8>) {
    match elem {
        ElemType::Bool => (ScalarValue::Bool(true), vec![1]),
        ElemType::I8 => (ScalarValue::I8(-77), (-77i8).to_le_bytes().to_vec()),
        ElemType::I16 => (
            ScalarValue::I16(-30_000),
            (-30_000i16).to_le_bytes().to_vec(),
        ),
        ElemType::I32 => (
            ScalarValue::I32(-2_000_000_001),
            (-2_000_000_001i32).to_le_bytes().to_vec(),
        ),
        ElemType::I64 => (
            ScalarValue::I64(-(1 << 60) - 3),
            (-(1i64 << 60) - 3).to_le_bytes().to_vec(),
        ),
        ElemType::U8 => (ScalarValue::U8(250), vec![250]),
        ElemType::U16 => (ScalarValue::U16(65_000), 65_000u16.to_le_bytes().to_vec()),
        ElemType::U32 => (
            ScalarValue::U32(4_000_000_000),
            4_000_000_000u32.to_le_bytes().to_vec(),
        ),
        ElemType::U64 => (
            ScalarValue::U64(u64::MAX - 12),
            (u64::MAX - 12).to_le_bytes().to_vec(),
        ),
        ElemType::F16 => {
            let v = f16::from_f32(-3.5);
            (ScalarValue::F16(v), v.to_bits().to_le_bytes().to_vec())
        }
        ElemType::BF16 => {
            let v = bf16::from_f32(1.0e20);
            (ScalarValue::BF16(v), v.to_bits().to_le_bytes().to_vec())
        }
        ElemType::F32 => (
            ScalarValue::F32(-1.25e-20),
            (-1.25e-20f32).to_le_bytes().to_vec(),
        ),
        ElemType::F64 => (
            ScalarValue::F64(core::f64::consts::PI),
            core::f64::consts::PI.to_le_bytes().to_vec(),
        ),
    }
}

/// Every element type loads and stores bit-exactly at vector widths 1 and 4, and a scalar
/// parameter of the type stores as passed. A type the backend does not declare must make the
/// launch fail with a clear error.
pub fn ir_types_load_store_every_elem<R: Runtime>(client: ComputeClient<R>) {
    for elem in ElemType::ALL {
        for width in [1u8, 4] {
            let n = 64usize;
            let input: Vec<u8> = (0..n).flat_map(|i| sample_bytes(elem, i)).collect();
            let (scalar, scalar_bytes) = sample_scalar(elem);
            let mut k = KernelBuilder::new(&format!("ir_copy_{elem}x{width}"), [16, 1, 1]);
            let src = k.input("src", elem, width);
            let dst = k.output("dst", elem, width);
            let s = k.scalar("s", elem);
            let i = k.absolute_pos();
            let entries = k.len(src);
            let inside = k.lt(i, entries);
            k.if_else(
                inside,
                |k| {
                    let v = k.load(src, i);
                    k.store(dst, i, v);
                },
                |k| {
                    let is_last = k.eq(i, entries);
                    k.if_(is_last, |k| {
                        let v = if width == 1 { s } else { k.splat(s, width) };
                        k.store(dst, i, v);
                    });
                },
            );
            let def = build(k);
            let src_h = client.create(Bytes::from_vec(input.clone()));
            let out_len = input.len() + scalar_bytes.len() * width as usize;
            let dst_h = client.create(Bytes::zeroed(out_len));
            launch(
                &client,
                &def,
                [(n as u32 / width as u32).div_ceil(16) + 1, 1, 1],
                KernelArguments::new()
                    .buffer(src_h.binding())
                    .buffer(dst_h.clone().binding())
                    .scalar(scalar),
            );
            if !feature_gate(&client, client.features().supports(elem), elem.name()) {
                continue;
            }
            let got = download::<R, u8>(&client, &dst_h);
            let mut expected = input.clone();
            for _ in 0..width {
                expected.extend_from_slice(&scalar_bytes);
            }
            assert_same(&got, &expected, &format!("copy of {elem} at width {width}"));
        }
    }
}

/// Launch `def` (one unit, output buffer 0, scalar `v` of element type `elem`) and check its
/// output against `expected`, unless the backend lacks `elem` (then the launch must have failed
/// cleanly, see [`feature_gate`]).
fn check_scalar_kernel<R: Runtime, T, O>(
    client: &ComputeClient<R>,
    def: &compute_core::kernel::KernelDefinition,
    elem: ElemType,
    v: T,
    expected: &[O],
    what: &str,
) where
    T: Into<ScalarValue>,
    O: Elem + PartialEq + core::fmt::Debug,
{
    let h = zeros::<R, O>(client, expected.len());
    launch(
        client,
        def,
        [1, 1, 1],
        KernelArguments::new().buffer(h.clone().binding()).scalar(v),
    );
    if !feature_gate(client, client.features().supports(elem), elem.name()) {
        return;
    }
    assert_same(&download::<R, O>(client, &h), expected, what);
}

fn scalar_case<R: Runtime, T>(client: &ComputeClient<R>, v: T, doubled: T)
where
    T: Elem + Into<ScalarValue> + PartialEq + core::fmt::Debug,
{
    let elem = T::ELEM;
    let mut k = KernelBuilder::new(&format!("ir_scalar_{elem}"), [1, 1, 1]);
    let out = k.output("out", elem, 1);
    let s = k.scalar("s", elem);
    k.store(out, 0u32, s);
    let d = k.add(s, s);
    k.store(out, 1u32, d);
    let def = build(k);
    let what = format!("scalar {elem}: [s, s + s]");
    check_scalar_kernel(client, &def, elem, v, &[v, doubled], &what);
}

/// A scalar parameter of every element type arrives exactly and takes part in arithmetic
/// (`s + s`, wrapping for integers; `!s` for bool). Exact comparison.
pub fn ir_types_scalar_every_elem<R: Runtime>(client: ComputeClient<R>) {
    scalar_case(&client, -100i8, (-100i8).wrapping_add(-100));
    scalar_case(&client, 20_000i16, 20_000i16.wrapping_add(20_000));
    scalar_case(
        &client,
        -1_500_000_000i32,
        (-1_500_000_000i32).wrapping_add(-1_500_000_000),
    );
    scalar_case(
        &client,
        i64::MIN + 5,
        (i64::MIN + 5).wrapping_add(i64::MIN + 5),
    );
    scalar_case(&client, 200u8, 200u8.wrapping_add(200));
    scalar_case(&client, 40_000u16, 40_000u16.wrapping_add(40_000));
    scalar_case(
        &client,
        3_000_000_000u32,
        3_000_000_000u32.wrapping_add(3_000_000_000),
    );
    scalar_case(
        &client,
        u64::MAX - 1,
        (u64::MAX - 1).wrapping_add(u64::MAX - 1),
    );
    scalar_case(&client, f16::from_f32(1.5), f16::from_f32(3.0));
    scalar_case(&client, bf16::from_f32(-0.375), bf16::from_f32(-0.75));
    scalar_case(&client, 1.0e-30f32, 2.0e-30f32);
    scalar_case(&client, 1.0e300f64, 2.0e300f64);

    let mut k = KernelBuilder::new("ir_scalar_bool", [1, 1, 1]);
    let out = k.output("out", ElemType::Bool, 1);
    let s = k.scalar("s", ElemType::Bool);
    k.store(out, 0u32, s);
    let n = k.not(s);
    k.store(out, 1u32, n);
    let def = build(k);
    for v in [false, true] {
        let h = zeros::<R, u8>(&client, 2);
        launch(
            &client,
            &def,
            [1, 1, 1],
            KernelArguments::new().buffer(h.clone().binding()).scalar(v),
        );
        assert_same(
            &download::<R, u8>(&client, &h),
            &[v as u8, !v as u8],
            &format!("scalar bool {v}: [s, !s]"),
        );
    }
}

/// One small-integer scalar, widened in the kernel: `[s as i32, s as f32 as i32]`, where the
/// first cast must follow the scalar's sign (an `i8` of -7 is -7, a `u8` of 250 is 250).
fn small_scalar_case<R: Runtime, T>(client: &ComputeClient<R>, v: T, want: i32)
where
    T: Elem + Into<ScalarValue> + Copy,
{
    let elem = T::ELEM;
    let mut k = KernelBuilder::new(&format!("ir_small_scalar_{elem}"), [1, 1, 1]);
    let out = k.output("out", ElemType::I32, 1);
    let s = k.scalar("s", elem);
    let wide = k.cast(s, ElemType::I32);
    k.store(out, 0u32, wide);
    let f = k.cast(s, ElemType::F32);
    let back = k.cast(f, ElemType::I32);
    k.store(out, 1u32, back);
    let def = build(k);
    let what = format!("scalar {elem} widened to i32 and through f32");
    check_scalar_kernel(client, &def, elem, v, &[want, want], &what);
}

/// Small-integer scalars (i8, i16, u8, u16), negative values and the extremes included, reach
/// the kernel with their value: widened to `i32` (and through `f32`) they keep their sign, on
/// every backend. The backends pass them in two encodings (a native-width parameter, or a
/// 32-bit shader word) written once in compute-core (`ScalarValue::native_bits`, `word_bits`).
pub fn ir_types_small_int_scalars_keep_their_sign<R: Runtime>(client: ComputeClient<R>) {
    for v in [-7i8, -128, 127, -1] {
        small_scalar_case(&client, v, i32::from(v));
    }
    for v in [-300i16, -32768, 32767, -1] {
        small_scalar_case(&client, v, i32::from(v));
    }
    for v in [250u8, 128, 255] {
        small_scalar_case(&client, v, i32::from(v));
    }
    for v in [65000u16, 32768, 65535] {
        small_scalar_case(&client, v, i32::from(v));
    }
}

/// Bool logic: `and`, `or`, `not`, `eq`, `ne` (xor), `select` on bools, over every pair. Exact.
pub fn ir_types_bool_logic<R: Runtime>(client: ComputeClient<R>) {
    let a: Vec<u8> = vec![0, 0, 1, 1];
    let b: Vec<u8> = vec![0, 1, 0, 1];
    let mut k = KernelBuilder::new("ir_bool_logic", [4, 1, 1]);
    let ha = k.input("a", ElemType::Bool, 1);
    let hb = k.input("b", ElemType::Bool, 1);
    let out = k.output("out", ElemType::Bool, 1);
    let i = k.absolute_pos();
    let x = k.load(ha, i);
    let y = k.load(hb, i);
    let nb = k.not(y);
    let results = [
        k.and(x, y),
        k.or(x, y),
        k.not(x),
        k.eq(x, y),
        k.ne(x, y),
        k.select(x, y, nb),
    ];
    for (j, r) in results.into_iter().enumerate() {
        let idx = k.mul(i, 6u32);
        let idx = k.add(idx, j as u32);
        k.store(out, idx, r);
    }
    let def = build(k);
    let h = zeros::<R, u8>(&client, 24);
    launch(
        &client,
        &def,
        [1, 1, 1],
        KernelArguments::new()
            .buffer(upload(&client, &a).binding())
            .buffer(upload(&client, &b).binding())
            .buffer(h.clone().binding()),
    );
    let expected: Vec<u8> = a
        .iter()
        .zip(&b)
        .flat_map(|(&x, &y)| {
            let (x, y) = (x == 1, y == 1);
            [x && y, x || y, !x, x == y, x != y, if x { y } else { !y }].map(|v| v as u8)
        })
        .collect();
    assert_same(
        &download::<R, u8>(&client, &h),
        &expected,
        "bool [and, or, not a, eq, ne, select(a, b, !b)] per pair (a, b)",
    );
}

fn vector_case<R: Runtime, T>(client: &ComputeClient<R>, width: u8, make: impl Fn(usize) -> T)
where
    T: Elem + PartialEq + HostAdd,
{
    let elem = T::ELEM;
    let w = width as usize;
    let entries = 37usize;
    let n = entries * w;
    let a: Vec<T> = (0..n).map(&make).collect();
    let b: Vec<T> = (0..n).map(|i| make(i * 7 + 3)).collect();
    let mut k = KernelBuilder::new(&format!("ir_vec_{elem}x{width}"), [8, 1, 1]);
    let ha = k.input("a", elem, width);
    let hb = k.buffer("b", elem, width, Access::ReadWrite);
    let lanes = k.output("lanes", elem, 1);
    let mixed = k.output("mixed", elem, width);
    let rev = k.output("rev", elem, width);
    let i = k.absolute_pos();
    let len = k.len(ha);
    let inside = k.lt(i, len);
    k.if_(inside, |k| {
        let x = k.load(ha, i);
        let y = k.load(hb, i);
        let s = k.add(x, y);
        k.store(hb, i, s);
        let base = k.mul(i, width as u32);
        let mut parts = Vec::new();
        for j in 0..width {
            let c = k.extract(x, width - 1 - j);
            let idx = k.add(base, j as u32);
            k.store(lanes, idx, c);
            parts.push(c);
        }
        let x0 = k.extract(x, 0);
        let y0 = k.extract(y, 0);
        let m = if width == 1 {
            y0
        } else {
            let sp = k.splat(x0, width);
            k.insert(sp, width - 1, y0)
        };
        k.store(mixed, i, m);
        let r = if width == 1 {
            parts[0]
        } else {
            k.vector(&parts)
        };
        k.store(rev, i, r);
    });
    let def = build(k);
    let hb_h = upload(client, &b);
    let lanes_h = zeros::<R, T>(client, n);
    let mixed_h = zeros::<R, T>(client, n);
    let rev_h = zeros::<R, T>(client, n);
    launch(
        client,
        &def,
        [(entries as u32).div_ceil(8), 1, 1],
        KernelArguments::new()
            .buffer(upload(client, &a).binding())
            .buffer(hb_h.clone().binding())
            .buffer(lanes_h.clone().binding())
            .buffer(mixed_h.clone().binding())
            .buffer(rev_h.clone().binding()),
    );
    if !feature_gate(client, client.features().supports(elem), elem.name()) {
        return;
    }
    let what = format!("{elem} x{width}");
    let sum: Vec<T> = a.iter().zip(&b).map(|(&x, &y)| x.host_add(y)).collect();
    assert_same(
        &download::<R, T>(client, &hb_h),
        &sum,
        &format!("{what}: b += a"),
    );
    let reversed: Vec<T> = a
        .chunks(w)
        .flat_map(|c| c.iter().rev().copied().collect::<Vec<_>>())
        .collect();
    assert_same(
        &download::<R, T>(client, &lanes_h),
        &reversed,
        &format!("{what}: extract of each component, reversed"),
    );
    assert_same(
        &download::<R, T>(client, &rev_h),
        &reversed,
        &format!("{what}: vector() of the reversed components"),
    );
    let mixed: Vec<T> = (0..entries)
        .flat_map(|e| (0..w).map(move |j| (e, j)))
        .map(|(e, j)| if j == w - 1 { b[e * w] } else { a[e * w] })
        .collect();
    assert_same(
        &download::<R, T>(client, &mixed_h),
        &mixed,
        &format!("{what}: insert(splat(a.0), last, b.0)"),
    );
}

/// Host addition matching the IR (wrapping for integers, IEEE for floats).
pub trait HostAdd: Copy + core::fmt::Debug {
    /// `self + other` as the IR computes it.
    fn host_add(self, other: Self) -> Self;
}

macro_rules! host_add_int {
    ($($t:ty),*) => {$(impl HostAdd for $t {
        fn host_add(self, other: Self) -> Self { self.wrapping_add(other) }
    })*};
}
host_add_int!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! host_add_float {
    ($($t:ty),*) => {$(impl HostAdd for $t {
        fn host_add(self, other: Self) -> Self {
            <$t as HostFloat>::from_f64(self.to_f64() + other.to_f64())
        }
    })*};
}
host_add_float!(f16, bf16, f32, f64);

/// Buffers of vector width 1, 2, 4, 8 and 16, for integer and float types: a vector add into a
/// read-write buffer, `extract`, `splat`, `insert` and `vector`. Sample values are small
/// integers (floats) so the sums are exact; comparison is exact.
pub fn ir_types_vector_widths<R: Runtime>(client: ComputeClient<R>) {
    for width in [1u8, 2, 4, 8, 16] {
        vector_case(&client, width, |i| (i * 37 % 251) as u8);
        vector_case(&client, width, |i| (i as i16).wrapping_mul(-331));
        vector_case(&client, width, |i| (i as u32).wrapping_mul(2_654_435_761));
        vector_case(&client, width, |i| (i as i64) * -1_000_000_007);
        vector_case(&client, width, |i| (i % 97) as f32 - 40.0);
        vector_case(&client, width, |i| f16::from_f32((i % 61) as f32 - 30.0));
        vector_case(&client, width, |i| bf16::from_f32((i % 31) as f32 * 2.0));
        vector_case(&client, width, |i| i as f64 * 0.5 - 3.0);
    }
}

/// A read-write buffer is read and written in place by the same unit; a read-only buffer bound
/// next to it is left untouched. Exact: `x[i] = x[i] * 3 + c[i]` on `i32`.
pub fn ir_types_read_only_and_read_write<R: Runtime>(client: ComputeClient<R>) {
    let n = 1000usize;
    let x: Vec<i32> = (0..n as i32).map(|i| i * 13 - 5000).collect();
    let c: Vec<i32> = (0..n as i32).map(|i| 7 - i).collect();
    let mut k = KernelBuilder::new("ir_in_place", [64, 1, 1]);
    let hc = k.input("c", ElemType::I32, 1);
    let hx = k.output("x", ElemType::I32, 1);
    let i = k.absolute_pos();
    let len = k.len(hx);
    let inside = k.lt(i, len);
    k.if_(inside, |k| {
        let v = k.load(hx, i);
        let v = k.mul(v, 3i32);
        let w = k.load(hc, i);
        let v = k.add(v, w);
        k.store(hx, i, v);
    });
    let def = build(k);
    let hx_h = upload(&client, &x);
    let hc_h = upload(&client, &c);
    launch(
        &client,
        &def,
        [(n as u32).div_ceil(64), 1, 1],
        KernelArguments::new()
            .buffer(hc_h.clone().binding())
            .buffer(hx_h.clone().binding()),
    );
    let expected: Vec<i32> = x.iter().zip(&c).map(|(x, c)| x * 3 + c).collect();
    assert_same(
        &download::<R, i32>(&client, &hx_h),
        &expected,
        "x = x * 3 + c",
    );
    assert_same(
        &download::<R, i32>(&client, &hc_h),
        &c,
        "read-only c unchanged",
    );
}

/// Float arithmetic of one float type over every pair of samples.
fn float_arith_case<R: Runtime, T: HostFloat + core::fmt::Debug>(
    client: &ComputeClient<R>,
    rel: f64,
) {
    use compute_core::kernel::{BinaryOp, CmpOp, UnaryOp};
    let elem = T::ELEM;
    let samples: Vec<f64> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -2.25,
        3.0,
        7.5,
        -100.125,
        1000.0,
        0.1,
        f64::INFINITY,
        f64::NAN,
    ];
    let samples: Vec<T> = samples.into_iter().map(T::from_f64).collect();
    let mut a = Vec::new();
    let mut b = Vec::new();
    for &x in &samples {
        for &y in &samples {
            a.push(x);
            b.push(y);
        }
    }
    let bin = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Min,
        BinaryOp::Max,
    ];
    let un = [UnaryOp::Neg, UnaryOp::Abs];
    let cmp = [
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ];
    let nv = bin.len() + un.len();
    let n = a.len();
    let mut k = KernelBuilder::new(&format!("ir_float_arith_{elem}"), [32, 1, 1]);
    let ha = k.input("a", elem, 1);
    let hb = k.input("b", elem, 1);
    let out = k.output("out", elem, 1);
    let flags = k.output("flags", ElemType::Bool, 1);
    let i = k.absolute_pos();
    let len = k.len(ha);
    let inside = k.lt(i, len);
    k.if_(inside, |k| {
        let x = k.load(ha, i);
        let y = k.load(hb, i);
        let base = k.mul(i, nv as u32);
        for (j, &op) in bin.iter().enumerate() {
            let r = k.binary(op, x, y);
            let idx = k.add(base, j as u32);
            k.store(out, idx, r);
        }
        for (j, &op) in un.iter().enumerate() {
            let r = k.unary(op, x);
            let idx = k.add(base, (bin.len() + j) as u32);
            k.store(out, idx, r);
        }
        let fbase = k.mul(i, cmp.len() as u32);
        for (j, &op) in cmp.iter().enumerate() {
            let r = k.compare(op, x, y);
            let idx = k.add(fbase, j as u32);
            k.store(flags, idx, r);
        }
    });
    let def = build(k);
    let out_h = zeros::<R, T>(client, n * nv);
    let flags_h = zeros::<R, u8>(client, n * cmp.len());
    launch(
        client,
        &def,
        [(n as u32).div_ceil(32), 1, 1],
        KernelArguments::new()
            .buffer(upload(client, &a).binding())
            .buffer(upload(client, &b).binding())
            .buffer(out_h.clone().binding())
            .buffer(flags_h.clone().binding()),
    );
    if !feature_gate(client, client.features().supports(elem), elem.name()) {
        return;
    }
    let got: Vec<f64> = download::<R, T>(client, &out_h)
        .into_iter()
        .map(T::to_f64)
        .collect();
    let mut got_checked = Vec::new();
    let mut expected = Vec::new();
    let mut labels = Vec::new();
    for p in 0..n {
        let (x, y) = (a[p].to_f64(), b[p].to_f64());
        let refs = [x + y, x - y, x * y, x / y, x.min(y), x.max(y), -x, x.abs()];
        let names = ["add", "sub", "mul", "div", "min", "max", "neg", "abs"];
        for (j, r) in refs.into_iter().enumerate() {
            // min/max of a NaN are not specified across backends.
            if (j == 4 || j == 5) && (x.is_nan() || y.is_nan()) {
                continue;
            }
            got_checked.push(got[p * nv + j]);
            expected.push(T::from_f64(r).to_f64());
            labels.push(format!("{}({x}, {y})", names[j]));
        }
    }
    assert_close_by_labels(
        &got_checked,
        &expected,
        rel,
        rel,
        &format!("{elem} arithmetic"),
        &labels,
    );
    let got_flags = download::<R, u8>(client, &flags_h);
    let expected_flags: Vec<u8> = (0..n)
        .flat_map(|p| {
            let (x, y) = (a[p].to_f64(), b[p].to_f64());
            [x == y, x != y, x < y, x <= y, x > y, x >= y].map(|v| v as u8)
        })
        .collect();
    assert_same(
        &got_flags,
        &expected_flags,
        &format!(
            "{elem} comparisons [eq, ne, lt, le, gt, ge] per pair (NaN compares false except ne)"
        ),
    );
}

fn assert_close_by_labels(
    got: &[f64],
    expected: &[f64],
    rel: f64,
    abs: f64,
    what: &str,
    labels: &[String],
) {
    super::ir_util::assert_close_by(got, expected, rel, abs, what, |i| labels[i].clone());
}

/// f16 arithmetic, comparisons: tolerance 1e-3 relative (2 ulp), IEEE semantics (inf, NaN).
pub fn ir_types_f16_arith<R: Runtime>(client: ComputeClient<R>) {
    float_arith_case::<R, f16>(&client, 1e-3);
}

/// bf16 arithmetic, comparisons: tolerance 8e-3 relative (1 ulp).
pub fn ir_types_bf16_arith<R: Runtime>(client: ComputeClient<R>) {
    float_arith_case::<R, bf16>(&client, 8e-3);
}

/// f32 arithmetic, comparisons: tolerance 1e-6 relative.
pub fn ir_types_f32_arith<R: Runtime>(client: ComputeClient<R>) {
    float_arith_case::<R, f32>(&client, 1e-6);
}

/// f64 arithmetic, comparisons: tolerance 1e-12 relative.
pub fn ir_types_f64_arith<R: Runtime>(client: ComputeClient<R>) {
    float_arith_case::<R, f64>(&client, 1e-12);
}
