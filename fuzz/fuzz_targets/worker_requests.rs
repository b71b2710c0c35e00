//! The worker's request handling on the emulated GPU: a session fed arbitrary requests (each a
//! 2-byte length and a body, as decoded from frames) never panics, never charges more than its
//! slice, and gives back every byte it held when it ends.
#![no_main]

use gpufuse_device::emu::EmuDevice;
use gpufuse_proto::Request;
use gpufuse_worker::{LocalLedger, Session};
use libfuzzer_sys::fuzz_target;

const LIMIT: u64 = 64 << 20;

fuzz_target!(|data: &[u8]| {
    let mut device = EmuDevice::new(0, 256 << 20, 0x2000_0000_0000, 1 << 40);
    let mut ledger = LocalLedger {
        total: 256 << 20,
        used: 0,
    };
    {
        let mut session = Session::new(&mut device, &mut ledger, Some(LIMIT));
        let mut rest = data;
        while let Some((len, tail)) = rest.split_first_chunk::<2>() {
            let len = usize::from(u16::from_le_bytes(*len)).min(tail.len());
            let (body, next) = tail.split_at(len);
            rest = next;
            let Ok(req) = gpufuse_proto::decode_borrowed::<Request>(body) else {
                continue;
            };
            // Kernels from fuzzed modules could run for ever: launches are not fuzzed here.
            if matches!(req, Request::LaunchKernel(_)) {
                continue;
            }
            let quiet = req.is_quiet();
            let _ = session.dispatch(req, quiet);
            assert!(
                session.used() <= LIMIT,
                "charged {} over {LIMIT}",
                session.used()
            );
        }
        session.release_all();
    }
    assert_eq!(ledger.used, 0, "every byte given back");
});
