//! Kernel IR: buffer length queries and tensor metadata (rank, shape, strides passed at launch),
//! used to index pitched tensors from `create_tensor` and strided views. Exact.

use compute_core::kernel::{Buffer, KernelBuilder, KernelDefinition};
use compute_core::{Bytes, ComputeClient, ElemType, KernelArguments, Runtime};

use super::ir_util::{assert_same, build, download, launch, upload, zeros};

/// `len` counts entries of the buffer's vector width, for several types and widths, and for a
/// sub-range binding; loads through the sub-range start at its offset.
pub fn ir_metadata_buffer_len<R: Runtime>(client: ComputeClient<R>) {
    let mut k = KernelBuilder::new("ir_buffer_len", [1, 1, 1]);
    let decls = [
        ("a", ElemType::F32, 1u8),
        ("b", ElemType::U8, 16),
        ("c", ElemType::F64, 2),
        ("d", ElemType::U16, 8),
        ("e", ElemType::I32, 4),
    ];
    let bufs: Vec<Buffer> = decls.iter().map(|&(n, e, w)| k.input(n, e, w)).collect();
    let out = k.output("out", ElemType::U32, 1);
    for (j, &b) in bufs.iter().enumerate() {
        let l = k.len(b);
        k.store(out, j as u32, l);
    }
    // Copy the sub-range `e` (i32x4) component 0 of each entry after the lengths.
    let le = k.len(bufs[4]);
    k.range(0u32, le, 1u32, |k, j| {
        let v = k.load(bufs[4], j);
        let c = k.extract(v, 0);
        let c = k.bitcast(c, ElemType::U32);
        let idx = k.add(j, decls.len() as u32);
        k.store(out, idx, c);
    });
    let def = build(k);
    let ints: Vec<i32> = (0..64).collect();
    let whole = upload(&client, &ints);
    // Bytes 32..160 of the i32 buffer: entries 8..40, as 8 vectors of 4.
    let sub = whole
        .clone()
        .range(32, 128)
        .expect("sub-range of a 256-byte buffer");
    let h = zeros::<R, u32>(&client, decls.len() + 8);
    launch(
        &client,
        &def,
        [1, 1, 1],
        KernelArguments::new()
            .buffer(client.create(Bytes::zeroed(40)).binding())
            .buffer(client.create(Bytes::zeroed(48)).binding())
            .buffer(client.create(Bytes::zeroed(80)).binding())
            .buffer(client.create(Bytes::zeroed(64)).binding())
            .buffer(sub.binding())
            .buffer(h.clone().binding()),
    );
    let mut expected = vec![10u32, 3, 5, 4, 8];
    expected.extend((0..8).map(|j| 8 + 4 * j));
    assert_same(
        &download::<R, u32>(&client, &h),
        &expected,
        "[len f32 (40 B), len u8x16 (48 B), len f64x2 (80 B), len u16x8 (64 B), len i32x4 sub-range (128 B), then sub-range entries' component 0]",
    );
}

/// A 2-D copy `out[r, c] = 2 * x[r * stride(x, 0) + c * stride(x, 1)]` over `shape(x)`, in a
/// 2-D launch, that also records the metadata queries of `x` and of the plain buffer `out`.
fn strided_copy() -> KernelDefinition {
    let mut k = KernelBuilder::new("ir_strided_copy", [8, 8, 1]);
    let x = k.input("x", ElemType::F32, 1);
    let out = k.output("out", ElemType::F32, 1);
    let meta = k.output("meta", ElemType::U32, 1);
    let c = k.absolute_pos_x();
    let r = k.absolute_pos_y();
    let rows = k.shape(x, 0u32);
    let cols = k.shape(x, 1u32);
    let s0 = k.stride(x, 0u32);
    let s1 = k.stride(x, 1u32);
    let first = k.add(r, c);
    let first = k.eq(first, 0u32);
    k.if_(first, |k| {
        let rank = k.rank(x);
        let past_shape = k.shape(x, 2u32);
        let past_stride = k.stride(x, 5u32);
        let plain_rank = k.rank(out);
        let values = [
            rank,
            rows,
            cols,
            s0,
            s1,
            past_shape,
            past_stride,
            plain_rank,
        ];
        for (j, v) in values.into_iter().enumerate() {
            k.store(meta, j as u32, v);
        }
    });
    let in_r = k.lt(r, rows);
    let in_c = k.lt(c, cols);
    let inside = k.and(in_r, in_c);
    k.if_(inside, |k| {
        let a = k.mul(r, s0);
        let b = k.mul(c, s1);
        let src = k.add(a, b);
        let v = k.load(x, src);
        let v = k.mul(v, 2.0f32);
        let dst = k.mul(r, cols);
        let dst = k.add(dst, c);
        k.store(out, dst, v);
    });
    build(k)
}

/// A pitched tensor from `create_tensor` (rows padded to the device's pitch alignment) indexed
/// through `stride(x, 0)`; and the same memory as a transposed, strided view (shape `[cols,
/// rows]`, strides `[1, pitch]`). Metadata past the rank is 0; a plain buffer has rank 0.
pub fn ir_metadata_pitched_tensor<R: Runtime>(client: ComputeClient<R>) {
    let (rows, cols) = (5usize, 7usize);
    let data: Vec<f32> = (0..rows * cols).map(|v| v as f32 * 0.5 - 3.0).collect();
    let layout = client.create_tensor(Bytes::from_elem_slice(&data), [rows, cols].into(), 4);
    let pitch = layout.strides[0];
    assert!(pitch >= cols, "row stride {pitch} < {cols} columns");
    let def = strided_copy();
    let run = |shape: [usize; 2], strides: [usize; 2]| {
        let out = zeros::<R, f32>(&client, rows * cols);
        let meta = zeros::<R, u32>(&client, 8);
        launch(
            &client,
            &def,
            [
                (shape[1] as u32).div_ceil(8),
                (shape[0] as u32).div_ceil(8),
                1,
            ],
            KernelArguments::new()
                .tensor(layout.memory.clone().binding(), shape, strides)
                .buffer(out.clone().binding())
                .buffer(meta.clone().binding()),
        );
        (
            download::<R, f32>(&client, &out),
            download::<R, u32>(&client, &meta),
        )
    };
    let (got, meta) = run([rows, cols], [pitch, 1]);
    let expected: Vec<f32> = data.iter().map(|v| v * 2.0).collect();
    assert_same(
        &got,
        &expected,
        &format!("pitched [{rows}, {cols}] with row stride {pitch}"),
    );
    assert_same(
        &meta,
        &[2, rows as u32, cols as u32, pitch as u32, 1, 0, 0, 0],
        "[rank, shape 0, shape 1, stride 0, stride 1, shape 2 (past rank), stride 5 (past rank), rank of a plain buffer]",
    );
    let (got, meta) = run([cols, rows], [1, pitch]);
    let expected: Vec<f32> = (0..cols)
        .flat_map(|c| (0..rows).map(move |r| (r, c)))
        .map(|(r, c)| data[r * cols + c] * 2.0)
        .collect();
    assert_same(
        &got,
        &expected,
        "transposed view through strides [1, pitch]",
    );
    assert_same(
        &meta,
        &[2, cols as u32, rows as u32, 1, pitch as u32, 0, 0, 0],
        "metadata of the transposed view",
    );
}
