//! `cuMemHostRegister`ed memory on the shared-memory transport, through the client core against
//! a real worker: its whole pages move into the host arena in place, copies of it both ways
//! (synchronous and asynchronous) carry no bytes through the rings, the partial pages at its
//! ends still arrive, and unregistering gives the application private memory with its bytes.

mod common;

use gpufuse_client::state::{Session, SessionConfig};
use gpufuse_client::ClientError;

const HOST_MEMORY_ALREADY_REGISTERED: i32 = 712;
const PAGE: usize = 4096;

/// A node on a fresh unix socket (so sessions move to the shared-memory rings), its workers
/// all with the same address window (a session reconnected to another node finds its
/// addresses free).
fn node() -> gpufuse_transport::Address {
    common::Node::start().address
}

/// A session at `address`, device 0's primary context current.
fn connect(address: &gpufuse_transport::Address) -> Session {
    let s = Session::connect(&SessionConfig {
        address: address.clone(),
        token: String::new(),
        resources: Default::default(),
    })
    .unwrap();
    let ctx = s.lock().retain_primary(0).unwrap();
    s.lock().set_current(ctx).unwrap();
    s
}

/// A session on a node of its own.
fn session() -> Session {
    connect(&node())
}

fn status<T>(r: Result<T, ClientError>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.status(),
    }
}

/// Bytes through the rings so far, both ways together.
fn ring_bytes(s: &Session) -> u64 {
    let (sent, received) = s
        .lock()
        .ring_bytes()
        .unwrap()
        .expect("a unix-socket session moves to the shared-memory rings");
    sent + received
}

/// What `/proc/self/maps` says is mapped at `p`.
fn mapping_at(p: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let (range, _) = line.split_once(' ').unwrap();
        let (lo, hi) = range.split_once('-').unwrap();
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).unwrap(),
            usize::from_str_radix(hi, 16).unwrap(),
        );
        if (lo..hi).contains(&p) {
            return line.to_string();
        }
    }
    panic!("nothing mapped at {p:#x}");
}

/// A private anonymous mapping of `len` bytes, as a large `malloc` gets.
fn anonymous(len: usize, prot: i32) -> usize {
    // SAFETY: a new mapping the kernel places.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p as usize
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ seed.wrapping_mul(31))
        .collect()
}

#[test]
fn registered_memory_is_copied_through_the_arena_without_ring_bytes() {
    let s = session();
    const SIZE: usize = 4 << 20;
    let map = anonymous(SIZE + 2 * PAGE, libc::PROT_READ | libc::PROT_WRITE);
    // Registered from 16 bytes into a page, as malloc's large blocks start: the first and
    // last partial pages stay the application's own.
    let p = map + 16;
    // SAFETY: `SIZE` bytes inside the mapping above, which lives until the end of the test.
    let buf = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, SIZE) };
    buf.copy_from_slice(&pattern(1, SIZE));
    s.lock().host_register(p, SIZE, 0).unwrap();
    let interior = map + PAGE;
    assert!(
        mapping_at(interior).contains("gpufuse-pinned"),
        "the registration's whole pages are the arena's: {}",
        mapping_at(interior)
    );
    assert!(
        !mapping_at(p).contains("gpufuse-pinned"),
        "the partial page is not"
    );
    assert_eq!(buf, &pattern(1, SIZE)[..], "registering keeps the bytes");
    let dev = s.lock().alloc(SIZE as u64).unwrap();

    // Both ways, synchronous: only the partial pages' bytes and the frames cross the rings.
    let before = ring_bytes(&s);
    s.lock().copy_to_device(dev, buf, 0).unwrap();
    buf.fill(0);
    s.lock().copy_from_device(buf, dev, 0).unwrap();
    let moved = ring_bytes(&s) - before;
    assert_eq!(buf, &pattern(1, SIZE)[..], "the bytes came back");
    assert!(
        moved < 4 * PAGE as u64,
        "{moved} bytes crossed the rings for two copies of {SIZE}"
    );

    // Both ways, asynchronous on a stream, then a synchronize.
    let st = s.lock().create_stream(0, 0).unwrap();
    buf.copy_from_slice(&pattern(2, SIZE));
    let before = ring_bytes(&s);
    s.lock().copy_to_device_async(dev, buf, st).unwrap();
    s.lock().synchronize_stream(st).unwrap();
    buf.fill(0);
    // SAFETY: `buf` lives until after the synchronize below.
    unsafe {
        s.lock()
            .copy_from_device_async(buf.as_mut_ptr(), dev, SIZE, st)
    }
    .unwrap();
    s.lock().synchronize_stream(st).unwrap();
    let moved = ring_bytes(&s) - before;
    assert_eq!(buf, &pattern(2, SIZE)[..], "the asynchronous copies' bytes");
    assert!(moved < 4 * PAGE as u64, "{moved} bytes crossed the rings");

    // A part of the registration, inside its whole pages.
    let mut part = vec![0u8; 3 * PAGE];
    s.lock()
        .copy_from_device(&mut part, dev + 2 * PAGE as u64, 0)
        .unwrap();
    assert_eq!(part, pattern(2, SIZE)[2 * PAGE..5 * PAGE]);

    // Overlapping registrations are refused, as the driver does.
    assert_eq!(
        status(s.lock().host_register(p + 8 * PAGE, PAGE, 0)),
        HOST_MEMORY_ALREADY_REGISTERED
    );
    assert_eq!(
        status(s.lock().host_register(map, 2 * PAGE, 0)),
        HOST_MEMORY_ALREADY_REGISTERED
    );

    // Unregistered: private memory again, bytes kept, and copies carry the bytes.
    s.lock().host_unregister(p).unwrap();
    assert!(!mapping_at(interior).contains("gpufuse-pinned"));
    assert_eq!(buf, &pattern(2, SIZE)[..], "unregistering keeps the bytes");
    buf.copy_from_slice(&pattern(3, SIZE));
    let before = ring_bytes(&s);
    s.lock().copy_to_device(dev, buf, 0).unwrap();
    assert!(
        ring_bytes(&s) - before >= SIZE as u64,
        "pageable bytes cross the rings"
    );
    let mut back = vec![0u8; SIZE];
    s.lock().copy_from_device(&mut back, dev, 0).unwrap();
    assert_eq!(back, pattern(3, SIZE));
    drop(s);
    // SAFETY: the mapping above, no longer used.
    unsafe { libc::munmap(map as *mut libc::c_void, SIZE + 2 * PAGE) };
}

#[test]
fn memory_that_cannot_move_is_registered_and_copied_through_the_rings() {
    let s = session();
    const SIZE: usize = 64 * PAGE;
    // Read-only memory (a READ_ONLY registration of constant data) keeps its pages.
    let map = anonymous(SIZE, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: the mapping above, `SIZE` bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(map as *mut u8, SIZE) };
    buf.copy_from_slice(&pattern(4, SIZE));
    // SAFETY: the mapping above, made read-only; `buf` is only read from now on.
    let protected = unsafe { libc::mprotect(map as *mut libc::c_void, SIZE, libc::PROT_READ) };
    assert_eq!(protected, 0);
    const READ_ONLY: u32 = 0x08;
    s.lock().host_register(map, SIZE, READ_ONLY).unwrap();
    assert!(!mapping_at(map).contains("gpufuse-pinned"));
    let dev = s.lock().alloc(SIZE as u64).unwrap();
    let before = ring_bytes(&s);
    s.lock().copy_to_device(dev, buf, 0).unwrap();
    assert!(ring_bytes(&s) - before >= SIZE as u64);
    let mut back = vec![0u8; SIZE];
    s.lock().copy_from_device(&mut back, dev, 0).unwrap();
    assert_eq!(back, pattern(4, SIZE));
    s.lock().host_unregister(map).unwrap();

    // The session's state going away gives a moved registration's pages back, bytes kept.
    let rw = anonymous(SIZE, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: the mapping above, `SIZE` bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(rw as *mut u8, SIZE) };
    buf.copy_from_slice(&pattern(5, SIZE));
    s.lock().host_register(rw, SIZE, 0).unwrap();
    assert!(mapping_at(rw).contains("gpufuse-pinned"));
    drop(s);
    assert!(!mapping_at(rw).contains("gpufuse-pinned"));
    assert_eq!(buf, &pattern(5, SIZE)[..]);
    // SAFETY: the mappings above, no longer used.
    unsafe {
        libc::munmap(map as *mut libc::c_void, SIZE);
        libc::munmap(rw as *mut libc::c_void, SIZE);
    }
}

#[test]
fn a_registration_outlives_a_reconnect_and_its_copies_then_carry_bytes() {
    let s = session();
    const SIZE: usize = 64 * PAGE;
    let map = anonymous(SIZE, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: the mapping above, `SIZE` bytes, alive until the end of the test.
    let buf = unsafe { std::slice::from_raw_parts_mut(map as *mut u8, SIZE) };
    buf.copy_from_slice(&pattern(6, SIZE));
    s.lock().host_register(map, SIZE, 0).unwrap();
    let dev = s.lock().alloc(SIZE as u64).unwrap();
    s.lock().copy_to_device(dev, buf, 0).unwrap();
    // Another worker, with a new host arena: the alias's arena stays mapped (the application's
    // pointers still reach it), and copies of it now travel through the rings.
    s.reconnect(&node()).unwrap();
    assert!(mapping_at(map).contains("gpufuse-pinned"));
    let mut back = vec![0u8; SIZE];
    s.lock().copy_from_device(&mut back, dev, 0).unwrap();
    assert_eq!(
        back,
        pattern(6, SIZE),
        "the device memory moved with the session"
    );
    buf.copy_from_slice(&pattern(7, SIZE));
    let before = ring_bytes(&s);
    s.lock().copy_to_device(dev, buf, 0).unwrap();
    buf.fill(0);
    s.lock().copy_from_device(buf, dev, 0).unwrap();
    assert!(
        ring_bytes(&s) - before >= 2 * SIZE as u64,
        "an arena the worker does not map: the bytes travel"
    );
    assert_eq!(buf, &pattern(7, SIZE)[..]);
    s.lock().host_unregister(map).unwrap();
    assert!(!mapping_at(map).contains("gpufuse-pinned"));
    assert_eq!(buf, &pattern(7, SIZE)[..]);
    drop(s);
    // SAFETY: the mapping above, no longer used.
    unsafe { libc::munmap(map as *mut libc::c_void, SIZE) };
}
