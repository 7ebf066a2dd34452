//! The conformance tests, grouped by concern. Each is `fn name<R: Runtime>(client: ComputeClient<R>)`.

pub mod bad_input;
pub mod collective;
pub mod defects;
pub mod devices;
pub mod facade;
pub mod graph;
pub mod honest;
pub mod ir_arith;
pub mod ir_builtins;
pub mod ir_control;
pub mod ir_errors;
pub mod ir_math;
pub mod ir_memory;
pub mod ir_metadata;
pub mod ir_plane;
pub mod ir_types;
pub mod ir_util;
pub mod kernel_macro;
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
            bad_input::bad_handle_is_bounded_by_its_slice,
            bad_input::bad_read_tensor_wrapping_strides,
            bad_input::bad_aliasing_strides_one_rule,
            bad_input::bad_tensor_size_overflow,
            bad_input::bad_metadata_rank_mismatch,
            bad_input::bad_to_client_partial_elements,
            bad_input::bad_malformed_kernels_one_error_everywhere,
            bad_input::bad_launch_limits_checked_in_core,
            bad_input::bad_nested_persistent_sections_restore_the_mode,
            bad_input::bad_failed_section_does_not_poison_the_next,
            bad_input::bad_descriptors_property,
            honest::honest_profile_scales_with_work,
            honest::honest_memory_plateau_over_a_training_loop,
            honest::honest_pitch_scales_with_the_row,
            transfer::create_and_read_back,
            transfer::create_from_slice_copies_before_returning,
            transfer::zero_size_buffer,
            transfer::write_in_place,
            transfer::write_too_long_is_an_error,
            transfer::pitched_tensor_reads,
            transfer::read_tensor_rejects_bad_strides,
            transfer::read_tensor_of_strided_views,
            transfer::strided_writes_keep_the_gaps,
            transfer::create_tensors_packs_one_allocation,
            transfer::empty_allocations,
            transfer::read_lazy_reflects_first_access,
            transfer::staging_materializes,
            transfer::get_resource_of_own_handle,
            transfer::burst_of_tensors_reads_back_exact,
            transfer::large_pageable_writes_land_exact,
            transfer::many_small_writes_land_exact,
            transfer::back_to_back_pageable_writes_land_exact,
            transfer::pageable_writes_feed_launches_in_order,
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
            streams::forked_capture_rounds_return_reserved_memory,
            streams::short_lived_threads_do_not_grow_reserved_memory,
            streams::memory_cleanup_reaches_every_stream,
            facade::facade_best_honours_the_override,
            facade::facade_dispatch_runs_generic_code,
            ir_types::ir_types_load_store_every_elem,
            ir_types::ir_types_scalar_every_elem,
            ir_types::ir_types_small_int_scalars_keep_their_sign,
            ir_types::ir_types_bool_logic,
            ir_types::ir_types_vector_widths,
            ir_types::ir_types_read_only_and_read_write,
            ir_types::ir_types_f16_arith,
            ir_types::ir_types_bf16_arith,
            ir_types::ir_types_f32_arith,
            ir_types::ir_types_f64_arith,
            ir_arith::ir_arith_i8,
            ir_arith::ir_arith_i16,
            ir_arith::ir_arith_i32,
            ir_arith::ir_arith_i64,
            ir_arith::ir_arith_u8,
            ir_arith::ir_arith_u16,
            ir_arith::ir_arith_u32,
            ir_arith::ir_arith_u64,
            ir_arith::ir_arith_int_edge_cases,
            ir_arith::ir_arith_cast_float_to_int,
            ir_arith::ir_arith_cast_conversions,
            ir_arith::ir_arith_bitcast,
            ir_arith::ir_arith_select_vector,
            ir_math::ir_math_f32,
            ir_math::ir_math_f64,
            ir_math::ir_math_f16,
            ir_math::ir_math_bf16,
            ir_control::ir_control_if_else_divergence,
            ir_control::ir_control_range_steps,
            ir_control::ir_control_loop_break_continue,
            ir_control::ir_control_early_return,
            ir_memory::ir_memory_local_array,
            ir_memory::ir_memory_shared_reverse_barrier,
            ir_memory::ir_memory_shared_reduction,
            ir_memory::ir_memory_atomic_histogram,
            ir_memory::ir_memory_atomic_global_ops,
            ir_memory::ir_memory_atomic_shared,
            ir_memory::ir_memory_atomic_wide_and_float,
            ir_plane::ir_plane_ops,
            ir_plane::ir_plane_divergent,
            ir_builtins::ir_builtins_3d,
            ir_builtins::ir_builtins_plane_3d,
            ir_metadata::ir_metadata_buffer_len,
            ir_metadata::ir_metadata_pitched_tensor,
            ir_errors::ir_errors_type_errors_name_values,
            ir_errors::ir_errors_read_only_and_atomics,
            ir_errors::ir_errors_scope_and_control,
            ir_errors::ir_errors_declarations,
            ir_errors::ir_errors_shared_memory_limit_at_launch,
            kernel_macro::kernel_macro_control,
            kernel_macro::kernel_macro_shared_and_local,
            kernel_macro::kernel_macro_atomics,
            kernel_macro::kernel_macro_generic_types_and_widths,
            kernel_macro::kernel_macro_tensor_metadata,
            kernel_macro::kernel_macro_plane_sum,
            kernel_macro::kernel_macro_unchecked_launch,
            launch::elementwise_add,
            launch::bounds_checked_and_unchecked,
            launch::out_of_range_global_loads_read_zero,
            launch::zero_count_launch,
            launch::dynamic_cube_count,
            launch::launch_argument_errors_are_reported,
            graph::graph_replay_with_refreshed_inputs,
            graph::capture_rejects_sync_and_fresh_allocation,
            graph::capture_beside_writes_on_other_streams,
            graph::dropped_graph_frees_its_buffers_at_the_next_sync,
            graph::graph_keeps_every_dependency,
            graph::graph_replays_after_its_handles_dropped,
            collective::all_reduce_sum_and_mean,
            collective::all_reduce_orders_with_compute,
            collective::collective_errors,
            collective::all_reduce_mismatch_fails_every_participant,
            collective::two_groups_issued_in_different_orders,
            collective::all_reduce_into_a_sub_range_changes_exactly_its_bytes,
            profile::profile_measures_work,
            profile::measure_throughput_reports,
            profile::measure_throughput_matches_an_independent_timing,
            profile::measure_launch_overhead_samples,
            defects::writes_change_exactly_their_bytes,
            defects::over_limit_dynamic_count_is_an_error,
            defects::dynamic_count_error_reaches_its_own_stream,
            defects::graph_keeps_recorded_buffers_alive,
            defects::largest_buffer_allocates,
        );
    };
}
