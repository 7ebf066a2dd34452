//! Types and declarations of the kernel IR: vector items, buffer, scalar, shared and local
//! declarations, builtins.

use serde::{Deserialize, Serialize};

use crate::elem::ElemType;

/// The vector widths a value or a buffer may have.
pub const VECTOR_WIDTHS: [u8; 5] = [1, 2, 4, 8, 16];

/// The type of a kernel value: an element type and a vector width (1 for a scalar).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Item {
    /// The element type of each component.
    pub elem: ElemType,
    /// The number of components: 1, 2, 4, 8 or 16.
    pub width: u8,
}

impl Item {
    /// A vector item.
    pub const fn new(elem: ElemType, width: u8) -> Self {
        Self { elem, width }
    }

    /// A scalar item (width 1).
    pub const fn scalar(elem: ElemType) -> Self {
        Self { elem, width: 1 }
    }

    /// Size of one value of this item in bytes.
    pub const fn size(self) -> usize {
        self.elem.size() * self.width as usize
    }

    /// The same width with another element type.
    pub const fn with_elem(self, elem: ElemType) -> Self {
        Self {
            elem,
            width: self.width,
        }
    }
}

impl core::fmt::Display for Item {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.width == 1 {
            write!(f, "{}", self.elem)
        } else {
            write!(f, "{}x{}", self.elem, self.width)
        }
    }
}

/// Whether a kernel may write a global buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Access {
    /// Loads only.
    ReadOnly,
    /// Loads, stores and atomics.
    ReadWrite,
}

/// A global buffer parameter of a kernel. Buffers are bound at launch in declaration order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BufferDecl {
    /// The parameter's name (used in error messages and generated source).
    pub name: String,
    /// Element type.
    pub elem: ElemType,
    /// Vector width: indices into the buffer count vectors of this many elements.
    pub vector_width: u8,
    /// Read-only or read-write.
    pub access: Access,
}

impl BufferDecl {
    /// The item one index of the buffer addresses.
    pub const fn item(&self) -> Item {
        Item::new(self.elem, self.vector_width)
    }
}

/// A scalar parameter of a kernel, passed by value at launch in declaration order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScalarDecl {
    /// The parameter's name.
    pub name: String,
    /// Element type.
    pub elem: ElemType,
}

/// An array in shared memory: one instance per cube, visible to all of its units.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SharedDecl {
    /// The array's name.
    pub name: String,
    /// The item of one entry.
    pub item: Item,
    /// Number of entries.
    pub len: u32,
}

impl SharedDecl {
    /// Size of the array in bytes.
    pub const fn size_bytes(&self) -> usize {
        self.item.size() * self.len as usize
    }
}

/// An array private to each unit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LocalArrayDecl {
    /// The array's name.
    pub name: String,
    /// The item of one entry.
    pub item: Item,
    /// Number of entries.
    pub len: u32,
}

/// A mutable local variable of each unit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VarDecl {
    /// The variable's name.
    pub name: String,
    /// Its type.
    pub item: Item,
}

/// A value the hardware provides to every unit. All builtins are `u32` scalars.
///
/// Linear variants flatten x, y, z with x fastest: `unit_pos = x + y * dim_x + z * dim_x * dim_y`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Builtin {
    /// Linear index of the unit in the whole launch: `cube_pos * cube_dim + unit_pos`.
    AbsolutePos,
    /// `cube_pos_x * cube_dim_x + unit_pos_x`.
    AbsolutePosX,
    /// `cube_pos_y * cube_dim_y + unit_pos_y`.
    AbsolutePosY,
    /// `cube_pos_z * cube_dim_z + unit_pos_z`.
    AbsolutePosZ,
    /// Linear index of the unit in its cube.
    UnitPos,
    /// Unit position in the cube, x.
    UnitPosX,
    /// Unit position in the cube, y.
    UnitPosY,
    /// Unit position in the cube, z.
    UnitPosZ,
    /// Linear index of the cube in the launch.
    CubePos,
    /// Cube position in the launch, x.
    CubePosX,
    /// Cube position in the launch, y.
    CubePosY,
    /// Cube position in the launch, z.
    CubePosZ,
    /// Number of units in a cube.
    CubeDim,
    /// Cube dimension, x.
    CubeDimX,
    /// Cube dimension, y.
    CubeDimY,
    /// Cube dimension, z.
    CubeDimZ,
    /// Number of cubes in the launch.
    CubeCount,
    /// Cube count, x.
    CubeCountX,
    /// Cube count, y.
    CubeCountY,
    /// Cube count, z.
    CubeCountZ,
    /// Number of units in a plane (warp, subgroup).
    PlaneSize,
    /// Index of the unit in its plane.
    UnitPosPlane,
}

impl Builtin {
    /// The builtin's name, as the builder method that reads it.
    pub const fn name(self) -> &'static str {
        match self {
            Builtin::AbsolutePos => "absolute_pos",
            Builtin::AbsolutePosX => "absolute_pos_x",
            Builtin::AbsolutePosY => "absolute_pos_y",
            Builtin::AbsolutePosZ => "absolute_pos_z",
            Builtin::UnitPos => "unit_pos",
            Builtin::UnitPosX => "unit_pos_x",
            Builtin::UnitPosY => "unit_pos_y",
            Builtin::UnitPosZ => "unit_pos_z",
            Builtin::CubePos => "cube_pos",
            Builtin::CubePosX => "cube_pos_x",
            Builtin::CubePosY => "cube_pos_y",
            Builtin::CubePosZ => "cube_pos_z",
            Builtin::CubeDim => "cube_dim",
            Builtin::CubeDimX => "cube_dim_x",
            Builtin::CubeDimY => "cube_dim_y",
            Builtin::CubeDimZ => "cube_dim_z",
            Builtin::CubeCount => "cube_count",
            Builtin::CubeCountX => "cube_count_x",
            Builtin::CubeCountY => "cube_count_y",
            Builtin::CubeCountZ => "cube_count_z",
            Builtin::PlaneSize => "plane_size",
            Builtin::UnitPosPlane => "unit_pos_plane",
        }
    }
}
