//! Time of the CUDA samples' matrixMul kernel (tiled shared-memory matmul, block 32x32) on the
//! PTX interpreter, the sample's own sizes (A 320x320, B 640x320):
//! `cargo run --release -p gpufuse-ptx --example sample_bench -- matrixMul.ptx [LAUNCHES [THREADS]]`
//! where matrixMul.ptx is `nvcc -ptx -arch=sm_80 -I Common matrixMul.cu` of the samples'
//! `Samples/0_Introduction/matrixMul`. Checks every element of the product.

use std::time::Instant;

use gpufuse_ptx::{LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x2000_0000_0000;

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
    let (a_len, b_len, c_len) = (
        (wa * ha) as usize * 4,
        (wb * wa) as usize * 4,
        (wb * ha) as usize * 4,
    );
    let mut mem = VecMemory::new(BASE, a_len + b_len + c_len);
    let (a, b, c) = (BASE, BASE + a_len as u64, BASE + (a_len + b_len) as u64);
    // A all 1.0, B all 0.01, as the sample fills them.
    let ones: Vec<u8> = (0..a_len / 4).flat_map(|_| 1.0f32.to_le_bytes()).collect();
    let hundredths: Vec<u8> = (0..b_len / 4).flat_map(|_| 0.01f32.to_le_bytes()).collect();
    mem.write(0, &ones);
    mem.write(a_len, &hundredths);
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
    let out = mem.read(a_len + b_len, c_len);
    let want = wa as f32 * 0.01;
    let bad = out
        .chunks_exact(4)
        .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
        .filter(|&v| (v - want).abs() > 1e-3)
        .count();
    assert_eq!(bad, 0, "elements of C differ from {want}");
    println!(
        "matrixMul 32x32 blocks, {launches} launch(es) on {threads} thread(s): {lanes} lane-instructions in {secs:.3} s: {:.1} M/s, {:.3} s per launch",
        lanes as f64 / secs / 1e6,
        secs / launches as f64
    );
}
