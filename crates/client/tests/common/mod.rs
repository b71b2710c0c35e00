//! What the client core's component tests share: a node of worker threads on emulated GPUs.
// Each test file is its own crate and uses part of it.
#![allow(dead_code)]

use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use gpufuse_client::state::{Session, SessionConfig};
use gpufuse_device::emu::EmuDevice;
use gpufuse_transport::{Address, Conn, Stream};
use gpufuse_worker::LocalLedger;

/// A node on a unix socket: every connection gets a worker thread on its own emulated GPU
/// (same address window, so a moved session finds its addresses free). Each worker reports the
/// bytes its ledger still held when its session ended.
pub struct Node {
    pub address: Address,
    ended: mpsc::Receiver<u64>,
}

impl Node {
    pub fn start() -> Node {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "gpufuse-client-test-{}-{}.sock",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let (tx, ended) = mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let mut dev = EmuDevice::new(0, 1 << 30, 0x2000_0000_0000, 1 << 40);
                    let mut ledger = LocalLedger {
                        total: 1 << 30,
                        used: 0,
                    };
                    let mut conn = Conn::new(Stream::Unix(stream));
                    // The node reads the hello before it hands the connection to a worker.
                    if conn.recv().is_err() {
                        return;
                    }
                    let _ = gpufuse_worker::serve(conn, 1, &mut dev, &mut ledger, None);
                    let _ = tx.send(ledger.used);
                });
            }
        });
        Node {
            address: format!("unix:{}", path.display()).parse().unwrap(),
            ended,
        }
    }

    pub fn connect(&self) -> Session {
        Session::connect(&SessionConfig {
            address: self.address.clone(),
            token: String::new(),
            resources: Default::default(),
        })
        .unwrap()
    }

    /// The bytes the next session to end left in its ledger.
    pub fn ended_with(&self) -> u64 {
        self.ended.recv_timeout(Duration::from_secs(10)).unwrap()
    }
}
