//! Collectives: one communication stream per group, each all-reduce a command on it that
//! meets the other devices' contributions in the process-wide [`HostRendezvous`].

use compute_core::collective::{AllReduce, HostRendezvous};
use compute_core::future::DynFut;
use compute_core::{DeviceId, ServerCollective, ServerError, StreamId};

use crate::device::device_count;
use crate::server::CpuServer;
use crate::worker::Command;

impl CpuServer {
    fn check_group(&self, devices: &[DeviceId]) -> Result<Vec<DeviceId>, ServerError> {
        compute_core::collective::check_group(devices, self.owner.device, device_count(), "CPU")
    }
}

impl ServerCollective for CpuServer {
    fn ensure_init_collective(
        &mut self,
        devices: &[DeviceId],
        _stream: StreamId,
    ) -> Result<(), ServerError> {
        let group = self.check_group(devices)?;
        HostRendezvous::global().register(&group);
        self.comm_streams
            .entry(group)
            .or_insert_with(StreamId::fresh);
        Ok(())
    }

    fn all_reduce(&mut self, reduce: AllReduce, _stream: StreamId) -> Result<(), ServerError> {
        let group = self.check_group(&reduce.devices)?;
        let comm = self.comm_streams.get(&group).copied();
        reduce.check(&group, comm.is_some())?;
        let Some(comm) = comm else {
            unreachable!("check_all_reduce refuses a group that was not initialised")
        };
        let source = self.resolve(&reduce.src)?;
        let target = self.resolve(&reduce.dst)?;
        let me = self.owner.device;
        let round = HostRendezvous::global().next_round(&group, me);
        let (keep_src, keep_dst) = (reduce.src.clone(), reduce.dst.clone());
        let command: Command = Box::new(move || {
            let _alive = (&keep_src, &keep_dst);
            // SAFETY: the bindings keep both ranges alive; stream waits order their contents.
            let data = unsafe { core::slice::from_raw_parts(source.ptr(), source.len()) }.to_vec();
            let out = HostRendezvous::global().all_reduce(
                &group,
                round,
                me,
                data,
                reduce.dtype,
                reduce.op,
            )?;
            // SAFETY: `target` holds `out.len()` bytes (sizes checked equal at submission).
            unsafe { core::ptr::copy_nonoverlapping(out.as_ptr(), target.ptr(), out.len()) };
            Ok(())
        });
        self.submit(comm, &[&reduce.src, &reduce.dst], command)?;
        Ok(())
    }

    fn sync_collective(&mut self, _stream: StreamId) -> DynFut<Result<(), ServerError>> {
        let comms: Vec<StreamId> = self.comm_streams.values().copied().collect();
        let markers: Vec<_> = comms.into_iter().map(|c| self.sync_marker(c)).collect();
        Box::pin(async move {
            for marker in markers {
                marker.await?;
            }
            Ok(())
        })
    }
}
