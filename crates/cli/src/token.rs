//! `gpufuse token secret FILE` and `gpufuse token issue --secret-file FILE --subject NAME`.

use std::path::{Path, PathBuf};

use anyhow::Context;

#[derive(clap::Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(clap::Subcommand)]
enum TokenCommand {
    /// Write a new random secret to FILE (mode 0600).
    Secret { file: PathBuf },
    /// Print a session token signed with the secret.
    Issue {
        #[arg(long)]
        secret_file: PathBuf,
        #[arg(long)]
        subject: String,
        /// Seconds until the token expires.
        #[arg(long)]
        ttl: Option<u64>,
        /// Most VRAM a session with this token may request (e.g. 8GiB).
        #[arg(long)]
        max_vram: Option<String>,
        /// Largest compute share (percent) a session with this token may ask for; a session
        /// asking for none gets this share.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
        max_compute: Option<u32>,
    },
}

pub fn read_secret(path: &Path) -> anyhow::Result<Vec<u8>> {
    let hex = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token secret file {}", path.display()))?;
    let hex = hex.trim();
    let not_hex = || {
        anyhow::anyhow!(
            "{} does not hold a token secret (at least 32 hex digits; `gpufuse token secret FILE` writes one)",
            path.display()
        )
    };
    if hex.len() < 32 || hex.len() % 2 != 0 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(not_hex());
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| not_hex()))
        .collect()
}

pub fn token(a: TokenArgs) -> anyhow::Result<()> {
    match a.command {
        TokenCommand::Secret { file } => {
            use std::os::unix::fs::OpenOptionsExt;
            let hex: String = gpufuse_auth::new_secret()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&file)
                .with_context(|| format!("cannot create {}", file.display()))?;
            std::io::Write::write_all(&mut f, hex.as_bytes())
                .with_context(|| format!("cannot write {}", file.display()))?;
            println!("wrote a new secret to {}", file.display());
        }
        TokenCommand::Issue {
            secret_file,
            subject,
            ttl,
            max_vram,
            max_compute,
        } => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs();
            let max_vram_bytes = match max_vram {
                Some(s) => Some(gpufuse_node::parse_size(&s).ok_or_else(|| {
                    anyhow::anyhow!(
                        "bad --max-vram {s:?}: expected {}",
                        gpufuse_node::SIZE_FORMS
                    )
                })?),
                None => None,
            };
            let claims = gpufuse_auth::Claims {
                subject,
                expires: ttl.map(|t| now + t),
                max_vram_bytes,
                max_compute_percent: max_compute,
                ..Default::default()
            };
            println!(
                "{}",
                gpufuse_auth::issue(&read_secret(&secret_file)?, &claims)?
            );
        }
    }
    Ok(())
}
