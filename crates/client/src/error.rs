//! Client errors and their one mapping to `CUresult`.

use crate::status::{self, CUresult};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("GPUFUSE_SERVER is not set; run the program with `gpufuse run`")]
    NoServerConfigured,
    #[error("bad GPUFUSE_SERVER address")]
    BadAddress(#[source] gpufuse_transport::AddressError),
    #[error("cannot reach the gpufuse server at {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the gpufuse server refused the session: {0}")]
    Refused(String),
    #[error("connection to the gpufuse server lost")]
    Lost(#[source] gpufuse_transport::TransportError),
    #[error(
        "the gpufuse server did not answer within {secs} s (a stopped server, or not a gpufuse \
         server?); GPUFUSE_HELLO_TIMEOUT sets the wait in seconds"
    )]
    NoAnswer { secs: f64 },
    #[error(
        "the gpufuse worker sent nothing for {secs} s while a call waited (a stopped worker or \
         server?); GPUFUSE_CALL_TIMEOUT sets the wait in seconds"
    )]
    Hung { secs: f64 },
    #[error("unexpected answer from the gpufuse server")]
    Protocol(#[source] gpufuse_proto::ProtoError),
    #[error("unexpected reply body")]
    UnexpectedReply,
    #[error("CUDA error {0}")]
    Cuda(CUresult),
    #[error("cannot move the session to the new worker: {0}")]
    Reconnect(String),
    #[error("shared-memory transport: {0} (GPUFUSE_TRANSPORT=socket, or a unix: address, uses the socket instead)")]
    Shm(String),
}

impl ClientError {
    /// The status a driver call returns for this error.
    pub fn status(&self) -> CUresult {
        match self {
            ClientError::NoServerConfigured
            | ClientError::BadAddress(_)
            | ClientError::Connect { .. }
            | ClientError::Refused(_)
            | ClientError::Shm(_) => status::NO_DEVICE,
            ClientError::Lost(_)
            | ClientError::NoAnswer { .. }
            | ClientError::Hung { .. }
            | ClientError::Protocol(_)
            | ClientError::UnexpectedReply
            | ClientError::Reconnect(_) => status::DEVICE_UNAVAILABLE,
            ClientError::Cuda(s) => *s,
        }
    }
}

impl From<CUresult> for ClientError {
    fn from(s: CUresult) -> Self {
        ClientError::Cuda(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_maps_to_a_cuda_error() {
        let io = || std::io::Error::other("x");
        let all = [
            ClientError::NoServerConfigured,
            ClientError::Connect {
                addr: "a".into(),
                source: io(),
            },
            ClientError::Refused("r".into()),
            ClientError::Shm("s".into()),
            ClientError::Lost(gpufuse_transport::TransportError::Closed),
            ClientError::UnexpectedReply,
            ClientError::Cuda(2),
        ];
        for e in all {
            assert_ne!(e.status(), status::SUCCESS, "{e}");
        }
    }
}
