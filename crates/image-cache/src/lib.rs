//! A node's cache of module images (fatbins, cubins, PTX), on disk, by content hash, shared
//! by the workers of all the node's sessions: a client names an image by its SHA-256 first,
//! and the bytes travel only when no session of the node has sent them before (within the
//! cache's size). The second process that loads the same libraries sends no image bytes
//! (`docs/module-loading.md`).
//!
//! One file per image, named by the hex of its hash, in one directory:
//! - bounded: after each insertion the oldest entries (by modification time, which a hit
//!   renews: least recently used) are removed until the directory holds at most the limit;
//! - safe against concurrent writers (the workers are separate processes): an entry is
//!   written to a temporary file in the same directory and renamed into place, so a reader
//!   sees a whole entry or none; two writers of the same image write the same bytes;
//! - safe against corrupt entries: every read checks the hash, and an entry whose bytes do
//!   not match is removed and reported as [`Lookup::Corrupt`] (the client is then asked for
//!   the bytes, which replace it).
//!
//! The node chooses the directory and the limit (`gpufuse serve --image-cache`,
//! `--image-cache-size`) and hands them to its workers in [`ENV_DIR`] and [`ENV_LIMIT`].
//! Written here rather than taken from a crate: the disk caches on crates.io (cacache and the
//! like) bring their own index files and async runtimes, while this needs a directory of
//! files named by a hash the caller already computed, which is a hundred lines of `std`.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

/// The cache's directory, set by the node for its workers (`off` or empty: no disk cache).
pub const ENV_DIR: &str = "GPUFUSE_IMAGE_CACHE";
/// The cache's size limit in bytes, set by the node for its workers.
pub const ENV_LIMIT: &str = "GPUFUSE_IMAGE_CACHE_SIZE";
/// The default size limit: 2 GiB (PyTorch's CUDA libraries hold about 330 MiB of images, of
/// which a program uses a part).
pub const DEFAULT_LIMIT: u64 = 2 << 30;

/// Temporary files older than this are a writer that died mid-write: removed at eviction.
const STALE_TEMP: Duration = Duration::from_secs(600);

/// An image's SHA-256.
pub type Hash = [u8; 32];

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    Hit(Vec<u8>),
    Miss,
    /// An entry was there but its bytes did not match its hash: it has been removed.
    Corrupt,
}

/// The cache in one directory.
#[derive(Debug, Clone)]
pub struct ImageCache {
    dir: PathBuf,
    limit: u64,
}

/// The entries of the cache: how many and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub entries: u64,
    pub bytes: u64,
}

impl ImageCache {
    /// The cache in `dir` (made if missing), holding at most `limit` bytes.
    pub fn open(dir: impl Into<PathBuf>, limit: u64) -> io::Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(Self { dir, limit })
    }

    /// The cache the node handed this worker in [`ENV_DIR`] and [`ENV_LIMIT`]; `Ok(None)` when
    /// it handed none (or `off`).
    pub fn from_env() -> io::Result<Option<Self>> {
        let Some(dir) = std::env::var_os(ENV_DIR).filter(|d| !d.is_empty() && d != "off") else {
            return Ok(None);
        };
        let limit = match std::env::var(ENV_LIMIT) {
            Ok(v) => v.trim().parse().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{ENV_LIMIT}={v:?} is not a number of bytes"),
                )
            })?,
            Err(_) => DEFAULT_LIMIT,
        };
        Self::open(dir, limit).map(Some)
    }

    /// The default directory: `$XDG_CACHE_HOME/gpufuse/images`, else
    /// `$HOME/.cache/gpufuse/images`; `None` without either.
    pub fn default_dir() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|d| !d.is_empty())
                    .map(|h| PathBuf::from(h).join(".cache"))
            })?;
        Some(base.join("gpufuse").join("images"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    fn path(&self, hash: &Hash) -> PathBuf {
        self.dir.join(hex(hash))
    }

    /// The image with this hash, checked against it (a mismatching entry is removed).
    pub fn get(&self, hash: &Hash) -> Lookup {
        let path = self.path(hash);
        let Ok(bytes) = fs::read(&path) else {
            return Lookup::Miss;
        };
        if Sha256::digest(&bytes).as_slice() != hash {
            let _ = fs::remove_file(&path);
            return Lookup::Corrupt;
        }
        touch(&path);
        Lookup::Hit(bytes)
    }

    /// Keeps `bytes` (whose hash the caller checked) under `hash`, then trims the cache to its
    /// limit. An image larger than the whole limit is not kept (`Ok(false)`).
    pub fn put(&self, hash: &Hash, bytes: &[u8]) -> io::Result<bool> {
        if bytes.len() as u64 > self.limit {
            return Ok(false);
        }
        let path = self.path(hash);
        if path.exists() {
            touch(&path);
            return Ok(true);
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tmp = self.dir.join(format!(
            ".tmp-{}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            hex(hash)
        ));
        let written = File::options()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|mut f| f.write_all(bytes))
            .and_then(|()| fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        self.trim()?;
        Ok(true)
    }

    /// Removes the least recently used entries until the cache holds at most its limit, and
    /// temporary files a dead writer left behind.
    pub fn trim(&self) -> io::Result<()> {
        let now = SystemTime::now();
        let mut entries = Vec::new();
        let mut total = 0u64;
        for e in fs::read_dir(&self.dir)? {
            let Ok(e) = e else { continue };
            let Ok(meta) = e.metadata() else { continue };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let name = e.file_name();
            let name = name.to_string_lossy();
            if is_entry_name(&name) {
                total += meta.len();
                entries.push((modified, meta.len(), e.path()));
            } else if name.starts_with(".tmp-")
                && now.duration_since(modified).unwrap_or_default() > STALE_TEMP
            {
                let _ = fs::remove_file(e.path());
            }
        }
        if total <= self.limit {
            return Ok(());
        }
        entries.sort_by_key(|(modified, _, _)| *modified);
        for (_, len, path) in entries {
            if total <= self.limit {
                break;
            }
            // Another worker may have removed it already: either way it is gone.
            let _ = fs::remove_file(&path);
            total = total.saturating_sub(len);
        }
        Ok(())
    }

    /// How many entries the cache holds and their bytes.
    pub fn usage(&self) -> Usage {
        let mut u = Usage::default();
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return u;
        };
        for e in dir.flatten() {
            if is_entry_name(&e.file_name().to_string_lossy()) {
                u.entries += 1;
                u.bytes += e.metadata().map_or(0, |m| m.len());
            }
        }
        u
    }
}

/// Marks an entry as used now (its place in the LRU order); a failure only ages it.
fn touch(path: &Path) {
    if let Ok(f) = File::options().write(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

fn is_entry_name(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Lower-case hex of a hash.
pub fn hex(hash: &Hash) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(64);
    for b in hash {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}
