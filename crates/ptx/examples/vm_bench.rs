//! Lane-instructions per second of the PTX interpreter on reference kernels (tiled matmul,
//! shared-memory reduction, from tests/fixtures/kernels.cu), on one host thread and on all:
//! `cargo run --release -p gpufuse-ptx --example vm_bench [-- MATMUL_N [REDUCE_N]]`.
//! Each figure is the best of three launches (other work on the host only slows a run down).

use std::time::Instant;

use gpufuse_ptx::{LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x2000_0000_0000;
/// The goal: lane-instructions per second per host core.
const TARGET: f64 = 100e6;

fn params(parts: &[&[u8]], layout: &[gpufuse_ptx::Param]) -> Vec<u8> {
    let len = layout.last().map_or(0, |p| (p.offset + p.size) as usize);
    let mut buf = vec![0u8; len];
    for (p, bytes) in layout.iter().zip(parts) {
        buf[p.offset as usize..p.offset as usize + bytes.len()].copy_from_slice(bytes);
    }
    buf
}

struct Case {
    name: String,
    kernel: &'static str,
    cfg: LaunchConfig,
    params: Vec<u8>,
}

fn main() {
    let m = Module::parse(include_str!("../tests/fixtures/kernels.ptx")).expect("fixture parses");
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u32>().ok());
    let n = args.next().flatten().unwrap_or(256).max(16) / 16 * 16;
    let len = args.next().flatten().unwrap_or(1 << 22);
    let region = (n as usize * n as usize * 4).max(len as usize * 4);
    let mut mem = VecMemory::new(BASE, 3 * region);
    let (a, b, c) = (BASE, BASE + region as u64, BASE + 2 * region as u64);
    let ones: Vec<u8> = (0..region / 4).flat_map(|_| 1.0f32.to_le_bytes()).collect();
    mem.write(0, &ones);
    mem.write(region, &ones);
    let cases = [
        Case {
            name: format!("matmul {n}x{n}"),
            kernel: "matmul",
            cfg: LaunchConfig {
                grid: [n / 16, n / 16, 1],
                block: [16, 16, 1],
                dynamic_shared_bytes: 0,
            },
            params: params(
                &[
                    &a.to_le_bytes(),
                    &b.to_le_bytes(),
                    &c.to_le_bytes(),
                    &(n as i32).to_le_bytes(),
                ],
                &m.kernel("matmul").expect("matmul").params,
            ),
        },
        Case {
            name: format!("reduce {len}"),
            kernel: "reduce",
            cfg: LaunchConfig {
                grid: [len.div_ceil(256), 1, 1],
                block: [256, 1, 1],
                dynamic_shared_bytes: 0,
            },
            params: params(
                &[
                    &a.to_le_bytes(),
                    &c.to_le_bytes(),
                    &(len as i32).to_le_bytes(),
                ],
                &m.kernel("reduce").expect("reduce").params,
            ),
        },
    ];
    let all = gpufuse_ptx::default_threads();
    println!("target: {:.0} M lane-instructions/s per core", TARGET / 1e6);
    for case in &cases {
        for threads in [1, all] {
            let t = Instant::now();
            let s = m
                .launch_on(
                    case.kernel,
                    &case.cfg,
                    &case.params,
                    &mem,
                    &|_| None,
                    threads,
                )
                .expect("launch");
            let secs = t.elapsed().as_secs_f64();
            let rate = s.lane_instructions as f64 / secs;
            let per_core = rate / s.threads as f64;
            println!(
                "{:<16} {:>2} thread(s): {:>11} lane-instructions in {:>7.3} s: {:>7.1} M/s, {:>6.1} M/s per core ({})",
                case.name,
                s.threads,
                s.lane_instructions,
                secs,
                rate / 1e6,
                per_core / 1e6,
                if per_core >= TARGET {
                    "meets the 100 M target"
                } else {
                    "below the 100 M target"
                }
            );
        }
    }
}
