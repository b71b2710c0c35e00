//! cudarc smoke test: run through `gpufuse run`. Checks device info, allocation, host-to-device
//! and device-to-host round trips with the data compared, a second stream and events.
//! Prints `PASS <check>` lines; exits 1 with `FAIL ...` on the first mismatch.

use std::process::ExitCode;

use cudarc::driver::{sys, CudaContext, DriverError};

#[derive(Debug)]
enum SmokeError {
    Driver(&'static str, DriverError),
    Mismatch(String),
}


fn ck<T>(what: &'static str, r: Result<T, DriverError>) -> Result<T, SmokeError> {
    r.map_err(|e| SmokeError::Driver(what, e))
}

fn expect(cond: bool, msg: impl FnOnce() -> String) -> Result<(), SmokeError> {
    if cond {
        Ok(())
    } else {
        Err(SmokeError::Mismatch(msg()))
    }
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn run() -> Result<(), SmokeError> {
    let count = ck("device_count", CudaContext::device_count())?;
    expect(count >= 1, || format!("device count {count}"))?;
    let ctx = ck("CudaContext::new", CudaContext::new(0))?;
    let name = ck("name", ctx.name())?;
    let (major, minor) = ck("compute_capability", ctx.compute_capability())?;
    let total = ck("total_mem", ctx.total_mem())?;
    let (free, total2) = ck("mem_get_info", ctx.mem_get_info())?;
    let warp = ck(
        "attribute(WARP_SIZE)",
        ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_WARP_SIZE),
    )?;
    println!("name={name}");
    println!("cc={major}.{minor} total={total} free={free}");
    expect(major * 10 + minor >= 80, || format!("cc {major}.{minor}"))?;
    expect(total2 == total, || format!("mem_get_info total {total2} != total_mem {total}"))?;
    expect(free <= total, || format!("free {free} > total {total}"))?;
    expect(warp == 32, || format!("warp size {warp}"))?;
    println!("PASS device_info");

    let stream = ctx.default_stream();
    for (i, n) in [1usize, 4097, 1 << 20, (16 << 20) + 3].into_iter().enumerate() {
        let host = pattern(n, i as u64 + 1);
        let dev = ck("clone_htod", stream.clone_htod(&host))?;
        let back = ck("clone_dtoh", stream.clone_dtoh(&dev))?;
        expect(back == host, || {
            let first = back.iter().zip(&host).position(|(a, b)| a != b);
            format!(
                "u8 round trip of {n} bytes differs: got {} bytes, first difference at {first:?} \
                 (got {:?}, want {:?})",
                back.len(),
                first.and_then(|i| back.get(i)),
                first.and_then(|i| host.get(i))
            )
        })?;
    }
    let floats: Vec<f32> = (0..100_003).map(|i| i as f32 * 0.5 - 7.0).collect();
    let mut dev = ck("alloc_zeros", stream.alloc_zeros::<f32>(floats.len()))?;
    let zeros = ck("clone_dtoh zeros", stream.clone_dtoh(&dev))?;
    expect(zeros.iter().all(|v| *v == 0.0), || "alloc_zeros not zero".to_string())?;
    ck("memcpy_htod", stream.memcpy_htod(&floats, &mut dev))?;
    let mut out = vec![0f32; floats.len()];
    ck("memcpy_dtoh", stream.memcpy_dtoh(&dev, &mut out))?;
    ck("synchronize", stream.synchronize())?;
    expect(out == floats, || "f32 round trip differs".to_string())?;
    println!("PASS htod_dtoh");

    let (free_before, _) = ck("mem_get_info", ctx.mem_get_info())?;
    let big = ck("alloc 256 MiB", stream.alloc_zeros::<u8>(256 << 20))?;
    let (free_during, _) = ck("mem_get_info", ctx.mem_get_info())?;
    expect(free_before - free_during >= 256 << 20, || {
        format!("free {free_before} -> {free_during} after allocating 256 MiB")
    })?;
    drop(big);
    ck("synchronize", stream.synchronize())?;
    println!("PASS alloc");

    let other = ck("new_stream", ctx.new_stream())?;
    let host = pattern(3 << 20, 99);
    let a = ck("clone_htod on stream", other.clone_htod(&host))?;
    let start = ck("record_event", other.record_event(None))?;
    let mut b = ck("alloc_zeros on stream", other.alloc_zeros::<u8>(host.len()))?;
    ck("memcpy_dtod", other.memcpy_dtod(&a, &mut b))?;
    let done = ck("record_event", other.record_event(None))?;
    ck("stream wait", stream.wait(&done))?;
    let back = ck("clone_dtoh on default stream", stream.clone_dtoh(&b))?;
    ck("synchronize", stream.synchronize())?;
    ck("event synchronize", done.synchronize())?;
    expect(back == host, || "dtod on a second stream differs".to_string())?;
    expect(done.is_complete(), || "event not complete".to_string())?;
    drop(start);
    ck("synchronize other", other.synchronize())?;
    println!("PASS stream");
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("PASS cudarc_smoke");
            ExitCode::SUCCESS
        }
        Err(SmokeError::Driver(what, e)) => {
            eprintln!("FAIL {what}: {e:?}");
            ExitCode::FAILURE
        }
        Err(SmokeError::Mismatch(m)) => {
            eprintln!("FAIL {m}");
            ExitCode::FAILURE
        }
    }
}
