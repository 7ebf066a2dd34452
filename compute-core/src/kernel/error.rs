//! Errors of [`KernelBuilder::build`](super::KernelBuilder::build).

/// A kernel that does not validate. The message names the kernel, the operation and the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// Operand or result types that do not fit the operation.
    #[error("`{op}` in kernel `{kernel}`: {detail}")]
    Type {
        /// The kernel.
        kernel: String,
        /// The operation.
        op: String,
        /// What is wrong, naming the values.
        detail: String,
    },
    /// A store or an atomic on a buffer declared with [`input`](super::KernelBuilder::input).
    #[error("{op} to read-only buffer `{buffer}` in kernel `{kernel}`")]
    ReadOnly {
        /// The kernel.
        kernel: String,
        /// The operation (`store`, `atomic_add`, ...).
        op: String,
        /// The buffer.
        buffer: String,
    },
    /// A value or variable used outside the block that defines it.
    #[error("`{op}` in kernel `{kernel}` uses `{name}` outside the scope it was defined in")]
    OutOfScope {
        /// The kernel.
        kernel: String,
        /// The operation.
        op: String,
        /// The value or variable.
        name: String,
    },
    /// A handle that this builder did not create (another builder's value, variable or buffer).
    #[error("`{op}` in kernel `{kernel}` uses unknown {what} `{name}` (made by another builder)")]
    Unknown {
        /// The kernel.
        kernel: String,
        /// The operation.
        op: String,
        /// `value`, `variable`, `buffer`, ...
        what: &'static str,
        /// The handle's index.
        name: String,
    },
    /// `break` or `continue` outside a loop.
    #[error("`{op}` outside a loop in kernel `{kernel}`")]
    NotInLoop {
        /// The kernel.
        kernel: String,
        /// The operation.
        op: String,
    },
    /// A declaration that cannot be honoured (vector width, cube dimension, duplicate name).
    #[error("invalid declaration `{name}` in kernel `{kernel}`: {detail}")]
    Declaration {
        /// The kernel.
        kernel: String,
        /// The declared name.
        name: String,
        /// What is wrong.
        detail: String,
    },
}
