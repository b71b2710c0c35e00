//! Starts a real `gpufuse serve` on a temporary unix socket for the shim's component tests.
//! The binary comes from the same target directory (`cargo build` the workspace first).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    pub dir: PathBuf,
    pub address: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn gpufuse_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    // target/<profile>/deps/<test> -> target/<profile>/gpufuse
    let bin = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .join("gpufuse");
    assert!(
        bin.exists(),
        "{} is missing: build the workspace first (cargo build)",
        bin.display()
    );
    bin
}

pub fn start(devices: &str) -> Server {
    let dir = std::env::temp_dir().join(format!("gpufuse-shim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let address = format!("unix:{}", sock.display());
    let child = Command::new(gpufuse_binary())
        .args(["serve", "--listen", &address, "--devices", devices])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start gpufuse serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "gpufuse serve did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server {
        child,
        dir,
        address,
    }
}
