//! Devices, properties, foreign handles, transfers between clients and `init`.

use compute_core::{ComputeClient, ElemType, Runtime, ServerError, block_on};

use crate::kernels;
use crate::util::{client_of, devices_or_single_device_check, f32_bytes};

/// `enumerate_devices`, `enumerate_all_devices`, `device_count`, `device_count_total` agree.
pub fn enumerate_devices_agree<R: Runtime>(client: ComputeClient<R>) {
    let all = client.enumerate_all_devices();
    assert!(!all.is_empty());
    assert!(all.contains(&client.device_id()));
    assert_eq!(client.device_count_total(), all.len());
    let of_type = client.enumerate_devices(client.device_id().type_id);
    assert_eq!(
        client.device_count(client.device_id().type_id),
        of_type.len()
    );
    assert!(of_type.iter().all(|d| all.contains(d)));
    assert!(client.enumerate_devices(u16::MAX).is_empty());
}

/// `properties`, `features`, `properties_mut` and `info` describe the device.
pub fn properties_and_features<R: Runtime>(mut client: ComputeClient<R>) {
    let props = client.properties().clone();
    assert_eq!(props.backend, R::name());
    assert!(props.hardware.max_units_per_cube >= 1);
    assert!(props.memory.max_page_size > 0);
    assert!(client.features().supports(ElemType::F32));
    assert_eq!(client.features(), &props.features);
    let info = format!("{:?}", client.info());
    assert!(!info.is_empty());
    let other = client.clone();
    client.properties_mut().unwrap().name = "renamed".into();
    assert_eq!(client.properties().name, "renamed");
    assert_eq!(
        other.properties().name,
        props.name,
        "other clients keep their properties"
    );
}

/// `io_optimized_vector_sizes` lists useful widths, widest first, within the load limit.
pub fn io_optimized_vector_sizes_fit<R: Runtime>(client: ComputeClient<R>) {
    let max = client.properties().hardware.max_load_bytes as usize;
    for elem in [1usize, 2, 4, 8] {
        let sizes: Vec<u8> = client.io_optimized_vector_sizes(elem).collect();
        assert_eq!(sizes.last(), Some(&1));
        assert!(sizes.windows(2).all(|w| w[0] > w[1]));
        assert!(sizes.iter().all(|&w| w == 1 || w as usize * elem <= max));
    }
    let f32_sizes: Vec<u8> = client.io_optimized_vector_sizes(4).collect();
    assert!(f32_sizes.contains(&4), "{f32_sizes:?}");
}

/// A handle from another device is rejected with an error, never used.
pub fn foreign_handle_is_rejected<R: Runtime>(client: ComputeClient<R>) {
    let Some(devices) = devices_or_single_device_check(&client, 2, "foreign_handle_is_rejected")
    else {
        return;
    };
    let Some(&other_id) = devices.iter().find(|&&d| d != client.device_id()) else {
        unreachable!("two distinct devices were enumerated");
    };
    let other = client_of::<R>(other_id);
    let foreign = other.create(f32_bytes(&[1.0, 2.0]));
    let err = client.read_one(foreign.clone()).unwrap_err();
    assert!(matches!(err, ServerError::WrongDevice { .. }), "{err:?}");
    assert!(matches!(
        client.get_resource(foreign.clone()),
        Err(ServerError::WrongDevice { .. })
    ));
    client.write(&foreign, f32_bytes(&[5.0, 6.0]));
    assert!(matches!(
        client.flush(),
        Err(ServerError::WrongDevice { .. })
    ));
    let own = client.empty(8);
    kernels::launch_binary(
        &client,
        &kernels::add_f32(1),
        &foreign,
        &foreign,
        &own,
        2,
        1,
    );
    assert!(matches!(
        client.flush(),
        Err(ServerError::WrongDevice { .. })
    ));
    assert_eq!(
        other.read_one(foreign).unwrap().to_elems::<f32>(),
        vec![1.0, 2.0]
    );
    assert!(client.get_resource(own).is_ok());
}

/// `to_client` and `to_client_tensor` copy data between devices.
pub fn to_client_copies_between_devices<R: Runtime>(mut client: ComputeClient<R>) {
    let Some(devices) =
        devices_or_single_device_check(&client, 2, "to_client_copies_between_devices")
    else {
        return;
    };
    let Some(&other_id) = devices.iter().find(|&&d| d != client.device_id()) else {
        unreachable!("two distinct devices were enumerated");
    };
    let other = client_of::<R>(other_id);
    let src = client.create(f32_bytes(&[1.0, -2.0, 3.0]));
    let copied = client.to_client(src, &other, ElemType::F32);
    assert_eq!(
        other.read_one(copied).unwrap().to_elems::<f32>(),
        vec![1.0, -2.0, 3.0]
    );
    let data: Vec<f32> = (0..15).map(|i| i as f32).collect();
    let tensor = client.create_tensor(f32_bytes(&data), [3, 5].into(), 4);
    let copied = client.to_client_tensor(tensor.copy_descriptor(), &other, ElemType::F32);
    assert_eq!(copied.size(), 60, "the copy is compact");
    assert_eq!(other.read_one(copied).unwrap().to_elems::<f32>(), data);
    other.flush().unwrap();
}

/// `init` installs a new server that `load` returns afterwards; old clients keep working.
pub fn init_replaces_the_server<R: Runtime>(client: ComputeClient<R>) {
    // Replacing the default device's server would pull it from under the tests running beside
    // this one: use another device.
    if devices_or_single_device_check(&client, 2, "init_replaces_the_server").is_none() {
        return;
    }
    let devices = client.enumerate_devices(client.device_id().type_id);
    let last = *devices.last().unwrap();
    let device = <R::Device as compute_core::Device>::from_id(last);
    let old = ComputeClient::<R>::load(&device);
    let kept = old.create(f32_bytes(&[7.0]));
    let server = R::create_server(&device).unwrap();
    let fresh = ComputeClient::<R>::init(&device, server);
    let loaded = ComputeClient::<R>::load(&device);
    let h = loaded.create(f32_bytes(&[8.0]));
    assert_eq!(
        fresh.read_one(h.clone()).unwrap().to_elems::<f32>(),
        vec![8.0]
    );
    assert!(
        matches!(old.read_one(h), Err(ServerError::ServerReplaced { device }) if device == last),
        "a handle of the new server is foreign to the old one, and the error says why"
    );
    assert_eq!(old.read_one(kept).unwrap().to_elems::<f32>(), vec![7.0]);
    let fut = fresh.sync();
    block_on(fut).unwrap();
}
