//! Quiet launches from several application threads of one process, each on its own stream,
//! through the client core exactly as the shim drives it (one `Session`, its `lock()` per
//! call): the aggregate rate with 1, 2 and 4 threads shows whether threads serialize.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use gpufuse_client::launch::LaunchConfig;
use gpufuse_client::state::set_current_context;
use gpufuse_client::{Session, SessionConfig};
use gpufuse_transport::Address;

use crate::remote::EMPTY_PTX;

/// Launches per second, all threads together: issued, and until every stream synchronized.
pub fn aggregate_launch_rate(
    addr: &Address,
    threads: usize,
    per_thread: usize,
) -> Result<(f64, f64)> {
    let session = Arc::new(
        Session::connect(&SessionConfig {
            address: addr.clone(),
            token: String::new(),
            resources: Default::default(),
        })
        .context("connect")?,
    );
    let (function, streams) = {
        let mut g = session.lock();
        let ctx = g.ensure_primary(0)?;
        set_current_context(ctx);
        let module = g.load_module(EMPTY_PTX.as_bytes().to_vec())?;
        let f = g.function(module, "noop")?;
        let (function, _) = g.launch_layout(f)?;
        let mut streams = Vec::new();
        for _ in 0..threads {
            let h = g.create_stream(1, 0)?;
            streams.push((h, g.stream_id(h)?));
        }
        (function, streams)
    };
    let start = Instant::now();
    let workers: Vec<_> = streams
        .iter()
        .map(|&(_, stream)| {
            let s = session.clone();
            std::thread::spawn(move || -> Result<()> {
                for _ in 0..per_thread {
                    let config = LaunchConfig {
                        grid: [1, 1, 1],
                        block: [1, 1, 1],
                        shared_mem: 0,
                        stream,
                        attributes: Vec::new(),
                    };
                    s.lock().launch(function, config, vec![0u8; 12])?;
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join().expect("launch thread")?;
    }
    let issued = start.elapsed().as_secs_f64();
    {
        let mut g = session.lock();
        for &(h, _) in &streams {
            g.synchronize_stream(h)?;
        }
    }
    let drained = start.elapsed().as_secs_f64();
    let n = (threads * per_thread) as f64;
    Ok((n / issued, n / drained))
}
