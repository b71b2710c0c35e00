//! The host arena as two processes see it: a block written through one mapping is read
//! through another made from the descriptor that travels (here a duplicate of it, as
//! `SCM_RIGHTS` gives the worker), blocks are carved and given back, and an arena that could
//! change size under the worker, or is not whole pages, is refused by name.

use std::os::fd::AsFd;

use gpufuse_transport::arena::{HostArena, PAGE};
use rustix::fs::{MemfdFlags, SealFlags};

#[test]
fn both_mappings_see_the_same_bytes() {
    let client = HostArena::create(64 * PAGE).unwrap();
    let worker = HostArena::adopt(client.fd().try_clone_to_owned().unwrap()).unwrap();
    assert_eq!(worker.len(), client.len());
    let p = client.alloc(3 * PAGE + 5).unwrap();
    let off = client.offset_of(p as usize, 3 * PAGE + 5).unwrap();
    let data: Vec<u8> = (0..3 * PAGE + 5).map(|i| (i * 31) as u8).collect();
    assert!(client.write(off, &data));
    let mut seen = vec![0u8; data.len()];
    assert!(worker.read(off, &mut seen));
    assert_eq!(seen, data, "the worker reads what the client wrote");
    assert!(worker.write(off + 1, b"worker"));
    let mut back = [0u8; 6];
    assert!(client.read(off + 1, &mut back));
    assert_eq!(&back, b"worker", "the client reads what the worker wrote");
    // Given back: its pages are released, so both sides see zeros there.
    assert!(client.free(p, 3 * PAGE + 5));
    assert!(worker.read(off, &mut seen));
    assert!(seen.iter().all(|&b| b == 0));
    // Ranges the worker is asked for are checked against the arena.
    assert!(worker.checked(63 * PAGE as u64, PAGE as u64).is_some());
    assert!(worker.checked(63 * PAGE as u64, PAGE as u64 + 1).is_none());
    assert!(!worker.read(u64::MAX, &mut back));
}

#[test]
fn an_arena_that_could_change_size_or_is_not_whole_pages_is_refused() {
    let unsealed =
        rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&unsealed, 16 * PAGE as u64).unwrap();
    let e = HostArena::adopt(unsealed.as_fd().try_clone_to_owned().unwrap()).unwrap_err();
    assert!(e.to_string().contains("not sealed"), "{e}");

    let odd =
        rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&odd, 16 * PAGE as u64 + 1).unwrap();
    rustix::fs::fcntl_add_seals(&odd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    let e = HostArena::adopt(odd).unwrap_err();
    assert!(e.to_string().contains("whole pages"), "{e}");

    let file = std::fs::File::open("/proc/self/exe").unwrap();
    let e = HostArena::adopt(file.into()).unwrap_err();
    assert!(e.to_string().contains("not a sealed memfd"), "{e}");
}

#[test]
fn a_full_arena_says_so_and_blocks_come_back() {
    // A page of pin map, then eight pages of blocks.
    let a = HostArena::create(9 * PAGE).unwrap();
    let blocks: Vec<_> = (0..8).map(|_| a.alloc(PAGE).unwrap()).collect();
    assert!(
        a.alloc(1).is_none(),
        "no room: the caller falls back to its heap"
    );
    for (i, &b) in blocks.iter().enumerate().rev() {
        assert!(a.free(b, PAGE), "block {i}");
    }
    assert_eq!(a.in_use(), 0);
    assert!(a.alloc(8 * PAGE).is_some(), "freed neighbours merge");
}
