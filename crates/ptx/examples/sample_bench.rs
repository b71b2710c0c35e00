//! Time of the CUDA samples' matrixMul kernel (tiled shared-memory matmul, block 32x32) on the
//! PTX interpreter, the sample's own sizes (A 320x320, B 640x320):
//! `cargo run --release -p gpufuse-ptx --example sample_bench -- matrixMul.ptx [LAUNCHES [THREADS]]`
//! where matrixMul.ptx is `nvcc -ptx -arch=sm_80 -I Common matrixMul.cu` of the samples'
//! `Samples/0_Introduction/matrixMul`. Each matrix is an allocation of its own, as on the
//! emulated device. Checks every element of the product.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use gpufuse_ptx::{DeviceMemory, LaunchConfig, Module, Region};

const BASE: u64 = 0x2000_0000_0000;

/// Device memory as the emulated device keeps it: each allocation its own region.
struct Allocations(Vec<(u64, Vec<AtomicU64>)>);

impl Allocations {
    /// Allocation `i` of `words[i]` (its 32-bit values) at `BASE + i * 2^32`.
    fn new(words: &[Vec<u32>]) -> Allocations {
        Allocations(
            words
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    let words = w
                        .chunks(2)
                        .map(|p| {
                            AtomicU64::new(
                                p[0] as u64 | (p.get(1).copied().unwrap_or(0) as u64) << 32,
                            )
                        })
                        .collect();
                    (BASE + ((i as u64) << 32), words)
                })
                .collect(),
        )
    }

    fn start(&self, i: usize) -> u64 {
        self.0[i].0
    }

    /// Allocation `i`'s 32-bit values.
    fn values(&self, i: usize) -> Vec<u32> {
        self.0[i]
            .1
            .iter()
            .flat_map(|w| {
                let w = w.load(Ordering::Relaxed);
                [w as u32, (w >> 32) as u32]
            })
            .collect()
    }
}

impl DeviceMemory for Allocations {
    fn region(&self, addr: u64) -> Option<Region<'_>> {
        self.0.iter().find_map(|(start, words)| {
            let len = 8 * words.len() as u64;
            (addr >= *start && addr - start < len).then_some(Region {
                start: *start,
                len,
                words,
            })
        })
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .unwrap_or_else(|| "/tmp/vmspeed/matrixMul.ptx".into());
    let launches: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let threads: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(gpufuse_ptx::default_threads);
    let text = std::fs::read_to_string(&path).expect("the matrixMul PTX");
    let m = Module::parse(&text).expect("PTX parses");
    let kernel = m
        .kernels()
        .iter()
        .map(|k| k.name.clone())
        .find(|n| n.contains("MatrixMulCUDAILi32"))
        .expect("the block-32 kernel");
    let bs = 32u32;
    let (wa, ha, wb) = (10 * bs, 10 * bs, 20 * bs);
    // A all 1.0, B all 0.01, as the sample fills them; each matrix its own allocation.
    let mem = Allocations::new(&[
        vec![1.0f32.to_bits(); (wa * ha) as usize],
        vec![0.01f32.to_bits(); (wb * wa) as usize],
        vec![0; (wb * ha) as usize],
    ]);
    let (a, b, c) = (mem.start(0), mem.start(1), mem.start(2));
    let info = m.kernel(&kernel).expect("kernel");
    let len = info
        .params
        .last()
        .map_or(0, |p| (p.offset + p.size) as usize);
    let mut params = vec![0u8; len];
    let parts: [&[u8]; 5] = [
        &c.to_le_bytes(),
        &a.to_le_bytes(),
        &b.to_le_bytes(),
        &(wa as i32).to_le_bytes(),
        &(wb as i32).to_le_bytes(),
    ];
    for (p, bytes) in info.params.iter().zip(parts) {
        params[p.offset as usize..p.offset as usize + bytes.len()].copy_from_slice(bytes);
    }
    let cfg = LaunchConfig {
        grid: [wb / bs, ha / bs, 1],
        block: [bs, bs, 1],
        dynamic_shared_bytes: 0,
    };
    let t = Instant::now();
    let mut lanes = 0u64;
    for _ in 0..launches {
        let s = m
            .launch_on(&kernel, &cfg, &params, &mem, &|_| None, threads)
            .expect("launch");
        lanes += s.lane_instructions;
    }
    let secs = t.elapsed().as_secs_f64();
    let want = wa as f32 * 0.01;
    let bad = mem
        .values(2)
        .into_iter()
        .map(f32::from_bits)
        .filter(|&v| (v - want).abs() > 1e-3)
        .count();
    assert_eq!(bad, 0, "elements of C differ from {want}");
    println!(
        "matrixMul 32x32 blocks, {launches} launch(es) on {threads} thread(s): {lanes} lane-instructions in {secs:.3} s: {:.1} M/s, {:.3} s per launch",
        lanes as f64 / secs / 1e6,
        secs / launches as f64
    );
}
