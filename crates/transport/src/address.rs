//! Endpoint addresses (`unix:PATH`, `shm:PATH`, `tcp:HOST:PORT`, `tcp+tls:HOST:PORT`) and
//! listeners.

use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::str::FromStr;

use crate::conn::Stream;
use crate::tls::{ClientTls, ServerTls};

/// Where a server listens or a client connects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    /// The unix socket at the path, with the session moved to the shared-memory transport
    /// ([`crate::shm`]) after the hello: required, where `unix:` only prefers it. A node
    /// listening here listens on the unix socket.
    Shm(PathBuf),
    Tcp(String),
    /// TCP with TLS: the server has a certificate, the client verifies it ([`crate::tls`]).
    TcpTls(String),
}

#[derive(Debug, thiserror::Error)]
#[error("bad address {0:?}: expected unix:PATH, shm:PATH, tcp:HOST:PORT or tcp+tls:HOST:PORT")]
pub struct AddressError(String);

impl FromStr for Address {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(p) = s.strip_prefix("unix:") {
            if !p.is_empty() {
                return Ok(Address::Unix(PathBuf::from(p)));
            }
        } else if let Some(p) = s.strip_prefix("shm:") {
            if !p.is_empty() {
                return Ok(Address::Shm(PathBuf::from(p)));
            }
        } else if let Some((tls, hp)) = s
            .strip_prefix("tcp:")
            .map(|hp| (false, hp))
            .or_else(|| s.strip_prefix("tcp+tls:").map(|hp| (true, hp)))
        {
            if let Some((h, p)) = hp
                .rsplit_once(':')
                .filter(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
            {
                // An IPv6 host written without brackets (a Kubernetes pod's `$(POD_IP)` in
                // `tcp:$(POD_IP):7070`): the port is after the last colon, and the host gets
                // the brackets a socket address needs.
                let hp = if h.contains(':') && !h.starts_with('[') {
                    format!("[{h}]:{p}")
                } else {
                    hp.to_string()
                };
                return Ok(if tls {
                    Address::TcpTls(hp)
                } else {
                    Address::Tcp(hp)
                });
            }
        }
        Err(AddressError(s.to_string()))
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
            Address::Shm(p) => write!(f, "shm:{}", p.display()),
            Address::Tcp(hp) => write!(f, "tcp:{hp}"),
            Address::TcpTls(hp) => write!(f, "tcp+tls:{hp}"),
        }
    }
}

impl Address {
    /// Connects a blocking stream. A `tcp+tls:` address takes its TLS settings from the
    /// environment ([`ClientTls::from_env`]) and completes the handshake here.
    pub fn connect(&self) -> std::io::Result<Stream> {
        match self {
            Address::TcpTls(hp) => {
                let tls = ClientTls::from_env().map_err(std::io::Error::other)?;
                Ok(Stream::TlsClient(Box::new(tls.connect(hp)?)))
            }
            Address::Unix(p) | Address::Shm(p) => Ok(Stream::Unix(UnixStream::connect(p)?)),
            Address::Tcp(hp) => {
                let s = TcpStream::connect(hp)?;
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
        }
    }

    /// Binds a listener. At a unix path, only a stale socket (one nobody answers on) is
    /// replaced: a live socket or anything that is not a socket is an error naming the path.
    /// A `tcp+tls:` address needs a server identity: see [`Address::bind_with`].
    pub fn bind(&self) -> std::io::Result<Listener> {
        self.bind_with(None)
    }

    /// [`Address::bind`], with the TLS identity a `tcp+tls:` listener serves with.
    pub fn bind_with(&self, tls: Option<&ServerTls>) -> std::io::Result<Listener> {
        match self {
            Address::TcpTls(hp) => match tls {
                Some(t) => Ok(Listener::Tls(TcpListener::bind(hp)?, t.clone())),
                None => Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{self} needs a certificate and a key (--tls-cert, --tls-key)"),
                )),
            },
            Address::Unix(p) | Address::Shm(p) => {
                use std::os::unix::fs::FileTypeExt;
                match std::fs::symlink_metadata(p) {
                    Ok(m) if !m.file_type().is_socket() => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::AlreadyExists,
                            format!(
                                "{} exists and is not a socket; not replacing it",
                                p.display()
                            ),
                        ))
                    }
                    Ok(_) => match UnixStream::connect(p) {
                        Ok(_) => {
                            return Err(std::io::Error::new(
                                std::io::ErrorKind::AddrInUse,
                                format!("another server is listening on {}", p.display()),
                            ))
                        }
                        // Nobody answers: a socket left behind by a server that died.
                        Err(_) => std::fs::remove_file(p)?,
                    },
                    Err(_) => {}
                }
                Ok(Listener::Unix(UnixListener::bind(p)?, p.clone()))
            }
            Address::Tcp(hp) => Ok(Listener::Tcp(TcpListener::bind(hp)?)),
        }
    }
}

/// A bound listener.
#[derive(Debug)]
pub enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
    Tls(TcpListener, ServerTls),
}

impl Listener {
    pub fn accept(&self) -> std::io::Result<Stream> {
        match self {
            Listener::Unix(l, _) => Ok(Stream::Unix(l.accept()?.0)),
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
            // The handshake is left to the first read, on the connection's own thread.
            Listener::Tls(l, tls) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                let conn = rustls::ServerConnection::new(tls.config.clone())
                    .map_err(std::io::Error::other)?;
                Ok(Stream::TlsServer(Box::new(rustls::StreamOwned::new(
                    conn, s,
                ))))
            }
        }
    }

    /// The address clients use to reach this listener (the bound port for `tcp:HOST:0`).
    pub fn local_address(&self) -> std::io::Result<Address> {
        match self {
            Listener::Unix(_, p) => Ok(Address::Unix(p.clone())),
            Listener::Tcp(l) => Ok(Address::Tcp(l.local_addr()?.to_string())),
            Listener::Tls(l, _) => Ok(Address::TcpTls(l.local_addr()?.to_string())),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod bind_tests {
    use super::*;

    /// `serve --listen unix:PATH` used to delete whatever regular file was at PATH.
    #[test]
    fn only_a_stale_socket_is_replaced() {
        let dir = std::env::temp_dir().join(format!("gpufuse-bind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("precious.txt");
        std::fs::write(&file, b"keep me").unwrap();
        let err = Address::Unix(file.clone()).bind().unwrap_err();
        assert!(err.to_string().contains("not a socket"), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");

        let sock = dir.join("live.sock");
        let live = Address::Unix(sock.clone()).bind().unwrap();
        let err = Address::Unix(sock.clone()).bind().unwrap_err();
        assert!(
            err.to_string().contains("another server is listening"),
            "{err}"
        );
        drop(live);
        // A socket nobody listens on any more (its server died without removing it).
        drop(UnixListener::bind(&sock).unwrap());
        assert!(sock.exists());
        let again = Address::Unix(sock.clone()).bind();
        assert!(
            again.is_ok(),
            "a stale socket is replaced: {:?}",
            again.err()
        );
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print() {
        assert_eq!(
            "unix:/tmp/x".parse::<Address>().unwrap(),
            Address::Unix("/tmp/x".into())
        );
        assert_eq!(
            "shm:/tmp/x".parse::<Address>().unwrap(),
            Address::Shm("/tmp/x".into())
        );
        assert_eq!(Address::Shm("/tmp/x".into()).to_string(), "shm:/tmp/x");
        assert_eq!(
            "tcp:127.0.0.1:80".parse::<Address>().unwrap().to_string(),
            "tcp:127.0.0.1:80"
        );
        assert_eq!(
            "tcp+tls:localhost:7000".parse::<Address>().unwrap(),
            Address::TcpTls("localhost:7000".into())
        );
        assert_eq!(
            Address::TcpTls("localhost:7000".into()).to_string(),
            "tcp+tls:localhost:7000"
        );
        // IPv6, bracketed or not (a pod IP substituted into `tcp:$(POD_IP):7070`).
        assert_eq!(
            "tcp:fd00::1:7070".parse::<Address>().unwrap(),
            Address::Tcp("[fd00::1]:7070".into())
        );
        assert_eq!(
            "tcp:[fd00::1]:7070".parse::<Address>().unwrap(),
            Address::Tcp("[fd00::1]:7070".into())
        );
        for bad in [
            "",
            "unix:",
            "shm:",
            "tcp:host",
            "tcp::1",
            "http://x",
            "tcp:h:notaport",
            "tcp+tls:host",
            "tls:h:1",
        ] {
            assert!(bad.parse::<Address>().is_err(), "{bad}");
        }
    }

    #[test]
    fn an_unbracketed_ipv6_address_listens_and_connects() {
        assert_eq!(
            "tcp:::1:0".parse::<Address>().unwrap().to_string(),
            "tcp:[::1]:0"
        );
        let l = match "tcp:::1:0".parse::<Address>().unwrap().bind() {
            Ok(l) => l,
            // A host without an IPv6 loopback (EADDRNOTAVAIL) cannot run the rest; the
            // parsing above ran.
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => return,
            Err(e) => panic!("binding [::1]: {e}"),
        };
        let Listener::Tcp(ref tcp) = l else {
            panic!("not a TCP listener");
        };
        let port = tcp.local_addr().unwrap().port();
        let addr: Address = format!("tcp:::1:{port}").parse().unwrap();
        addr.connect().unwrap();
    }
}
