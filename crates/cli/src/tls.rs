//! TLS options of the commands (`serve --tls-cert`, `run --tls-ca`, ...) and `gpufuse certs`,
//! which makes a CA and certificates for a small deployment or a test.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// How a client reaches a `tcp+tls:` server. The values are exported to the environment
/// (`GPUFUSE_TLS_CA`, `GPUFUSE_TLS_CERT`, `GPUFUSE_TLS_KEY`), where the transport and the
/// shims inside the program read them.
#[derive(clap::Args, Debug, Default)]
pub struct ClientTlsArgs {
    /// tcp+tls: the CA certificate(s) (PEM) that the server's certificate must chain to;
    /// without it, the system's CA certificates.
    #[arg(long, env = "GPUFUSE_TLS_CA", value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// tcp+tls: a client certificate (PEM) for a server that requires one (with --tls-key).
    #[arg(
        long,
        env = "GPUFUSE_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,
    /// tcp+tls: the client certificate's private key (PEM).
    #[arg(
        long,
        env = "GPUFUSE_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
}

impl ClientTlsArgs {
    /// Puts the options in this process's environment (absolute paths, so a program started
    /// in another directory finds them). Called first thing, before any thread starts.
    pub fn export(&self) -> anyhow::Result<()> {
        for (var, path) in [
            ("GPUFUSE_TLS_CA", &self.tls_ca),
            ("GPUFUSE_TLS_CERT", &self.tls_cert),
            ("GPUFUSE_TLS_KEY", &self.tls_key),
        ] {
            if let Some(p) = path {
                let abs = std::path::absolute(p)
                    .with_context(|| format!("{var}: bad path {}", p.display()))?;
                std::env::set_var(var, abs);
            }
        }
        Ok(())
    }
}

/// A server's TLS identity.
#[derive(clap::Args, Debug, Default)]
pub struct ServerTlsArgs {
    /// The certificate chain (PEM, leaf first) that tcp+tls: listeners present.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require clients on tcp+tls: listeners to present a certificate signed by a CA in this
    /// file (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
}

impl ServerTlsArgs {
    pub fn load(&self) -> anyhow::Result<Option<gpufuse_transport::ServerTls>> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        Ok(Some(gpufuse_transport::ServerTls::from_files(
            cert,
            key,
            self.tls_client_ca.as_deref(),
        )?))
    }

    pub fn requires_client_certs(&self) -> bool {
        self.tls_client_ca.is_some()
    }
}

#[derive(clap::Args)]
pub struct CertsArgs {
    /// Where to write ca.pem, ca-key.pem, server.pem, server-key.pem, client.pem and
    /// client-key.pem (created; existing files are not overwritten).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// A name or IP address the server is reached at; may be given several times.
    /// Default: localhost, 127.0.0.1, ::1 and this machine's host name.
    #[arg(long = "host", value_name = "NAME")]
    hosts: Vec<String>,
    /// How long the certificates are valid, in days.
    #[arg(long, default_value_t = 365)]
    days: u32,
}

const FILES: [&str; 6] = [
    "ca.pem",
    "ca-key.pem",
    "server.pem",
    "server-key.pem",
    "client.pem",
    "client-key.pem",
];

fn hostname() -> Option<String> {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let h = h.trim();
    (!h.is_empty()).then(|| h.to_string())
}

/// `gpufuse certs`: a CA, a server certificate for the given hosts and a client certificate,
/// all signed by that CA (ECDSA P-256).
pub fn certs(a: CertsArgs) -> anyhow::Result<()> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    for f in FILES {
        let p = a.dir.join(f);
        anyhow::ensure!(!p.exists(), "{} exists; not overwriting it", p.display());
    }
    let hosts = if a.hosts.is_empty() {
        let mut h = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
        h.extend(hostname().filter(|n| n != "localhost"));
        h
    } else {
        a.hosts.clone()
    };
    let now = time::OffsetDateTime::now_utc();
    let valid = |p: &mut CertificateParams| {
        p.not_before = now - time::Duration::hours(1);
        p.not_after = now + time::Duration::days(i64::from(a.days));
    };

    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // A name of its own: a client that trusts another `gpufuse certs` CA must be told the
    // issuer is unknown, not that a signature is bad.
    let serial = now.unix_timestamp_nanos() ^ i128::from(std::process::id());
    ca_params.distinguished_name.push(
        DnType::CommonName,
        format!("gpufuse CA {:x}", serial as u64),
    );
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    valid(&mut ca_params);
    let ca = ca_params.self_signed(&ca_key)?;

    let server_key = KeyPair::generate()?;
    let mut server_params = CertificateParams::new(hosts.clone())
        .with_context(|| format!("bad --host in {hosts:?}"))?;
    server_params
        .distinguished_name
        .push(DnType::CommonName, hosts[0].clone());
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    valid(&mut server_params);
    let server = server_params.signed_by(&server_key, &ca, &ca_key)?;

    let client_key = KeyPair::generate()?;
    let mut client_params = CertificateParams::new(Vec::<String>::new())?;
    client_params
        .distinguished_name
        .push(DnType::CommonName, "gpufuse client");
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    valid(&mut client_params);
    let client = client_params.signed_by(&client_key, &ca, &ca_key)?;

    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("cannot create {}", a.dir.display()))?;
    let contents = [
        ca.pem(),
        ca_key.serialize_pem(),
        server.pem(),
        server_key.serialize_pem(),
        client.pem(),
        client_key.serialize_pem(),
    ];
    for (f, text) in FILES.iter().zip(contents) {
        write_new(&a.dir.join(f), &text, f.ends_with("-key.pem"))?;
    }
    println!(
        "wrote {} (server certificate for {})\n  serve: --listen tcp+tls:HOST:PORT --tls-cert {} --tls-key {} [--tls-client-ca {}]\n  run:   --server tcp+tls:HOST:PORT --tls-ca {} [--tls-cert {} --tls-key {}]",
        a.dir.display(),
        hosts.join(", "),
        a.dir.join("server.pem").display(),
        a.dir.join("server-key.pem").display(),
        a.dir.join("ca.pem").display(),
        a.dir.join("ca.pem").display(),
        a.dir.join("client.pem").display(),
        a.dir.join("client-key.pem").display(),
    );
    Ok(())
}

/// Creates `path` (it must not exist); private keys are readable by their owner only.
fn write_new(path: &Path, text: &str, private: bool) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}
