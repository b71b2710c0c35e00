//! Virtual memory management on the emulated GPU: physical memory that exists apart from any
//! address, address ranges reserved in the session's window, and mappings of the one into the
//! other.
//!
//! A mapping moves the physical memory's words into the device's address map at the mapped
//! address (so copies and kernels see it like any allocation) and unmapping moves them back:
//! the data survives an unmap and a later map elsewhere. One physical allocation is mapped at
//! most once at a time (a second mapping, which would alias it, is refused as not supported),
//! and a mapping covers its whole physical allocation.

use std::collections::{BTreeMap, HashMap};

use super::words::Words;
use crate::capture::PhysicalImage;
use crate::status::*;

/// Granularity of reservations and physical sizes: 2 MiB, as GPUs report it.
pub const GRANULARITY: u64 = 2 << 20;

/// How [`crate::Device::resident`] names unmapped physical memory (it has no address): this bit
/// with the physical id, outside every address window. Eviction takes such contents out of
/// device memory like a range's.
pub const PHYSICAL_KEY: u64 = 1 << 63;

#[derive(Default)]
pub struct Vmm {
    /// Physical memory by id: its size, and its words while unmapped.
    physical: HashMap<u64, Physical>,
    next_physical: u64,
    /// Reserved ranges: start -> size.
    reserved: BTreeMap<u64, u64>,
    /// Mapped ranges: start -> physical id.
    mapped: BTreeMap<u64, u64>,
}

struct Physical {
    size: u64,
    words: Option<Words>,
    mapped_at: Option<u64>,
    released: bool,
}

impl Vmm {
    pub fn create(&mut self, size: u64) -> Result<u64, Status> {
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(INVALID_VALUE);
        }
        let words = Words::zeroed(usize::try_from(size).map_err(|_| OUT_OF_MEMORY)?)
            .ok_or(OUT_OF_MEMORY)?;
        Ok(self.insert(size, words))
    }

    fn insert(&mut self, size: u64, words: Words) -> u64 {
        self.next_physical += 1;
        self.physical.insert(
            self.next_physical,
            Physical {
                size,
                words: Some(words),
                mapped_at: None,
                released: false,
            },
        );
        self.next_physical
    }

    /// Physical memory whose words are `backing`, another process's memory (CUDA IPC).
    pub fn create_shared(&mut self, size: u64, backing: crate::HostSpan) -> Result<u64, Status> {
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(INVALID_VALUE);
        }
        let words = Words::shared(backing, usize::try_from(size).map_err(|_| INVALID_VALUE)?)
            .ok_or(INVALID_VALUE)?;
        Ok(self.insert(size, words))
    }

    /// Moves `id`'s contents into `backing` (mapped or not; its words are then `backing`'s).
    pub fn share(
        &mut self,
        id: u64,
        backing: crate::HostSpan,
        allocations: &mut BTreeMap<u64, Words>,
    ) -> Result<(), Status> {
        let p = self.physical.get_mut(&id).ok_or(INVALID_VALUE)?;
        if p.released {
            return Err(INVALID_VALUE);
        }
        let slot = match p.mapped_at {
            Some(at) => allocations.get_mut(&at),
            None => p.words.as_mut(),
        }
        .ok_or(INVALID_VALUE)?;
        let bytes = slot.bytes().ok_or(INVALID_VALUE)?;
        let len = usize::try_from(p.size).map_err(|_| INVALID_VALUE)?;
        let mut words = Words::shared(backing, len).ok_or(INVALID_VALUE)?;
        words.write_at(0, bytes);
        *slot = words;
        Ok(())
    }

    /// Whether any physical memory, mapped or not, is another process's too.
    pub fn has_shared(&self, allocations: &BTreeMap<u64, Words>) -> bool {
        self.physical.values().any(|p| {
            p.words.as_ref().is_some_and(Words::is_shared)
                || p.mapped_at
                    .and_then(|at| allocations.get(&at))
                    .is_some_and(Words::is_shared)
        })
    }

    pub fn release(&mut self, id: u64) -> Result<(), Status> {
        let p = self.physical.get_mut(&id).ok_or(INVALID_VALUE)?;
        if p.released {
            return Err(INVALID_VALUE);
        }
        p.released = true;
        if p.mapped_at.is_none() {
            self.physical.remove(&id);
        }
        Ok(())
    }

    /// Records a reservation of `size` bytes at `ptr` (the device picks the address).
    pub fn reserve(&mut self, ptr: u64, size: u64) {
        self.reserved.insert(ptr, size);
    }

    pub fn unreserve(&mut self, ptr: u64, size: u64) -> Result<(), Status> {
        if self.reserved.get(&ptr) != Some(&size) {
            return Err(INVALID_VALUE);
        }
        if self.mapped.range(ptr..ptr + size).next().is_some() {
            return Err(INVALID_VALUE);
        }
        self.reserved.remove(&ptr);
        Ok(())
    }

    /// Maps `id` at `ptr`: its words go into `allocations`.
    pub fn map(
        &mut self,
        ptr: u64,
        id: u64,
        allocations: &mut BTreeMap<u64, Words>,
    ) -> Result<(), Status> {
        let p = self.physical.get_mut(&id).ok_or(INVALID_VALUE)?;
        if p.released {
            return Err(INVALID_VALUE);
        }
        if p.mapped_at.is_some() {
            return Err(NOT_SUPPORTED);
        }
        let end = ptr.checked_add(p.size).ok_or(INVALID_VALUE)?;
        let inside = self
            .reserved
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&r, &size)| end <= r + size);
        let overlaps = self
            .mapped
            .range(..end)
            .next_back()
            .is_some_and(|(&m, other)| {
                let other_end = m + self.physical.get(other).map_or(0, |o| o.size);
                other_end > ptr
            });
        if !inside || overlaps || !ptr.is_multiple_of(GRANULARITY) {
            return Err(INVALID_VALUE);
        }
        let p = self.physical.get_mut(&id).ok_or(INVALID_VALUE)?;
        allocations.insert(ptr, p.words.take().ok_or(INVALID_VALUE)?);
        p.mapped_at = Some(ptr);
        self.mapped.insert(ptr, id);
        Ok(())
    }

    /// Unmaps every mapping that starts in `[ptr, ptr+size)`; they must lie wholly inside it.
    pub fn unmap(
        &mut self,
        ptr: u64,
        size: u64,
        allocations: &mut BTreeMap<u64, Words>,
    ) -> Result<(), Status> {
        let end = ptr.checked_add(size).ok_or(INVALID_VALUE)?;
        let starts: Vec<(u64, u64)> = self.mapped.range(ptr..end).map(|(&a, &i)| (a, i)).collect();
        if starts.is_empty() {
            return Err(INVALID_VALUE);
        }
        for &(at, id) in &starts {
            let psize = self.physical.get(&id).map_or(0, |p| p.size);
            if at + psize > end {
                return Err(INVALID_VALUE);
            }
        }
        for (at, id) in starts {
            self.mapped.remove(&at);
            let words = allocations.remove(&at);
            let Some(p) = self.physical.get_mut(&id) else {
                continue;
            };
            p.mapped_at = None;
            p.words = words;
            if p.released {
                self.physical.remove(&id);
            }
        }
        Ok(())
    }

    /// Unmapped physical memory whose contents are on the device: (id, size). Memory another
    /// process shares is not the device's to move and is left out.
    pub fn unmapped(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.physical
            .iter()
            .filter(|(_, p)| p.words.as_ref().is_some_and(|w| !w.is_shared()))
            .map(|(&id, p)| (id, p.size))
    }

    /// Takes unmapped physical memory's contents out (eviction); never memory another process
    /// shares.
    pub fn take_unmapped(&mut self, id: u64) -> Option<Words> {
        let words = &mut self.physical.get_mut(&id)?.words;
        if words.as_ref().is_some_and(Words::is_shared) {
            return None;
        }
        words.take()
    }

    /// Puts evicted unmapped contents back.
    pub fn put_unmapped(&mut self, id: u64, words: Words) -> Result<(), Status> {
        match self.physical.get_mut(&id) {
            Some(p)
                if p.words.is_none() && p.mapped_at.is_none() && words.len() as u64 == p.size =>
            {
                p.words = Some(words);
                Ok(())
            }
            _ => Err(INVALID_VALUE),
        }
    }

    /// The books as a captured image: physical memory (unmapped contents included) and
    /// reservations; mapped contents are captured with the device's allocations.
    pub fn capture(&self) -> (Vec<PhysicalImage>, u64, Vec<(u64, u64)>) {
        let mut physical: Vec<PhysicalImage> = self
            .physical
            .iter()
            .map(|(&id, p)| PhysicalImage {
                id,
                size: p.size,
                mapped_at: p.mapped_at,
                released: p.released,
                contents: p.words.as_ref().map(|w| w.to_vec()).unwrap_or_default(),
            })
            .collect();
        physical.sort_by_key(|p| p.id);
        let reserved = self.reserved.iter().map(|(&a, &s)| (a, s)).collect();
        (physical, self.next_physical, reserved)
    }

    /// Rebuilds captured books (the mapped contents are already in the device's allocations).
    pub fn rebuild(
        &mut self,
        physical: &[PhysicalImage],
        next_physical: u64,
        reserved: &[(u64, u64)],
    ) -> Result<(), Status> {
        for p in physical {
            let words = match p.mapped_at {
                Some(at) => {
                    self.mapped.insert(at, p.id);
                    None
                }
                None => Some(Words::from_bytes(&p.contents).ok_or(OUT_OF_MEMORY)?),
            };
            self.physical.insert(
                p.id,
                Physical {
                    size: p.size,
                    words,
                    mapped_at: p.mapped_at,
                    released: p.released,
                },
            );
        }
        self.next_physical = next_physical;
        self.reserved = reserved.iter().copied().collect();
        Ok(())
    }

    /// Whether `ptr` starts a mapping (such memory is not freed with `cuMemFree`).
    pub fn is_mapped(&self, ptr: u64) -> bool {
        self.mapped.contains_key(&ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_survives_unmap_and_map_elsewhere() {
        let mut v = Vmm::default();
        let mut allocations = BTreeMap::new();
        let base = 0x1000_0000_0000u64;
        v.reserve(base, 4 * GRANULARITY);
        let a = v.create(GRANULARITY).unwrap();
        assert_eq!(v.create(GRANULARITY + 1), Err(INVALID_VALUE));
        v.map(base, a, &mut allocations).unwrap();
        allocations.get_mut(&base).unwrap().bytes_mut().unwrap()[5] = 42;
        assert_eq!(
            v.map(base + GRANULARITY, a, &mut allocations),
            Err(NOT_SUPPORTED)
        );
        assert_eq!(v.unreserve(base, 4 * GRANULARITY), Err(INVALID_VALUE));
        v.unmap(base, 4 * GRANULARITY, &mut allocations).unwrap();
        assert!(allocations.is_empty());
        v.map(base + 2 * GRANULARITY, a, &mut allocations).unwrap();
        assert_eq!(allocations[&(base + 2 * GRANULARITY)].to_vec()[5], 42);
        // Outside the reservation, or overlapping a mapping: refused.
        let b = v.create(2 * GRANULARITY).unwrap();
        assert_eq!(
            v.map(base + 3 * GRANULARITY, b, &mut allocations),
            Err(INVALID_VALUE)
        );
        assert_eq!(
            v.map(base + GRANULARITY, b, &mut allocations),
            Err(INVALID_VALUE)
        );
        v.map(base, b, &mut allocations).unwrap();
        v.release(a).unwrap();
        v.unmap(base + 2 * GRANULARITY, GRANULARITY, &mut allocations)
            .unwrap();
        assert_eq!(
            v.map(base + 2 * GRANULARITY, a, &mut allocations),
            Err(INVALID_VALUE)
        );
    }
}
