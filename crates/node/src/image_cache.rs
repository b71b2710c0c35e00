//! The node's image cache (`gpufuse serve --image-cache DIR --image-cache-size SIZE`): a
//! directory of module images by content hash (`gpufuse_image_cache`) that every worker of
//! the node reads and writes, so a second process loading the same libraries sends only
//! their hashes. The node hands the directory and limit to each worker in its environment and
//! adds up what the workers report (images received, cache hits, corrupt entries) for
//! `gpufuse status` and `/metrics`.

use std::process::Command;

use gpufuse_image_cache::{ImageCache, ENV_DIR, ENV_LIMIT};
use gpufuse_proto::{ImageCacheStatus, ImageCounts};

/// The cache and the workers' reports since the node started.
#[derive(Debug, Default, Clone)]
pub struct ImageCacheBooks {
    pub cache: Option<ImageCache>,
    pub counts: ImageCounts,
}

impl ImageCacheBooks {
    pub fn new(cache: Option<ImageCache>) -> Self {
        Self {
            cache,
            counts: ImageCounts::default(),
        }
    }

    /// Adds a worker's report.
    pub fn record(&mut self, c: ImageCounts) {
        let t = &mut self.counts;
        t.received += c.received;
        t.received_bytes += c.received_bytes;
        t.hits += c.hits;
        t.hit_bytes += c.hit_bytes;
        t.corrupt += c.corrupt;
    }

    /// The cache as `gpufuse status` shows it (its size read from the directory now: not
    /// under the node's lock, where a copy of the books is read instead).
    pub fn status(&self) -> ImageCacheStatus {
        let usage = self.cache.as_ref().map(|c| c.usage()).unwrap_or_default();
        ImageCacheStatus {
            entries: usage.entries,
            bytes: usage.bytes,
            ..self.counted()
        }
    }

    /// The directory, limit and the workers' counts, without reading the directory (`entries`
    /// and `bytes` are 0).
    pub fn counted(&self) -> ImageCacheStatus {
        ImageCacheStatus {
            dir: self.cache.as_ref().map(|c| c.dir().display().to_string()),
            limit_bytes: self.cache.as_ref().map_or(0, |c| c.limit()),
            entries: 0,
            bytes: 0,
            counts: self.counts,
        }
    }
}

/// Hands the cache to a worker about to start (or tells it there is none, whatever the node's
/// own environment says).
pub fn configure_worker(cmd: &mut Command, cache: Option<&ImageCache>) {
    match cache {
        Some(c) => {
            cmd.env(ENV_DIR, c.dir())
                .env(ENV_LIMIT, c.limit().to_string());
        }
        None => {
            cmd.env(ENV_DIR, "off");
        }
    }
}

/// `--image-cache-size`: `2GiB`, `512MiB`, `1000000` (powers of 1024).
pub fn parse_limit(s: &str) -> Result<u64, String> {
    crate::devices::parse_size(s).ok_or_else(|| format!("{s:?} is not a size such as 2GiB"))
}

/// The cache `gpufuse serve` opens: `dir` (`off`: none), else the default directory
/// ([`ImageCache::default_dir`]: `$XDG_CACHE_HOME/gpufuse/images`, else
/// `$HOME/.cache/gpufuse/images`; none without either), holding at most `limit` bytes.
pub fn open(dir: Option<&std::path::Path>, limit: u64) -> std::io::Result<Option<ImageCache>> {
    let dir = match dir {
        Some(d) if d.as_os_str() == "off" => return Ok(None),
        Some(d) => d.to_path_buf(),
        None => match ImageCache::default_dir() {
            Some(d) => d,
            None => return Ok(None),
        },
    };
    ImageCache::open(dir, limit).map(Some)
}
