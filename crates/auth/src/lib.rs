//! Session tokens.
//!
//! A token is `gf1.<claims>.<mac>`: the claims (JSON, base64url) say who the session is and
//! what it may ask for; the MAC is HMAC-SHA256 over `gf1.<claims>` with the server's secret.
//! The node verifies the token in the hello, before a worker is started, so a missing,
//! forged, altered or expired token never reaches CUDA. The secret is 32 random bytes kept in
//! a file only the server reads (`gpufuse token secret`; `gpufuse serve --token-secret-file`),
//! and `gpufuse token` issues tokens with it.
//!
//! The [`Claims`] bound what the session may ask for (its VRAM slice, its compute share), and
//! a token the DRA plugin issues for a Kubernetes claim names its claim and its device.
//!
//! Hand-written only as far as the format goes: the MAC is the `hmac` crate, the comparison is
//! its constant-time `verify_slice`.

#![forbid(unsafe_code)]

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

const PREFIX: &str = "gf1";
/// Longest token accepted (a bound on what a hello can make the node parse).
pub const MAX_TOKEN_LEN: usize = 4096;

/// What a token grants.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Who the session belongs to (a tenant or user name).
    pub subject: String,
    /// Unix seconds after which the token is refused; `None` never expires.
    pub expires: Option<u64>,
    /// The most VRAM the session may request, in bytes; `None` is no extra cap.
    pub max_vram_bytes: Option<u64>,
    /// The largest compute share (percent) the session may ask for; a session that asks for
    /// none gets this share. `None` is no cap. Absent from tokens issued without it, so tokens
    /// from before this field verify unchanged, and older nodes ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_compute_percent: Option<u32>,
    /// The Kubernetes ResourceClaim (its UID) the token was issued for by the DRA plugin. A
    /// node started with `--cdi-dir` honours such a token only while the claim is prepared on
    /// it (its CDI spec, [`claim_spec_path`], exists), and ends the claim's sessions when the
    /// plugin unprepares it; a node without `--cdi-dir` refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// The one device (its UUID) a session of this token may run on: the device Kubernetes
    /// allocated to the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

/// Where the DRA plugin writes the CDI spec of claim `uid` in `dir` (and a node looks for it):
/// `gpufuse.dev-gpu_<uid>.json`. `None` for a UID that is not a Kubernetes UID's characters
/// (letters, digits, `-`), so no claim can name a path outside `dir`.
pub fn claim_spec_path(dir: &std::path::Path, uid: &str) -> Option<std::path::PathBuf> {
    let plain = !uid.is_empty()
        && uid.len() <= 64
        && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    plain.then(|| dir.join(format!("gpufuse.dev-gpu_{uid}.json")))
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("no session token was presented")]
    Missing,
    #[error("the session token is malformed")]
    Malformed,
    #[error("the session token's signature does not verify (forged or altered, or issued by another server)")]
    BadSignature,
    #[error("the session token expired")]
    Expired,
    #[error("the secret must be at least 16 bytes")]
    WeakSecret,
}

fn mac(secret: &[u8], data: &str) -> Result<Hmac<Sha256>, AuthError> {
    if secret.len() < 16 {
        return Err(AuthError::WeakSecret);
    }
    let mut m = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| AuthError::WeakSecret)?;
    m.update(data.as_bytes());
    Ok(m)
}

/// A new random secret.
pub fn new_secret() -> [u8; 32] {
    rand::random()
}

/// Issues a token for `claims`.
pub fn issue(secret: &[u8], claims: &Claims) -> Result<String, AuthError> {
    seal(secret, PREFIX, claims)
}

/// Verifies `token` at time `now` (unix seconds) and returns its claims.
pub fn verify(secret: &[u8], token: &str, now: u64) -> Result<Claims, AuthError> {
    let claims: Claims = open(secret, PREFIX, token)?;
    if claims.expires.is_some_and(|e| now >= e) {
        return Err(AuthError::Expired);
    }
    Ok(claims)
}

/// Signs `value` as a token of `kind` (`kind.<json, base64url>.<mac>`): the pool's grants and
/// end orders, which the controller issues and a node verifies with the key the controller
/// gave it. `kind` keeps one kind of token from being accepted as another.
pub fn seal<T: Serialize>(secret: &[u8], kind: &str, value: &T) -> Result<String, AuthError> {
    let body = B64.encode(serde_json::to_vec(value).map_err(|_| AuthError::Malformed)?);
    let signed = format!("{kind}.{body}");
    let tag = B64.encode(mac(secret, &signed)?.finalize().into_bytes());
    Ok(format!("{signed}.{tag}"))
}

/// Verifies a token made by [`seal`] with the same `kind` and returns its value (expiry is
/// the value's business).
pub fn open<T: serde::de::DeserializeOwned>(
    secret: &[u8],
    kind: &str,
    token: &str,
) -> Result<T, AuthError> {
    if token.is_empty() {
        return Err(AuthError::Missing);
    }
    if token.len() > MAX_TOKEN_LEN {
        return Err(AuthError::Malformed);
    }
    let (signed, tag) = token.rsplit_once('.').ok_or(AuthError::Malformed)?;
    let (prefix, body) = signed.split_once('.').ok_or(AuthError::Malformed)?;
    if prefix != kind {
        return Err(AuthError::Malformed);
    }
    let tag = B64.decode(tag).map_err(|_| AuthError::Malformed)?;
    mac(secret, signed)?
        .verify_slice(&tag)
        .map_err(|_| AuthError::BadSignature)?;
    serde_json::from_slice(&B64.decode(body).map_err(|_| AuthError::Malformed)?)
        .map_err(|_| AuthError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn claims() -> Claims {
        Claims {
            subject: "team-a".into(),
            expires: Some(2_000),
            max_vram_bytes: Some(1 << 30),
            ..Default::default()
        }
    }

    #[test]
    fn claim_tokens_round_trip_and_claim_paths_stay_in_their_directory() {
        let c = Claims {
            claim: Some("7d2c33b4-0000-4000-8000-000000000001".into()),
            device: Some("GPU-1".into()),
            ..claims()
        };
        let t = issue(SECRET, &c).unwrap();
        assert_eq!(verify(SECRET, &t, 1_000).unwrap(), c);
        let dir = std::path::Path::new("/run/cdi");
        assert_eq!(
            claim_spec_path(dir, "ab-12").unwrap(),
            dir.join("gpufuse.dev-gpu_ab-12.json")
        );
        for bad in ["", "../x", "a/b", "a.b", &"x".repeat(65)] {
            assert_eq!(claim_spec_path(dir, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn tokens_without_a_compute_cap_read_as_before_and_with_one_round_trip() {
        // The claims of a token issued before `max_compute_percent` existed.
        let old = r#"{"subject":"team-a","expires":2000,"max_vram_bytes":1073741824}"#;
        let c: Claims = serde_json::from_str(old).unwrap();
        assert_eq!(c, claims());
        assert_eq!(serde_json::to_string(&claims()).unwrap(), old);
        let capped = Claims {
            max_compute_percent: Some(30),
            ..claims()
        };
        let t = issue(SECRET, &capped).unwrap();
        assert_eq!(verify(SECRET, &t, 1_000).unwrap(), capped);
    }

    #[test]
    fn issued_tokens_verify() {
        let t = issue(SECRET, &claims()).unwrap();
        assert_eq!(verify(SECRET, &t, 1_000).unwrap(), claims());
    }

    #[test]
    fn missing_forged_altered_and_expired_tokens_are_refused() {
        let t = issue(SECRET, &claims()).unwrap();
        assert_eq!(verify(SECRET, "", 0), Err(AuthError::Missing));
        assert_eq!(
            verify(b"another-secret-of-32-bytes-long!", &t, 0),
            Err(AuthError::BadSignature)
        );
        let (signed, tag) = t.rsplit_once('.').unwrap();
        let greedy = Claims {
            max_vram_bytes: None,
            ..claims()
        };
        let forged_body = B64.encode(serde_json::to_vec(&greedy).unwrap());
        assert_eq!(
            verify(SECRET, &format!("gf1.{forged_body}.{tag}"), 0),
            Err(AuthError::BadSignature)
        );
        assert_eq!(
            verify(SECRET, &format!("{signed}.AAAA"), 0),
            Err(AuthError::BadSignature)
        );
        assert_eq!(verify(SECRET, "gf1.nodot", 0), Err(AuthError::Malformed));
        assert_eq!(verify(SECRET, &t, 2_000), Err(AuthError::Expired));
    }

    #[test]
    fn sealed_values_open_only_with_their_kind_and_key() {
        let t = seal(SECRET, "gfg1", &claims()).unwrap();
        assert_eq!(open::<Claims>(SECRET, "gfg1", &t).unwrap(), claims());
        assert_eq!(
            open::<Claims>(SECRET, "gfe1", &t),
            Err(AuthError::Malformed)
        );
        assert_eq!(
            open::<Claims>(b"another-secret-of-32-bytes-long!", "gfg1", &t),
            Err(AuthError::BadSignature)
        );
        // A session token is not a grant.
        let token = issue(SECRET, &claims()).unwrap();
        assert_eq!(
            open::<Claims>(SECRET, "gfg1", &token),
            Err(AuthError::Malformed)
        );
    }

    #[test]
    fn weak_secrets_are_rejected() {
        assert_eq!(issue(b"short", &claims()), Err(AuthError::WeakSecret));
    }
}
