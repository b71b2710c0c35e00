//! What an operator asks of a node besides status: the admission check `gpufuse run` makes
//! before it starts a program, ending a session (`gpufuse kill`), and the per-session lines of
//! the node's log.

use std::time::{Duration, Instant};

use gpufuse_auth::Claims;
use gpufuse_proto::{ClientHello, ServerHello};

use crate::{lock, NodeConfig, Shared, TokenPolicy};
use gpufuse_proto::SessionId;

/// How long `End` waits for a killed worker to be reaped and its session released.
const END_DEADLINE: Duration = Duration::from_secs(10);

/// Bytes as an operator reads them: `512 B`, `1.5 GiB` (the pool's scheduler formats its
/// refusals the same way).
pub use gpufuse_scheduler::human_bytes;

/// The session's slice: what it asked for, bounded by what its token allows (a token with a
/// maximum gives a session that asked for none that maximum).
pub fn slice_limit(hello: &ClientHello, claims: Option<&Claims>) -> Result<Option<u64>, String> {
    let limit = hello.resources.vram_bytes;
    let Some(max) = claims.and_then(|c| c.max_vram_bytes) else {
        return Ok(limit);
    };
    match limit {
        Some(l) if l > max => Err(format!(
            "the token allows at most {} of VRAM, and {} was asked for",
            human_bytes(max),
            human_bytes(l)
        )),
        _ => Ok(Some(limit.unwrap_or(max))),
    }
}

/// The session's compute share, bounded by what its token allows: a session asking for more
/// is refused, one asking for none gets the token's share (as with VRAM in [`slice_limit`]).
pub fn bound_compute(hello: &mut ClientHello, claims: Option<&Claims>) -> Result<(), String> {
    let Some(max) = claims.and_then(|c| c.max_compute_percent) else {
        return Ok(());
    };
    if hello.resources.tflops.is_some() {
        return Err(format!(
            "the token allows at most {max}% of a device's compute: ask for a percentage, not TFLOPS"
        ));
    }
    match hello.resources.compute_percent {
        Some(p) if p > max => Err(format!(
            "the token allows at most {max}% of a device's compute, and {p}% was asked for"
        )),
        Some(_) => Ok(()),
        None => {
            hello.resources.compute_percent = Some(max);
            Ok(())
        }
    }
}

/// Answers a `Check` hello: admits the session as a `Cuda` hello would and takes it back at
/// once, under one lock, so the answer is the one a session arriving now would get.
pub fn check(
    state: &Shared,
    hello: &ClientHello,
    limit: Option<u64>,
    allowed: impl Fn(u32) -> bool,
) -> ServerHello {
    let mut s = lock(state);
    match s.admit_where(hello, limit, allowed) {
        Ok(a) => {
            s.end_session(a.id);
            // The probe's id is not a session anyone will see: the next session takes it.
            if s.next_session == a.id + 1 {
                s.next_session = a.id;
            }
            ServerHello::Admissible { device: a.device }
        }
        Err(reason) => {
            tracing::info!(
                "refused a session for {} (pid {}) at its admission check: {reason}",
                hello.program,
                hello.pid
            );
            ServerHello::Refused { reason }
        }
    }
}

/// Records the tenant (the token's subject) of an admitted session.
pub fn set_subject(state: &Shared, id: u64, claims: Option<&Claims>) {
    if let Some(c) = claims {
        if let Some(r) = lock(state).sessions.get_mut(&id) {
            r.subject = Some(c.subject.clone());
            r.claim = c.claim.clone();
        }
    }
}

/// Answers an `End` hello: kills session `id`'s worker and waits until the node has released
/// everything the session held. On a node that checks tokens, only a token of the session's
/// own tenant may end it.
pub fn end(
    state: &Shared,
    config: &NodeConfig,
    id: u64,
    claims: Option<&Claims>,
    asker: &ClientHello,
) -> ServerHello {
    let refused = |reason: String| ServerHello::Refused { reason };
    {
        let s = lock(state);
        let Some(rec) = s.sessions.get(&id) else {
            return refused(format!("there is no session {id}"));
        };
        if let (TokenPolicy::Verify(_), Some(c)) = (&config.tokens, claims) {
            if rec.subject.as_deref() != Some(c.subject.as_str()) {
                return refused(format!(
                    "session {id} belongs to another tenant; a token for {:?} may end only its own sessions",
                    c.subject
                ));
            }
        }
        if rec.worker_pid == 0 {
            return refused(format!(
                "session {id} is still starting its worker; try again"
            ));
        }
        tracing::info!(
            "ending session {id} (worker pid {}) as asked by pid {}",
            rec.worker_pid,
            asker.pid
        );
        // The lock is held: the session is in the table, so its worker has not been reaped
        // (the node releases a session only after waiting for its worker) and the pid is still
        // the worker's.
        let pid = libc::pid_t::try_from(rec.worker_pid).unwrap_or(0);
        if pid > 0 {
            // SAFETY: kill(2) with a pid and a signal number touches no memory of ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let deadline = Instant::now() + END_DEADLINE;
    while lock(state).sessions.contains_key(&id) {
        if Instant::now() >= deadline {
            return refused(format!(
                "session {id}'s worker was killed but the session was not released within {} s",
                END_DEADLINE.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    ServerHello::Ended {
        session: SessionId(id),
    }
}

/// Warns when a TCP listener runs without authentication (anyone who can reach it may run
/// code on the node's devices, see every session and end them) or without encryption.
pub fn warn_if_open_tcp(
    tokens: &TokenPolicy,
    client_certs: bool,
    listeners: &[gpufuse_transport::Listener],
) {
    use gpufuse_transport::Address;
    for l in listeners {
        let open = matches!(tokens, TokenPolicy::Open);
        match l.local_address() {
            Ok(a @ Address::Tcp(_)) if open => tracing::warn!(
                "{a} accepts sessions without authentication: anyone who can reach it can use the GPUs and end sessions; pass --token-secret-file (see `gpufuse token`) or listen on a unix socket"
            ),
            Ok(a @ Address::TcpTls(_)) if open && !client_certs => tracing::warn!(
                "{a} accepts sessions without authentication (TLS encrypts, but any client may connect): pass --token-secret-file (see `gpufuse token`) or --tls-client-ca"
            ),
            Ok(a @ Address::Tcp(_)) => tracing::warn!(
                "{a} is plain TCP: data and session tokens cross the network unencrypted; listen on tcp+tls: (--tls-cert, --tls-key) where the network is not trusted"
            ),
            _ => {}
        }
    }
}

/// One line describing session `id` for the log: program, pid, tenant, device, slice, share.
fn describe(state: &Shared, id: u64) -> Option<String> {
    let s = lock(state);
    let r = s.sessions.get(&id)?;
    let device = s
        .devices
        .get(r.device as usize)
        .map_or(String::new(), |d| format!(" ({})", d.name));
    let tenant = r
        .subject
        .as_deref()
        .map_or(String::new(), |t| format!(", tenant {t}"));
    let slice = r.limit.map_or("no slice".to_string(), |l| {
        format!("slice {}", human_bytes(l))
    });
    let share = r
        .compute
        .map_or(String::new(), |c| format!(", compute {c}%"));
    Some(format!(
        "program {} (pid {}){tenant}, device {}{device}, {slice}{share}, qos {}, worker pid {}",
        r.program,
        r.pid,
        r.device,
        r.qos.name(),
        r.worker_pid
    ))
}

/// Logs that session `id` started (its worker is running).
pub fn log_started(state: &Shared, id: u64) {
    let what = describe(state, id).unwrap_or_default();
    tracing::info!("session {id} started: {what}");
}

/// How a worker ended, in words: "worker exited normally", "worker killed by signal 9 (SIGKILL)".
pub fn describe_exit(status: &std::io::Result<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(0), _) => "worker exited normally".to_string(),
            (Some(c), _) => format!("worker exited with status {c}"),
            (None, Some(sig)) => match signal_name(sig) {
                Some(name) => format!("worker killed by signal {sig} ({name})"),
                None => format!("worker killed by signal {sig}"),
            },
            (None, None) => format!("worker ended ({s})"),
        },
        Err(e) => format!("worker's exit status unknown: {e}"),
    }
}

fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => return None,
    })
}

/// Logs that session `id` ended and how, with what it held at the end. Call before the session
/// is released.
pub fn log_ended(state: &Shared, id: u64, status: &std::io::Result<std::process::ExitStatus>) {
    let how = describe_exit(status);
    let held = lock(state).sessions.get(&id).map_or(0, |r| r.used);
    let what = describe(state, id).unwrap_or_default();
    tracing::info!(
        "session {id} ended: {how}; {what}, held {} at the end",
        human_bytes(held)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    #[test]
    fn exits_are_told_in_words() {
        // Wait statuses as waitpid(2) gives them: a signal in the low bits, a code above.
        assert_eq!(
            describe_exit(&Ok(ExitStatus::from_raw(9))),
            "worker killed by signal 9 (SIGKILL)"
        );
        assert_eq!(
            describe_exit(&Ok(ExitStatus::from_raw(0))),
            "worker exited normally"
        );
        assert_eq!(
            describe_exit(&Ok(ExitStatus::from_raw(3 << 8))),
            "worker exited with status 3"
        );
        assert_eq!(
            describe_exit(&Ok(ExitStatus::from_raw(64))),
            "worker killed by signal 64"
        );
    }

    #[test]
    fn bytes_are_told_in_binary_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1 << 30), "1 GiB");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
        assert_eq!(human_bytes(1 << 40), "1 TiB");
    }

    fn hello(vram: Option<u64>) -> ClientHello {
        ClientHello {
            protocol_version: gpufuse_proto::PROTOCOL_VERSION,
            kind: gpufuse_proto::SessionKind::Check,
            token: String::new(),
            pid: 1,
            program: "p".into(),
            resources: gpufuse_proto::ResourceRequest {
                vram_bytes: vram,
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_token_bounds_the_slice() {
        let claims = Claims {
            subject: "alice".into(),
            expires: None,
            max_vram_bytes: Some(1 << 30),
            max_compute_percent: None,
            ..Default::default()
        };
        assert_eq!(slice_limit(&hello(None), None), Ok(None));
        assert_eq!(slice_limit(&hello(None), Some(&claims)), Ok(Some(1 << 30)));
        assert_eq!(
            slice_limit(&hello(Some(1 << 20)), Some(&claims)),
            Ok(Some(1 << 20))
        );
        assert_eq!(
            slice_limit(&hello(Some(2 << 30)), Some(&claims)),
            Err("the token allows at most 1 GiB of VRAM, and 2 GiB was asked for".into())
        );
    }

    #[test]
    fn a_token_bounds_the_compute_share() {
        let claims = Claims {
            subject: "alice".into(),
            expires: None,
            max_vram_bytes: None,
            max_compute_percent: Some(30),
            ..Default::default()
        };
        let mut h = hello(None);
        bound_compute(&mut h, None).unwrap();
        assert_eq!(h.resources.compute_percent, None);
        bound_compute(&mut h, Some(&claims)).unwrap();
        assert_eq!(h.resources.compute_percent, Some(30));
        h.resources.compute_percent = Some(20);
        bound_compute(&mut h, Some(&claims)).unwrap();
        assert_eq!(h.resources.compute_percent, Some(20));
        h.resources.compute_percent = Some(31);
        assert!(bound_compute(&mut h, Some(&claims))
            .unwrap_err()
            .contains("at most 30%"));
        h.resources.compute_percent = None;
        h.resources.tflops = Some(5);
        assert!(bound_compute(&mut h, Some(&claims)).is_err());
    }
}
