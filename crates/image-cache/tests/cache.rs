//! The image cache on a real directory: hits, corrupt entries, LRU eviction under the limit,
//! concurrent writers.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use gpufuse_image_cache::{hex, Hash, ImageCache, Lookup};
use sha2::{Digest, Sha256};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpufuse-image-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn image(seed: u8, len: usize) -> (Hash, Vec<u8>) {
    let bytes: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
    (Sha256::digest(&bytes).into(), bytes)
}

/// Sets an entry's modification time `secs_ago` seconds back (its place in the LRU order).
fn age(cache: &ImageCache, hash: &Hash, secs_ago: u64) {
    let f = std::fs::File::options()
        .write(true)
        .open(cache.dir().join(hex(hash)))
        .unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(secs_ago))
        .unwrap();
}

#[test]
fn an_image_put_is_found_by_its_hash_and_only_by_it() {
    let d = dir("hit");
    let cache = ImageCache::open(&d, 1 << 20).unwrap();
    let (h, bytes) = image(1, 1000);
    let (other, _) = image(2, 1000);
    assert_eq!(cache.get(&h), Lookup::Miss);
    assert!(cache.put(&h, &bytes).unwrap());
    assert_eq!(cache.get(&h), Lookup::Hit(bytes.clone()));
    assert_eq!(cache.get(&other), Lookup::Miss);
    // A second cache on the same directory (another worker) sees it.
    let again = ImageCache::open(&d, 1 << 20).unwrap();
    assert_eq!(again.get(&h), Lookup::Hit(bytes));
    assert_eq!(cache.usage().entries, 1);
    assert_eq!(cache.usage().bytes, 1000);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_corrupt_entry_is_removed_and_replaced_by_the_next_put() {
    let d = dir("corrupt");
    let cache = ImageCache::open(&d, 1 << 20).unwrap();
    let (h, bytes) = image(3, 4096);
    cache.put(&h, &bytes).unwrap();
    let path = d.join(hex(&h));
    let mut damaged = bytes.clone();
    damaged[100] ^= 0xff;
    std::fs::write(&path, &damaged).unwrap();
    assert_eq!(cache.get(&h), Lookup::Corrupt);
    assert!(!path.exists(), "the corrupt entry is dropped");
    assert_eq!(cache.get(&h), Lookup::Miss);
    // A truncated entry is corrupt too.
    cache.put(&h, &bytes).unwrap();
    std::fs::write(&path, &bytes[..10]).unwrap();
    assert_eq!(cache.get(&h), Lookup::Corrupt);
    cache.put(&h, &bytes).unwrap();
    assert_eq!(cache.get(&h), Lookup::Hit(bytes));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_least_recently_used_entries_go_when_the_limit_is_passed() {
    let d = dir("lru");
    let cache = ImageCache::open(&d, 3000).unwrap();
    let a = image(10, 1000);
    let b = image(11, 1000);
    let c = image(12, 1000);
    cache.put(&a.0, &a.1).unwrap();
    cache.put(&b.0, &b.1).unwrap();
    cache.put(&c.0, &c.1).unwrap();
    age(&cache, &a.0, 300);
    age(&cache, &b.0, 200);
    age(&cache, &c.0, 100);
    // Using `a` makes it the most recent: `b` is now the oldest.
    assert!(matches!(cache.get(&a.0), Lookup::Hit(_)));
    let d4 = image(13, 1000);
    cache.put(&d4.0, &d4.1).unwrap();
    assert_eq!(
        cache.get(&b.0),
        Lookup::Miss,
        "the least recently used went"
    );
    for (h, _) in [&a, &c, &d4] {
        assert!(matches!(cache.get(h), Lookup::Hit(_)));
    }
    assert!(cache.usage().bytes <= 3000);
    // An image larger than the whole cache is not kept, and evicts nothing.
    let big = image(14, 5000);
    assert!(!cache.put(&big.0, &big.1).unwrap());
    assert_eq!(cache.usage().entries, 3);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn concurrent_writers_leave_whole_entries() {
    let d = dir("concurrent");
    let cache = ImageCache::open(&d, 64 << 20).unwrap();
    let images: Vec<(Hash, Vec<u8>)> = (0..4).map(|i| image(i, 1 << 20)).collect();
    std::thread::scope(|s| {
        for _ in 0..4 {
            let cache = cache.clone();
            let images = &images;
            s.spawn(move || {
                for (h, bytes) in images {
                    cache.put(h, bytes).unwrap();
                    match cache.get(h) {
                        Lookup::Hit(got) => assert_eq!(&got, bytes),
                        other => panic!("a reader saw {other:?}"),
                    }
                }
            });
        }
    });
    assert_eq!(cache.usage().entries, 4);
    let leftovers: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary file stays");
    std::fs::remove_dir_all(&d).unwrap();
}
