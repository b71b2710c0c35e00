//! Golden bytes: the exact encoding of every message, pinned. A change to a message, to the
//! order of a message enum or to the frame header fails here; such a change must bump
//! `PROTOCOL_VERSION` and update these bytes on purpose. `GOLDEN_PRINT=1 cargo test -p
//! gpufuse-proto --test golden -- --nocapture` prints the current encodings (for a new
//! message; never to paper over a changed one).

use gpufuse_proto::SessionId;
use gpufuse_proto::*;
use gpufuse_proto::{
    ContextHandle, DevicePtr, EventHandle, FunctionHandle, ModuleHandle, PhysicalHandle,
    StreamHandle, TexHandle,
};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn body<T: serde::Serialize>(msg: &T) -> Vec<u8> {
    let mut frame = Vec::new();
    encode_frame(&mut frame, FrameKind::Request, 0, 0, msg);
    frame[HEADER_LEN..].to_vec()
}

fn check(name: &str, got: &[u8], want: &str) {
    if std::env::var_os("GOLDEN_PRINT").is_some() {
        println!("        (\"{name}\", \"{}\"),", hex(got));
        return;
    }
    assert_eq!(hex(got), want, "{name}: its encoding changed");
}

const DATA: &[u8] = &[0xde, 0xad, 0xbe, 0xef];
const HASH: [u8; 32] = [0x11; 32];

fn requests() -> Vec<(&'static str, Request<'static>)> {
    let rect = Rect {
        ptr: DevicePtr(0x2000),
        pitch: 512,
    };
    vec![
        ("Ping", Request::Ping),
        (
            "CtxCreate",
            Request::CtxCreate {
                ctx: ContextHandle(1),
                device: 0,
                flags: 4,
            },
        ),
        (
            "CtxDestroy",
            Request::CtxDestroy {
                ctx: ContextHandle(1),
            },
        ),
        (
            "CtxSynchronize",
            Request::CtxSynchronize {
                ctx: ContextHandle(1),
            },
        ),
        ("DeviceReset", Request::DeviceReset { device: 0 }),
        (
            "MemAlloc",
            Request::MemAlloc {
                device: 0,
                size: 1 << 20,
            },
        ),
        (
            "MemAllocPitch",
            Request::MemAllocPitch {
                device: 0,
                width: 100,
                height: 3,
                elem_size: 4,
            },
        ),
        (
            "MemFree",
            Request::MemFree {
                ptr: DevicePtr(0x7f00_0000_1000),
            },
        ),
        ("MemGetInfo", Request::MemGetInfo { device: 0 }),
        (
            "MemcpyHtoD",
            Request::MemcpyHtoD {
                dst: DevicePtr(0x1000),
                stream: StreamHandle(2),
                data: DATA,
            },
        ),
        (
            "MemcpyDtoH",
            Request::MemcpyDtoH {
                src: DevicePtr(0x1000),
                size: 64,
                stream: StreamHandle(0),
            },
        ),
        (
            "MemcpyDtoHAsync",
            Request::MemcpyDtoHAsync {
                src: DevicePtr(0x1000),
                size: 64,
                stream: StreamHandle(2),
                tag: 9,
            },
        ),
        (
            "MemcpyDtoD",
            Request::MemcpyDtoD {
                dst: DevicePtr(0x2000),
                src: DevicePtr(0x1000),
                size: 64,
                stream: StreamHandle(0),
            },
        ),
        (
            "Memcpy2DDtoD",
            Request::Memcpy2DDtoD {
                dst: rect,
                src: rect,
                width: 16,
                height: 2,
                stream: StreamHandle(0),
            },
        ),
        (
            "Memcpy2DHtoD",
            Request::Memcpy2DHtoD {
                dst: rect,
                width: 2,
                height: 2,
                stream: StreamHandle(0),
                data: DATA,
            },
        ),
        (
            "Memcpy2DDtoH",
            Request::Memcpy2DDtoH {
                src: rect,
                width: 2,
                height: 2,
                stream: StreamHandle(0),
            },
        ),
        (
            "Memset",
            Request::Memset {
                dst: DevicePtr(0x1000),
                value: 0xff,
                elem_size: 1,
                count: 10,
                stream: StreamHandle(0),
            },
        ),
        (
            "Memset2D",
            Request::Memset2D {
                dst: rect,
                value: 7,
                elem_size: 4,
                width: 4,
                height: 2,
                stream: StreamHandle(0),
            },
        ),
        (
            "StreamCreate",
            Request::StreamCreate {
                stream: StreamHandle(3),
                flags: 1,
                priority: -1,
            },
        ),
        (
            "StreamDestroy",
            Request::StreamDestroy {
                stream: StreamHandle(3),
            },
        ),
        (
            "StreamSynchronize",
            Request::StreamSynchronize {
                stream: StreamHandle(3),
            },
        ),
        (
            "StreamQuery",
            Request::StreamQuery {
                stream: StreamHandle(3),
            },
        ),
        (
            "StreamWaitEvent",
            Request::StreamWaitEvent {
                stream: StreamHandle(3),
                event: EventHandle(5),
            },
        ),
        (
            "EventCreate",
            Request::EventCreate {
                event: EventHandle(5),
                flags: 2,
            },
        ),
        (
            "EventDestroy",
            Request::EventDestroy {
                event: EventHandle(5),
            },
        ),
        (
            "EventRecord",
            Request::EventRecord {
                event: EventHandle(5),
                stream: StreamHandle(3),
            },
        ),
        (
            "EventQuery",
            Request::EventQuery {
                event: EventHandle(5),
            },
        ),
        (
            "EventSynchronize",
            Request::EventSynchronize {
                event: EventHandle(5),
            },
        ),
        (
            "EventElapsedTime",
            Request::EventElapsedTime {
                start: EventHandle(5),
                end: EventHandle(6),
            },
        ),
        (
            "ModuleLoad",
            Request::ModuleLoad {
                module: ModuleHandle(7),
                device: 0,
                hash: HASH,
                image: Some(DATA),
            },
        ),
        (
            "ModuleUnload",
            Request::ModuleUnload {
                module: ModuleHandle(7),
            },
        ),
        (
            "ModuleGetFunction",
            Request::ModuleGetFunction {
                module: ModuleHandle(7),
                name: "saxpy",
                function: FunctionHandle(8),
            },
        ),
        (
            "ModuleGetGlobal",
            Request::ModuleGetGlobal {
                module: ModuleHandle(7),
                name: "g",
            },
        ),
        (
            "LaunchKernel",
            Request::LaunchKernel(Launch {
                function: FunctionHandle(8),
                grid: [2, 1, 1],
                block: [128, 1, 1],
                shared_mem: 0,
                stream: StreamHandle(3),
                params: DATA,
                attributes: vec![(2, [1, 0, 0, 0, 0, 0, 0, 0])],
            }),
        ),
        ("DebugLaunchLog", Request::DebugLaunchLog { max: 10 }),
        (
            "MemCreate",
            Request::MemCreate {
                handle: PhysicalHandle(1),
                device: 0,
                size: 2 << 20,
            },
        ),
        (
            "MemRelease",
            Request::MemRelease {
                handle: PhysicalHandle(1),
            },
        ),
        (
            "MemAddressReserve",
            Request::MemAddressReserve {
                size: 2 << 20,
                align: 0,
            },
        ),
        (
            "MemAddressFree",
            Request::MemAddressFree {
                ptr: DevicePtr(0x4000_0000),
                size: 2 << 20,
            },
        ),
        (
            "MemMap",
            Request::MemMap {
                ptr: DevicePtr(0x4000_0000),
                size: 2 << 20,
                handle: PhysicalHandle(1),
            },
        ),
        (
            "MemUnmap",
            Request::MemUnmap {
                ptr: DevicePtr(0x4000_0000),
                size: 2 << 20,
            },
        ),
        (
            "ModuleImagePart",
            Request::ModuleImagePart {
                hash: HASH,
                total: 100,
                offset: 0,
                data: DATA,
            },
        ),
        (
            "TexObjectCreate",
            Request::TexObjectCreate {
                handle: TexHandle(9),
                desc: TexObjectDesc {
                    ptr: DevicePtr(0x1000),
                    format: 0x20,
                    channels: 4,
                    shape: TexShape::D2,
                    width: 16,
                    height: 8,
                    depth: 1,
                    pitch: 64,
                    sampler: Some(TexSampler {
                        address: [1, 1, 0],
                        filter: 1,
                        flags: 2,
                        border: [0.0, 0.5, 1.0, 0.0],
                    }),
                },
            },
        ),
        (
            "TexObjectDestroy",
            Request::TexObjectDestroy {
                handle: TexHandle(9),
            },
        ),
        (
            "ShmAttach",
            Request::ShmAttach {
                request_ring: 1 << 22,
                reply_ring: 1 << 22,
            },
        ),
        (
            "MemcpyHtoDHost",
            Request::MemcpyHtoDHost {
                dst: DevicePtr(0x7f00_0000_1000),
                stream: StreamHandle(2),
                offset: 1 << 20,
                size: 4096,
            },
        ),
        (
            "MemcpyDtoHHost",
            Request::MemcpyDtoHHost {
                src: DevicePtr(0x7f00_0000_1000),
                stream: StreamHandle(2),
                offset: 1 << 20,
                size: 4096,
            },
        ),
        (
            "MemAllocShared",
            Request::MemAllocShared {
                device: 0,
                size: 4096,
                offset: 1 << 20,
            },
        ),
        (
            "MapHostArena",
            Request::MapHostArena {
                base: 0x7f00_0000_0000,
            },
        ),
        (
            "SetLimit",
            Request::SetLimit {
                device: 0,
                limit: 2,
                value: 64 << 20,
            },
        ),
        (
            "IpcGetMemHandle",
            Request::IpcGetMemHandle {
                ptr: DevicePtr(0x2000_0000_0000),
            },
        ),
        (
            "IpcOpenMemHandle",
            Request::IpcOpenMemHandle {
                device: 0,
                handle: &[0xab; 4],
            },
        ),
        (
            "IpcCloseMemHandle",
            Request::IpcCloseMemHandle {
                ptr: DevicePtr(0x2000_0000_0000),
            },
        ),
        (
            "IpcExportPhysical",
            Request::IpcExportPhysical {
                handle: PhysicalHandle(7),
            },
        ),
        (
            "IpcImportPhysical",
            Request::IpcImportPhysical {
                handle: PhysicalHandle(7),
                shared: &[0xab; 4],
            },
        ),
        (
            "Occupancy",
            Request::Occupancy {
                function: FunctionHandle(5),
                block: 256,
                dyn_smem: 32768,
                max_dyn_smem: 49152,
                flags: 2,
            },
        ),
        (
            "GetLimit",
            Request::GetLimit {
                device: 0,
                limit: 7,
            },
        ),
        (
            "GraphDefine",
            Request::GraphDefine {
                graph: 9,
                nodes: vec![
                    GraphNode::Launch {
                        function: FunctionHandle(5),
                        grid: [2, 1, 1],
                        block: [64, 1, 1],
                        shared_mem: 0,
                        params: vec![1, 2],
                        cooperative: false,
                    },
                    GraphNode::Copy {
                        dst: DevicePtr(0x40),
                        src: DevicePtr(0x80),
                        size: 16,
                    },
                    GraphNode::Memset {
                        dst: DevicePtr(0x40),
                        value: 7,
                        elem_size: 4,
                        count: 4,
                    },
                ],
            },
        ),
        (
            "GraphLaunch",
            Request::GraphLaunch {
                graph: 9,
                stream: StreamHandle(3),
            },
        ),
        ("GraphDestroy", Request::GraphDestroy { graph: 9 }),
    ]
}

const REQUESTS: &[(&str, &str)] = &[
    ("Ping", "00"),
    ("CtxCreate", "01010004"),
    ("CtxDestroy", "0201"),
    ("CtxSynchronize", "0301"),
    ("DeviceReset", "0400"),
    ("MemAlloc", "0500808040"),
    ("MemAllocPitch", "0600640304"),
    ("MemFree", "0780a0808080e01f"),
    ("MemGetInfo", "0800"),
    ("MemcpyHtoD", "0980200204deadbeef"),
    ("MemcpyDtoH", "0a80204000"),
    ("MemcpyDtoHAsync", "0b8020400209"),
    ("MemcpyDtoD", "0c804080204000"),
    ("Memcpy2DDtoD", "0d8040800480408004100200"),
    ("Memcpy2DHtoD", "0e8040800402020004deadbeef"),
    ("Memcpy2DDtoH", "0f80408004020200"),
    ("Memset", "108020ff01010a00"),
    ("Memset2D", "11804080040704040200"),
    ("StreamCreate", "12030101"),
    ("StreamDestroy", "1303"),
    ("StreamSynchronize", "1403"),
    ("StreamQuery", "1503"),
    ("StreamWaitEvent", "160305"),
    ("EventCreate", "170502"),
    ("EventDestroy", "1805"),
    ("EventRecord", "190503"),
    ("EventQuery", "1a05"),
    ("EventSynchronize", "1b05"),
    ("EventElapsedTime", "1c0506"),
    (
        "ModuleLoad",
        "1d070011111111111111111111111111111111111111111111111111111111111111110104deadbeef",
    ),
    ("ModuleUnload", "1e07"),
    ("ModuleGetFunction", "1f0705736178707908"),
    ("ModuleGetGlobal", "20070167"),
    (
        "LaunchKernel",
        "210802010180010101000304deadbeef01020100000000000000",
    ),
    ("DebugLaunchLog", "220a"),
    ("MemCreate", "23010080808001"),
    ("MemRelease", "2401"),
    ("MemAddressReserve", "258080800100"),
    ("MemAddressFree", "26808080800480808001"),
    ("MemMap", "2780808080048080800101"),
    ("MemUnmap", "28808080800480808001"),
    (
        "ModuleImagePart",
        "291111111111111111111111111111111111111111111111111111111111111111640004deadbeef",
    ),
    (
        "TexObjectCreate",
        "2a09802040040210080140010101000102000000000000003f0000803f00000000",
    ),
    ("TexObjectDestroy", "2b09"),
    ("ShmAttach", "2c8080800280808002"),
    ("MemcpyHtoDHost", "2d80a0808080e01f028080408020"),
    ("MemcpyDtoHHost", "2e80a0808080e01f028080408020"),
    ("MemAllocShared", "2f008020808040"),
    ("MapHostArena", "308080808080e01f"),
    ("SetLimit", "31000280808020"),
    ("IpcGetMemHandle", "3280808080808008"),
    ("IpcOpenMemHandle", "330004abababab"),
    ("IpcCloseMemHandle", "3480808080808008"),
    ("IpcExportPhysical", "3507"),
    ("IpcImportPhysical", "360704abababab"),
    ("Occupancy", "3705800280800280800302"),
    ("GetLimit", "380007"),
    (
        "GraphDefine",
        "3909030005020101400101000201020001408001100240070404",
    ),
    ("GraphLaunch", "3a0903"),
    ("GraphDestroy", "3b09"),
];

#[test]
fn every_request_encodes_to_its_golden_bytes_and_starts_with_its_opcode() {
    let all = requests();
    if std::env::var_os("GOLDEN_PRINT").is_none() {
        assert_eq!(all.len(), REQUESTS.len(), "a request without golden bytes");
    }
    for (i, (name, req)) in all.iter().enumerate() {
        let bytes = body(req);
        let want = REQUESTS.get(i).map_or("", |w| w.1);
        check(name, &bytes, want);
        // Opcodes are explicit, consecutive and in enum order: postcard's variant index.
        assert_eq!(req.opcode(), i as u32, "{name}'s opcode");
        let (index, _) = postcard::take_from_bytes::<u32>(&bytes).unwrap();
        assert_eq!(
            index,
            req.opcode(),
            "{name}: the wire's variant index is its opcode"
        );
        assert_eq!(
            &decode_borrowed::<Request>(&bytes).unwrap(),
            req,
            "{name} round trip"
        );
    }
}

fn others() -> Vec<(&'static str, Vec<u8>)> {
    let mut reply = Reply::ok(ReplyBody::Ptr(DevicePtr(0x1000)));
    reply.deferred_error = Some(700);
    reply.staged = vec![StagedCopy {
        tag: 9,
        data: DATA.to_vec(),
    }];
    reply.output = b"hi\n".to_vec();
    let bodies: Vec<(&str, ReplyBody)> = vec![
        ("ReplyBody::None", ReplyBody::None),
        ("ReplyBody::Ptr", ReplyBody::Ptr(DevicePtr(0x1000))),
        (
            "ReplyBody::Pitch",
            ReplyBody::Pitch {
                ptr: DevicePtr(0x1000),
                pitch: 512,
            },
        ),
        (
            "ReplyBody::MemInfo",
            ReplyBody::MemInfo {
                free: 1 << 30,
                total: 2 << 30,
            },
        ),
        ("ReplyBody::Data", ReplyBody::Data(DATA.to_vec())),
        ("ReplyBody::Elapsed", ReplyBody::Elapsed(1.5)),
        ("ReplyBody::NeedImage", ReplyBody::NeedImage),
        (
            "ReplyBody::Function",
            ReplyBody::Function(FunctionInfo {
                params: vec![ParamSlot { offset: 0, size: 8 }],
                attributes: vec![(0, 1024)],
            }),
        ),
        (
            "ReplyBody::Global",
            ReplyBody::Global {
                ptr: DevicePtr(0x3000),
                size: 4,
            },
        ),
        (
            "ReplyBody::Opened",
            ReplyBody::Opened {
                ptr: DevicePtr(0x1000),
                size: 4096,
            },
        ),
        ("ReplyBody::Count", ReplyBody::Count(24)),
        (
            "ReplyBody::Launches",
            ReplyBody::Launches(vec![LaunchRecord {
                function_name: "k".into(),
                grid: [1, 1, 1],
                block: [32, 1, 1],
                shared_mem: 0,
                stream: StreamHandle(0),
                params: DATA.to_vec(),
            }]),
        ),
    ];
    let hello = ClientHello {
        protocol_version: PROTOCOL_VERSION,
        kind: SessionKind::Cuda,
        token: "t".into(),
        pid: 42,
        program: "p".into(),
        resources: ResourceRequest {
            vram_bytes: Some(1 << 30),
            compute_percent: Some(30),
            tflops: None,
            qos: Qos::High,
        },
    };
    let device = DeviceInfo {
        index: 0,
        name: "gpu".into(),
        kind: DeviceKind::Emulated,
        uuid: [7; 16],
        total_mem: 1 << 30,
        attributes: vec![(1, 1024)],
    };
    let status = NodeStatus {
        compute_policy: ComputePolicy::Hard,
        devices: vec![DeviceStatus {
            index: 0,
            name: "gpu".into(),
            kind: DeviceKind::Cuda,
            total_bytes: 1 << 30,
            used_bytes: 1 << 20,
            uuid: [7; 16],
            compute_capability: (9, 0),
            pci: (0, 0x40, 0),
            utilization_percent: 50,
        }],
        sessions: vec![SessionStatus {
            id: SessionId(1),
            pid: 42,
            program: "p".into(),
            subject: Some("alice".into()),
            worker_pid: 43,
            device: 0,
            used_bytes: 1 << 20,
            limit_bytes: Some(1 << 30),
            utilization_percent: 50,
            qos: Qos::Low,
            compute_percent: Some(30),
            device_time_us: 1000,
            queue_p50_us: 10,
            queue_p99_us: 100,
            on_device: true,
            swapped_host_bytes: 4096,
            swapped_disk_bytes: 0,
        }],
        notes: vec!["n".into()],
        pending: vec![],
        image_cache: ImageCacheStatus {
            dir: Some("/c".into()),
            limit_bytes: 1 << 30,
            entries: 2,
            bytes: 4096,
            counts: ImageCounts {
                received: 1,
                received_bytes: 4096,
                hits: 2,
                hit_bytes: 1500,
                corrupt: 0,
            },
        },
    };
    let mut out: Vec<(&'static str, Vec<u8>)> =
        bodies.into_iter().map(|(n, b)| (n, body(&b))).collect();
    out.push(("Reply", body(&reply)));
    out.push(("ClientHello", body(&hello)));
    for (n, k) in [
        ("SessionKind::Status", SessionKind::Status),
        ("SessionKind::Check", SessionKind::Check),
        (
            "SessionKind::End",
            SessionKind::End {
                session: SessionId(3),
            },
        ),
        (
            "SessionKind::Migrate",
            SessionKind::Migrate {
                session: SessionId(3),
                device: 1,
            },
        ),
        ("SessionKind::EndClaim", SessionKind::EndClaim),
    ] {
        out.push((n, body(&k)));
    }
    out.push((
        "ServerHello::Accepted",
        body(&ServerHello::Accepted {
            session_id: SessionId(1),
            devices: vec![device],
        }),
    ));
    out.push((
        "ServerHello::Refused",
        body(&ServerHello::Refused {
            reason: "no".into(),
        }),
    ));
    out.push(("ServerHello::Status", body(&ServerHello::Status(status))));
    out.push((
        "ServerHello::Admissible",
        body(&ServerHello::Admissible { device: 1 }),
    ));
    out.push((
        "ServerHello::Ended",
        body(&ServerHello::Ended {
            session: SessionId(3),
        }),
    ));
    out.push((
        "ServerHello::Migrated",
        body(&ServerHello::Migrated {
            session: SessionId(3),
            device: 1,
            stop_us: 1500,
            total_us: 4096,
        }),
    ));
    let figures = MoveFigures {
        stop_us: 1500,
        rounds: 2,
        bytes: 1 << 28,
        precopied_bytes: 1 << 29,
        stop_bytes: 4096,
    };
    out.push((
        "ServerHello::MigratedWith",
        body(&ServerHello::MigratedWith {
            session: SessionId(3),
            device: 1,
            total_us: 4096,
            figures,
        }),
    ));
    out.push((
        "ServerHello::ClaimEnded",
        body(&ServerHello::ClaimEnded { sessions: 2 }),
    ));
    out.push(("MoveOutcome::Moved", body(&MoveOutcome::Moved(figures))));
    out.push((
        "MoveOutcome::Refused",
        body(&MoveOutcome::Refused {
            reason: "no".into(),
        }),
    ));
    for (n, r) in [
        (
            "ControlRequest::Reserve",
            ControlRequest::Reserve { bytes: 4096 },
        ),
        (
            "ControlRequest::Release",
            ControlRequest::Release { bytes: 4096 },
        ),
        ("ControlRequest::DeviceUsed", ControlRequest::DeviceUsed),
        ("ControlRequest::Acquire", ControlRequest::Acquire),
        (
            "ControlRequest::Done",
            ControlRequest::Done { micros: 1500 },
        ),
        (
            "ControlRequest::Renew",
            ControlRequest::Renew { micros: 1500 },
        ),
        (
            "ControlRequest::Swapped",
            ControlRequest::Swapped {
                host: 4096,
                disk: 1500,
            },
        ),
        (
            "ControlRequest::ReserveWaiting",
            ControlRequest::ReserveWaiting { bytes: 4096 },
        ),
        (
            "ControlRequest::Images",
            ControlRequest::Images(ImageCounts {
                received: 1,
                received_bytes: 4096,
                hits: 2,
                hit_bytes: 1500,
                corrupt: 0,
            }),
        ),
    ] {
        out.push((n, body(&r)));
    }
    for (n, c) in [
        (
            "NodeCommand::Evict",
            NodeCommand::Evict {
                bytes: 4096,
                to_disk: true,
            },
        ),
        ("NodeCommand::Migrate", NodeCommand::Migrate { device: 1 }),
        (
            "NodeCommand::MigrateWithFigures",
            NodeCommand::MigrateWithFigures { device: 1 },
        ),
    ] {
        out.push((n, body(&c)));
    }
    out.push((
        "ControlAnswer",
        body(&ControlAnswer {
            ok: true,
            value: 1000,
        }),
    ));
    let mut header = FrameHeader::new(
        FrameKind::Reply,
        FLAG_QUIET,
        0x0102_0304,
        0x1122_3344_5566_7788,
    );
    header.tail = 0x0a0b;
    out.push(("FrameHeader", header.encode().to_vec()));
    // The pool's messages (gpufuse_proto::pool).
    out.push(("SessionKind::NodeAgent", body(&SessionKind::NodeAgent)));
    out.push((
        "ServerHello::Redirect",
        body(&ServerHello::Redirect {
            address: "unix:/n".into(),
            grant: "g".into(),
        }),
    ));
    out.push((
        "ServerHello::PoolStatus",
        body(&ServerHello::PoolStatus(gpufuse_proto::PoolStatus {
            policy: "binpack".into(),
            ..Default::default()
        })),
    ));
    // A claim's session in the pool's status (protocol 12).
    out.push((
        "ServerHello::PoolStatus with a claim's session",
        body(&ServerHello::PoolStatus(gpufuse_proto::PoolStatus {
            policy: "spread".into(),
            sessions: vec![gpufuse_proto::PoolSessionView {
                id: gpufuse_proto::SessionId(2),
                tenant: "ns/c".into(),
                node: Some("a".into()),
                device: Some(1),
                state: "running".into(),
                vram_limit_bytes: Some(1 << 28),
                compute_percent: Some(30),
                qos: "medium".into(),
                memory_used_bytes: 0,
                node_session: Some(gpufuse_proto::SessionId(4)),
                claim: Some("u-1".into()),
            }],
            ..Default::default()
        })),
    ));
    out.push((
        "ServerHello::PoolAgent",
        body(&ServerHello::PoolAgent {
            grant_key: vec![1, 2],
            heartbeat_ms: 1000,
        }),
    ));
    out.push((
        "NodeReport",
        body(&gpufuse_proto::NodeReport {
            name: "a".into(),
            address: "unix:/a".into(),
            labels: [("zone".to_string(), "x".to_string())].into(),
            devices: vec![gpufuse_proto::PoolDeviceReport {
                index: 0,
                model: "m".into(),
                memory_total_bytes: 1 << 30,
                memory_used_bytes: 1 << 20,
                memory_promised_bytes: 1 << 29,
                compute_capability: (10, 0),
                capacity_mtflops: 80_000,
                utilization_percent: 5,
                uuid: [7; 16],
            }],
            sessions: vec![gpufuse_proto::PoolSessionReport {
                pool_session: Some(SessionId(7)),
                node_session: SessionId(3),
                tenant: Some("t".into()),
                device: 0,
                vram_limit_bytes: Some(1 << 29),
                compute_percent: Some(25),
                qos: Qos::High,
                memory_used_bytes: 1 << 20,
                claim: None,
            }],
        }),
    ));
    // A session a pool node admitted on a Kubernetes claim's token (protocol 12).
    out.push((
        "NodeReport with a claim's session",
        body(&gpufuse_proto::NodeReport {
            name: "a".into(),
            address: "unix:/a".into(),
            labels: Default::default(),
            devices: Vec::new(),
            sessions: vec![gpufuse_proto::PoolSessionReport {
                pool_session: None,
                node_session: gpufuse_proto::SessionId(4),
                tenant: Some("ns/c".into()),
                device: 1,
                vram_limit_bytes: Some(1 << 28),
                compute_percent: None,
                qos: Qos::Medium,
                memory_used_bytes: 0,
                claim: Some("u-1".into()),
            }],
        }),
    ));
    out.push(("AgentAnswer::Ack", body(&gpufuse_proto::AgentAnswer::Ack)));
    // Moves between nodes (protocol 10).
    for (n, k) in [
        (
            "SessionKind::MoveIn",
            SessionKind::MoveIn {
                session: SessionId(3),
                device: 1,
                window_base: 4096,
                bytes: 1500,
            },
        ),
        ("SessionKind::Resume", SessionKind::Resume { key: 5 }),
        (
            "SessionKind::MigrateTo",
            SessionKind::MigrateTo {
                session: SessionId(3),
                node: "b".into(),
                device: 1,
                token: "t".into(),
            },
        ),
    ] {
        out.push((n, body(&k)));
    }
    out.push((
        "ServerHello::MovedToNode",
        body(&ServerHello::MovedToNode {
            session: SessionId(3),
            node: "b".into(),
            new_session: SessionId(5),
            device: 1,
            total_us: 4096,
            figures,
        }),
    ));
    out.push((
        "MoveOutcome::MovedAway",
        body(&MoveOutcome::MovedAway {
            session: SessionId(5),
            figures,
        }),
    ));
    for (n, c) in [
        (
            "NodeCommand::MigrateOut",
            NodeCommand::MigrateOut {
                address: "b".into(),
                token: "t".into(),
                device: 1,
                resources: ResourceRequest {
                    vram_bytes: Some(4096),
                    compute_percent: Some(25),
                    tflops: None,
                    qos: Qos::High,
                },
                pid: 42,
                program: "p".into(),
            },
        ),
        ("NodeCommand::Adopt", NodeCommand::Adopt { tcp: true }),
    ] {
        out.push((n, body(&c)));
    }
    for (n, m) in [
        (
            "MoveMessage::Layout",
            MoveMessage::Layout {
                total: 4,
                data: DATA.to_vec(),
            },
        ),
        (
            "MoveMessage::Chunk",
            MoveMessage::Chunk {
                addr: 4096,
                data: Vec::new(),
            },
        ),
        ("MoveMessage::Commit", MoveMessage::Commit(DATA.to_vec())),
        (
            "MoveMessage::Abort",
            MoveMessage::Abort {
                reason: "no".into(),
            },
        ),
        // Forwarded requests after a quiet stop (protocol 11).
        ("MoveMessage::Forward", MoveMessage::Forward(DATA.to_vec())),
        ("MoveMessage::Forwarded", MoveMessage::Forwarded),
        ("MoveMessage::Waiting", MoveMessage::Waiting),
    ] {
        out.push((n, body(&m)));
    }
    out.push(("MoveAck::Ready", body(&MoveAck::Ready { key: 5 })));
    out.push((
        "MoveAck::Refused",
        body(&MoveAck::Refused {
            reason: "no".into(),
        }),
    ));
    out.push((
        "Moved",
        body(&Moved {
            address: "b".into(),
            key: 5,
        }),
    ));
    // Drain and cordon (protocol 11).
    for (n, k) in [
        (
            "SessionKind::Drain",
            SessionKind::Drain { node: "a".into() },
        ),
        (
            "SessionKind::Cordon",
            SessionKind::Cordon {
                node: "a".into(),
                cordoned: true,
            },
        ),
    ] {
        out.push((n, body(&k)));
    }
    out.push((
        "ServerHello::Drained",
        body(&ServerHello::Drained {
            node: "a".into(),
            moved: vec![gpufuse_proto::DrainedSession {
                session: SessionId(3),
                node: "b".into(),
                device: 1,
                total_us: 4096,
                figures,
            }],
            stuck: vec![gpufuse_proto::StuckSession {
                session: SessionId(4),
                reason: "no".into(),
            }],
        }),
    ));
    out.push((
        "ServerHello::Cordoned",
        body(&ServerHello::Cordoned {
            node: "a".into(),
            cordoned: false,
        }),
    ));
    out
}

const OTHERS: &[(&str, &str)] = &[
    ("ReplyBody::None", "00"),
    ("ReplyBody::Ptr", "018020"),
    ("ReplyBody::Pitch", "0280208004"),
    ("ReplyBody::MemInfo", "0380808080048080808008"),
    ("ReplyBody::Data", "0404deadbeef"),
    ("ReplyBody::Elapsed", "050000c03f"),
    ("ReplyBody::NeedImage", "06"),
    ("ReplyBody::Function", "0701000801008010"),
    ("ReplyBody::Global", "08806004"),
    ("ReplyBody::Opened", "0a80208020"),
    ("ReplyBody::Count", "0b18"),
    ("ReplyBody::Launches", "0901016b010101200101000004deadbeef"),
    ("Reply", "0001f80a010904deadbeef0368690a018020"),
    ("ClientHello", "110001742a0170018080808004011e0002"),
    ("SessionKind::Status", "01"),
    ("SessionKind::Check", "02"),
    ("SessionKind::End", "0303"),
    ("SessionKind::Migrate", "050301"),
    ("SessionKind::EndClaim", "06"),
    ("ServerHello::Accepted", "00010100036770750007070707070707070707070707070707808080800401028010"),
    ("ServerHello::Refused", "01026e6f"),
    ("ServerHello::Status", "02000100036770750180808080048080400707070707070707070707070707070709000040003201012a01700105616c6963652b008080400180808080043200011ee8070a640180200001016e0001022f63808080800402802001802002dc0b00"),
    ("ServerHello::Admissible", "0301"),
    ("ServerHello::Ended", "0403"),
    ("ServerHello::Migrated", "080301dc0b8020"),
    ("ServerHello::MigratedWith", "0903018020dc0b02808080800180808080028020"),
    ("ServerHello::ClaimEnded", "0a02"),
    ("MoveOutcome::Moved", "00dc0b02808080800180808080028020"),
    ("MoveOutcome::Refused", "01026e6f"),
    ("ControlRequest::Reserve", "008020"),
    ("ControlRequest::Release", "018020"),
    ("ControlRequest::DeviceUsed", "02"),
    ("ControlRequest::Acquire", "03"),
    ("ControlRequest::Done", "04dc0b"),
    ("ControlRequest::Renew", "05dc0b"),
    ("ControlRequest::Swapped", "068020dc0b"),
    ("ControlRequest::ReserveWaiting", "078020"),
    ("ControlRequest::Images", "0801802002dc0b00"),
    ("NodeCommand::Evict", "00802001"),
    ("NodeCommand::Migrate", "0101"),
    ("NodeCommand::MigrateWithFigures", "0201"),
    ("ControlAnswer", "01e807"),
    ("FrameHeader", "4746555311000401040302010b0a00008877665544332211"),
    ("SessionKind::NodeAgent", "04"),
    ("ServerHello::Redirect", "0507756e69783a2f6e0167"),
    ("ServerHello::PoolStatus", "060762696e7061636b000000"),
    ("ServerHello::PoolStatus with a claim's session", "0606737072656164000102046e732f6301016101010772756e6e696e67018080808001011e066d656469756d0001040103752d3100"),
    ("ServerHello::PoolAgent", "07020102e807"),
    ("NodeReport", "016107756e69783a2f6101047a6f6e6501780100016d808080800480804080808080020a0080f1040507070707070707070707070707070707010107030101740001808080800201190280804000"),
    ("NodeReport with a claim's session", "016107756e69783a2f61000001000401046e732f63010180808080010001000103752d31"),
    ("AgentAnswer::Ack", "00"),
    ("SessionKind::MoveIn", "0703018020dc0b"),
    ("SessionKind::Resume", "0805"),
    ("SessionKind::MigrateTo", "09030162010174"),
    ("ServerHello::MovedToNode", "0b03016205018020dc0b02808080800180808080028020"),
    ("MoveOutcome::MovedAway", "0205dc0b02808080800180808080028020"),
    ("NodeCommand::MigrateOut", "030162017401018020011900022a0170"),
    ("NodeCommand::Adopt", "0401"),
    ("MoveMessage::Layout", "000404deadbeef"),
    ("MoveMessage::Chunk", "01802000"),
    ("MoveMessage::Commit", "0204deadbeef"),
    ("MoveMessage::Abort", "03026e6f"),
    ("MoveMessage::Forward", "0404deadbeef"),
    ("MoveMessage::Forwarded", "05"),
    ("MoveMessage::Waiting", "06"),
    ("MoveAck::Ready", "0005"),
    ("MoveAck::Refused", "01026e6f"),
    ("Moved", "016205"),
    ("SessionKind::Drain", "0a0161"),
    ("SessionKind::Cordon", "0b016101"),
    ("ServerHello::Drained", "0c016101030162018020dc0b028080808001808080800280200104026e6f"),
    ("ServerHello::Cordoned", "0d016100"),
];

#[test]
fn replies_hellos_and_the_header_encode_to_their_golden_bytes() {
    let all = others();
    if std::env::var_os("GOLDEN_PRINT").is_none() {
        assert_eq!(all.len(), OTHERS.len(), "a message without golden bytes");
    }
    for (i, (name, bytes)) in all.iter().enumerate() {
        let want = OTHERS.get(i).map_or("", |w| w.1);
        if std::env::var_os("GOLDEN_PRINT").is_none() {
            assert_eq!(OTHERS[i].0, *name);
        }
        check(name, bytes, want);
    }
}
