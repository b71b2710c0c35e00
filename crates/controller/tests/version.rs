//! A client of another protocol version is refused in a header it can read.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpufuse_controller::{Controller, ControllerConfig};
use gpufuse_proto::{
    encode_frame, ClientHello, FrameKind, ServerHello, SessionKind, HEADER_LEN, PROTOCOL_VERSION,
};
use gpufuse_transport::Address;

/// A controller on a fresh unix socket, serving on a thread for the rest of the test process.
fn controller(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "gpufuse-controller-version-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ctrl.sock");
    let c = Controller::new(ControllerConfig::new(vec![Address::Unix(path.clone())]));
    std::thread::spawn(move || c.serve().unwrap());
    let start = Instant::now();
    while UnixStream::connect(&path).is_err() {
        assert!(start.elapsed() < Duration::from_secs(10), "no controller");
        std::thread::sleep(Duration::from_millis(10));
    }
    path
}

fn hello(protocol_version: u16) -> ClientHello {
    ClientHello {
        protocol_version,
        kind: SessionKind::Status,
        token: String::new(),
        pid: std::process::id(),
        program: "version-test".into(),
        resources: Default::default(),
    }
}

/// Sends `hello` in a frame whose header says `header_version`; returns the reply's header
/// version and reason.
fn refusal(path: &PathBuf, header_version: u16, hello: &ClientHello) -> (u16, String) {
    let mut sock = UnixStream::connect(path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut frame = Vec::new();
    encode_frame(&mut frame, FrameKind::Hello, 0, 0, hello);
    gpufuse_proto::set_frame_version(&mut frame, header_version);
    sock.write_all(&frame).unwrap();
    let mut h = [0u8; HEADER_LEN];
    sock.read_exact(&mut h).unwrap();
    assert_eq!(&h[0..4], b"GFUS");
    let version = u16::from_le_bytes([h[4], h[5]]);
    // Every version's header has the body's length at 8..12 and zeros at 12..16 when the
    // frame has no bulk tail.
    assert_eq!(&h[12..16], &[0, 0, 0, 0]);
    let len = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len];
    sock.read_exact(&mut body).unwrap();
    match gpufuse_proto::decode_owned::<ServerHello>(&body).unwrap() {
        ServerHello::Refused { reason } => (version, reason),
        other => panic!("{other:?}"),
    }
}

/// Protocol 5 (before the header declared tails), in its own header: the refusal comes back
/// in version 5's header, naming both sides.
#[test]
fn an_older_client_reads_its_refusal_in_its_own_version() {
    let path = controller("older");
    let (version, reason) = refusal(&path, 5, &hello(5));
    assert_eq!(version, 5);
    assert!(
        reason.contains("client speaks 5") && reason.contains("upgrade the client"),
        "{reason}"
    );
    // The same when only the hello names the older version.
    let (version, reason) = refusal(&path, PROTOCOL_VERSION, &hello(5));
    assert_eq!(version, 5);
    assert!(reason.contains("client speaks 5"), "{reason}");
}

/// A newer client is answered in this controller's newest version and told to upgrade the
/// controller.
#[test]
fn a_newer_client_is_refused_in_the_controllers_version() {
    let path = controller("newer");
    let newer = PROTOCOL_VERSION + 1;
    let (version, reason) = refusal(&path, PROTOCOL_VERSION, &hello(newer));
    assert_eq!(version, PROTOCOL_VERSION);
    assert!(
        reason.contains(&format!("client speaks {newer}"))
            && reason.contains("upgrade the controller"),
        "{reason}"
    );
}
