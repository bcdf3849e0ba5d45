use super::*;

fn pattern(length: usize, seed: u8) -> Vec<u8> {
    (0..length)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn reads_back_what_was_written(device: &dyn BlockDevice) {
    let block = device.block_size() as usize;
    let data = pattern(3 * block, 7);
    device.write(2, &data).unwrap();
    let mut back = vec![0; 3 * block];
    device.read(2, &mut back).unwrap();
    assert_eq!(back, data);
}

fn refuses_blocks_past_the_end(device: &dyn BlockDevice) {
    let block = device.block_size() as usize;
    let last = device.block_count() - 1;
    assert!(device.write(last, &vec![0; block]).is_ok());
    assert!(matches!(
        device.write(last, &vec![0; 2 * block]),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        device.read(u64::MAX, &mut vec![0; block]),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        device.write_zeroes(u64::MAX - 1, 4),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        device.write(0, &vec![0; block + 1]),
        Err(Error::PartialBlock { .. })
    ));
}

fn zeroes_and_deallocates(device: &dyn BlockDevice) {
    let block = device.block_size() as usize;
    device.write(0, &pattern(4 * block, 1)).unwrap();
    device.write_zeroes(1, 1).unwrap();
    device.deallocate(3, 1).unwrap();
    let mut back = vec![0; 4 * block];
    device.read(0, &mut back).unwrap();
    assert_eq!(&back[..block], &pattern(4 * block, 1)[..block]);
    assert!(back[block..2 * block].iter().all(|&byte| byte == 0));
    assert!(back[3 * block..].iter().all(|&byte| byte == 0));
}

#[test]
fn a_ram_device_reads_back_what_was_written() {
    reads_back_what_was_written(&RamBackend::new(512, 64).unwrap());
}

#[test]
fn a_ram_device_refuses_blocks_past_its_end() {
    refuses_blocks_past_the_end(&RamBackend::new(4096, 8).unwrap());
}

#[test]
fn a_ram_device_zeroes_and_deallocates() {
    zeroes_and_deallocates(&RamBackend::new(512, 8).unwrap());
}

/// `read_to` hands over exactly the blocks `read` returns, in order, refuses what `read`
/// refuses, and reports a sink's refusal as the destination's, not the device's.
fn hands_blocks_to_a_sink(device: &dyn BlockDevice) {
    let block = device.block_size() as usize;
    device.write(1, &pattern(2 * block, 5)).unwrap();
    let mut bounce = Vec::new();
    let mut received = Vec::new();
    device
        .read_to(1, 2 * block, &mut bounce, &mut |at, piece| {
            assert_eq!(at, received.len(), "pieces come in order");
            received.extend_from_slice(piece);
            Ok(())
        })
        .unwrap();
    assert_eq!(received, pattern(2 * block, 5));
    assert!(matches!(
        device.read_to(device.block_count(), block, &mut bounce, &mut |_, _| Ok(())),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        device.read_to(0, block + 1, &mut bounce, &mut |_, _| Ok(())),
        Err(Error::PartialBlock { .. })
    ));
    assert!(matches!(
        device.read_to(0, block, &mut bounce, &mut |_, _| Err("full".into())),
        Err(Error::Destination(reason)) if reason == "full"
    ));
}

#[test]
fn a_ram_device_lends_its_blocks_to_a_sink() {
    hands_blocks_to_a_sink(&RamBackend::new(512, 16).unwrap());
}

#[test]
fn a_file_device_hands_its_blocks_to_a_sink_through_the_bounce_buffer() {
    let path = temporary_path("sink");
    hands_blocks_to_a_sink(&FileBackend::create(&path, 512, 16, FileMode::Buffered).unwrap());
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn block_sizes_other_than_powers_of_two_from_512_to_4096_are_refused() {
    for size in [0, 256, 1000, 8192] {
        assert!(matches!(RamBackend::new(size, 1), Err(Error::Config(_))), "{size}");
    }
}

fn temporary_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("rnic-storage-{}-{name}", std::process::id()))
}

#[test]
fn a_buffered_file_device_persists_across_opens() {
    let path = temporary_path("buffered");
    {
        let device = FileBackend::create(&path, 512, 32, FileMode::Buffered).unwrap();
        reads_back_what_was_written(&device);
        refuses_blocks_past_the_end(&device);
        zeroes_and_deallocates(&device);
        device.write(10, &pattern(512, 9)).unwrap();
        device.flush().unwrap();
    }
    let device = FileBackend::open(&path, 512, FileMode::Buffered).unwrap();
    assert_eq!(device.block_count(), 32);
    let mut back = vec![0; 512];
    device.read(10, &mut back).unwrap();
    assert_eq!(back, pattern(512, 9));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_direct_file_device_works_with_unaligned_caller_buffers() {
    // tmpfs refuses O_DIRECT; use the working directory's file system, and accept a
    // refusal only as EINVAL at open (a file system without O_DIRECT), never a wrong read.
    let path = std::env::current_dir()
        .unwrap()
        .join(format!("target-direct-{}", std::process::id()));
    match FileBackend::create(&path, 4096, 16, FileMode::Direct) {
        Ok(device) => {
            reads_back_what_was_written(&device);
            let mut unaligned = vec![0u8; 4096 + 1];
            device.write(5, &pattern(4096, 3)).unwrap();
            device.read(5, &mut unaligned[1..]).unwrap();
            assert_eq!(&unaligned[1..], &pattern(4096, 3)[..]);
        }
        Err(Error::Io { source, .. }) => assert_eq!(source.raw_os_error(), Some(libc::EINVAL)),
        Err(other) => panic!("unexpected error {other}"),
    }
    let _ = std::fs::remove_file(&path);
}
