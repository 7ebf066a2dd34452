//! Vulkan-specific checks beyond the conformance suite: limits named in errors, the device's
//! configuration, device-time profiles. Where Vulkan is unavailable each test reports a skip
//! (`compute_core::env::report_reduced`) and returns; `cargo xtask test-all` counts it as skipped.

use compute_core::kernel::KernelBuilder;
use compute_core::{
    Bytes, ComputeClient, CubeCount, ElemType, KernelArguments, Runtime, ServerError, TimingMethod,
};
use compute_vulkan::{VulkanDevice, VulkanKernel, VulkanRuntime};

fn client() -> Option<ComputeClient<VulkanRuntime>> {
    match VulkanRuntime::availability() {
        Ok(()) => Some(ComputeClient::load(&VulkanDevice::default())),
        Err(reason) => {
            compute_core::env::report_reduced(&format!("Vulkan unavailable ({reason})"));
            None
        }
    }
}

#[test]
fn too_large_allocation_is_buffer_too_large() {
    let Some(client) = client() else { return };
    let max = client.properties().memory.max_page_size;
    // The least of maxStorageBufferRange, maxBufferSize and maxMemoryAllocationSize, rounded
    // down to the slice alignment.
    assert_eq!(max % client.properties().memory.alignment, 0, "{max}");
    let err = client.try_empty(max as usize + 1).unwrap_err();
    assert_eq!(
        err,
        ServerError::BufferTooLarge {
            requested: max + 1,
            maximum: max
        }
    );
    // The largest block itself works.
    let ok = client.try_empty(max as usize);
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn info_describes_the_device() {
    let Some(client) = client() else { return };
    let info = client.info();
    assert!(!info.name.is_empty());
    assert!(info.caps.version >= (1, 5), "{:?}", info.caps);
    assert_eq!(
        client.properties().features.elem_types,
        compute_vulkan::elem_types(&info.caps)
    );
    assert_eq!(
        client.device_count_total(),
        compute_vulkan::device_count() as usize
    );
}

#[test]
fn profile_reports_device_time_where_timestamps_exist() {
    let Some(client) = client() else { return };
    let mut k = KernelBuilder::new("vk_fill", [64, 1, 1]);
    let out = k.output("out", ElemType::F32, 1);
    let i = k.absolute_pos();
    k.store(out, i, 2.0f32);
    let kernel: VulkanKernel = k.build().expect("kernel").into();
    let n = 1 << 16;
    let out = client.empty(n * 4);
    let args = KernelArguments::new().buffer(out.clone().binding());
    let (_, duration) = client
        .profile(
            || {
                for _ in 0..4 {
                    client.launch(kernel.clone(), CubeCount::cover(n, 64), args.clone());
                }
            },
            "vk_fill",
        )
        .expect("profile");
    let expected = if client.properties().features.device_timestamps {
        TimingMethod::Device
    } else {
        TimingMethod::Host
    };
    assert_eq!(duration.timing, expected);
    assert!(duration.duration.as_nanos() > 0);
    let values = client.read_one(out).unwrap().to_elems::<f32>();
    assert!(values.iter().all(|&v| v == 2.0));
}

#[test]
fn many_small_writes_and_reads_round_trip() {
    let Some(client) = client() else { return };
    // Exercises the staging chunks (many writes per batch) and batch flushing.
    let handles: Vec<_> = (0..3000u32)
        .map(|i| client.create(Bytes::from_elems(vec![i, i + 1, i + 2])))
        .collect();
    let bytes = client.read(handles);
    for (i, b) in bytes.iter().enumerate() {
        let i = i as u32;
        assert_eq!(b.to_elems::<u32>(), vec![i, i + 1, i + 2]);
    }
    client.flush().unwrap();
    if compute_vulkan::validation_enabled() {
        assert_eq!(compute_vulkan::validation_message_count(), 0);
    }
}

/// Three kernels no other test builds (distinct stored constants).
fn cache_probe_kernels() -> Vec<compute_core::kernel::KernelDefinition> {
    (0..3u32)
        .map(|c| {
            let mut k = KernelBuilder::new(&format!("pipeline_cache_probe_{c}"), [64, 1, 1]);
            let out = k.output("out", ElemType::U32, 1);
            let i = k.absolute_pos();
            let v = k.add(i, 7_000_000 + c);
            k.store(out, i, v);
            k.build().unwrap()
        })
        .collect()
}

/// The on-disk pipeline cache: a second process creating the same pipelines gets every one of
/// them from the cache (the driver's creation feedback says so), while the first process, on
/// an empty cache directory, got none. Each side is a fresh process of this test binary.
#[test]
fn a_second_process_creates_its_pipelines_from_the_disk_cache() {
    const NAME: &str = "a_second_process_creates_its_pipelines_from_the_disk_cache";
    let Some(client) = client() else { return };
    if compute_core::env::is_child_test(NAME) {
        for (c, def) in cache_probe_kernels().into_iter().enumerate() {
            let out = client.empty(64 * 4);
            let kernel: VulkanKernel = def.into();
            client.launch(
                kernel,
                CubeCount::Static(1, 1, 1),
                KernelArguments::new().buffer(out.clone().binding()),
            );
            let got = client.read_one(out).unwrap().to_elems::<u32>();
            assert_eq!(got[63], 63 + 7_000_000 + c as u32);
        }
        // The cache is written at most every 2 s while pipelines are being created: let the
        // interval pass so that this flush writes it.
        std::thread::sleep(std::time::Duration::from_millis(2100));
        client.flush().unwrap();
        let n = compute_vulkan::pipeline_counts();
        println!(
            "pipelines: created={} feedback={} hits={}",
            n.created, n.with_feedback, n.cache_hits
        );
        return;
    }
    let dir = compute_core::env::scratch_dir("compute-vulkan-cache-test");
    let run = || -> (u64, u64, u64) {
        let n = compute_core::env::child_test_counts(
            NAME,
            &[(compute_vulkan::CACHE_DIR_ENV, dir.as_os_str())],
            "pipelines: ",
        )
        .unwrap();
        (n["created"], n["feedback"], n["hits"])
    };
    let first = run();
    let cache_bytes: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    let second = run();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        first.0 >= 3 && second.0 == first.0,
        "{first:?} then {second:?}"
    );
    assert!(cache_bytes >= 32, "the first process wrote no cache file");
    if cache_bytes <= 32 {
        // Mesa's lavapipe, for one, keeps no pipelines in its cache data: a bare header.
        compute_core::env::report_reduced(
            "the driver's pipeline cache data holds no pipelines (a bare 32-byte header)",
        );
        return;
    }
    if first.1 == 0 {
        compute_core::env::report_reduced(
            "the driver fills in no pipeline creation feedback: cache hits cannot be seen",
        );
        return;
    }
    assert_eq!(
        first.2, 0,
        "the first process found pipelines in an empty cache"
    );
    assert_eq!(
        second.2, second.1,
        "the second process compiled pipelines the first one had cached: {second:?}"
    );
}
