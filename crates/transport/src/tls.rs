//! TLS for `tcp+tls:HOST:PORT` addresses: rustls with the ring provider, TLS 1.2 and 1.3.
//!
//! - A **server** has a certificate chain and a key ([`ServerTls::from_files`]) and may require
//!   client certificates signed by a CA of its own (`client_ca`).
//! - A **client** verifies the server's certificate by default: against the CA in
//!   `GPUFUSE_TLS_CA` when it is set, else against the system's roots. A certificate in that
//!   file that is the server's own (a self-signed certificate made the common way, `openssl
//!   req -x509 ... -subj /CN=HOST`, which marks itself a CA) is accepted as *pinned*, as curl
//!   and OpenSSL accept it: the same bytes, valid now, naming the host ([`Pinned`]); the
//!   handshake's signatures are checked as for any certificate. It presents a
//!   certificate of its own when `GPUFUSE_TLS_CERT` and `GPUFUSE_TLS_KEY` are set. The
//!   environment is the interface because the client runs inside applications (the shim and
//!   the NVML shim connect from `cuInit`/`nvmlInit`); `gpufuse run --tls-ca` sets it for them.
//!
//! The handshake of a client happens in [`ClientTls::connect`], with a deadline, so that a
//! wrong certificate or a plain-TCP listener is an error naming the cause before any frame is
//! sent. A server's handshake happens on its first read, under the caller's read deadline
//! (the node's hello deadline).

use std::io::{self, Read};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, StreamOwned};

/// Everything that can be wrong with a TLS configuration or handshake.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} from {path}: {source}")]
    File {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} holds no {what} (expected PEM)")]
    Empty { what: &'static str, path: PathBuf },
    #[error("bad {what} in {path}: {reason}")]
    Bad {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{0} is set but {1} is not: a client certificate needs both")]
    HalfIdentity(&'static str, &'static str),
    #[error("no CA to verify servers with: set GPUFUSE_TLS_CA (--tls-ca), or install system CA certificates ({0})")]
    NoRoots(String),
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::File {
        what,
        path: path.into(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Bad {
            what,
            path: path.into(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.into(),
        });
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::File {
        what: "a private key",
        path: path.into(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what: "private key",
            path: path.into(),
        },
        e => TlsError::Bad {
            what: "private key",
            path: path.into(),
            reason: e.to_string(),
        },
    })
}

/// Server certificate verification: the web PKI against the configured roots, and else an
/// exact match with a certificate of the CA file (pinned). Every check of the handshake's
/// signatures is the web PKI verifier's.
#[derive(Debug)]
struct Pinned {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
}

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let verdict =
            self.inner
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now);
        if verdict.is_ok()
            || !self
                .pinned
                .iter()
                .any(|p| p.as_ref() == end_entity.as_ref())
        {
            return verdict;
        }
        // The server presented exactly a certificate the user gave as trusted: it still
        // must be valid now and name the host.
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|e| rustls::Error::General(format!("pinned certificate: {e}")))?;
        cert.verify_is_valid_for_subject_name(server_name)
            .map_err(|e| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::Other(
                    rustls::OtherError(Arc::new(e)),
                ))
            })?;
        let parsed = x509_validity(end_entity.as_ref()).ok_or_else(|| {
            rustls::Error::General("pinned certificate: unreadable validity".into())
        })?;
        let t = now.as_secs();
        if t < parsed.0 {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidYet,
            ));
        }
        if t > parsed.1 {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Expired,
            ));
        }
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A certificate's validity (notBefore, notAfter) in seconds since the epoch, read from its
/// DER (`tbsCertificate.validity`): webpki checks validity only on the chain path, which a
/// pinned certificate does not take.
fn x509_validity(der: &[u8]) -> Option<(u64, u64)> {
    // A DER element: (tag, content, rest).
    fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, b) = b.split_first()?;
        let (&l, mut b) = b.split_first()?;
        let len = if l < 0x80 {
            l as usize
        } else {
            let n = (l & 0x7f) as usize;
            if n == 0 || n > 4 || b.len() < n {
                return None;
            }
            let v = b[..n].iter().fold(0usize, |a, &x| a << 8 | x as usize);
            b = &b[n..];
            v
        };
        (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
    }
    fn time(tag: u8, v: &[u8]) -> Option<u64> {
        let s = std::str::from_utf8(v).ok()?.strip_suffix('Z')?;
        let (year, rest) = match tag {
            0x17 => {
                let y: u64 = s.get(..2)?.parse().ok()?;
                (if y >= 50 { 1900 + y } else { 2000 + y }, s.get(2..)?)
            }
            0x18 => (s.get(..4)?.parse().ok()?, s.get(4..)?),
            _ => return None,
        };
        let n = |i: usize| -> Option<u64> { rest.get(i..i + 2)?.parse().ok() };
        let (mo, d, h, mi, se) = (n(0)?, n(2)?, n(4)?, n(6)?, n(8)?);
        // Days from the civil date (Howard Hinnant's algorithm).
        let (y, m) = if mo <= 2 {
            (year - 1, mo + 9)
        } else {
            (year, mo - 3)
        };
        let era = y / 400;
        let yoe = y - era * 400;
        let doy = (153 * m + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        Some(days * 86_400 + h * 3600 + mi * 60 + se)
    }
    let (_, cert, _) = tlv(der)?;
    let (_, tbs, _) = tlv(cert)?;
    let mut rest = tbs;
    // [0] version (optional), serial, signature algorithm, issuer, validity.
    let (tag, _, r) = tlv(rest)?;
    rest = if tag == 0xa0 { r } else { rest };
    for _ in 0..3 {
        rest = tlv(rest)?.2;
    }
    let (_, validity, _) = tlv(rest)?;
    let (t1, v1, r) = tlv(validity)?;
    let (t2, v2, _) = tlv(r)?;
    Some((time(t1, v1)?, time(t2, v2)?))
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for c in certs(path, "CA certificates")? {
        store.add(c).map_err(|e| TlsError::Bad {
            what: "CA certificate",
            path: path.into(),
            reason: e.to_string(),
        })?;
    }
    Ok(store)
}

/// A server's TLS identity and client-certificate policy.
#[derive(Clone, Debug)]
pub struct ServerTls {
    pub(crate) config: Arc<ServerConfig>,
}

impl ServerTls {
    /// The certificate chain in `cert` (PEM, leaf first) and its private key in `key` (PEM:
    /// PKCS#8, PKCS#1 or SEC1). With `client_ca`, every client must present a certificate
    /// signed by a CA in that file.
    pub fn from_files(
        cert: &Path,
        key_file: &Path,
        client_ca: Option<&Path>,
    ) -> Result<Self, TlsError> {
        let chain = certs(cert, "certificates")?;
        let key = key(key_file)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let builder = match client_ca {
            Some(ca) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots(ca)?),
                    provider(),
                )
                .build()
                .map_err(|e| TlsError::Bad {
                    what: "client CA",
                    path: ca.into(),
                    reason: e.to_string(),
                })?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Bad {
                what: "certificate and key pair",
                path: cert.into(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            config: Arc::new(config),
        })
    }
}

impl ServerTls {
    /// The rustls configuration, for servers that terminate TLS themselves (the Kubernetes
    /// admission webhook).
    pub fn rustls_config(&self) -> Arc<ServerConfig> {
        self.config.clone()
    }
}

/// A client's TLS settings: whom it trusts and, optionally, its own certificate.
#[derive(Clone, Debug)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
}

/// How long a client's handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl ClientTls {
    /// Trusts the CAs in `ca` (else the system's roots); presents `identity` (certificate
    /// chain file, key file) when given.
    pub fn new(ca: Option<&Path>, identity: Option<(&Path, &Path)>) -> Result<Self, TlsError> {
        let roots = match ca {
            Some(ca) => roots(ca)?,
            None => {
                let found = rustls_native_certs::load_native_certs();
                let mut store = RootCertStore::empty();
                let (added, _) = store.add_parsable_certificates(found.certs);
                if added == 0 {
                    let why = found
                        .errors
                        .first()
                        .map_or("none found".to_string(), |e| e.to_string());
                    return Err(TlsError::NoRoots(why));
                }
                store
            }
        };
        let pinned = match ca {
            Some(ca) => certs(ca, "CA certificates")?,
            None => Vec::new(),
        };
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .map_err(|e| TlsError::Config(rustls::Error::General(e.to_string())))?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Pinned { inner, pinned }));
        let config = match identity {
            Some((cert, key_file)) => builder
                .with_client_auth_cert(certs(cert, "client certificates")?, key(key_file)?)
                .map_err(|e| TlsError::Bad {
                    what: "client certificate and key pair",
                    path: cert.into(),
                    reason: e.to_string(),
                })?,
            None => builder.with_no_client_auth(),
        };
        Ok(Self {
            config: Arc::new(config),
        })
    }

    /// From `GPUFUSE_TLS_CA`, `GPUFUSE_TLS_CERT` and `GPUFUSE_TLS_KEY` (see the module docs).
    pub fn from_env() -> Result<Self, TlsError> {
        let var = |n: &str| {
            std::env::var_os(n)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let ca = var("GPUFUSE_TLS_CA");
        let identity = match (var("GPUFUSE_TLS_CERT"), var("GPUFUSE_TLS_KEY")) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(TlsError::HalfIdentity(
                    "GPUFUSE_TLS_CERT",
                    "GPUFUSE_TLS_KEY",
                ))
            }
            (None, Some(_)) => {
                return Err(TlsError::HalfIdentity(
                    "GPUFUSE_TLS_KEY",
                    "GPUFUSE_TLS_CERT",
                ))
            }
        };
        Self::new(
            ca.as_deref(),
            identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
        )
    }

    /// Connects to `host_port` and completes the handshake (verifying the server's
    /// certificate for the host's name or IP address).
    pub fn connect(&self, host_port: &str) -> io::Result<StreamOwned<ClientConnection, TcpStream>> {
        let host = host_port
            .rsplit_once(':')
            .map_or(host_port, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = ServerName::try_from(host.to_string()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad TLS server name {host:?}: {e}"),
            )
        })?;
        let conn = ClientConnection::new(self.config.clone(), name).map_err(io::Error::other)?;
        let sock = TcpStream::connect(host_port)?;
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        sock.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let mut s = StreamOwned::new(conn, sock);
        while s.conn.is_handshaking() {
            match s.conn.complete_io(&mut s.sock) {
                Ok((0, 0)) => {
                    return Err(handshake_error(
                        io::ErrorKind::UnexpectedEof.into(),
                        host_port,
                    ))
                }
                Ok(_) => {}
                Err(e) => return Err(handshake_error(e, host_port)),
            }
        }
        s.sock.set_read_timeout(None)?;
        s.sock.set_write_timeout(None)?;
        Ok(s)
    }
}

/// A handshake failure that says what it likely means.
fn handshake_error(e: io::Error, host_port: &str) -> io::Error {
    let hint = match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => {
            " (the server closed the connection: is it listening with tcp+tls:?)"
        }
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => " (no answer)",
        _ if e.to_string().contains("invalid peer certificate") => {
            " (is --tls-ca / GPUFUSE_TLS_CA the CA that signed the server's certificate, and does the certificate name this host?)"
        }
        _ => "",
    };
    io::Error::new(
        e.kind(),
        format!("TLS handshake with {host_port} failed: {e}{hint}"),
    )
}

/// A reader that takes only what the socket holds now (`recv` with `MSG_DONTWAIT`).
pub(crate) struct DontWait<'a>(pub &'a TcpStream);

impl Read for DontWait<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        crate::conn::recv_fd_now(std::os::fd::AsFd::as_fd(self.0), buf)
    }
}

/// What a TLS stream can give now without blocking: decrypted bytes already held, else one
/// non-blocking read of the socket. `Ok(0)`: the peer closed.
pub(crate) fn recv_now<C, S>(s: &mut StreamOwned<C, TcpStream>, buf: &mut [u8]) -> io::Result<usize>
where
    C: std::ops::DerefMut + std::ops::Deref<Target = rustls::ConnectionCommon<S>>,
    S: rustls::SideData,
{
    match s.conn.reader().read(buf) {
        Ok(n) => return Ok(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
        Err(e) => return Err(e),
    }
    if s.conn.read_tls(&mut DontWait(&s.sock))? == 0 {
        return Ok(0);
    }
    s.conn
        .process_new_packets()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    match s.conn.reader().read(buf) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
        r => r,
    }
}
