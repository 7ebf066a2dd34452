//! The conformance tests, grouped by concern. Each is `fn name<R: Runtime>(client: ComputeClient<R>)`.

pub mod collective;
pub mod devices;
pub mod graph;
pub mod launch;
pub mod memory;
pub mod profile;
pub mod streams;
pub mod transfer;

/// Call `$callback!($($args)*, group::test, ...)` with every test of the suite.
#[doc(hidden)]
#[macro_export]
macro_rules! for_each_test {
    ($callback:path, $($args:tt)*) => {
        $callback!(
            $($args)*,
            transfer::create_and_read_back,
            transfer::zero_size_buffer,
            transfer::write_in_place,
            transfer::write_too_long_is_an_error,
            transfer::pitched_tensor_reads,
            transfer::read_tensor_rejects_bad_strides,
            transfer::create_tensors_packs_one_allocation,
            transfer::empty_allocations,
            transfer::read_lazy_reflects_first_access,
            transfer::staging_materializes,
            transfer::get_resource_of_own_handle,
            transfer::burst_of_tensors_reads_back_exact,
            memory::memory_usage_is_exact,
            memory::memory_stays_flat_over_iterations,
            memory::memory_cleanup_releases_free_pages,
            memory::allocation_that_cannot_fit_is_an_error,
            memory::configure_memory_pools_layouts,
            memory::persistent_allocations,
            devices::enumerate_devices_agree,
            devices::properties_and_features,
            devices::io_optimized_vector_sizes_fit,
            devices::foreign_handle_is_rejected,
            devices::to_client_copies_between_devices,
            devices::init_replaces_the_server,
            streams::read_after_write_one_stream,
            streams::read_after_write_across_streams,
            streams::eight_threads_hammer_one_device,
            streams::exclusive_keeps_others_out,
            launch::elementwise_add,
            launch::bounds_checked_and_unchecked,
            launch::zero_count_launch,
            launch::dynamic_cube_count,
            launch::launch_argument_errors_are_reported,
            graph::graph_replay_with_refreshed_inputs,
            graph::capture_rejects_sync_and_fresh_allocation,
            collective::all_reduce_sum_and_mean,
            collective::all_reduce_orders_with_compute,
            collective::collective_errors,
            profile::profile_measures_work,
            profile::measure_throughput_reports,
            profile::measure_launch_overhead_samples,
        );
    };
}
