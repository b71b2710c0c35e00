//! Moving sessions between devices: the ledger of moves in flight, where a session could
//! go, and the two plans built on them: draining a node (`gpufuse node drain`) and
//! defragmenting the pool (`gpufuse controller --defrag PCT`). The controller carries the
//! moves out with live migration (`docs/migration.md`); this module only decides.
//!
//! A move is charged before it runs: [`Pool::begin_move`] charges the session's slice and
//! share on the target and takes them off its device, and until [`Pool::finish_move`] the
//! session's node's reports do not put it back (the move's outcome settles where it is).
//! Sessions move only to a device of the same model as theirs (a session's device state
//! rebuilds only there), on a ready, uncordoned node that has the labels it asked for.

use std::collections::BTreeSet;

use crate::pool::{Pool, Session, SessionState};
use crate::quota::human_bytes;
use crate::SessionId;

/// A move the pool has charged and not yet settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InFlight {
    pub from_node: String,
    pub from_device: u32,
    /// Its id on the node it leaves (what that node is asked to move).
    pub from_node_session: Option<u64>,
    pub to_node: String,
    pub to_device: u32,
    /// The session stays charged where it is until the move lands, and the target holds a
    /// reservation of `bytes` and `compute` meanwhile (a drain, a defragmentation, an
    /// operator's move: the session's memory is on both devices while it is copied). A
    /// preemption victim's move gives its device away at once instead (the session is
    /// charged at the target already).
    pub holds_source: bool,
    pub bytes: u64,
    pub compute: u32,
}
/// A session to move, from where to where.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Move {
    pub session: SessionId,
    pub from_node: String,
    pub from_device: u32,
    pub to_node: String,
    pub to_device: u32,
    /// What it is charged (its slice, or what it was measured using).
    pub bytes: u64,
}

/// How a charged move ended ([`Pool::finish_move`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveEnd {
    /// It runs at the target now, as the target node's session `node_session`.
    Moved { node_session: u64 },
    /// It stayed where it was, untouched.
    Stayed,
    /// It was ended instead (a preemption victim that could not move).
    Ended,
}

/// What draining a node would do: each session's move, and the sessions that cannot move
/// now, with the reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainPlan {
    pub moves: Vec<Move>,
    pub stuck: Vec<(SessionId, String)>,
}

impl Pool {
    /// Stops (`true`) or allows again (`false`) new sessions on `node`; its sessions keep
    /// running. Returns whether anything changed.
    pub fn cordon(&mut self, node: &str, cordoned: bool) -> Result<bool, String> {
        let n = self.node_index(node)?;
        if self.nodes[n as usize].cordoned == cordoned {
            return Ok(false);
        }
        self.with_node(n, |nd| nd.cordoned = cordoned);
        Ok(true)
    }

    /// The sessions being moved, and where to.
    pub fn moves_in_flight(&self) -> impl Iterator<Item = (SessionId, &InFlight)> {
        self.moving.iter().map(|(id, m)| (*id, m))
    }

    /// Whether session `id` is being moved.
    pub fn is_moving(&self, id: SessionId) -> bool {
        self.moving.contains_key(&id)
    }

    /// Why session `s` cannot move at all, if it cannot.
    pub(crate) fn unmovable(&self, s: &Session) -> Option<String> {
        if s.pinned {
            return Some(format!(
                "session {} is bound to its device (a claim's device)",
                s.id
            ));
        }
        if self.moving.contains_key(&s.id) {
            return Some(format!("session {} is moving already", s.id));
        }
        match (s.state, s.node_session) {
            (SessionState::Running, Some(_)) => None,
            (SessionState::Lost, _) => Some(format!("session {}'s node is lost", s.id)),
            _ => Some(format!("session {} has not started on its node yet", s.id)),
        }
    }

    /// Charges a move of session `id` to device `device` of node `node`: the target holds
    /// its slice and share until the move lands, and its own device keeps them too
    /// (`holds_source`), or gives them up at once (a preemption's victim: then the move
    /// cannot stay, only land or end). Refused, nothing changed, when it cannot move or does
    /// not fit.
    pub fn begin_move(
        &mut self,
        id: SessionId,
        node: &str,
        device: u32,
        holds_source: bool,
    ) -> Result<(), String> {
        let s = self
            .session(id)
            .cloned()
            .ok_or_else(|| format!("there is no session {id} in the pool"))?;
        if let Some(why) = self.unmovable(&s) {
            return Err(why);
        }
        if s.node == node && s.device == device {
            return Err(format!(
                "session {id} is on device {device} of node {node} already"
            ));
        }
        let (bytes, compute) = (s.memory_charge(), s.compute_percent.unwrap_or(0));
        if holds_source {
            self.room_for(node, device, bytes, compute, id)?;
            self.hold(node, device, bytes, compute, true);
        } else {
            self.relocate(id, node, device, None)?;
        }
        self.moving.insert(
            id,
            InFlight {
                from_node: s.node.clone(),
                from_device: s.device,
                from_node_session: s.node_session,
                to_node: node.to_string(),
                to_device: device,
                holds_source,
                bytes,
                compute,
            },
        );
        Ok(())
    }

    /// Settles a move [`Pool::begin_move`] charged. A move that gave its device away cannot
    /// stay: [`MoveEnd::Stayed`] ends it in the ledger as [`MoveEnd::Ended`] does (its caller
    /// ends it on its node).
    pub fn finish_move(&mut self, id: SessionId, end: MoveEnd) {
        let Some(m) = self.moving.remove(&id) else {
            return;
        };
        if m.holds_source {
            self.hold(&m.to_node, m.to_device, m.bytes, m.compute, false);
        }
        let Some(s) = self.session(id).cloned() else {
            return; // it ended meanwhile
        };
        match end {
            MoveEnd::Moved { node_session } => {
                let ready = self
                    .node(&m.to_node)
                    .is_some_and(|n| n.state == crate::NodeState::Ready);
                self.put(Session {
                    node: m.to_node,
                    device: m.to_device,
                    node_session: Some(node_session),
                    state: if ready {
                        SessionState::Running
                    } else {
                        SessionState::Lost
                    },
                    ..s
                })
            }
            MoveEnd::Stayed if m.holds_source => {}
            MoveEnd::Stayed | MoveEnd::Ended => {
                self.end_session(id);
            }
        }
    }

    /// Why device `device` of `node` cannot take `bytes` and `compute` more for session
    /// `id`, if it cannot.
    fn room_for(
        &self,
        node: &str,
        device: u32,
        bytes: u64,
        compute: u32,
        id: SessionId,
    ) -> Result<(), String> {
        let nd = &self.nodes[self.node_index(node)? as usize];
        if !nd.placeable() {
            return Err(format!("node {node} is not ready or is cordoned"));
        }
        let p = nd
            .position_of(device)
            .ok_or_else(|| format!("node {node} has no device {device}"))?;
        nd.devices[p].room_for(node, id, bytes, compute)
    }

    /// Charges (`add`) or gives back a move's reservation of `bytes` and `compute` on device
    /// `device` of `node`, the indexes kept right.
    fn hold(&mut self, node: &str, device: u32, bytes: u64, compute: u32, add: bool) {
        let Ok(n) = self.node_index(node) else {
            return;
        };
        let Some(p) = self.nodes[n as usize].position_of(device) else {
            return;
        };
        self.with_node(n, |nd| {
            let d = &mut nd.devices[p];
            if add {
                d.charged_memory += bytes;
                d.charged_compute += compute;
            } else {
                d.charged_memory = d.charged_memory.saturating_sub(bytes);
                d.charged_compute = d.charged_compute.saturating_sub(compute);
            }
        });
    }

    /// Charges node `n`'s devices again with the moves they receive (after its ledgers were
    /// rebuilt).
    pub(crate) fn reserve_moves_to(&mut self, n: u32) {
        let name = self.nodes[n as usize].spec.name.clone();
        let held: Vec<(u32, u64, u32)> = self
            .moving
            .values()
            .filter(|m| m.holds_source && m.to_node == name)
            .map(|m| (m.to_device, m.bytes, m.compute))
            .collect();
        for (device, bytes, compute) in held {
            self.hold(&name, device, bytes, compute, true);
        }
    }

    /// The reservations moves hold on device `device` of `node`: (bytes, percent).
    pub(crate) fn reserved_on(&self, node: &str, device: u32) -> (u64, u32) {
        self.moving
            .values()
            .filter(|m| m.holds_source && m.to_node == node && m.to_device == device)
            .fold((0, 0), |(b, c), m| (b + m.bytes, c + m.compute))
    }

    /// Where session `id` would go if it moved now: the device of the same model, on
    /// another ready, uncordoned node with its labels or another device of its own, that
    /// holds it with the least room to spare (moves pack).
    pub fn move_target(&self, id: SessionId) -> Result<(String, u32), String> {
        let s = self
            .session(id)
            .ok_or_else(|| format!("there is no session {id} in the pool"))?;
        if let Some(why) = self.unmovable(s) {
            return Err(why);
        }
        let (n, p) = self
            .target_for(s, &|_, _| false)
            .ok_or_else(|| self.why_nowhere(s))?;
        let node = &self.nodes[n as usize];
        Ok((node.spec.name.clone(), node.devices[p].spec.index))
    }

    fn why_nowhere(&self, s: &Session) -> String {
        format!(
            "no other device of its model has {} and {}% compute unpromised{}",
            human_bytes(s.memory_charge()),
            s.compute_percent.unwrap_or(0),
            if s.selector.is_empty() {
                String::new()
            } else {
                " on a node with its labels".into()
            }
        )
    }

    /// The best-fitting device for `s` other than its own and those `skip` names (node,
    /// device position).
    pub(crate) fn target_for(
        &self,
        s: &Session,
        skip: &dyn Fn(u32, usize) -> bool,
    ) -> Option<(u32, usize)> {
        let here = self.node_index(&s.node).ok();
        let model = here.and_then(|n| {
            let nd = &self.nodes[n as usize];
            nd.devices
                .iter()
                .find(|d| d.spec.index == s.device)
                .map(|d| d.spec.model.clone())
        })?;
        let need = s.memory_charge().max(1);
        let comp = s.compute_percent.unwrap_or(0);
        self.devices_from(need).find(|&(n, p)| {
            let node = &self.nodes[n as usize];
            let d = &node.devices[p];
            let own = Some(n) == here && d.spec.index == s.device;
            !own && !skip(n, p)
                && d.spec.model == model
                && d.free_compute() >= comp
                && s.selector
                    .iter()
                    .all(|(k, v)| node.spec.labels.get(k) == Some(v))
        })
    }

    /// Everything that must move to empty `node`, and where each would go now (the plan
    /// `gpufuse node drain` carries out, moving the largest first), as if it were cordoned.
    pub fn plan_drain(&self, node: &str) -> Result<DrainPlan, String> {
        let mut sim = self.clone();
        sim.cordon(node, true)?;
        let mut on: Vec<Session> = sim.sessions().filter(|s| s.node == node).cloned().collect();
        on.sort_by_key(|s| (std::cmp::Reverse(s.memory_charge()), s.id));
        let mut plan = DrainPlan::default();
        for s in on {
            if let Some(why) = sim.unmovable(&s) {
                plan.stuck.push((s.id, why));
                continue;
            }
            match sim.target_for(&s, &|_, _| false) {
                Some((n, p)) => {
                    let m = sim.move_of(&s, n, p);
                    sim.put(Session {
                        node: m.to_node.clone(),
                        device: m.to_device,
                        ..s
                    });
                    plan.moves.push(m);
                }
                None => plan.stuck.push((s.id, sim.why_nowhere(&s))),
            }
        }
        Ok(plan)
    }

    pub(crate) fn move_of(&self, s: &Session, n: u32, p: usize) -> Move {
        let node = &self.nodes[n as usize];
        Move {
            session: s.id,
            from_node: s.node.clone(),
            from_device: s.device,
            to_node: node.spec.name.clone(),
            to_device: node.devices[p].spec.index,
            bytes: s.memory_charge(),
        }
    }

    /// A defragmentation round: the moves that empty whole devices. Devices whose promised
    /// memory is under `threshold_percent` of their total are emptied, least promised first,
    /// when every one of their sessions fits elsewhere (all or none: a device half emptied
    /// frees nothing). Sessions go to the best-fitting device of their model, never to one
    /// this round empties, and a device that receives is never emptied in the same round, so
    /// no session moves twice. Pure: nothing changes.
    pub fn plan_defrag(&self, threshold_percent: u32) -> Vec<Move> {
        let mut sim = self.clone();
        let mut candidates: Vec<(u64, usize, u32, usize)> = Vec::new();
        for (n, node) in sim.nodes.iter().enumerate() {
            if !node.placeable() {
                continue;
            }
            for (p, d) in node.devices.iter().enumerate() {
                let total = d.spec.memory_total.max(1);
                let busy = d.charged_memory.saturating_mul(100) / total;
                if !d.sessions.is_empty() && busy < u64::from(threshold_percent) {
                    candidates.push((d.charged_memory, d.sessions.len(), n as u32, p));
                }
            }
        }
        candidates.sort_unstable();
        let mut emptied: BTreeSet<(u32, usize)> = BTreeSet::new();
        let mut receivers: BTreeSet<(u32, usize)> = BTreeSet::new();
        let mut plan = Vec::new();
        for &(_, _, n, p) in &candidates {
            if receivers.contains(&(n, p)) {
                continue;
            }
            let ids = sim.nodes[n as usize].devices[p].sessions.clone();
            let mut trial = sim.clone();
            let mut moves = Vec::new();
            let mut got = Vec::new();
            let all_moved = ids.iter().all(|id| {
                let Some(s) = trial.session(*id).cloned() else {
                    return false;
                };
                if trial.unmovable(&s).is_some() {
                    return false;
                }
                let skip = |tn: u32, tp: usize| (tn, tp) == (n, p) || emptied.contains(&(tn, tp));
                match trial.target_for(&s, &skip) {
                    Some((tn, tp)) => {
                        let m = trial.move_of(&s, tn, tp);
                        trial.put(Session {
                            node: m.to_node.clone(),
                            device: m.to_device,
                            ..s
                        });
                        got.push((tn, tp));
                        moves.push(m);
                        true
                    }
                    None => false,
                }
            });
            if all_moved && !moves.is_empty() {
                sim = trial;
                emptied.insert((n, p));
                receivers.extend(got);
                plan.extend(moves);
            }
        }
        plan
    }

    /// Whether the pool's ledger of moves agrees with its sessions.
    pub(crate) fn check_moves(&self) -> Result<(), String> {
        for (id, m) in &self.moving {
            let s = self
                .session(*id)
                .ok_or_else(|| format!("session {id} is moving but not in the pool"))?;
            let at_target = s.node == m.to_node && s.device == m.to_device;
            if at_target == m.holds_source {
                return Err(format!(
                    "session {id} is moving to {}/{} (holding its source: {}) but charged on {}/{}",
                    m.to_node, m.to_device, m.holds_source, s.node, s.device
                ));
            }
        }
        Ok(())
    }
}
