//! What a client asks the pool for beyond its resources: tenant, node labels, GPU model and
//! how long it will wait. `gpufuse run --tenant/--selector/--gpu-model/--wait` carries it
//! to the controller inside the session token (`GPUFUSE_TOKEN`), so the programs it starts,
//! and every process they start, ask the same way with no change to the client's hello:
//!
//! ```text
//! gfp1;tenant=alice;selector=zone=a;selector=gpu=big;gpu_model=B200;wait=30;token=<session token>
//! ```
//!
//! `token=` comes last and holds the user's own session token (possibly empty), which the
//! controller verifies as it would a plain one. Nothing here is trusted on its own: the
//! tenant must match the token's subject on a controller that checks tokens.

use std::collections::BTreeMap;

/// The longest wait a client may ask for (a day): deadlines stay representable.
pub const MAX_WAIT_S: u64 = 24 * 3600;

/// The prefix of a token that carries a [`PlacementAsk`].
pub const ASK_PREFIX: &str = "gfp1;";

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementAsk {
    pub tenant: Option<String>,
    pub selector: BTreeMap<String, String>,
    pub gpu_model: Option<String>,
    /// Seconds the client waits for capacity.
    pub wait_s: Option<u64>,
    /// The user's session token.
    pub token: String,
}

impl PlacementAsk {
    /// Whether anything besides the token is asked (else the plain token is sent).
    pub fn is_plain(&self) -> bool {
        self.tenant.is_none()
            && self.selector.is_empty()
            && self.gpu_model.is_none()
            && self.wait_s.is_none()
    }

    /// The token to send. Values may not contain `;` (nor keys `=`).
    pub fn encode(&self) -> Result<String, String> {
        if self.is_plain() {
            return Ok(self.token.clone());
        }
        let mut fields: Vec<(&str, String)> = Vec::new();
        if let Some(t) = &self.tenant {
            fields.push(("tenant", t.clone()));
        }
        for (k, v) in &self.selector {
            if k.is_empty() || k.contains('=') {
                return Err(format!("bad selector key {k:?}"));
            }
            fields.push(("selector", format!("{k}={v}")));
        }
        if let Some(m) = &self.gpu_model {
            fields.push(("gpu_model", m.clone()));
        }
        if let Some(w) = self.wait_s {
            fields.push(("wait", w.to_string()));
        }
        let mut s = ASK_PREFIX.to_string();
        for (k, v) in fields {
            if v.contains(';') {
                return Err(format!("{k} {v:?} may not contain ';'"));
            }
            s += &format!("{k}={v};");
        }
        s += "token=";
        s += &self.token;
        Ok(s)
    }

    /// Reads a token: a plain token is an ask with only a token.
    pub fn parse(token: &str) -> Result<Self, String> {
        let Some(mut rest) = token.strip_prefix(ASK_PREFIX) else {
            return Ok(Self {
                token: token.to_string(),
                ..Self::default()
            });
        };
        let mut ask = Self::default();
        loop {
            if let Some(t) = rest.strip_prefix("token=") {
                ask.token = t.to_string();
                return Ok(ask);
            }
            let (field, tail) = rest
                .split_once(';')
                .ok_or("a placement request (gfp1;...) must end with token=")?;
            rest = tail;
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| format!("bad placement field {field:?}"))?;
            match k {
                "tenant" => ask.tenant = Some(v.to_string()),
                "gpu_model" => ask.gpu_model = Some(v.to_string()),
                "wait" => {
                    let w: u64 = v
                        .parse()
                        .map_err(|_| format!("bad wait {v:?}: expected seconds"))?;
                    if w > MAX_WAIT_S {
                        return Err(format!(
                            "wait {w} s is longer than a day ({MAX_WAIT_S} s), the most a session waits"
                        ));
                    }
                    ask.wait_s = Some(w);
                }
                "selector" => {
                    let (sk, sv) = v
                        .split_once('=')
                        .ok_or_else(|| format!("bad selector {v:?}: expected K=V"))?;
                    ask.selector.insert(sk.to_string(), sv.to_string());
                }
                _ => return Err(format!("unknown placement field {k:?}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_round_trip_and_plain_tokens_stay_plain() {
        let ask = PlacementAsk {
            tenant: Some("alice".into()),
            selector: BTreeMap::from([("zone".into(), "a".into()), ("gpu".into(), "x".into())]),
            gpu_model: Some("B200".into()),
            wait_s: Some(30),
            token: "gf1.abc.def".into(),
        };
        let s = ask.encode().unwrap();
        assert!(
            s.starts_with(ASK_PREFIX) && s.ends_with(";token=gf1.abc.def"),
            "{s}"
        );
        assert_eq!(PlacementAsk::parse(&s).unwrap(), ask);
        let plain = PlacementAsk {
            token: "gf1.x.y".into(),
            ..Default::default()
        };
        assert_eq!(plain.encode().unwrap(), "gf1.x.y");
        assert_eq!(PlacementAsk::parse("gf1.x.y").unwrap(), plain);
    }

    #[test]
    fn malformed_asks_are_errors_naming_the_field() {
        assert!(PlacementAsk::parse("gfp1;colour=red;token=")
            .unwrap_err()
            .contains("colour"));
        assert!(PlacementAsk::parse("gfp1;wait=soon;token=")
            .unwrap_err()
            .contains("soon"));
        // A wait whose deadline could not be represented is refused, not a panic.
        assert!(PlacementAsk::parse("gfp1;wait=18446744073709551615;token=")
            .unwrap_err()
            .contains("longer than a day"));
        assert!(PlacementAsk::parse("gfp1;wait=86400;token=").is_ok());
        assert!(PlacementAsk::parse("gfp1;tenant=a").is_err());
        let bad = PlacementAsk {
            tenant: Some("a;b".into()),
            ..Default::default()
        };
        assert!(bad.encode().is_err());
    }
}
