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

    /// Binds a listener. A stale unix socket file is replaced.
    pub fn bind(&self) -> std::io::Result<Listener> {
        match self {
            Address::Unix(p) => {
                if p.exists() && UnixStream::connect(p).is_err() {
                    let _ = std::fs::remove_file(p);
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
