//! A session's books as they travel with a move between nodes: the worker's own tables (the
//! slice and what is charged, allocations and VMM books, module and function handles,
//! contexts, streams, events, texture handles, graphs the worker keeps) and what the client
//! has not been told yet (the
//! deferred error, the sticky fault, staged device-to-host copies, device `printf` output).
//! The device's state (memory, modules, VMM mappings, textures) travels separately as a
//! [`gpufuse_device::DeviceImage`]; the two together are the session.
//!
//! Encoded as `MAGIC`, a version (u32, little-endian), then postcard, like the device image
//! (`docs/state-capture.md`); another version is refused by name.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gpufuse_proto::{StagedCopy, Status, TexObjectDesc};
use serde::{Deserialize, Serialize};

use crate::Session;

const MAGIC: [u8; 8] = *b"GFBOOKS\0";
/// 2: graphs the worker keeps (`GraphDefine`, protocol 17).
const VERSION: u32 = 2;

/// See the module docs. Maps travel as sorted lists (stable bytes for the same books).
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SessionBooks {
    limit: Option<u64>,
    used: u64,
    allocations: Vec<(u64, u64)>,
    vmm_physical: Vec<(u64, (u64, u64))>,
    vmm_reserved: Vec<(u64, u64)>,
    vmm_mapped: Vec<(u64, u64)>,
    /// An image arriving in parts when the session stopped: its hash and the bytes so far.
    partial_image: Option<([u8; 32], Vec<u8>)>,
    /// Client module handle -> device module id (the device image keeps the ids).
    modules: Vec<(u64, u64)>,
    /// Client function handle -> client module handle, kernel name.
    functions: Vec<(u64, u64, String)>,
    contexts: Vec<u64>,
    streams: Vec<u64>,
    /// Event handle -> microseconds between its last record and the capture (`None`: never
    /// recorded). Elapsed times between events survive the move exactly.
    events: Vec<(u64, Option<u64>)>,
    device_time_us: u64,
    textures: Vec<(u64, TexObjectDesc)>,
    deferred: Option<Status>,
    sticky: Option<Status>,
    staged: Vec<StagedCopy>,
    output: Vec<u8>,
    /// Graphs the worker keeps: id -> nodes (made the device's own again where it lands).
    graphs: Vec<(u64, Vec<gpufuse_proto::GraphNode>)>,
}

fn sorted<K: Ord + Copy, V: Clone>(m: &HashMap<K, V>) -> Vec<(K, V)> {
    let mut v: Vec<(K, V)> = m.iter().map(|(k, v)| (*k, v.clone())).collect();
    v.sort_by_key(|(k, _)| *k);
    v
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl SessionBooks {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&VERSION.to_le_bytes());
        // Encoding plain data into a Vec cannot fail.
        out.extend_from_slice(&postcard::to_stdvec(self).unwrap_or_default());
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        let rest = bytes
            .strip_prefix(&MAGIC)
            .ok_or("the session's books are not a gpufuse books image")?;
        let (version, body) = rest
            .split_at_checked(4)
            .ok_or("the session's books are truncated")?;
        let version = u32::from_le_bytes(version.try_into().map_err(|_| "truncated books")?);
        if version != VERSION {
            return Err(format!(
                "the session's books are version {version}; this worker reads version {VERSION}"
            ));
        }
        postcard::from_bytes(body).map_err(|e| format!("the session's books do not decode: {e}"))
    }
}

impl Session<'_> {
    /// The session's books as they are now ([`SessionBooks`]); nothing changes here, so a
    /// move that fails after this leaves the session as it was. Device output not yet handed
    /// over is kept with the session first.
    pub(crate) fn books_for_move(&mut self) -> SessionBooks {
        let pending = self.device.take_output();
        self.carried_output.extend_from_slice(&pending);
        let mut functions: Vec<(u64, u64, String)> = self
            .modules
            .functions
            .iter()
            .map(|(&f, (m, name))| (f, *m, name.to_string()))
            .collect();
        functions.sort_by_key(|f| f.0);
        let mut contexts: Vec<u64> = self.sync.contexts.iter().copied().collect();
        contexts.sort_unstable();
        let mut streams: Vec<u64> = self.sync.streams.iter().copied().collect();
        streams.sort_unstable();
        let events: Vec<(u64, Option<u64>)> = self
            .event_ages()
            .into_iter()
            .map(|(e, age)| (e, age.map(micros)))
            .collect();
        SessionBooks {
            limit: self.memory.limit,
            used: self.memory.used,
            allocations: sorted(&self.memory.allocations),
            vmm_physical: sorted(&self.memory.vmm.physical),
            vmm_reserved: sorted(&self.memory.vmm.reserved),
            vmm_mapped: sorted(&self.memory.vmm.mapped),
            partial_image: self.modules.partial_image.clone(),
            modules: sorted(&self.modules.modules),
            functions,
            contexts,
            streams,
            events,
            device_time_us: micros(self.launch.device_time),
            textures: sorted(&self.textures),
            deferred: self.deferred,
            sticky: self.sticky,
            staged: self.staged.clone(),
            output: self.carried_output.clone(),
            graphs: self.graphs_for_move(),
        }
    }

    /// Takes over a session from its books, on a device already rebuilt from its image. The
    /// slice is this worker's own (the node admitted the session with it); the bytes the
    /// books charge are reserved in this node's ledger, or the session is refused.
    pub(crate) fn adopt_books(&mut self, b: SessionBooks) -> Result<(), String> {
        if b.limit != self.memory.limit {
            return Err(format!(
                "the session's slice is {:?} bytes where it was and {:?} here",
                b.limit, self.memory.limit
            ));
        }
        if b.used > 0 && !self.ledger.reserve(b.used) {
            return Err(format!(
                "this device cannot hold the session's {} bytes",
                b.used
            ));
        }
        self.memory.used = b.used;
        self.memory.allocations = b.allocations.into_iter().collect();
        self.memory.vmm.physical = b.vmm_physical.into_iter().collect();
        self.memory.vmm.reserved = b.vmm_reserved.into_iter().collect();
        self.memory.vmm.mapped = b.vmm_mapped.into_iter().collect();
        self.modules.partial_image = b.partial_image;
        self.modules.modules = b.modules.into_iter().collect();
        self.modules.functions = b
            .functions
            .into_iter()
            .map(|(f, m, name)| (f, (m, Arc::from(name))))
            .collect();
        self.sync.contexts = b.contexts.into_iter().collect();
        self.sync.streams = b.streams.into_iter().collect();
        let ages: Vec<(u64, Option<Duration>)> = b
            .events
            .into_iter()
            .map(|(e, ago)| (e, ago.map(Duration::from_micros)))
            .collect();
        self.adopt_graphs(b.graphs);
        self.rebuild_sync(&ages);
        self.launch.device_time = Duration::from_micros(b.device_time_us);
        self.textures = b.textures.into_iter().collect();
        self.deferred = b.deferred;
        self.sticky = b.sticky;
        self.staged = b.staged;
        self.carried_output = b.output;
        Ok(())
    }

    /// After the session was handed to another node: what it left here goes (the device
    /// output it carried is the other node's to deliver now).
    pub(crate) fn forget_moved(&mut self) {
        self.carried_output.clear();
        self.deferred = None;
        self.staged.clear();
        self.sticky = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn books_round_trip_and_another_version_is_refused_by_name() {
        let books = SessionBooks {
            limit: Some(1 << 30),
            used: 4096,
            allocations: vec![(0x1000, 4096)],
            modules: vec![(7, 1)],
            functions: vec![(9, 7, "k".into())],
            contexts: vec![1],
            streams: vec![2, 3],
            events: vec![(4, Some(1500)), (5, None)],
            deferred: Some(700),
            output: b"hello\n".to_vec(),
            graphs: vec![(
                12,
                vec![gpufuse_proto::GraphNode::Memset {
                    dst: gpufuse_proto::DevicePtr(0x1000),
                    value: 1,
                    elem_size: 4,
                    count: 8,
                }],
            )],
            ..Default::default()
        };
        let bytes = books.encode();
        assert_eq!(SessionBooks::decode(&bytes).unwrap(), books);
        let mut other = bytes.clone();
        other[8] = 1;
        let e = SessionBooks::decode(&other).unwrap_err();
        assert!(e.contains("version 1"), "{e}");
        assert!(SessionBooks::decode(b"GFSTATE\0....").is_err());
        assert!(SessionBooks::decode(&bytes[..10]).is_err());
    }
}
