//! Endpoint addresses (`unix:PATH`, `tcp:HOST:PORT`) and listeners.

use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::str::FromStr;

use crate::conn::Stream;

/// Where a server listens or a client connects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    Tcp(String),
}

#[derive(Debug, thiserror::Error)]
#[error("bad address {0:?}: expected unix:PATH or tcp:HOST:PORT")]
pub struct AddressError(String);

impl FromStr for Address {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(p) = s.strip_prefix("unix:") {
            if !p.is_empty() {
                return Ok(Address::Unix(PathBuf::from(p)));
            }
        } else if let Some(hp) = s.strip_prefix("tcp:") {
            if hp
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
            {
                return Ok(Address::Tcp(hp.to_string()));
            }
        }
        Err(AddressError(s.to_string()))
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
            Address::Tcp(hp) => write!(f, "tcp:{hp}"),
        }
    }
}

impl Address {
    /// Connects a blocking stream.
    pub fn connect(&self) -> std::io::Result<Stream> {
        match self {
            Address::Unix(p) => Ok(Stream::Unix(UnixStream::connect(p)?)),
            Address::Tcp(hp) => {
                let s = TcpStream::connect(hp)?;
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
        }
    }

    /// Binds a listener. At a unix path, only a stale socket (one nobody answers on) is
    /// replaced: a live socket or anything that is not a socket is an error naming the path.
    pub fn bind(&self) -> std::io::Result<Listener> {
        match self {
            Address::Unix(p) => {
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
        }
    }

    /// The address clients use to reach this listener (the bound port for `tcp:HOST:0`).
    pub fn local_address(&self) -> std::io::Result<Address> {
        match self {
            Listener::Unix(_, p) => Ok(Address::Unix(p.clone())),
            Listener::Tcp(l) => Ok(Address::Tcp(l.local_addr()?.to_string())),
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
            "tcp:127.0.0.1:80".parse::<Address>().unwrap().to_string(),
            "tcp:127.0.0.1:80"
        );
        for bad in [
            "",
            "unix:",
            "tcp:host",
            "tcp::1",
            "http://x",
            "tcp:h:notaport",
        ] {
            assert!(bad.parse::<Address>().is_err(), "{bad}");
        }
    }
}
