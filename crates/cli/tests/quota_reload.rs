//! The quota file is kept in force while `gpufuse controller` runs: an edit is applied
//! within about a second (new sessions get the new limits), a malformed file is logged and
//! the limits in force stay, and SIGHUP re-reads it at once (and does not end the
//! controller). Checked with `gpufuse run`'s admission check against the controller.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Controller {
    dir: PathBuf,
    child: Child,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Controller {
    fn start(name: &str, quota: &str) -> Self {
        Self::start_as(name, quota, &["controller"])
    }

    /// `gpufuse ARGS... --listen unix:DIR/c.sock --quota-file DIR/quota.toml`.
    fn start_as(name: &str, quota: &str, args: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("gfquota-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("quota.toml"), quota).unwrap();
        let log = std::fs::File::create(dir.join("controller.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_gpufuse"))
            .args(args)
            .arg("--listen")
            .arg(format!("unix:{}", dir.join("c.sock").display()))
            .arg("--quota-file")
            .arg(dir.join("quota.toml"))
            .env("GPUFUSE_LOG", "info")
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let c = Controller { dir, child };
        c.eventually("the controller listening", || {
            std::os::unix::net::UnixStream::connect(c.dir.join("c.sock")).is_ok()
        });
        c
    }

    fn addr(&self) -> String {
        format!("unix:{}", self.dir.join("c.sock").display())
    }

    fn write(&self, quota: &str) {
        // Written beside and renamed over it, as editors and Kubernetes do.
        let tmp = self.dir.join("quota.toml.new");
        std::fs::write(&tmp, quota).unwrap();
        std::fs::rename(&tmp, self.dir.join("quota.toml")).unwrap();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("controller.log")).unwrap_or_default()
    }

    /// `gpufuse run --tenant alice --vram VRAM -- /bin/true` against the controller.
    fn run(&self, vram: &str) -> Output {
        Command::new(env!("CARGO_BIN_EXE_gpufuse"))
            .args([
                "run",
                "--server",
                &self.addr(),
                "--tenant",
                "alice",
                "--vram",
                vram,
            ])
            .args(["--", "/bin/true"])
            .output()
            .unwrap()
    }

    fn eventually(&self, what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !f() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for: {what}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn refused_for(o: &Output, limit: &str) -> bool {
    let err = String::from_utf8_lossy(&o.stderr);
    !o.status.success() && err.contains(limit) && err.contains("was not started")
}

fn count(log: &str, what: &str) -> usize {
    log.matches(what).count()
}

#[test]
fn an_edited_quota_file_applies_and_a_malformed_one_keeps_the_quotas_in_force() {
    let c = Controller::start("edit", "[tenants.alice]\nmax_session_vram = \"1GiB\"\n");
    let o = c.run("2GiB");
    assert!(
        refused_for(&o, "at most 1 GiB of VRAM per session (max_session_vram)"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Raised: applied within about a second, without a restart.
    c.write("[tenants.alice]\nmax_session_vram = \"4GiB\"\n");
    c.eventually("the raised limit in force", || {
        c.run("2GiB").status.success()
    });
    assert!(
        c.log().contains("reloaded: 1 tenant(s), no default"),
        "{}",
        c.log()
    );
    // A file that does not parse: logged, naming the fault, and the limits in force stay.
    c.write("[tenants.alice]\nmax_session_vram = \"4 parsecs\"\n");
    c.eventually("the malformed file logged", || {
        let log = c.log();
        log.contains("not reloaded") && log.contains("parsecs")
    });
    assert!(c.run("2GiB").status.success(), "{}", c.log());
    let o = c.run("5GiB");
    assert!(
        refused_for(&o, "at most 4 GiB of VRAM per session"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Logged once, not every second.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(count(&c.log(), "not reloaded"), 1, "{}", c.log());
    // Fixed again (a default for everyone now): applied.
    c.write("[default]\nmax_session_vram = \"512MiB\"\n");
    c.eventually("the fixed file in force", || {
        refused_for(&c.run("1GiB"), "at most 512 MiB")
    });
    // A file that disappears keeps the quotas too.
    std::fs::remove_file(c.dir.join("quota.toml")).unwrap();
    c.eventually("the missing file logged", || {
        c.log().contains("cannot read the quota file")
    });
    assert!(refused_for(&c.run("1GiB"), "at most 512 MiB"));
}

#[test]
fn sighup_rereads_the_quota_file_and_the_controller_goes_on() {
    let mut c = Controller::start("hup", "[tenants.alice]\nsessions = 3\n");
    // SAFETY: kill(2) with a pid this test started; it touches no memory.
    let hup =
        |c: &Controller| assert_eq!(unsafe { libc::kill(c.child.id() as i32, libc::SIGHUP) }, 0);
    hup(&c);
    c.eventually("the SIGHUP reload logged", || {
        c.log().contains("reloaded (SIGHUP): 1 tenant(s)")
    });
    assert!(
        c.child.try_wait().unwrap().is_none(),
        "SIGHUP ended the controller"
    );
    // Malformed, then SIGHUP: said so (once per look), the limits in force stay.
    let before = count(&c.log(), "not reloaded");
    std::fs::write(c.dir.join("quota.toml"), "[tenants.alice]\nsesions = 1\n").unwrap();
    c.eventually("the malformed file logged", || {
        count(&c.log(), "not reloaded") > before
    });
    hup(&c);
    c.eventually("the SIGHUP look logged", || {
        c.log().contains("not reloaded (SIGHUP)")
    });
    assert!(c.log().contains("sesions"), "{}", c.log());
    assert!(c.run("1GiB").status.success(), "{}", c.log());
    assert!(c.child.try_wait().unwrap().is_none());
}

#[test]
fn serve_rereads_its_quota_file_too() {
    let c = Controller::start_as(
        "serve",
        "[tenants.alice]\nmax_session_vram = \"1GiB\"\n",
        &["serve", "--devices", "emu:1:4GiB"],
    );
    assert!(refused_for(&c.run("2GiB"), "(max_session_vram)"));
    c.write("[tenants.alice]\nmax_session_vram = \"3GiB\"\n");
    c.eventually("the raised limit in force", || {
        c.run("2GiB").status.success()
    });
    assert!(c.log().contains("reloaded: 1 tenant(s)"), "{}", c.log());
}
