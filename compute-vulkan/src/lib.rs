//! # compute-vulkan
//!
//! The native Vulkan backend of the compute runtime, on ash with the loader opened at run time.

pub mod spirv;
