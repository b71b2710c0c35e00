//! The quota file, kept in force while the controller runs: re-read when its contents change
//! (looked at every [`QUOTA_POLL`]) and at once when asked (`SIGHUP`). New limits apply to new
//! placements and to the pending queue at once; running sessions keep running. A file that
//! does not parse (or cannot be read) is logged, and the quotas in force stay.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use gpufuse_scheduler::QuotaFile;

use crate::Controller;

/// How often the controller looks at its quota file.
pub const QUOTA_POLL: Duration = Duration::from_secs(1);

impl Controller {
    /// Replaces the quota file's limits (what the Kubernetes operator set for a tenant stays
    /// over them) and retries the pending queue under them.
    pub fn reload_quotas(&self, file: QuotaFile) {
        let mut b = self.books();
        let mut q = file.clone();
        for (tenant, quota) in &b.quota_overrides {
            q.set_tenant(tenant, Some(quota.clone()));
        }
        b.file_quotas = file;
        b.pool.set_quotas(q);
        self.reschedule(&mut b);
    }

    /// Keeps the quotas those of the file at `path` (read at start): its contents are looked
    /// at every `every` and whenever `kick` receives (`SIGHUP`); a change is applied
    /// ([`Controller::reload_quotas`]) and logged, a malformed or unreadable file is logged
    /// once and the quotas in force stay. The watching thread ends when `kick`'s sender is
    /// dropped (never, without `kick`).
    pub fn watch_quota_file(&self, path: PathBuf, every: Duration, kick: Option<Receiver<()>>) {
        let c = self.clone();
        let mut seen = std::fs::read_to_string(&path).ok();
        std::thread::Builder::new()
            .name("quota-file".into())
            .spawn(move || loop {
                let asked = match &kick {
                    Some(rx) => match rx.recv_timeout(every) {
                        Ok(()) => true,
                        Err(RecvTimeoutError::Timeout) => false,
                        Err(RecvTimeoutError::Disconnected) => return,
                    },
                    None => {
                        std::thread::sleep(every);
                        false
                    }
                };
                c.look_at_quota_file(&path, &mut seen, asked);
            })
            .expect("cannot start the quota file's thread");
    }

    /// One look at the quota file: `seen` is the text last looked at (applied or refused);
    /// `asked` (SIGHUP) applies it even unchanged.
    fn look_at_quota_file(&self, path: &Path, seen: &mut Option<String>, asked: bool) {
        let why = if asked { " (SIGHUP)" } else { "" };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                if seen.is_some() || asked {
                    tracing::error!(
                        "cannot read the quota file {}{why}: {e}; the quotas in force stay",
                        path.display()
                    );
                }
                *seen = None;
                return;
            }
        };
        // Unchanged: nothing to do, unless asked (SIGHUP reads and applies it again).
        if seen.as_deref() == Some(text.as_str()) && !asked {
            return;
        }
        *seen = Some(text.clone());
        match QuotaFile::parse(&text) {
            Ok(q) => {
                let tenants = q.tenants.len();
                let default = if q.default.is_some() {
                    "a default"
                } else {
                    "no default"
                };
                self.reload_quotas(q);
                tracing::info!(
                    "quota file {} reloaded{why}: {tenants} tenant(s), {default}; new placements and waiting sessions get the new limits",
                    path.display()
                );
            }
            Err(e) => tracing::error!(
                "quota file {} not reloaded{why}: {e}; the quotas in force stay",
                path.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use gpufuse_scheduler::{QuotaFile, TenantQuota};

    use crate::{Controller, ControllerConfig};

    fn sessions(c: &Controller, tenant: &str) -> Option<u32> {
        c.books()
            .pool
            .quotas()
            .for_tenant(tenant)
            .and_then(|q| q.sessions)
    }

    #[test]
    fn a_reloaded_file_keeps_what_the_operator_set_for_a_tenant() {
        let mut config = ControllerConfig::new(Vec::new());
        config.quotas =
            QuotaFile::parse("[tenants.alice]\nsessions = 1\n[tenants.bob]\nsessions = 2\n")
                .unwrap();
        let c = Controller::new(config);
        let five = TenantQuota {
            sessions: Some(5),
            ..Default::default()
        };
        c.set_tenant_quota("alice", Some(five));
        c.reload_quotas(
            QuotaFile::parse("[tenants.alice]\nsessions = 7\n[tenants.bob]\nsessions = 3\n")
                .unwrap(),
        );
        assert_eq!(
            sessions(&c, "alice"),
            Some(5),
            "the GPUQuota stays over the file"
        );
        assert_eq!(sessions(&c, "bob"), Some(3), "the file's new limit");
        // The GPUQuota goes: the reloaded file's entry applies, not the first file's.
        c.set_tenant_quota("alice", None);
        assert_eq!(sessions(&c, "alice"), Some(7));
        c.reload_quotas(QuotaFile::default());
        assert_eq!(sessions(&c, "alice"), None);
    }

    #[test]
    fn a_malformed_file_keeps_the_quotas_in_force() {
        let dir = std::env::temp_dir().join(format!("gfquota-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("q.toml");
        std::fs::write(&path, "[default]\nsessions = 2\n").unwrap();
        let c = Controller::new(ControllerConfig::new(Vec::new()));
        let mut seen = None;
        c.look_at_quota_file(&path, &mut seen, false);
        assert_eq!(sessions(&c, "anyone"), Some(2));
        std::fs::write(&path, "[default]\nsesions = 3\n").unwrap();
        c.look_at_quota_file(&path, &mut seen, false);
        assert_eq!(sessions(&c, "anyone"), Some(2));
        assert!(seen.as_deref().unwrap().contains("sesions"));
        std::fs::remove_file(&path).unwrap();
        c.look_at_quota_file(&path, &mut seen, true);
        assert_eq!(sessions(&c, "anyone"), Some(2));
        assert_eq!(seen, None);
        std::fs::write(&path, "[default]\nsessions = 4\n").unwrap();
        c.look_at_quota_file(&path, &mut seen, false);
        assert_eq!(sessions(&c, "anyone"), Some(4));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
