//! Virtual memory management (`cuMemCreate`, `cuMemAddressReserve`, `cuMemMap`): physical
//! memory is charged when created; a mapping covers one whole physical allocation and is kept
//! among the allocations as [`MemoryKind::Mapped`](crate::memory::MemoryKind::Mapped).

use gpufuse_proto::{ReplyBody, Request};

use crate::error::ClientError;
use crate::handles::{self, Kind};
use crate::state::Inner;
use crate::status::{INVALID_VALUE, NOT_SUPPORTED, UNKNOWN};
use gpufuse_proto::{DevicePtr, PhysicalHandle};

impl Inner {
    /// `cuMemCreate`: physical memory of `size` bytes on `device`; its handle.
    pub fn create_physical(&mut self, device: u32, size: u64) -> Result<u64, ClientError> {
        self.create_physical_with(device, size, false)
    }

    /// `cuMemCreate` of compressible memory (`CU_MEM_ALLOCATION_COMP_GENERIC`) when
    /// `compressible`, which the caller grants only where the device reports
    /// `CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED` (107), as NVIDIA's driver falls back
    /// to uncompressed memory elsewhere; [`Inner::physical_compressible`] says which it got.
    /// Compression changes a GPU's bandwidth, never the contents: the memory is the same.
    pub fn create_physical_with(
        &mut self,
        device: u32,
        size: u64,
        compressible: bool,
    ) -> Result<u64, ClientError> {
        let h = handles::mint(Kind::Physical);
        self.conn.call(&Request::MemCreate {
            handle: PhysicalHandle(h),
            device,
            size,
        })?;
        self.physical.insert(h, (size, device, compressible));
        Ok(h)
    }

    /// `cuMemRetainAllocationHandle`: one more reference to physical memory `handle`, which
    /// one more `cuMemRelease` gives back (NCCL retains the handle of memory it maps and
    /// releases both references).
    pub fn retain_physical(&mut self, handle: u64) -> Result<(), ClientError> {
        if !self.physical.contains_key(&handle) {
            return Err(INVALID_VALUE.into());
        }
        *self.physical_retains.entry(handle).or_insert(0) += 1;
        Ok(())
    }

    /// `cuMemRelease`: drops one reference; the last releases the memory.
    pub fn release_physical(&mut self, handle: u64) -> Result<(), ClientError> {
        if let Some(n) = self.physical_retains.get_mut(&handle) {
            *n -= 1;
            if *n == 0 {
                self.physical_retains.remove(&handle);
            }
            return Ok(());
        }
        self.physical.remove(&handle).ok_or(INVALID_VALUE)?;
        self.conn.quiet(&Request::MemRelease {
            handle: PhysicalHandle(handle),
        })
    }

    /// `cuMemAddressReserve`: the reserved range's start.
    pub fn reserve_address(&mut self, size: u64, align: u64) -> Result<u64, ClientError> {
        match self
            .conn
            .call(&Request::MemAddressReserve { size, align })?
        {
            ReplyBody::Ptr(DevicePtr(p)) => Ok(p),
            _ => Err(UNKNOWN.into()),
        }
    }

    /// `cuMemAddressFree`.
    pub fn free_address(&mut self, ptr: u64, size: u64) -> Result<(), ClientError> {
        self.conn.quiet(&Request::MemAddressFree {
            ptr: DevicePtr(ptr),
            size,
        })
    }

    /// `cuMemMap` of all of physical memory `handle` at `ptr` (`size` must be all of it, at
    /// offset 0).
    pub fn map(
        &mut self,
        ptr: u64,
        size: u64,
        offset: u64,
        handle: u64,
    ) -> Result<(), ClientError> {
        let &(psize, device, _) = self.physical.get(&handle).ok_or(INVALID_VALUE)?;
        if offset != 0 || size != psize {
            return Err(NOT_SUPPORTED.into());
        }
        self.conn.call(&Request::MemMap {
            ptr: DevicePtr(ptr),
            size: psize,
            handle: PhysicalHandle(handle),
        })?;
        self.note_mapping(ptr, psize, device);
        self.mappings.insert(ptr, handle);
        Ok(())
    }

    /// `cuMemUnmap` of every mapping in `[ptr, ptr+size)`.
    pub fn unmap(&mut self, ptr: u64, size: u64) -> Result<(), ClientError> {
        let end = ptr.checked_add(size).ok_or(INVALID_VALUE)?;
        let inside: Vec<u64> = self
            .allocations
            .range(ptr..end)
            .filter(|(_, a)| a.is_mapped())
            .map(|(&p, _)| p)
            .collect();
        if inside.is_empty() {
            return Err(INVALID_VALUE.into());
        }
        // Quiet, as the protocol declares it (and as MemRelease and MemAddressFree are): the
        // range was checked here; a worker-side failure comes back as a deferred error.
        self.conn.quiet(&Request::MemUnmap {
            ptr: DevicePtr(ptr),
            size,
        })?;
        for p in inside {
            self.forget_mapping(p);
            self.mappings.remove(&p);
        }
        Ok(())
    }

    /// Physical memory `handle`: (size, device).
    pub fn physical(&self, handle: u64) -> Option<(u64, u32)> {
        self.physical
            .get(&handle)
            .map(|&(size, device, _)| (size, device))
    }

    /// Whether physical memory `handle` is compressible (`cuMemGetAllocationPropertiesFromHandle`
    /// reports `CU_MEM_ALLOCATION_COMP_GENERIC`); None for an unknown handle.
    pub fn physical_compressible(&self, handle: u64) -> Option<bool> {
        self.physical.get(&handle).map(|&(_, _, c)| c)
    }

    /// The physical memory mapped at `ptr` (a mapping's start).
    pub fn mapping_handle(&self, ptr: u64) -> Option<u64> {
        self.mappings.get(&ptr).copied()
    }

    /// Whether every byte of `[ptr, ptr+size)` lies in mapped memory.
    pub fn all_mapped(&self, ptr: u64, size: u64) -> Result<(), ClientError> {
        let mut at = ptr;
        let end = ptr.checked_add(size).ok_or(INVALID_VALUE)?;
        while at < end {
            match self.find_allocation(at, 1) {
                Some((base, a)) if a.is_mapped() => at = base + a.size,
                _ => return Err(INVALID_VALUE.into()),
            }
        }
        Ok(())
    }
}
