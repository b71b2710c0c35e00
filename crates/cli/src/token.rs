//! `gpufuse token secret FILE` and `gpufuse token issue --secret-file FILE --subject NAME`.

use std::path::{Path, PathBuf};

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
    },
}

pub fn read_secret(path: &Path) -> anyhow::Result<Vec<u8>> {
    let hex = std::fs::read_to_string(path)?;
    let hex = hex.trim();
    anyhow::ensure!(
        hex.len() >= 32 && hex.len() % 2 == 0,
        "{} does not hold a hex secret",
        path.display()
    );
    (0..hex.len())
        .step_by(2)
        .map(|i| Ok(u8::from_str_radix(&hex[i..i + 2], 16)?))
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
                .open(&file)?;
            std::io::Write::write_all(&mut f, hex.as_bytes())?;
            println!("wrote a new secret to {}", file.display());
        }
        TokenCommand::Issue {
            secret_file,
            subject,
            ttl,
            max_vram,
        } => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs();
            let max_vram_bytes = match max_vram {
                Some(s) => Some(
                    gpufuse_node::parse_size(&s).ok_or_else(|| anyhow::anyhow!("bad size {s}"))?,
                ),
                None => None,
            };
            let claims = gpufuse_auth::Claims {
                subject,
                expires: ttl.map(|t| now + t),
                max_vram_bytes,
            };
            println!(
                "{}",
                gpufuse_auth::issue(&read_secret(&secret_file)?, &claims)?
            );
        }
    }
    Ok(())
}
