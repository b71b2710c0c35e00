//! Memory pools and stream-ordered allocation (`cuMemAllocAsync`, `cuMemPoolCreate`, graph
//! allocation nodes). Freed pool memory goes back to the device at once (no caching), so a
//! pool's books say reserved equals used.

use crate::error::ClientError;
use crate::graph::{GraphAlloc, Op};
use crate::memory::MemoryKind;
use crate::state::{Inner, PoolStats};
use crate::status::{INVALID_VALUE, OUT_OF_MEMORY};

/// Default pools are `DEFAULT_POOLS + device`; created pools count up from `CREATED_POOLS`.
/// Both are opaque, non-NULL handles.
const DEFAULT_POOLS: u64 = 0x9000_0000;
const CREATED_POOLS: u64 = 0xa000_0000;

/// The default pool of `device` (graph allocation nodes name a device, not a pool).
pub fn default_pool(dev: u32) -> u64 {
    DEFAULT_POOLS + u64::from(dev)
}

impl Inner {
    /// The device `pool` allocates on: a created pool's, or a valid device's default pool.
    pub fn pool_device(&self, pool: u64) -> Result<u32, ClientError> {
        if let Some(stats) = self.pools.get(&pool) {
            return Ok(stats.device);
        }
        let dev = pool
            .checked_sub(DEFAULT_POOLS)
            .filter(|&d| pool < CREATED_POOLS && (d as usize) < self.primary.len())
            .ok_or(ClientError::Cuda(INVALID_VALUE))?;
        Ok(dev as u32)
    }

    /// A pool's books (a default pool's are made on first use).
    pub fn pool_stats(&mut self, pool: u64) -> Result<&mut PoolStats, ClientError> {
        let device = self.pool_device(pool)?;
        Ok(self.pools.entry(pool).or_insert(PoolStats {
            device,
            ..PoolStats::default()
        }))
    }

    /// The pool `cuMemAllocAsync` allocates from on `device`.
    pub fn current_pool(&self, device: u32) -> u64 {
        self.current_pools
            .get(&device)
            .copied()
            .unwrap_or_else(|| default_pool(device))
    }

    /// `cuDeviceSetMemPool`.
    pub fn set_current_pool(&mut self, device: u32, pool: u64) -> Result<(), ClientError> {
        if self.pool_device(pool)? != device {
            return Err(INVALID_VALUE.into());
        }
        self.current_pools.insert(device, pool);
        Ok(())
    }

    /// `cuMemPoolCreate` on `device`, at most `max_size` bytes (0: no limit); `shareable`:
    /// exportable, with this secret (`crate::ipc`).
    pub fn create_pool(&mut self, device: u32, max_size: u64, shareable: Option<[u8; 16]>) -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let h = CREATED_POOLS + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.pools.insert(
            h,
            PoolStats {
                device,
                max_size,
                shareable,
                ..PoolStats::default()
            },
        );
        h
    }

    /// `cuMemPoolDestroy`: allocations still out keep working and are freed as usual; the
    /// device falls back to its default pool if this one was current.
    pub fn destroy_pool(&mut self, h: u64) -> Result<(), ClientError> {
        if h < CREATED_POOLS || !self.pools.contains_key(&h) {
            return Err(INVALID_VALUE.into());
        }
        self.pools.remove(&h);
        self.current_pools.retain(|_, &mut p| p != h);
        Ok(())
    }

    /// Allocates `size` bytes from `pool` and charges the pool.
    fn alloc_from_pool(&mut self, size: u64, pool: u64) -> Result<u64, ClientError> {
        let device = self.pool_device(pool)?;
        let (_, current) = self.current()?;
        if device != current {
            return Err(INVALID_VALUE.into());
        }
        let stats = self.pool_stats(pool)?;
        if stats.imported {
            // An imported pool gives out its exporter's pointers only.
            return Err(INVALID_VALUE.into());
        }
        if stats.max_size != 0 && stats.used.saturating_add(size) > stats.max_size {
            return Err(OUT_OF_MEMORY.into());
        }
        let p = self.alloc(size)?;
        if let Some(a) = self.allocations.get_mut(&p) {
            a.kind = MemoryKind::Pooled { pool };
            let size = a.size;
            let stats = self.pool_stats(pool)?;
            stats.used += size;
            stats.high = stats.high.max(stats.used);
            stats.reserved_high = stats.reserved_high.max(stats.used);
        }
        Ok(p)
    }

    /// `cuMemAllocAsync` on stream `st`: at once, or, under stream capture, as a graph
    /// allocation node whose address is fixed now (its memory is reserved until the graph
    /// goes).
    pub fn alloc_async(&mut self, size: u64, pool: u64, st: u64) -> Result<u64, ClientError> {
        let p = self.alloc_from_pool(size, pool)?;
        if self.graphs.capturing(st).is_some() {
            self.graph_allocation(p, size);
            self.graphs.record(st, Op::MemAlloc { ptr: p, size });
        }
        Ok(p)
    }

    /// `cuMemFreeAsync`: a graph allocation's free is recorded or ends its life; anything
    /// else is freed.
    pub fn free_async(&mut self, ptr: u64, st: u64) -> Result<(), ClientError> {
        if self.graphs.capturing(st).is_some() {
            // A free node: only of a graph allocation.
            if !self.graphs.allocations.contains_key(&ptr) {
                return Err(INVALID_VALUE.into());
            }
            self.graphs.record(st, Op::MemFree { ptr });
            return Ok(());
        }
        if let Some(a) = self.graphs.allocations.get_mut(&ptr) {
            // A graph allocation freed outside the graph: its life ends, the memory stays
            // reserved for the graph's next launch.
            if !a.live {
                return Err(INVALID_VALUE.into());
            }
            a.live = false;
            return Ok(());
        }
        self.free(ptr)
    }

    /// Marks `ptr` (just allocated) as a graph allocation held by the graph being built.
    pub fn graph_allocation(&mut self, ptr: u64, size: u64) {
        self.graphs.allocations.insert(
            ptr,
            GraphAlloc {
                size,
                refs: 1,
                live: false,
            },
        );
    }

    /// A graph allocation node for `size` bytes in `pool`: the address.
    pub fn graph_alloc_node(&mut self, size: u64, pool: u64) -> Result<u64, ClientError> {
        let p = self.alloc_from_pool(size, pool)?;
        self.graph_allocation(p, size);
        Ok(p)
    }
}
