//! Kubernetes claims on a node. The DRA plugin (`gpufuse dra-plugin`, beside the node) issues
//! each prepared ResourceClaim a session token that names the claim (its UID) and the device
//! the scheduler allocated (its UUID). A node started with `--cdi-dir` (the plugin's CDI spec
//! directory) honours such a token only while the claim is prepared on this node, that is
//! while its CDI spec exists there, so a token stops working when the kubelet unprepares the
//! claim, and a copy of it taken to another node opens nothing. Its sessions run only on the
//! allocated device. On unprepare the plugin asks the node to end the claim's sessions
//! (`SessionKind::EndClaim`). A node without `--cdi-dir` cannot tell and refuses claim tokens.
//!
//! On a pool node (`gpufuse node --controller`), whose other sessions need the controller's
//! grant, a claim's token is admitted by the node itself, the same way: the cluster's
//! scheduler placed the claim, and the operator charged it to its namespace's quota. The node
//! reports the session with the claim's UID, so the controller counts it on its device once
//! and never moves it (`agent.rs`).

use gpufuse_auth::Claims;
use gpufuse_proto::{uuid_text, ClientHello, ServerHello, SessionKind};

use crate::agent::PoolLink;
use crate::{lock, DeviceState, NodeConfig, Shared, TokenPolicy};

/// The hello's token's claims, on a node that checks tokens and when the token verifies
/// (`None` otherwise: the admission path refuses a bad token with its own reason).
pub fn verified(config: &NodeConfig, token: &str) -> Option<Claims> {
    let TokenPolicy::Verify(secret) = &config.tokens else {
        return None;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    gpufuse_auth::verify(secret, token, now).ok()
}

/// Whether a pool node admits this hello itself rather than through its controller: a `Cuda`
/// hello whose token verifies and names a claim, on a node whose controller is another
/// process (`gpufuse serve`'s own controller places claims' sessions on their device).
pub fn admitted_by_node(config: &NodeConfig, link: &PoolLink, hello: &ClientHello) -> bool {
    link.local.is_none()
        && matches!(hello.kind, SessionKind::Cuda)
        && verified(config, &hello.token).is_some_and(|c| c.claim.is_some())
}

/// [`binding`] for a hello's token: the device its session must run on, or why it may not
/// open one here.
pub fn check_hello(
    state: &Shared,
    config: &NodeConfig,
    hello: &ClientHello,
) -> Result<Option<u32>, String> {
    match verified(config, &hello.token) {
        Some(c) if c.claim.is_some() || c.device.is_some() => {
            binding(config, &c, &lock(state).devices)
        }
        _ => Ok(None),
    }
}

/// Whether `claims` may open a session here now, and the device it must run on (`None`: any).
pub fn binding(
    config: &NodeConfig,
    claims: &Claims,
    devices: &[DeviceState],
) -> Result<Option<u32>, String> {
    if let Some(uid) = &claims.claim {
        let Some(dir) = &config.cdi_dir else {
            return Err(format!(
                "the token is for Kubernetes claim {uid}, and this node was started without --cdi-dir, so it cannot tell whether the claim is prepared"
            ));
        };
        let path = gpufuse_auth::claim_spec_path(dir, uid)
            .ok_or_else(|| format!("the token names a claim {uid:?} that is not a UID"))?;
        if !path.exists() {
            return Err(format!(
                "Kubernetes claim {uid} is not prepared on this node (it was unprepared, or it belongs to another node)"
            ));
        }
    }
    let Some(want) = &claims.device else {
        return Ok(None);
    };
    devices
        .iter()
        .position(|d| uuid_text(&d.uuid).eq_ignore_ascii_case(want))
        .map(|i| Some(i as u32))
        .ok_or_else(|| format!("the token is for device {want}, which this node does not have"))
}

/// Answers an `EndClaim` hello: ends every session of the claim the hello's token names and
/// waits until each is released.
pub fn end_claim(
    state: &Shared,
    config: &NodeConfig,
    claims: Option<&Claims>,
    asker: &ClientHello,
) -> ServerHello {
    let Some(uid) = claims.and_then(|c| c.claim.as_deref()) else {
        return ServerHello::Refused {
            reason: "ending a claim's sessions needs a token of that claim (on a node that checks tokens)".into(),
        };
    };
    let ids: Vec<u64> = lock(state)
        .sessions
        .iter()
        .filter(|(_, r)| r.claim.as_deref() == Some(uid))
        .map(|(id, _)| *id)
        .collect();
    let mut ended = 0;
    for id in ids {
        match crate::admin::end(state, config, id, None, asker) {
            ServerHello::Ended { .. } => ended += 1,
            // Gone meanwhile (its client ended it) is what was asked.
            ServerHello::Refused { reason } if lock(state).sessions.contains_key(&id) => {
                return ServerHello::Refused {
                    reason: format!("claim {uid}: {reason}"),
                };
            }
            _ => {}
        }
    }
    tracing::info!("claim {uid} unprepared: ended {ended} session(s)");
    ServerHello::ClaimEnded { sessions: ended }
}
