//! Elastic sessions on the node: VRAM oversubscription (a device promises more than it holds;
//! when it runs short, idle sessions are asked to move memory to host memory or disk, least
//! recently active first), the idle TTLs its workers apply by themselves (scale to zero), and
//! moving a session to another device of the node (`gpufuse migrate`).
//!
//! The node reaches a worker through its command socket ([`NodeCommand`]); a worker answers
//! between requests, so a session running a kernel is never interrupted: the node waits for it
//! (bounded) or asks another.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpufuse_proto::{
    decode_owned, encode_frame, ControlAnswer, FrameKind, MoveOutcome, NodeCommand, ServerHello,
};
use gpufuse_transport::Conn;

use crate::{lock, NodeConfig, Shared, TokenPolicy};
use gpufuse_proto::SessionId;

/// `gpufuse serve --vram-oversubscribe`, `--swap-dir`, `--idle-ttl`, `--idle-disk-ttl`.
#[derive(Clone, Debug, Default)]
pub struct ElasticOptions {
    /// How much more than a device's memory may be promised, held in host memory (percent of
    /// the device's memory).
    pub host_percent: u32,
    /// ... and on disk (needs `swap_dir`).
    pub disk_percent: u32,
    pub swap_dir: Option<PathBuf>,
    pub idle_ttl: Option<Duration>,
    pub idle_disk_ttl: Option<Duration>,
}

impl ElasticOptions {
    /// Parses `host=PCT[,disk=PCT]`.
    pub fn parse_oversubscribe(&mut self, s: &str) -> Result<(), String> {
        let bad = || format!("bad --vram-oversubscribe {s:?}: expected host=PCT[,disk=PCT]");
        for part in s.split(',') {
            let (k, v) = part.split_once('=').ok_or_else(bad)?;
            let v: u32 = v.trim().trim_end_matches('%').parse().map_err(|_| bad())?;
            if v > 10_000 {
                return Err(bad());
            }
            match k.trim() {
                "host" => self.host_percent = v,
                "disk" => self.disk_percent = v,
                _ => return Err(bad()),
            }
        }
        Ok(())
    }

    /// Whether a device may be promised more than it holds.
    pub fn oversubscribes(&self) -> bool {
        self.host_percent > 0 || self.disk_percent > 0
    }

    /// What may be promised on a device of `total` bytes.
    pub fn capacity(&self, total: u64) -> u64 {
        let pct = 100 + u128::from(self.host_percent) + u128::from(self.disk_percent);
        u64::try_from(u128::from(total) * pct / 100).unwrap_or(u64::MAX)
    }

    /// Host memory that may hold a device's evicted bytes.
    pub fn host_budget(&self, total: u64) -> u64 {
        u64::try_from(u128::from(total) * u128::from(self.host_percent) / 100).unwrap_or(u64::MAX)
    }
}

/// Parses a duration: `500ms`, `30s`, `5m`, `2h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("bad duration {s:?}: expected e.g. 500ms, 30s, 5m or 2h"))?;
    Ok(match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => {
            return Err(format!(
                "bad duration {s:?}: expected e.g. 500ms, 30s, 5m or 2h"
            ))
        }
    })
}

/// The node's line to one worker: its command socket.
#[derive(Clone)]
pub struct CommandLine(Arc<Mutex<(Conn, u64)>>);

impl std::fmt::Debug for CommandLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommandLine")
    }
}

impl CommandLine {
    pub fn new(stream: std::os::unix::net::UnixStream) -> Self {
        Self(Arc::new(Mutex::new((
            Conn::new(gpufuse_transport::Stream::Unix(stream)),
            1,
        ))))
    }

    /// Sends `cmd` and waits up to `timeout` for the answer; `None` if the worker is gone,
    /// busy past the deadline, or answered nonsense (the line is then unusable for this
    /// command's answer: a late answer is skipped by its id next time).
    pub fn ask(&self, cmd: NodeCommand, timeout: Duration) -> Option<ControlAnswer> {
        self.exchange(cmd, timeout, |body| decode_owned(body).ok())
    }

    /// [`CommandLine::ask`] for `MigrateWithFigures`, answered by a [`MoveOutcome`].
    pub fn ask_move(&self, device: u32, timeout: Duration) -> Option<MoveOutcome> {
        self.exchange(
            NodeCommand::MigrateWithFigures { device },
            timeout,
            |body| decode_owned(body).ok(),
        )
    }

    /// [`CommandLine::ask`] for `MigrateOut`, answered by a [`MoveOutcome`].
    pub fn ask_move_out(&self, cmd: NodeCommand, timeout: Duration) -> Option<MoveOutcome> {
        self.exchange(cmd, timeout, |body| decode_owned(body).ok())
    }

    /// Hands the worker of an incoming session its client's connection (`Adopt`, with the
    /// descriptor attached).
    pub fn hand_over(
        &self,
        fd: std::os::fd::OwnedFd,
        tcp: bool,
        timeout: Duration,
    ) -> Option<ControlAnswer> {
        self.exchange_with_fd(NodeCommand::Adopt { tcp }, Some(fd), timeout, |body| {
            decode_owned(body).ok()
        })
    }

    fn exchange<T>(
        &self,
        cmd: NodeCommand,
        timeout: Duration,
        decode: impl Fn(&[u8]) -> Option<T>,
    ) -> Option<T> {
        self.exchange_with_fd(cmd, None, timeout, decode)
    }

    fn exchange_with_fd<T>(
        &self,
        cmd: NodeCommand,
        fd: Option<std::os::fd::OwnedFd>,
        timeout: Duration,
        decode: impl Fn(&[u8]) -> Option<T>,
    ) -> Option<T> {
        use std::os::fd::AsFd;
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (conn, next) = &mut *g;
        let id = *next;
        *next += 1;
        let mut out = Vec::new();
        encode_frame(&mut out, FrameKind::Control, 0, id, &cmd);
        match &fd {
            Some(fd) => conn.send_with_fds(&out, &[fd.as_fd()]).ok()?,
            None => conn.send(&out).ok()?,
        }
        drop(fd);
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let _ = conn
                .stream()
                .set_read_timeout(Some(left.max(Duration::from_millis(1))));
            let (h, body) = conn.recv().ok()?;
            if h.kind == FrameKind::ControlReply && h.request_id == id {
                return decode(body);
            }
            // An answer to an earlier command that timed out: skipped.
        }
    }
}

/// What the node keeps per session for elastic use.
#[derive(Clone, Debug)]
pub struct SessionElastic {
    /// The worker's command socket.
    pub commands: Option<CommandLine>,
    /// Bytes of the session's memory in host memory and on disk (the worker's reports).
    pub swapped_host: u64,
    pub swapped_disk: u64,
    /// The last time the session's worker talked to the node (least recently active sessions
    /// are evicted first).
    pub last_active: Instant,
    /// The session is waiting for room itself (never a victim then: it cannot answer).
    pub waiting: bool,
    /// A session moved here from another node whose client has not resumed it yet: the
    /// one-time key its `Resume` hello brings (`spawn::resume`).
    pub incoming_key: Option<u64>,
}

impl Default for SessionElastic {
    fn default() -> Self {
        Self {
            commands: None,
            swapped_host: 0,
            swapped_disk: 0,
            last_active: Instant::now(),
            waiting: false,
            incoming_key: None,
        }
    }
}

/// Whether the asker may manage session `id` (move it): on a node that checks tokens, only a
/// token of the session's own tenant may.
pub fn may_manage(
    state: &Shared,
    config: &NodeConfig,
    id: u64,
    claims: Option<&gpufuse_auth::Claims>,
) -> Result<(), String> {
    let s = lock(state);
    let rec = s
        .sessions
        .get(&id)
        .ok_or_else(|| format!("there is no session {id}"))?;
    if let (TokenPolicy::Verify(_), Some(c)) = (&config.tokens, claims) {
        if rec.subject.as_deref() != Some(c.subject.as_str()) {
            return Err(format!(
                "session {id} belongs to another tenant; a token for {:?} may manage only its \
                 own sessions",
                c.subject
            ));
        }
    }
    Ok(())
}

/// How long the node waits for one victim to answer an eviction.
const EVICT_WAIT: Duration = Duration::from_secs(10);
/// How long a session that holds nothing waits for room.
const ROOM_WAIT: Duration = Duration::from_secs(60);
/// How long a move may take before the node gives up on its answer.
const MIGRATE_WAIT: Duration = Duration::from_secs(300);

/// Moves session `id` to device `device` of the node at `address` (`token`: the hello token
/// there, a controller's grant in a pool): the worker copies the session there while it runs
/// and hands it over at its client's next synchronous call (`gpufuse_worker`'s `remote.rs`).
/// A refusal leaves the session where it was. Once it moved, the session's books here are
/// released at once; its worker ends when the client has gone to the other node.
/// Why session `id` may not leave its device: a Kubernetes claim's session runs only on the
/// device allocated to the claim (`claims.rs`), and its token opens nothing elsewhere.
fn bound_to_device(id: u64, rec: &crate::SessionRecord) -> Option<String> {
    rec.claim.as_ref().map(|uid| {
        format!("session {id} runs under Kubernetes claim {uid} and is bound to its device")
    })
}

pub fn migrate_out(
    state: &Shared,
    id: u64,
    address: &str,
    device: u32,
    token: &str,
) -> ServerHello {
    let refused = |reason: String| ServerHello::Refused { reason };
    let started = Instant::now();
    let (line, cmd, source) = {
        let s = lock(state);
        let Some(rec) = s.sessions.get(&id) else {
            return refused(format!("there is no session {id}"));
        };
        if let Some(why) = bound_to_device(id, rec) {
            return refused(why);
        }
        if rec.elastic.incoming_key.is_some() {
            return refused(format!(
                "session {id} is still arriving from another node (its client has not resumed it)"
            ));
        }
        let Some(line) = rec.elastic.commands.clone() else {
            return refused(format!("session {id}'s worker takes no commands"));
        };
        let cmd = NodeCommand::MigrateOut {
            address: address.to_string(),
            token: token.to_string(),
            device,
            resources: gpufuse_proto::ResourceRequest {
                vram_bytes: rec.limit,
                compute_percent: rec.compute,
                tflops: None,
                qos: rec.qos,
            },
            pid: rec.pid,
            program: rec.program.clone(),
        };
        (line, cmd, rec.device)
    };
    match line.ask_move_out(cmd, MIGRATE_WAIT) {
        Some(MoveOutcome::MovedAway {
            session: SessionId(session),
            figures,
        }) => {
            tracing::info!(
                session = id,
                to = address,
                device,
                new_session = session,
                stop_us = figures.stop_us,
                rounds = figures.rounds,
                stop_bytes = figures.stop_bytes,
                "session moved to another node"
            );
            // It is the other node's now: its slice, share and place in the launch queue go
            // back here at once (its worker stays only to send its client on, holding no
            // device memory), and this node stops reporting it to a controller.
            lock(state).end_session(id);
            ServerHello::MovedToNode {
                session: SessionId(id),
                node: address.to_string(),
                new_session: SessionId(session),
                device,
                total_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
                figures,
            }
        }
        Some(MoveOutcome::Refused { reason }) => refused(format!(
            "session {id} cannot move: {reason}; it stays on device {source}"
        )),
        Some(MoveOutcome::Moved(_)) | None if !lock(state).sessions.contains_key(&id) => {
            refused(format!("session {id} ended before the move could finish"))
        }
        Some(MoveOutcome::Moved(_)) | None => refused(format!(
            "session {id}'s worker did not answer the move; it stays on device {source}"
        )),
    }
}

/// Session `id` needs `bytes` more on its device than is free: asks other sessions of the
/// device, least recently active first and never one running a kernel, to move memory out.
/// Returns when there is room, or when no session can give any: at once, or with `wait` (the
/// session holds no device memory itself) after other sessions had [`ROOM_WAIT`] to finish
/// what they are doing.
pub fn make_room(state: &Shared, id: u64, bytes: u64, wait: bool) {
    let mut asked: Vec<u64> = Vec::new();
    let deadline = Instant::now() + ROOM_WAIT;
    let Some(device) = lock(state).sessions.get(&id).map(|r| r.device) else {
        return;
    };
    set_waiting(state, id, true);
    loop {
        let (victim, line, need, to_disk) = {
            let s = lock(state);
            let Some(d) = s.devices.get(device as usize) else {
                break;
            };
            let free = d.total.saturating_sub(d.used);
            if free >= bytes {
                break;
            }
            let need = bytes - free;
            let queue = s.queues.get(device as usize).cloned();
            let victim = s
                .sessions
                .iter()
                .filter(|(&v, r)| {
                    v != id
                        && r.device == device
                        && r.used > 0
                        && !r.elastic.waiting
                        && r.elastic.commands.is_some()
                        && !asked.contains(&v)
                        && !queue.as_ref().is_some_and(|q| q.usage(v).1)
                })
                .min_by_key(|(_, r)| r.elastic.last_active)
                .map(|(&v, r)| (v, r.elastic.commands.clone()));
            let Some((victim, Some(line))) = victim else {
                if wait && Instant::now() < deadline {
                    // Others are busy or waiting themselves: they answer, or give their memory
                    // up, when their request ends.
                    drop(s);
                    std::thread::sleep(Duration::from_millis(10));
                    asked.clear();
                    continue;
                }
                break;
            };
            // Host memory first, up to its budget; then disk.
            let in_host: u64 = s
                .sessions
                .values()
                .filter(|r| r.device == device)
                .map(|r| r.elastic.swapped_host)
                .sum();
            let budget = s.elastic.host_budget(d.total);
            let to_disk = s.elastic.swap_dir.is_some() && in_host.saturating_add(need) > budget;
            (victim, line, need, to_disk)
        };
        asked.push(victim);
        match line.ask(
            NodeCommand::Evict {
                bytes: need,
                to_disk,
            },
            EVICT_WAIT,
        ) {
            Some(a) => tracing::debug!(
                session = id,
                victim,
                need,
                released = a.value,
                to_disk,
                "made room"
            ),
            None => tracing::warn!(victim, "session did not answer an eviction in time"),
        }
    }
    set_waiting(state, id, false);
}

fn set_waiting(state: &Shared, id: u64, waiting: bool) {
    if let Some(r) = lock(state).sessions.get_mut(&id) {
        r.elastic.waiting = waiting;
    }
}

/// Moves session `id` to the node's device `target`: the target must hold its memory, slice
/// and compute share; the worker rebuilds the session there; then the books move. A refusal
/// leaves the session where it was.
pub fn migrate(state: &Shared, id: u64, target: u32) -> ServerHello {
    let refused = |reason: String| ServerHello::Refused { reason };
    let started = Instant::now();
    let (line, source, bytes) = {
        let s = lock(state);
        let Some(rec) = s.sessions.get(&id) else {
            return refused(format!("there is no session {id}"));
        };
        if let Some(why) = bound_to_device(id, rec) {
            return refused(why);
        }
        let Some(d) = s.devices.get(target as usize) else {
            return refused(format!(
                "device {target} does not exist (the node has {})",
                s.devices.len()
            ));
        };
        if rec.device == target {
            return refused(format!("session {id} already runs on device {target}"));
        }
        let Some(line) = rec.elastic.commands.clone() else {
            return refused(format!("session {id}'s worker takes no commands"));
        };
        let bytes = rec.used + rec.elastic.swapped_host + rec.elastic.swapped_disk;
        if d.used.saturating_add(bytes) > d.total {
            return refused(format!(
                "device {target} has {} free; session {id} holds {}",
                crate::admin::human_bytes(d.total.saturating_sub(d.used)),
                crate::admin::human_bytes(bytes)
            ));
        }
        if let Some(l) = rec.limit {
            if d.promised.saturating_add(l) > s.elastic.capacity(d.total) {
                return refused(format!(
                    "device {target} cannot promise session {id}'s slice of {}",
                    crate::admin::human_bytes(l)
                ));
            }
        }
        if let (Some(c), Some(q)) = (rec.compute, s.queues.get(target as usize)) {
            let promised = q.lock().promised_percent();
            if promised + c > 100 {
                return refused(format!(
                    "device {target} cannot grant session {id}'s {c}% compute share ({promised}% is promised)"
                ));
            }
        }
        (line, rec.device, bytes)
    };
    // The worker copies the session's memory to the target while it runs (pre-copy), then
    // stops between requests, copies what is still dirty and switches.
    let answer = line.ask_move(target, MIGRATE_WAIT);
    let figures = match answer {
        Some(MoveOutcome::Moved(f)) => f,
        Some(MoveOutcome::Refused { reason }) => {
            return refused(format!(
                "session {id} cannot move: {reason}; it stays on device {source}"
            ))
        }
        Some(MoveOutcome::MovedAway { .. }) | None => {
            return refused(format!(
                "session {id}'s worker did not answer the move; it stays on device {source}"
            ))
        }
    };
    // The books move with the session: memory, slice, place and share in the launch queue.
    let mut s = lock(state);
    let Some(rec) = s.sessions.get(&id).cloned() else {
        return refused(format!("session {id} ended while it moved"));
    };
    if let Some(d) = s.devices.get_mut(source as usize) {
        d.used = d.used.saturating_sub(rec.used);
        if let Some(l) = rec.limit {
            d.promised = d.promised.saturating_sub(l);
        }
    }
    if let Some(d) = s.devices.get_mut(target as usize) {
        d.used = d.used.saturating_add(rec.used);
        if let Some(l) = rec.limit {
            d.promised = d.promised.saturating_add(l);
        }
    }
    if let Some(q) = s.queues.get(source as usize) {
        q.remove(id);
    }
    if let Some(q) = s.queues.get(target as usize) {
        q.lock().add(id, rec.qos, rec.compute);
    }
    if let Some(r) = s.sessions.get_mut(&id) {
        r.device = target;
    }
    tracing::info!(
        session = id,
        from = source,
        to = target,
        bytes,
        stop_us = figures.stop_us,
        rounds = figures.rounds,
        stop_bytes = figures.stop_bytes,
        "session moved"
    );
    ServerHello::MigratedWith {
        session: SessionId(id),
        device: target,
        total_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        figures,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_bound_what_a_device_promises() {
        let mut o = ElasticOptions::default();
        assert!(!o.oversubscribes());
        assert_eq!(o.capacity(1000), 1000);
        o.parse_oversubscribe("host=50,disk=100").unwrap();
        assert!(o.oversubscribes());
        assert_eq!((o.host_percent, o.disk_percent), (50, 100));
        assert_eq!(o.capacity(1000), 2500);
        assert_eq!(o.host_budget(1000), 500);
        o.parse_oversubscribe("host=20%").unwrap();
        assert_eq!(o.host_percent, 20);
        for bad in [
            "",
            "host",
            "host=x",
            "swap=10",
            "host=10,disk",
            "host=100000",
        ] {
            assert!(o.parse_oversubscribe(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        for bad in ["", "ms", "5d", "-1s", "1.5s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
