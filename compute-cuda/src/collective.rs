//! NCCL communicators, shared by the servers of one process.
//!
//! The first server of a group to call `ensure_init_collective` creates the communicators of every
//! device of the group at once (`ncclCommInitAll`); each server then uses its own rank's. A group
//! of one device gets a one-rank communicator, which NCCL runs as a local copy.

use std::sync::OnceLock;

use compute_core::{DeviceId, ElemType, ReduceOperation, ServerError};
use cudarc::nccl::{result as nccl, sys};
use hashbrown::HashMap;

use crate::driver::Raw;

type Comms = HashMap<Vec<DeviceId>, Vec<Raw<sys::ncclComm_t>>>;

fn registry() -> &'static spin::Mutex<Comms> {
    static COMMS: OnceLock<spin::Mutex<Comms>> = OnceLock::new();
    COMMS.get_or_init(|| spin::Mutex::new(HashMap::new()))
}

/// Keep NVLink multicast (NVLS) off: it can put the host's shared GPUs out of service.
pub(crate) fn disable_nvls() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            // SAFETY: set once, before NCCL is first loaded, from the thread creating a
            // communicator; the runtime reads no other environment variable concurrently.
            unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
        }
    });
}

fn nccl_error(what: &str, e: nccl::NcclError) -> ServerError {
    ServerError::Driver(format!("{what}: {e:?}"))
}

/// The communicator of `me` in `group` (sorted, deduplicated), creating the group's on first use.
pub(crate) fn communicator(
    group: &[DeviceId],
    me: DeviceId,
) -> Result<Raw<sys::ncclComm_t>, ServerError> {
    let rank = group.iter().position(|d| *d == me).ok_or_else(|| {
        ServerError::InvalidArgument(format!(
            "collective group {group:?} does not contain this device {me}"
        ))
    })?;
    let mut comms = registry().lock();
    if let Some(list) = comms.get(group) {
        return Ok(list[rank]);
    }
    if !crate::driver::nccl_available() {
        return Err(ServerError::Unavailable(
            "libnccl not found: collectives need NCCL".into(),
        ));
    }
    disable_nvls();
    let devices: Vec<i32> = group.iter().map(|d| d.index_id as i32).collect();
    let mut raw = vec![core::ptr::null_mut(); devices.len()];
    // SAFETY: `raw` has room for one communicator per device of `devices`.
    unsafe { nccl::comm_init_all(raw.as_mut_ptr(), devices.len() as i32, devices.as_ptr()) }
        .map_err(|e| nccl_error("ncclCommInitAll", e))?;
    let list: Vec<_> = raw.into_iter().map(Raw).collect();
    let mine = list[rank];
    comms.insert(group.to_vec(), list);
    Ok(mine)
}

/// Whether the group has communicators already.
pub(crate) fn initialised(group: &[DeviceId]) -> bool {
    registry().lock().contains_key(group)
}

/// NCCL's type for `dtype`.
pub(crate) fn data_type(dtype: ElemType) -> Result<sys::ncclDataType_t, ServerError> {
    use sys::ncclDataType_t as T;
    Ok(match dtype {
        ElemType::I8 => T::ncclInt8,
        ElemType::U8 => T::ncclUint8,
        ElemType::I32 => T::ncclInt32,
        ElemType::U32 => T::ncclUint32,
        ElemType::I64 => T::ncclInt64,
        ElemType::U64 => T::ncclUint64,
        ElemType::F16 => T::ncclFloat16,
        ElemType::BF16 => T::ncclBfloat16,
        ElemType::F32 => T::ncclFloat32,
        ElemType::F64 => T::ncclFloat64,
        other => {
            return Err(ServerError::Unsupported(format!(
                "all_reduce over {other} (NCCL has no such type)"
            )));
        }
    })
}

/// NCCL's operation for `op`.
pub(crate) fn reduce_op(op: ReduceOperation) -> sys::ncclRedOp_t {
    match op {
        ReduceOperation::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOperation::Mean => sys::ncclRedOp_t::ncclAvg,
        ReduceOperation::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOperation::Min => sys::ncclRedOp_t::ncclMin,
    }
}

/// Enqueue `ncclAllReduce` of `count` elements on `stream`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn all_reduce(
    comm: Raw<sys::ncclComm_t>,
    src: u64,
    dst: u64,
    count: usize,
    dtype: ElemType,
    op: ReduceOperation,
    stream: Raw<cudarc::driver::sys::CUstream>,
) -> Result<(), ServerError> {
    let dt = data_type(dtype)?;
    // SAFETY: `src` and `dst` are device ranges of `count` elements kept alive by the caller's
    // bindings; `comm` lives in the process registry; the stream is alive.
    unsafe {
        nccl::all_reduce(
            src as *const _,
            dst as *mut _,
            count,
            dt,
            reduce_op(op),
            comm.0,
            stream.0.cast(),
        )
    }
    .map_err(|e| nccl_error("ncclAllReduce", e))?;
    Ok(())
}
