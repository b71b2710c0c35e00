//! Simulated device memory (the virtual memory management API: reservations, physical
//! allocations, mappings, access) and the registry of page-locked host ranges.

use std::collections::{BTreeMap, HashMap};

use gpufuse_cuda_types::{short as E, CUresult};

use crate::tables::GRANULARITY;

/// Where reservations go when the caller gives no usable hint, and where they must end.
const VA_BASE: u64 = 0x7f00_0000_0000;
const VA_END: u64 = 0x8000_0000_0000;
/// The least address a hint may name.
const VA_MIN: u64 = 0x1_0000_0000;

/// A physical allocation (`cuMemCreate`): zeroed host memory, allocated lazily by the system.
struct Phys {
    data: Vec<u8>,
    device: usize,
    /// Mappings of it.
    mapped: u32,
    /// `cuMemRelease` was called: freed when the last mapping goes.
    released: bool,
}

/// `[va, va + size)` mapped to `[offset, offset + size)` of physical allocation `phys`.
struct Mapping {
    size: u64,
    phys: u64,
    offset: u64,
    /// `cuMemSetAccess` gave read/write access.
    access: bool,
}

/// One piece of a device range: `len` bytes at `offset` of physical allocation `phys`.
#[derive(Clone, Copy, Debug)]
struct Seg {
    phys: u64,
    offset: usize,
    len: usize,
}

#[derive(Default)]
pub(crate) struct Memory {
    reservations: BTreeMap<u64, u64>,
    phys: HashMap<u64, Phys>,
    next_phys: u64,
    mappings: BTreeMap<u64, Mapping>,
    /// Bytes of physical memory in use, per device.
    used: Vec<u64>,
    /// Page-locked host ranges: start address -> length.
    host: BTreeMap<usize, usize>,
}

/// `len` (> 0) zero bytes from the allocator's zeroed memory: for large sizes, pages the
/// system maps only when they are first written.
fn zeroed(len: usize) -> Option<Vec<u8>> {
    let layout = std::alloc::Layout::array::<u8>(len).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the layout's size is not zero.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` comes from the global allocator with this layout (`len` bytes, alignment
    // 1), all `len` bytes initialized (zero); the vector owns it from here.
    Some(unsafe { Vec::from_raw_parts(p, len, len) })
}

/// Bytes a zero fill compares before writing: zero pages never written stay unmapped.
const PAGE: usize = 4096;

fn aligned(v: u64, a: u64) -> bool {
    v.is_multiple_of(a)
}

impl Memory {
    pub fn new(devices: usize) -> Self {
        Memory {
            used: vec![0; devices],
            next_phys: 1,
            ..Default::default()
        }
    }

    fn overlaps_reservation(&self, start: u64, size: u64) -> bool {
        let end = start + size;
        self.reservations
            .range(..end)
            .next_back()
            .is_some_and(|(&s, &sz)| s + sz > start)
    }

    /// `cuMemAddressReserve`: at `hint` if it is aligned and free, else the lowest free range.
    pub fn reserve(&mut self, size: u64, align: u64, hint: u64) -> Result<u64, CUresult> {
        if size == 0 || !aligned(size, GRANULARITY) {
            return Err(E::INVALID_VALUE);
        }
        if align != 0 && !align.is_power_of_two() {
            return Err(E::INVALID_VALUE);
        }
        let align = align.max(GRANULARITY);
        if hint != 0
            && aligned(hint, align)
            && hint >= VA_MIN
            && hint.checked_add(size).is_some_and(|e| e <= VA_END)
            && !self.overlaps_reservation(hint, size)
        {
            self.reservations.insert(hint, size);
            return Ok(hint);
        }
        let mut at = VA_BASE.next_multiple_of(align);
        for (&s, &sz) in &self.reservations {
            if s + sz <= at {
                continue;
            }
            if at + size <= s {
                break;
            }
            at = (s + sz).next_multiple_of(align);
        }
        if at.checked_add(size).is_none_or(|e| e > VA_END) {
            return Err(E::OUT_OF_MEMORY);
        }
        self.reservations.insert(at, size);
        Ok(at)
    }

    /// `cuMemAddressFree`: exactly a reservation, with nothing mapped in it.
    pub fn free_reservation(&mut self, va: u64, size: u64) -> Result<(), CUresult> {
        if self.reservations.get(&va) != Some(&size) {
            return Err(E::INVALID_VALUE);
        }
        if self.mappings.range(va..va + size).next().is_some() {
            return Err(E::INVALID_VALUE);
        }
        self.reservations.remove(&va);
        Ok(())
    }

    /// `cuMemCreate`: `size` bytes on `device`, refused past `total`.
    pub fn create(&mut self, device: usize, size: u64, total: u64) -> Result<u64, CUresult> {
        if size == 0 || !aligned(size, GRANULARITY) {
            return Err(E::INVALID_VALUE);
        }
        let used = self.used[device];
        if used.checked_add(size).is_none_or(|u| u > total) {
            return Err(E::OUT_OF_MEMORY);
        }
        let len = usize::try_from(size).map_err(|_| E::OUT_OF_MEMORY)?;
        let data = zeroed(len).ok_or(E::OUT_OF_MEMORY)?;
        self.used[device] += size;
        let h = self.next_phys;
        self.next_phys += 1;
        self.phys.insert(
            h,
            Phys {
                data,
                device,
                mapped: 0,
                released: false,
            },
        );
        Ok(h)
    }

    fn drop_if_unused(&mut self, h: u64) {
        if self
            .phys
            .get(&h)
            .is_some_and(|p| p.released && p.mapped == 0)
        {
            if let Some(p) = self.phys.remove(&h) {
                self.used[p.device] -= p.data.len() as u64;
            }
        }
    }

    /// `cuMemRelease`: the memory goes when its last mapping does.
    pub fn release(&mut self, h: u64) -> Result<(), CUresult> {
        match self.phys.get_mut(&h) {
            Some(p) if !p.released => p.released = true,
            _ => return Err(E::INVALID_VALUE),
        }
        self.drop_if_unused(h);
        Ok(())
    }

    /// `cuMemMap`: inside one reservation, over nothing mapped.
    pub fn map(&mut self, va: u64, size: u64, offset: u64, h: u64) -> Result<(), CUresult> {
        if size == 0 || !aligned(va, GRANULARITY) || !aligned(size, GRANULARITY) {
            return Err(E::INVALID_VALUE);
        }
        if !aligned(offset, GRANULARITY) {
            return Err(E::INVALID_VALUE);
        }
        let end = va.checked_add(size).ok_or(E::INVALID_VALUE)?;
        let in_reservation = self
            .reservations
            .range(..=va)
            .next_back()
            .is_some_and(|(&s, &sz)| end <= s + sz);
        if !in_reservation {
            return Err(E::INVALID_VALUE);
        }
        let p = self
            .phys
            .get(&h)
            .filter(|p| !p.released)
            .ok_or(E::INVALID_VALUE)?;
        if offset
            .checked_add(size)
            .is_none_or(|e| e > p.data.len() as u64)
        {
            return Err(E::INVALID_VALUE);
        }
        let overlaps = self
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&s, m)| s + m.size > va);
        if overlaps {
            return Err(E::INVALID_VALUE);
        }
        if let Some(p) = self.phys.get_mut(&h) {
            p.mapped += 1;
        }
        self.mappings.insert(
            va,
            Mapping {
                size,
                phys: h,
                offset,
                access: false,
            },
        );
        Ok(())
    }

    /// `cuMemUnmap`: whole mappings only, at least one.
    pub fn unmap(&mut self, va: u64, size: u64) -> Result<(), CUresult> {
        let end = va.checked_add(size).ok_or(E::INVALID_VALUE)?;
        if size == 0 {
            return Err(E::INVALID_VALUE);
        }
        let starts_inside = self
            .mappings
            .range(..va)
            .next_back()
            .is_some_and(|(&s, m)| s + m.size > va);
        let inside: Vec<u64> = self.mappings.range(va..end).map(|(&s, _)| s).collect();
        let ends_inside = inside
            .last()
            .is_some_and(|s| s + self.mappings[s].size > end);
        if starts_inside || ends_inside || inside.is_empty() {
            return Err(E::INVALID_VALUE);
        }
        for s in inside {
            if let Some(m) = self.mappings.remove(&s) {
                if let Some(p) = self.phys.get_mut(&m.phys) {
                    p.mapped -= 1;
                }
                self.drop_if_unused(m.phys);
            }
        }
        Ok(())
    }

    /// `cuMemSetAccess`: every byte of the range must be mapped.
    pub fn set_access(&mut self, va: u64, size: u64, read_write: bool) -> Result<(), CUresult> {
        if size == 0 {
            return Err(E::INVALID_VALUE);
        }
        self.walk(va, size, false)?;
        let end = va + size;
        let first = self
            .mappings
            .range(..=va)
            .next_back()
            .map(|(&s, _)| s)
            .unwrap_or(va);
        for (_, m) in self.mappings.range_mut(first..end) {
            m.access = read_write;
        }
        Ok(())
    }

    /// The pieces of `[va, va + len)`: every byte mapped (and with access, if asked).
    fn walk(&self, va: u64, len: u64, need_access: bool) -> Result<Vec<Seg>, CUresult> {
        let mut out = Vec::new();
        let mut at = va;
        let end = va.checked_add(len).ok_or(E::INVALID_VALUE)?;
        while at < end {
            let (&s, m) = self
                .mappings
                .range(..=at)
                .next_back()
                .filter(|(&s, m)| s + m.size > at)
                .ok_or(E::INVALID_VALUE)?;
            if need_access && !m.access {
                return Err(E::INVALID_VALUE);
            }
            let take = (s + m.size).min(end) - at;
            out.push(Seg {
                phys: m.phys,
                offset: (m.offset + (at - s)) as usize,
                len: take as usize,
            });
            at += take;
        }
        Ok(out)
    }

    /// Whether `[va, va + len)` is mapped with read/write access (`CUDA_ERROR_INVALID_VALUE`
    /// if not).
    pub fn check(&self, va: u64, len: u64) -> Result<(), CUresult> {
        self.walk(va, len, true).map(|_| ())
    }

    fn seg_mut(&mut self, s: Seg) -> &mut [u8] {
        let p = self.phys.get_mut(&s.phys).expect("mapped memory exists");
        &mut p.data[s.offset..s.offset + s.len]
    }

    fn seg(&self, s: Seg) -> &[u8] {
        let p = self.phys.get(&s.phys).expect("mapped memory exists");
        &p.data[s.offset..s.offset + s.len]
    }

    /// Copies device memory at `va` into `out`.
    pub fn read(&self, va: u64, out: &mut [u8]) -> Result<(), CUresult> {
        let mut done = 0;
        for s in self.walk(va, out.len() as u64, true)? {
            out[done..done + s.len].copy_from_slice(self.seg(s));
            done += s.len;
        }
        Ok(())
    }

    /// Copies `data` to device memory at `va`.
    pub fn write(&mut self, va: u64, data: &[u8]) -> Result<(), CUresult> {
        let mut done = 0;
        for s in self.walk(va, data.len() as u64, true)? {
            self.seg_mut(s).copy_from_slice(&data[done..done + s.len]);
            done += s.len;
        }
        Ok(())
    }

    /// Copies `len` bytes of host memory at `src` to device memory at `va`.
    ///
    /// # Safety
    /// `src` must be valid for reading `len` bytes, and not inside simulated device memory.
    pub unsafe fn write_from_host(
        &mut self,
        va: u64,
        src: *const u8,
        len: usize,
    ) -> Result<(), CUresult> {
        let mut done = 0;
        for s in self.walk(va, len as u64, true)? {
            let dst = self.seg_mut(s);
            // SAFETY: `src` is readable for `len` >= `done + s.len` bytes (the contract);
            // `dst` is this memory's own buffer, distinct from `src`.
            unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.as_mut_ptr(), s.len) };
            done += s.len;
        }
        Ok(())
    }

    /// Copies `len` bytes of device memory at `va` to host memory at `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writing `len` bytes, and not inside simulated device memory.
    pub unsafe fn read_to_host(&self, va: u64, dst: *mut u8, len: usize) -> Result<(), CUresult> {
        let mut done = 0;
        for s in self.walk(va, len as u64, true)? {
            let src = self.seg(s);
            // SAFETY: `dst` is writable for `len` >= `done + s.len` bytes (the contract);
            // `src` is this memory's own buffer, distinct from `dst`.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.add(done), s.len) };
            done += s.len;
        }
        Ok(())
    }

    /// Sets `count` elements of `elem` bytes (1, 2 or 4) at `va` to `value`.
    pub fn fill(&mut self, va: u64, value: u32, elem: u8, count: usize) -> Result<(), CUresult> {
        let pattern = value.to_le_bytes();
        let elem = elem as usize;
        let mut done = 0usize;
        for s in self.walk(va, (count * elem) as u64, true)? {
            let seg = self.seg_mut(s);
            if value == 0 {
                // Zeroing what is already zero writes nothing, so memory only zeroed (as
                // gpufuse's backend zeroes each new mapping) costs no RAM.
                for chunk in seg.chunks_mut(PAGE) {
                    if chunk.iter().any(|&b| b != 0) {
                        chunk.fill(0);
                    }
                }
            } else {
                for (i, b) in seg.iter_mut().enumerate() {
                    *b = pattern[(done + i) % elem];
                }
            }
            done += s.len;
        }
        Ok(())
    }

    /// Adds `value` (wrapping) to `n` little-endian 32-bit words at `va`.
    pub fn add_u32(&mut self, va: u64, n: u32, value: u32) -> Result<(), CUresult> {
        let len = n as usize * 4;
        let mut buf = vec![0u8; len];
        self.read(va, &mut buf)?;
        for w in buf.chunks_exact_mut(4) {
            let v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]).wrapping_add(value);
            w.copy_from_slice(&v.to_le_bytes());
        }
        self.write(va, &buf)
    }

    // ---- page-locked host memory ----

    /// `cuMemHostRegister`: no overlap with an existing registration.
    pub fn host_register(&mut self, p: usize, len: usize) -> Result<(), CUresult> {
        if p == 0 || len == 0 {
            return Err(E::INVALID_VALUE);
        }
        let end = p.checked_add(len).ok_or(E::INVALID_VALUE)?;
        let overlaps = self
            .host
            .range(..end)
            .next_back()
            .is_some_and(|(&s, &l)| s + l > p);
        if overlaps {
            return Err(E::HOST_MEMORY_ALREADY_REGISTERED);
        }
        self.host.insert(p, len);
        Ok(())
    }

    /// `cuMemHostUnregister`: `p` must start a registration.
    pub fn host_unregister(&mut self, p: usize) -> Result<(), CUresult> {
        self.host
            .remove(&p)
            .map(|_| ())
            .ok_or(E::HOST_MEMORY_NOT_REGISTERED)
    }

    /// Whether `[p, p + len)` lies inside one page-locked registration.
    pub fn is_pinned(&self, p: usize, len: usize) -> bool {
        self.host
            .range(..=p)
            .next_back()
            .is_some_and(|(&s, &l)| p.checked_add(len).is_some_and(|e| e <= s + l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = GRANULARITY;

    #[test]
    fn reserve_map_copy_unmap() {
        let mut m = Memory::new(1);
        let va = m.reserve(4 * G, 0, 0).unwrap();
        assert_eq!(va, VA_BASE);
        // The hint is honoured when free, not when taken.
        assert_eq!(m.reserve(G, 0, 0x10_0000_0000).unwrap(), 0x10_0000_0000);
        assert_ne!(m.reserve(G, 0, va).unwrap(), va);
        assert_eq!(m.reserve(G + 1, 0, 0), Err(E::INVALID_VALUE));
        let h1 = m.create(0, 2 * G, 8 * G).unwrap();
        let h2 = m.create(0, 2 * G, 8 * G).unwrap();
        assert_eq!(m.create(0, 6 * G, 8 * G), Err(E::OUT_OF_MEMORY));
        m.map(va, 2 * G, 0, h1).unwrap();
        m.map(va + 2 * G, 2 * G, 0, h2).unwrap();
        assert_eq!(m.map(va, 2 * G, 0, h2), Err(E::INVALID_VALUE));
        // No access yet.
        assert_eq!(m.write(va, &[1]), Err(E::INVALID_VALUE));
        m.set_access(va, 4 * G, true).unwrap();
        // A copy across the two mappings.
        let data: Vec<u8> = (0..=255).collect();
        m.write(va + 2 * G - 100, &data).unwrap();
        let mut back = vec![0; 256];
        m.read(va + 2 * G - 100, &mut back).unwrap();
        assert_eq!(back, data);
        m.fill(va, 0x0102_0304, 4, 3).unwrap();
        m.add_u32(va, 2, 1).unwrap();
        let mut w = [0u8; 12];
        m.read(va, &mut w).unwrap();
        assert_eq!(w, [5, 3, 2, 1, 5, 3, 2, 1, 4, 3, 2, 1]);
        assert_eq!(m.free_reservation(va, 4 * G), Err(E::INVALID_VALUE));
        assert_eq!(m.unmap(va, G), Err(E::INVALID_VALUE));
        m.release(h1).unwrap();
        assert_eq!(m.release(h1), Err(E::INVALID_VALUE));
        m.unmap(va, 4 * G).unwrap();
        assert_eq!(m.used[0], 2 * G);
        m.release(h2).unwrap();
        assert_eq!(m.used[0], 0);
        m.free_reservation(va, 4 * G).unwrap();
        assert_eq!(m.read(va, &mut back), Err(E::INVALID_VALUE));
    }

    #[test]
    fn host_registry() {
        let mut m = Memory::new(1);
        m.host_register(0x1000, 0x1000).unwrap();
        assert_eq!(
            m.host_register(0x1800, 0x1000),
            Err(E::HOST_MEMORY_ALREADY_REGISTERED)
        );
        assert!(m.is_pinned(0x1000, 0x1000));
        assert!(!m.is_pinned(0x1800, 0x1000));
        assert_eq!(
            m.host_unregister(0x1800),
            Err(E::HOST_MEMORY_NOT_REGISTERED)
        );
        m.host_unregister(0x1000).unwrap();
        assert!(!m.is_pinned(0x1000, 1));
    }
}
