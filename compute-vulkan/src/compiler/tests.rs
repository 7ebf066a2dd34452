//! Unit tests of the SPIR-V emitter: every op family over every element type and width, each
//! module checked with `spirv-val --target-env vulkan1.3` (skipped with a note when the
//! validator is not installed).

use std::io::Write as _;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use compute_core::ElemType;
use compute_core::ServerError;
use compute_core::kernel::{
    AtomicOp, BinaryOp, CmpOp, KernelBuilder, KernelDefinition, PlaneOp, ScalarValue, UnaryOp,
};

use super::{SpirvCaps, SpirvKernel, compile};

fn full_caps() -> SpirvCaps {
    SpirvCaps {
        version: (1, 6),
        float16: true,
        float64: true,
        int8: true,
        int16: true,
        int64: true,
        storage8: true,
        storage16: true,
        subgroups: true,
        int64_atomics_buffer: true,
        int64_atomics_shared: true,
        float32_atomic_add_buffer: true,
        float32_atomic_add_shared: true,
        max_push_constant_bytes: 128,
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Run `spirv-val` on the module; `None` when the validator is not installed.
fn validate(words: &[u32], env: &str) -> Option<Result<(), String>> {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "compute-vulkan-spirv-test-{}-{n}.spv",
        std::process::id()
    ));
    let mut f = std::fs::File::create(&path).expect("temp file");
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    f.write_all(&bytes).expect("write module");
    drop(f);
    let out = Command::new("spirv-val")
        .arg("--target-env")
        .arg(env)
        .arg(&path)
        .output();
    let result = match out {
        Err(_) => {
            compute_core::env::report_reduced(
                "spirv-val not found on PATH: the SPIR-V was not validated",
            );
            None
        }
        Ok(o) if o.status.success() => Some(Ok(())),
        Ok(o) => {
            let dis = Command::new("spirv-dis")
                .arg(&path)
                .output()
                .map(|d| String::from_utf8_lossy(&d.stdout).into_owned())
                .unwrap_or_default();
            Some(Err(format!(
                "{}{}\n{dis}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )))
        }
    };
    let _ = std::fs::remove_file(&path);
    result
}

/// Compile with `caps` and validate for `env`; the compiled kernel.
fn compile_valid_with(def: &KernelDefinition, caps: &SpirvCaps, env: &str) -> SpirvKernel {
    for checked in [false, true] {
        let k = compile(def, caps, checked)
            .unwrap_or_else(|e| panic!("kernel `{}` failed to compile: {e}", def.name()));
        assert_eq!(k.words[0], 0x0723_0203, "magic");
        if let Some(Err(msg)) = validate(&k.words, env) {
            panic!(
                "kernel `{}` (checked: {checked}) is invalid SPIR-V:\n{msg}",
                def.name()
            );
        }
    }
    compile(def, caps, true).expect("compiles")
}

fn compile_valid(def: &KernelDefinition) -> SpirvKernel {
    compile_valid_with(def, &full_caps(), "vulkan1.3")
}

fn lit(elem: ElemType, v: i64) -> ScalarValue {
    match elem {
        ElemType::Bool => ScalarValue::Bool(v != 0),
        ElemType::I8 => ScalarValue::I8(v as i8),
        ElemType::I16 => ScalarValue::I16(v as i16),
        ElemType::I32 => ScalarValue::I32(v as i32),
        ElemType::I64 => ScalarValue::I64(v),
        ElemType::U8 => ScalarValue::U8(v as u8),
        ElemType::U16 => ScalarValue::U16(v as u16),
        ElemType::U32 => ScalarValue::U32(v as u32),
        ElemType::U64 => ScalarValue::U64(v as u64),
        ElemType::F16 => ScalarValue::F16(half::f16::from_f64(v as f64)),
        ElemType::BF16 => ScalarValue::BF16(half::bf16::from_f64(v as f64)),
        ElemType::F32 => ScalarValue::F32(v as f32),
        ElemType::F64 => ScalarValue::F64(v as f64),
    }
}

/// Arithmetic, comparisons, select, fma/clamp, math and casts over one item.
fn arith_kernel(elem: ElemType, width: u8) -> KernelDefinition {
    let mut k = KernelBuilder::new(&format!("arith_{elem}x{width}"), [64, 1, 1]);
    let a = k.input("a", elem, width);
    let b = k.input("b", elem, width);
    let out = k.output("out", elem, width);
    let flags = k.output("flags", ElemType::Bool, width);
    let s = k.scalar("s", elem);
    let i = k.absolute_pos();
    let x = k.load(a, i);
    let y = k.load(b, i);
    let sv = k.splat(s, width);
    let mut r = x;
    if elem == ElemType::Bool {
        for op in [BinaryOp::And, BinaryOp::Or] {
            r = k.binary(op, r, y);
        }
        r = k.not(r);
    } else {
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Rem,
            BinaryOp::Min,
            BinaryOp::Max,
        ] {
            r = k.binary(op, r, y);
        }
        r = k.binary(BinaryOp::Add, r, sv);
        if elem.is_int() {
            for op in [
                BinaryOp::BitAnd,
                BinaryOp::BitOr,
                BinaryOp::BitXor,
                BinaryOp::Shl,
                BinaryOp::Shr,
            ] {
                r = k.binary(op, r, y);
            }
            r = k.bit_not(r);
            if elem.is_signed_int() {
                r = k.neg(r);
                r = k.abs(r);
            }
        } else {
            r = k.pow(r, y);
            for op in [
                UnaryOp::Neg,
                UnaryOp::Abs,
                UnaryOp::Sqrt,
                UnaryOp::Rsqrt,
                UnaryOp::Exp,
                UnaryOp::Log,
                UnaryOp::Log1p,
                UnaryOp::Sin,
                UnaryOp::Cos,
                UnaryOp::Tanh,
                UnaryOp::Erf,
                UnaryOp::Floor,
                UnaryOp::Ceil,
                UnaryOp::Round,
                UnaryOp::Recip,
            ] {
                r = k.unary(op, r);
            }
        }
        if elem.is_float() {
            r = k.fma(r, x, y);
        }
        r = k.clamp(r, x, y);
    }
    let c = k.compare(CmpOp::Lt, r, x);
    let c2 = k.compare(CmpOp::Ne, r, y);
    let c = k.and(c, c2);
    r = k.select(c, r, x);
    k.store(out, i, r);
    k.store(flags, i, c);
    k.build().expect("builds")
}

#[test]
fn arithmetic_on_every_type_and_width_validates() {
    for elem in ElemType::ALL {
        for width in [1u8, 2, 4, 8, 16] {
            let def = arith_kernel(elem, width);
            let sk = compile_valid(&def);
            assert_eq!(
                sk.buffer_item_sizes[0],
                (elem.size() * width as usize) as u64
            );
        }
    }
}

#[test]
fn casts_and_bitcasts_between_all_types_validate() {
    for from in ElemType::ALL {
        let mut k = KernelBuilder::new(&format!("cast_{from}"), [32, 1, 1]);
        let a = k.input("a", from, 2);
        let i = k.absolute_pos();
        let x = k.load(a, i);
        for to in ElemType::ALL {
            let out = k.output(&format!("o_{to}"), to, 2);
            let c = k.cast(x, to);
            k.store(out, i, c);
        }
        // Bitcasts to every element size (same total bytes).
        let bytes = from.size() * 2;
        for to in ElemType::ALL {
            if to == ElemType::Bool || bytes % to.size() != 0 {
                continue;
            }
            let w = (bytes / to.size()) as u8;
            if ![1u8, 2, 4, 8, 16].contains(&w) {
                continue;
            }
            let out = k.output(&format!("b_{to}"), to, w);
            let c = k.bitcast(x, to);
            k.store(out, i, c);
        }
        compile_valid(&k.build().expect("builds"));
    }
}

#[test]
fn memory_vars_and_control_flow_validate() {
    for elem in ElemType::ALL {
        for width in [1u8, 4, 16] {
            let mut k = KernelBuilder::new(&format!("mem_{elem}x{width}"), [8, 4, 2]);
            let a = k.input("a", elem, width);
            let out = k.output("out", elem, width);
            let sh = k.shared("sh", elem, width, 64);
            let loc = k.local_array("loc", elem, width, 5);
            let n = k.scalar("n", ElemType::I32);
            let i = k.unit_pos();
            let x = k.load(a, i);
            k.store(sh, i, x);
            k.barrier();
            let v = k.var(x);
            k.range(0i32, n, 2i32, |k, j| {
                let y = k.load(sh, j);
                k.store(loc, j, y);
                let small = k.lt(j, 3i32);
                k.if_else(
                    small,
                    |k| {
                        k.assign(v, y);
                        k.continue_();
                    },
                    |k| {
                        let z = k.load(loc, 1u32);
                        k.assign(v, z);
                    },
                );
                let big = k.gt(j, 100i32);
                k.if_(big, |k| k.break_());
            });
            k.range(10i64, -3i64, -1i64, |k, _| {
                k.return_();
            });
            k.loop_(|k| {
                let p = k.unit_pos_x();
                let z = k.eq(p, 0u32);
                k.if_(z, |k| k.break_());
                k.break_();
            });
            let r = k.get(v);
            let g = k.absolute_pos();
            k.store(out, g, r);
            compile_valid(&k.build().expect("builds"));
        }
    }
}

#[test]
fn builtins_metadata_and_vectors_validate() {
    let mut k = KernelBuilder::new("meta", [4, 4, 4]);
    let t = k.input("t", ElemType::F32, 4);
    let out = k.output("out", ElemType::U32, 4);
    let mut parts = Vec::new();
    for b in [
        compute_core::kernel::Builtin::AbsolutePos,
        compute_core::kernel::Builtin::AbsolutePosY,
        compute_core::kernel::Builtin::CubePos,
        compute_core::kernel::Builtin::CubeCount,
        compute_core::kernel::Builtin::CubeDimZ,
        compute_core::kernel::Builtin::UnitPos,
        compute_core::kernel::Builtin::PlaneSize,
        compute_core::kernel::Builtin::UnitPosPlane,
    ] {
        parts.push(k.builtin(b));
    }
    let r = k.rank(t);
    let d = k.sub(r, 1u32);
    let s = k.shape(t, d);
    let st = k.stride(t, 0i32);
    let l = k.len(t);
    let v = k.vector(&[s, st, l, parts[0]]);
    let e = k.extract(v, 2);
    let v = k.insert(v, 0, e);
    let i = k.absolute_pos();
    k.store(out, i, v);
    let def = k.build().expect("builds");
    let sk = compile_valid(&def);
    assert!(sk.uses_info, "metadata reads the info buffer");
    assert!(sk.uses_subgroups);
    assert!(sk.args.in_push_constants);
    assert_eq!(sk.args.buffer_words, vec![0, 2]);
    assert_eq!(sk.args.info_header_word, 0);
    assert_eq!(sk.push_constant_bytes, 16);
    assert_eq!(sk.info_binding, 2);
}

#[test]
fn argument_layout_aligns_64_bit_scalars_and_spills_to_the_info_buffer() {
    let mut k = KernelBuilder::new("args", [32, 1, 1]);
    let out = k.output("out", ElemType::F64, 1);
    let a = k.scalar("a", ElemType::U8);
    let b = k.scalar("b", ElemType::F64);
    let c = k.scalar("c", ElemType::BF16);
    let d = k.scalar("d", ElemType::Bool);
    let a = k.cast(a, ElemType::F64);
    let c = k.cast(c, ElemType::F64);
    let x = k.add(a, b);
    let x = k.add(x, c);
    let zero = k.lit_f64(0.0);
    let x = k.select(d, x, zero);
    let i = k.absolute_pos();
    k.store(out, i, x);
    let def = k.build().expect("builds");
    let sk = compile_valid(&def);
    assert_eq!(sk.args.scalar_words, vec![0, 2, 4, 5]);
    assert_eq!(sk.args.buffer_words, vec![6]);
    assert_eq!(sk.args.words, 8);
    assert!(sk.args.in_push_constants);
    assert!(!sk.uses_info);
    assert_eq!(sk.push_constant_bytes, 32);
    // A device with little push-constant space: the words move to the info buffer.
    let caps = SpirvCaps {
        max_push_constant_bytes: 16,
        ..full_caps()
    };
    let sk = compile_valid_with(&def, &caps, "vulkan1.3");
    assert!(!sk.args.in_push_constants);
    assert!(sk.uses_info);
    assert_eq!(sk.args.info_header_word, 8);
    assert_eq!(sk.push_constant_bytes, 0);
}

#[test]
fn atomics_validate_on_global_and_shared_memory() {
    for elem in [
        ElemType::I32,
        ElemType::U32,
        ElemType::I64,
        ElemType::U64,
        ElemType::F32,
    ] {
        let mut k = KernelBuilder::new(&format!("atomics_{elem}"), [64, 1, 1]);
        let g = k.output("g", elem, 1);
        let out = k.output("out", elem, 1);
        let sh = k.shared("sh", elem, 1, 64);
        let i = k.unit_pos();
        let one = k.lit(lit(elem, 1));
        let mut acc = k.atomic_load(g, i);
        for mem_shared in [false, true] {
            let ops: &[AtomicOp] = if elem == ElemType::F32 {
                &[AtomicOp::Add, AtomicOp::Exchange]
            } else {
                &[
                    AtomicOp::Add,
                    AtomicOp::Sub,
                    AtomicOp::Min,
                    AtomicOp::Max,
                    AtomicOp::Exchange,
                    AtomicOp::And,
                    AtomicOp::Or,
                    AtomicOp::Xor,
                ]
            };
            for &op in ops {
                let r = if mem_shared {
                    k.atomic(op, sh, i, one, None)
                } else {
                    k.atomic(op, g, i, one, None)
                };
                acc = k.add(acc, r);
            }
            if elem != ElemType::F32 {
                let r = if mem_shared {
                    k.atomic_compare_exchange(sh, i, one, acc)
                } else {
                    k.atomic_compare_exchange(g, i, one, acc)
                };
                acc = k.add(acc, r);
            }
        }
        k.atomic_store(sh, i, acc);
        k.store(out, i, acc);
        let sk = compile_valid(&k.build().expect("builds"));
        if elem == ElemType::F32 {
            assert!(
                sk.extensions
                    .iter()
                    .any(|e| e == "SPV_EXT_shader_atomic_float_add")
            );
        }
        if elem.size() == 8 {
            assert!(sk.capabilities.contains(&spirv::Capability::Int64Atomics));
        }
    }
}

#[test]
fn plane_operations_validate() {
    for elem in ElemType::ALL {
        let mut k = KernelBuilder::new(&format!("plane_{elem}"), [32, 1, 1]);
        let a = k.input("a", elem, 2);
        let out = k.output("out", elem, 2);
        let bal = k.output("ballot", ElemType::U32, 4);
        let i = k.absolute_pos();
        let x = k.load(a, i);
        let mut r = x;
        let ops: &[PlaneOp] = if elem == ElemType::Bool {
            &[PlaneOp::All, PlaneOp::Any]
        } else {
            &[PlaneOp::Sum, PlaneOp::Prod, PlaneOp::Min, PlaneOp::Max]
        };
        for &op in ops {
            r = k.plane(op, r);
        }
        let lane = k.lit_u32(3);
        r = k.plane_broadcast(r, lane);
        let dyn_lane = k.cube_pos_x();
        r = k.plane_broadcast(r, dyn_lane);
        let p = k.unit_pos_plane();
        let l2 = k.bit_xor(p, 1u32);
        r = k.plane_shuffle(r, l2);
        k.store(out, i, r);
        let c = k.lt(p, 7u32);
        let b = k.ballot(c);
        k.store(bal, i, b);
        let def = k.build().expect("builds");
        let sk = compile_valid(&def);
        assert!(sk.uses_subgroups);
        assert_eq!(
            sk.subgroup_extended_types,
            matches!(elem, ElemType::I64 | ElemType::U64),
            "{elem}: only 64-bit integer products need extended subgroup types"
        );
        // SPIR-V 1.3 (Vulkan 1.1): broadcast of a non-constant id goes through shuffle.
        let caps = SpirvCaps {
            version: (1, 3),
            ..full_caps()
        };
        compile_valid_with(&def, &caps, "vulkan1.1");
    }
}

#[test]
fn shared_bool_and_bf16_without_small_integers_stay_register_typed() {
    let mut k = KernelBuilder::new("shared_plain", [32, 1, 1]);
    let out = k.output("out", ElemType::U32, 1);
    let sb = k.shared("sb", ElemType::Bool, 1, 32);
    let sh = k.shared("sh", ElemType::BF16, 2, 32);
    let i = k.unit_pos();
    let odd = k.bit_and(i, 1u32);
    let c = k.eq(odd, 1u32);
    k.store(sb, i, c);
    let f = k.cast(i, ElemType::BF16);
    let f2 = k.splat(f, 2);
    k.store(sh, i, f2);
    k.barrier();
    let j = k.sub(31u32, i);
    let b = k.load(sb, j);
    let v = k.load(sh, j);
    let v = k.extract(v, 1);
    let v = k.cast(v, ElemType::U32);
    let zero = k.lit_u32(0);
    let r = k.select(b, v, zero);
    k.store(out, i, r);
    let def = k.build().expect("builds");
    let caps = SpirvCaps {
        int8: false,
        int16: false,
        storage8: false,
        storage16: false,
        ..full_caps()
    };
    let sk = compile_valid_with(&def, &caps, "vulkan1.3");
    assert!(!sk.capabilities.contains(&spirv::Capability::Int8));
    assert!(!sk.capabilities.contains(&spirv::Capability::Int16));
    let sk = compile_valid(&def);
    assert!(sk.capabilities.contains(&spirv::Capability::Int8));
    assert!(sk.capabilities.contains(&spirv::Capability::Int16));
}

#[test]
fn plane_sum_min_max_of_64_bit_integers_need_no_extended_types() {
    for elem in [ElemType::I64, ElemType::U64] {
        let mut k = KernelBuilder::new(&format!("plane64_{elem}"), [32, 1, 1]);
        let a = k.input("a", elem, 1);
        let out = k.output("out", elem, 1);
        let i = k.absolute_pos();
        let x = k.load(a, i);
        let s = k.plane_sum(x);
        let m = k.plane_min(s);
        let r = k.plane_max(m);
        k.store(out, i, r);
        let sk = compile_valid(&k.build().expect("builds"));
        assert!(!sk.subgroup_extended_types);
    }
}

#[test]
fn missing_features_are_unsupported_and_name_the_feature() {
    type Strip = fn(&mut SpirvCaps);
    let cases: &[(ElemType, Strip, &str)] = &[
        (ElemType::F64, |c| c.float64 = false, "shaderFloat64"),
        (ElemType::F16, |c| c.float16 = false, "shaderFloat16"),
        (ElemType::I64, |c| c.int64 = false, "shaderInt64"),
        (ElemType::U8, |c| c.int8 = false, "shaderInt8"),
        (ElemType::I16, |c| c.int16 = false, "shaderInt16"),
        (
            ElemType::Bool,
            |c| c.storage8 = false,
            "storageBuffer8BitAccess",
        ),
        (
            ElemType::BF16,
            |c| c.storage16 = false,
            "storageBuffer16BitAccess",
        ),
    ];
    for &(elem, strip, feature) in cases {
        let mut k = KernelBuilder::new(&format!("needs_{elem}"), [32, 1, 1]);
        let a = k.input("a", elem, 1);
        let out = k.output("out", elem, 1);
        let i = k.absolute_pos();
        let x = k.load(a, i);
        k.store(out, i, x);
        let def = k.build().expect("builds");
        let mut caps = full_caps();
        strip(&mut caps);
        match compile(&def, &caps, false) {
            Err(ServerError::Unsupported(msg)) => {
                assert!(msg.contains(feature), "{msg} names {feature}");
                assert!(msg.contains(def.name()), "{msg} names the kernel");
            }
            other => panic!("{elem} without {feature}: {other:?}"),
        }
    }
    // Subgroups.
    let mut k = KernelBuilder::new("needs_subgroups", [32, 1, 1]);
    let out = k.output("out", ElemType::F32, 1);
    let i = k.absolute_pos();
    let x = k.lit_f32(1.0);
    let s = k.plane_sum(x);
    k.store(out, i, s);
    let def = k.build().expect("builds");
    let caps = SpirvCaps {
        subgroups: false,
        ..full_caps()
    };
    assert!(
        matches!(compile(&def, &caps, false), Err(ServerError::Unsupported(m)) if m.contains("plane_sum"))
    );
    // Float atomics and 64-bit atomics.
    let mut k = KernelBuilder::new("needs_fatomic", [32, 1, 1]);
    let g = k.output("g", ElemType::F32, 1);
    let i = k.absolute_pos();
    let x = k.lit_f32(1.0);
    k.atomic_add(g, i, x);
    let def = k.build().expect("builds");
    let caps = SpirvCaps {
        float32_atomic_add_buffer: false,
        ..full_caps()
    };
    assert!(
        matches!(compile(&def, &caps, false), Err(ServerError::Unsupported(m)) if m.contains("shaderBufferFloat32AtomicAdd"))
    );
}

#[test]
fn only_used_capabilities_are_declared() {
    let mut k = KernelBuilder::new("copy", [256, 1, 1]);
    let a = k.input("a", ElemType::F32, 4);
    let out = k.output("out", ElemType::F32, 4);
    let i = k.absolute_pos();
    let x = k.load(a, i);
    k.store(out, i, x);
    let def = k.build().expect("builds");
    let sk = compile_valid(&def);
    assert_eq!(sk.capabilities, vec![spirv::Capability::Shader]);
    // Checked launches guard the global accesses; unchecked ones have no branches at all.
    let count = |words: &[u32], op: spirv::Op| {
        let mut n = 0;
        let mut p = 5;
        while p < words.len() {
            if (words[p] & 0xffff) == op as u32 {
                n += 1;
            }
            p += ((words[p] >> 16) as usize).max(1);
        }
        n
    };
    let unchecked = compile(&def, &full_caps(), false).expect("compiles");
    assert_eq!(count(&unchecked.words, spirv::Op::SelectionMerge), 0);
    assert_eq!(count(&sk.words, spirv::Op::SelectionMerge), 2);
    assert_eq!(count(&sk.words, spirv::Op::Phi), 4);
    assert!(sk.extensions.is_empty());
    assert!(!sk.uses_subgroups);
    assert!(!sk.uses_info);
    // The copy stays one 128-bit load and store per item: the buffers are arrays of vec4 with a
    // 16-byte stride.
    let w = &sk.words;
    let mut found_stride16 = false;
    let mut p = 5;
    while p < w.len() {
        let n = (w[p] >> 16) as usize;
        if (w[p] & 0xffff) == spirv::Op::Decorate as u32
            && w[p + 2] == spirv::Decoration::ArrayStride as u32
            && w[p + 3] == 16
        {
            found_stride16 = true;
        }
        p += n.max(1);
    }
    assert!(found_stride16);
}

#[test]
fn spirv_1_3_with_8bit_storage_declares_the_extension() {
    let mut k = KernelBuilder::new("bytes", [32, 1, 1]);
    let a = k.input("a", ElemType::U8, 4);
    let out = k.output("out", ElemType::U8, 4);
    let i = k.absolute_pos();
    let x = k.load(a, i);
    let y = k.add(x, x);
    k.store(out, i, y);
    let def = k.build().expect("builds");
    let caps = SpirvCaps {
        version: (1, 3),
        ..full_caps()
    };
    let sk = compile_valid_with(&def, &caps, "vulkan1.1");
    assert!(sk.extensions.iter().any(|e| e == "SPV_KHR_8bit_storage"));
    let sk = compile_valid(&def);
    assert!(sk.extensions.is_empty());
    assert!(
        sk.capabilities
            .contains(&spirv::Capability::StorageBuffer8BitAccess)
    );
}
