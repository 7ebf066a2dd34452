//! Word-level SPIR-V module building: id allocation, the module's sections, deduplicated types
//! and constants, instruction encoding.

use std::collections::{BTreeSet, HashMap};

use spirv::{Capability, Decoration, Op, StorageClass};

/// `GLSL.std.450` extended instruction numbers the emitter uses.
#[allow(missing_docs)]
pub(super) mod gl {
    pub const ROUND_EVEN: u32 = 2;
    pub const FABS: u32 = 4;
    pub const FLOOR: u32 = 8;
    pub const CEIL: u32 = 9;
    pub const SQRT: u32 = 31;
    pub const FMIN: u32 = 37;
    pub const FMAX: u32 = 40;
    pub const FMA: u32 = 50;
    pub const FREXP_STRUCT: u32 = 52;
    pub const LDEXP: u32 = 53;
    pub const NMIN: u32 = 79;
    pub const NMAX: u32 = 80;
}

/// Encode a literal string operand (nul-terminated, padded to a word).
pub(super) fn string_words(s: &str) -> Vec<u32> {
    let mut bytes = s.as_bytes().to_vec();
    bytes.push(0);
    while !bytes.len().is_multiple_of(4) {
        bytes.push(0);
    }
    bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Append one instruction to `buf`.
pub(super) fn inst(buf: &mut Vec<u32>, op: Op, operands: &[u32]) {
    let count = operands.len() as u32 + 1;
    buf.push((count << 16) | op as u32);
    buf.extend_from_slice(operands);
}

/// The sections of a module under construction, and its type and constant tables.
#[derive(Default)]
pub(super) struct Module {
    /// Next free id.
    pub next: u32,
    /// Declared capabilities.
    pub capabilities: BTreeSet<u32>,
    /// Declared extensions.
    pub extensions: BTreeSet<&'static str>,
    /// `OpDecorate` / `OpMemberDecorate`.
    pub annotations: Vec<u32>,
    /// Types, constants and global variables.
    pub globals: Vec<u32>,
    /// Deduplicated types and constants, by their opcode and operands.
    cache: HashMap<(u32, Vec<u32>), u32>,
    /// Global variables for the entry point's interface.
    pub interface: Vec<u32>,
    /// Ids of the constants.
    constants: std::collections::HashSet<u32>,
}

impl Module {
    /// A fresh id.
    pub fn id(&mut self) -> u32 {
        self.next += 1;
        self.next
    }

    /// Declare a capability.
    pub fn cap(&mut self, c: Capability) {
        self.capabilities.insert(c as u32);
    }

    /// Declare an extension.
    pub fn ext(&mut self, e: &'static str) {
        self.extensions.insert(e);
    }

    /// A deduplicated type or constant: `op result operands...` (types) or
    /// `op type result operands...` (constants, `typed` set).
    fn cached(&mut self, op: Op, typed: Option<u32>, operands: &[u32]) -> u32 {
        let mut key_ops = Vec::with_capacity(operands.len() + 1);
        if let Some(t) = typed {
            key_ops.push(t);
        }
        key_ops.extend_from_slice(operands);
        let key = (op as u32, key_ops);
        if let Some(&id) = self.cache.get(&key) {
            return id;
        }
        let id = self.id();
        let mut ops = Vec::with_capacity(operands.len() + 2);
        if let Some(t) = typed {
            ops.push(t);
        }
        ops.push(id);
        ops.extend_from_slice(operands);
        inst(&mut self.globals, op, &ops);
        self.cache.insert(key, id);
        if typed.is_some() {
            self.constants.insert(id);
        }
        id
    }

    /// Whether `id` is a constant.
    pub fn is_const(&self, id: u32) -> bool {
        self.constants.contains(&id)
    }

    /// `OpTypeVoid`.
    pub fn t_void(&mut self) -> u32 {
        self.cached(Op::TypeVoid, None, &[])
    }

    /// `OpTypeBool`.
    pub fn t_bool(&mut self) -> u32 {
        self.cached(Op::TypeBool, None, &[])
    }

    /// An integer type of `bits` (signedness 0: signed operations pick the interpretation).
    pub fn t_int(&mut self, bits: u32) -> u32 {
        match bits {
            8 => self.cap(Capability::Int8),
            16 => self.cap(Capability::Int16),
            64 => self.cap(Capability::Int64),
            _ => {}
        }
        self.cached(Op::TypeInt, None, &[bits, 0])
    }

    /// A float type of `bits`.
    pub fn t_float(&mut self, bits: u32) -> u32 {
        match bits {
            16 => self.cap(Capability::Float16),
            64 => self.cap(Capability::Float64),
            _ => {}
        }
        self.cached(Op::TypeFloat, None, &[bits])
    }

    /// `u32`.
    pub fn t_u32(&mut self) -> u32 {
        self.t_int(32)
    }

    /// A vector of `n` components (`n` 2..=4).
    pub fn t_vec(&mut self, comp: u32, n: u32) -> u32 {
        self.cached(Op::TypeVector, None, &[comp, n])
    }

    /// A pointer type.
    pub fn t_ptr(&mut self, class: StorageClass, pointee: u32) -> u32 {
        self.cached(Op::TypePointer, None, &[class as u32, pointee])
    }

    /// A fixed-size array (undecorated; Function and Workgroup storage).
    pub fn t_array(&mut self, elem: u32, len: u32) -> u32 {
        let n = self.c_u32(len);
        self.cached(Op::TypeArray, None, &[elem, n])
    }

    /// A new struct type (never deduplicated, so its decorations are its own).
    pub fn t_struct(&mut self, members: &[u32]) -> u32 {
        let id = self.id();
        let mut ops = vec![id];
        ops.extend_from_slice(members);
        inst(&mut self.globals, Op::TypeStruct, &ops);
        id
    }

    /// A new array type with an `ArrayStride` (never deduplicated).
    pub fn t_strided_array(&mut self, elem: u32, len: Option<u32>, stride: u32) -> u32 {
        let id = self.id();
        match len {
            Some(n) => {
                let c = self.c_u32(n);
                inst(&mut self.globals, Op::TypeArray, &[id, elem, c]);
            }
            None => inst(&mut self.globals, Op::TypeRuntimeArray, &[id, elem]),
        }
        self.decorate(id, Decoration::ArrayStride, &[stride]);
        id
    }

    /// A function type.
    pub fn t_fn(&mut self, ret: u32) -> u32 {
        self.cached(Op::TypeFunction, None, &[ret])
    }

    /// `OpDecorate`.
    pub fn decorate(&mut self, target: u32, d: Decoration, extra: &[u32]) {
        let mut ops = vec![target, d as u32];
        ops.extend_from_slice(extra);
        inst(&mut self.annotations, Op::Decorate, &ops);
    }

    /// `OpMemberDecorate`.
    pub fn member_decorate(&mut self, target: u32, member: u32, d: Decoration, extra: &[u32]) {
        let mut ops = vec![target, member, d as u32];
        ops.extend_from_slice(extra);
        inst(&mut self.annotations, Op::MemberDecorate, &ops);
    }

    /// A global variable (its id is added to the interface list).
    pub fn global_var(&mut self, ptr_ty: u32, class: StorageClass) -> u32 {
        let id = self.id();
        inst(&mut self.globals, Op::Variable, &[ptr_ty, id, class as u32]);
        self.interface.push(id);
        id
    }

    /// A constant of type `ty` with the given literal words.
    pub fn constant(&mut self, ty: u32, words: &[u32]) -> u32 {
        self.cached(Op::Constant, Some(ty), words)
    }

    /// `OpConstantTrue` / `OpConstantFalse`.
    pub fn c_bool(&mut self, v: bool) -> u32 {
        let t = self.t_bool();
        let op = if v {
            Op::ConstantTrue
        } else {
            Op::ConstantFalse
        };
        self.cached(op, Some(t), &[])
    }

    /// An integer constant of `bits` (the value's low bits).
    pub fn c_int(&mut self, bits: u32, v: u64) -> u32 {
        let t = self.t_int(bits);
        match bits {
            64 => self.constant(t, &[v as u32, (v >> 32) as u32]),
            32 => self.constant(t, &[v as u32]),
            16 => self.constant(t, &[(v as u32) & 0xffff]),
            _ => self.constant(t, &[(v as u32) & 0xff]),
        }
    }

    /// A `u32` constant.
    pub fn c_u32(&mut self, v: u32) -> u32 {
        self.c_int(32, u64::from(v))
    }

    /// A float constant of `bits`, rounded from `v`.
    pub fn c_float(&mut self, bits: u32, v: f64) -> u32 {
        let t = self.t_float(bits);
        match bits {
            16 => self.constant(t, &[u32::from(half::f16::from_f64(v).to_bits())]),
            32 => self.constant(t, &[(v as f32).to_bits()]),
            _ => {
                let b = v.to_bits();
                self.constant(t, &[b as u32, (b >> 32) as u32])
            }
        }
    }

    /// `OpConstantNull` of a type.
    pub fn c_null(&mut self, ty: u32) -> u32 {
        self.cached(Op::ConstantNull, Some(ty), &[])
    }
}
