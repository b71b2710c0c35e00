//! Property: whatever several sessions allocate, free, reset and end, in any order, the node's
//! ledgers (the device's and each session's) add up to exactly what the device backends hold.
//!
//! Each session is a real worker `Session` on its own emulated device (as in one worker
//! process per session), reaching the node's ledger through the same calls the control socket
//! makes; the devices are wrapped to count what they actually hold.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gpufuse_device::emu::EmuDevice;
use gpufuse_device::{Device, DeviceError, EventId, KernelLaunch, ModuleId, Status, StreamId};
use gpufuse_node::{DeviceState, NodeState};
use gpufuse_proto::DevicePtr;
use gpufuse_proto::{
    ClientHello, ComputePolicy, DeviceInfo, DeviceKind, FunctionInfo, ReplyBody, Request,
    ResourceRequest, SessionKind,
};
use gpufuse_worker::{Ledger, Session};
use proptest::prelude::*;

const TOTAL: u64 = 64 << 20;
const SESSIONS: usize = 4;

/// A device that counts the bytes it holds, by what its backend says.
struct Counting {
    inner: EmuDevice,
    held: Arc<AtomicU64>,
}

impl Device for Counting {
    fn info(&self, limit: Option<u64>) -> DeviceInfo {
        self.inner.info(limit)
    }
    fn alloc(&mut self, size: u64) -> Result<u64, Status> {
        let p = self.inner.alloc(size)?;
        self.held.fetch_add(size, Ordering::Relaxed);
        Ok(p)
    }
    fn free(&mut self, ptr: u64) -> Result<u64, Status> {
        let n = self.inner.free(ptr)?;
        self.held.fetch_sub(n, Ordering::Relaxed);
        Ok(n)
    }
    fn limit(&mut self, limit: u32) -> Result<u64, Status> {
        self.inner.limit(limit)
    }
    fn occupancy(
        &mut self,
        module: gpufuse_device::ModuleId,
        function: &str,
        q: gpufuse_device::Occupancy,
    ) -> Result<i32, Status> {
        self.inner.occupancy(module, function, q)
    }
    fn contains(&self, ptr: u64, len: u64) -> bool {
        self.inner.contains(ptr, len)
    }
    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Status> {
        self.inner.write(dst, data)
    }
    fn read(&mut self, src: u64, out: &mut [u8]) -> Result<(), Status> {
        self.inner.read(src, out)
    }
    fn copy(&mut self, dst: u64, src: u64, len: u64, stream: StreamId) -> Result<(), Status> {
        self.inner.copy(dst, src, len, stream)
    }
    fn memset(
        &mut self,
        dst: u64,
        value: u32,
        elem_size: u8,
        count: u64,
        stream: StreamId,
    ) -> Result<(), Status> {
        self.inner.memset(dst, value, elem_size, count, stream)
    }
    fn create_stream(&mut self, stream: StreamId, flags: u32, priority: i32) -> Result<(), Status> {
        self.inner.create_stream(stream, flags, priority)
    }
    fn destroy_stream(&mut self, stream: StreamId) -> Result<(), Status> {
        self.inner.destroy_stream(stream)
    }
    fn create_event(&mut self, event: EventId, flags: u32) -> Result<(), Status> {
        self.inner.create_event(event, flags)
    }
    fn destroy_event(&mut self, event: EventId) -> Result<(), Status> {
        self.inner.destroy_event(event)
    }
    fn record(&mut self, event: EventId, stream: StreamId) -> Result<(), Status> {
        self.inner.record(event, stream)
    }
    fn wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), Status> {
        self.inner.wait_event(stream, event)
    }
    fn event_done(&mut self, event: EventId) -> Result<bool, Status> {
        self.inner.event_done(event)
    }
    fn sync_event(&mut self, event: EventId) -> Result<(), Status> {
        self.inner.sync_event(event)
    }
    fn elapsed(&mut self, start: EventId, end: EventId) -> Result<f32, Status> {
        self.inner.elapsed(start, end)
    }
    fn stream_done(&mut self, stream: StreamId) -> Result<bool, Status> {
        self.inner.stream_done(stream)
    }
    fn sync_stream(&mut self, stream: StreamId) -> Result<(), Status> {
        self.inner.sync_stream(stream)
    }
    fn synchronize(&mut self) -> Result<(), Status> {
        self.inner.synchronize()
    }
    fn device_time(&mut self) -> std::time::Duration {
        self.inner.device_time()
    }
    fn load_module(&mut self, image: &[u8]) -> Result<ModuleId, DeviceError> {
        self.inner.load_module(image)
    }
    fn unload_module(&mut self, module: ModuleId) -> Result<(), Status> {
        self.inner.unload_module(module)
    }
    fn function(&mut self, module: ModuleId, name: &str) -> Result<FunctionInfo, Status> {
        self.inner.function(module, name)
    }
    fn global(&mut self, module: ModuleId, name: &str) -> Result<(u64, u64), Status> {
        self.inner.global(module, name)
    }
    fn launch(&mut self, launch: &KernelLaunch) -> Result<(), DeviceError> {
        self.inner.launch(launch)
    }
}

/// The node's ledger as one session's worker reaches it (what `serve_control` calls).
struct NodeLedger {
    state: Arc<Mutex<NodeState>>,
    id: u64,
}

impl Ledger for NodeLedger {
    fn reserve(&mut self, bytes: u64) -> bool {
        self.state.lock().unwrap().reserve(self.id, bytes).0
    }
    fn release(&mut self, bytes: u64) {
        self.state.lock().unwrap().release(self.id, bytes);
    }
    fn device_used(&mut self) -> u64 {
        self.state.lock().unwrap().device_used(self.id)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { s: usize, size: u64 },
    Free { s: usize, pick: usize },
    FreeUnknown { s: usize },
    Reset { s: usize },
    End { s: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let s = 0..SESSIONS;
    prop_oneof![
        6 => (s.clone(), 1u64..(6 << 20)).prop_map(|(s, size)| Op::Alloc { s, size }),
        4 => (s.clone(), any::<usize>()).prop_map(|(s, pick)| Op::Free { s, pick }),
        1 => s.clone().prop_map(|s| Op::FreeUnknown { s }),
        1 => s.clone().prop_map(|s| Op::Reset { s }),
        1 => s.prop_map(|s| Op::End { s }),
    ]
}

fn hello(vram: Option<u64>) -> ClientHello {
    ClientHello {
        protocol_version: gpufuse_proto::PROTOCOL_VERSION,
        kind: SessionKind::Cuda,
        token: String::new(),
        pid: 1,
        program: "ledger-test".into(),
        resources: ResourceRequest {
            vram_bytes: vram,
            ..Default::default()
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn ledgers_add_up_to_what_the_devices_hold(
        limits in proptest::collection::vec(proptest::option::of(1u64..(24 << 20)), SESSIONS),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let device = DeviceState {
            name: "emu".into(),
            kind: DeviceKind::Emulated,
            total: TOTAL,
            used: 0,
            promised: 0,
            uuid: [0; 16],
            pci: (0, 0, 0),
            peak_tflops: 100.0,
            compute_capability: (10, 0),
        };
        let state = Arc::new(Mutex::new(NodeState::new(
            vec![device],
            vec![],
            ComputePolicy::Elastic,
        )));
        let mut admitted = Vec::new();
        for l in &limits {
            // A slice that does not fit what is left unpromised is refused; that session
            // then has none.
            let a = state.lock().unwrap().admit(&hello(*l), *l);
            let (a, limit) = match a {
                Ok(a) => (a, *l),
                Err(_) => (state.lock().unwrap().admit(&hello(None), None).unwrap(), None),
            };
            admitted.push((a, limit));
        }
        let held: Vec<Arc<AtomicU64>> = (0..SESSIONS).map(|_| Arc::default()).collect();
        let backend = |i: usize| held[i].load(Ordering::Relaxed);
        let mut devices: Vec<Counting> = admitted
            .iter()
            .zip(&held)
            .map(|((a, _), h)| Counting {
                inner: EmuDevice::new(0, TOTAL, a.base, gpufuse_node::WINDOW),
                held: h.clone(),
            })
            .collect();
        let mut ledgers: Vec<NodeLedger> = admitted
            .iter()
            .map(|(a, _)| NodeLedger { state: state.clone(), id: a.id })
            .collect();
        let mut sessions: Vec<Option<Session>> = devices
            .iter_mut()
            .zip(ledgers.iter_mut())
            .zip(&admitted)
            .map(|((d, l), (_, limit))| Some(Session::new(d, l, *limit)))
            .collect();
        let mut live: Vec<Vec<u64>> = vec![Vec::new(); SESSIONS];

        for op in ops {
            match op {
                Op::Alloc { s, size } => {
                    if let Some(sess) = sessions[s].as_mut() {
                        match sess.handle(Request::MemAlloc { device: 0, size }) {
                            Ok(ReplyBody::Ptr(DevicePtr(p))) => live[s].push(p),
                            Ok(other) => prop_assert!(false, "alloc answered {other:?}"),
                            Err(e) => prop_assert_eq!(e, 2, "only out of memory may fail"),
                        }
                    }
                }
                Op::Free { s, pick } => {
                    if let (Some(sess), false) = (sessions[s].as_mut(), live[s].is_empty()) {
                        let k = pick % live[s].len();
                        let ptr = live[s].swap_remove(k);
                        let freed = sess.handle(Request::MemFree { ptr: DevicePtr(ptr) });
                        prop_assert!(freed.is_ok(), "free of a live pointer: {:?}", freed);
                    }
                }
                Op::FreeUnknown { s } => {
                    if let Some(sess) = sessions[s].as_mut() {
                        let ptr = live[(s + 1) % SESSIONS].first().copied().unwrap_or(0x1000);
                        // Another session's pointer or a stray one: refused, nothing moves.
                        let freed = sess.handle(Request::MemFree { ptr: DevicePtr(ptr) });
                        prop_assert!(freed.is_err(), "free of a foreign pointer: {:?}", freed);
                    }
                }
                Op::Reset { s } => {
                    if let Some(sess) = sessions[s].as_mut() {
                        let reset = sess.handle(Request::DeviceReset { device: 0 });
                        prop_assert!(reset.is_ok(), "reset: {:?}", reset);
                        live[s].clear();
                    }
                }
                Op::End { s } => {
                    if let Some(mut sess) = sessions[s].take() {
                        // What the worker does when its client leaves, then what the node
                        // does when the worker exits.
                        sess.release_all();
                        state.lock().unwrap().end_session(admitted[s].0.id);
                        live[s].clear();
                    }
                }
            }

            let st = state.lock().unwrap();
            let d = &st.devices[0];
            let mut sum_sessions = 0;
            let mut sum_promised = 0;
            for (i, sess) in sessions.iter().enumerate() {
                let id = admitted[i].0.id;
                match sess {
                    Some(sess) => {
                        let rec = st.sessions.get(&id);
                        prop_assert!(rec.is_some(), "session {} is known", id);
                        let rec = rec.unwrap();
                        prop_assert_eq!(rec.used, sess.used(), "node and worker agree");
                        prop_assert_eq!(rec.used, backend(i), "node and backend agree");
                        sum_sessions += rec.used;
                        sum_promised += rec.limit.unwrap_or(0);
                        if let Some(l) = rec.limit {
                            prop_assert!(rec.used <= l, "within its slice");
                        }
                    }
                    None => {
                        prop_assert!(!st.sessions.contains_key(&id));
                        prop_assert_eq!(backend(i), 0, "an ended session's backend is empty");
                    }
                }
            }
            let in_backends: u64 = (0..SESSIONS).map(backend).sum();
            prop_assert_eq!(d.used, sum_sessions, "device ledger = sum of session ledgers");
            prop_assert_eq!(d.used, in_backends, "device ledger = what the backends hold");
            prop_assert_eq!(d.promised, sum_promised, "promised = live slices");
            prop_assert!(d.used <= d.total);
        }
        // Every session ends: the device is empty, and so are the backends.
        for (i, s) in sessions.iter_mut().enumerate() {
            if let Some(mut sess) = s.take() {
                sess.release_all();
                state.lock().unwrap().end_session(admitted[i].0.id);
            }
        }
        drop(sessions);
        let st = state.lock().unwrap();
        prop_assert_eq!(st.devices[0].used, 0);
        prop_assert_eq!(st.devices[0].promised, 0);
        prop_assert!(st.sessions.is_empty());
        for i in 0..SESSIONS {
            prop_assert_eq!(backend(i), 0, "the backends hold nothing");
        }
    }
}
