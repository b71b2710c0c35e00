//! `gpufuse top`'s model, without a terminal: which sessions it shows in what order, what its
//! keys do, and the figures' text. The terminal side (ratatui) is `crates/cli/src/top.rs`.

use crate::snapshot::{PoolSnapshot, SessionSnapshot};

/// What the session table is ordered by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    Id,
    Tenant,
    Memory,
    Busy,
    Queue,
    DeviceTime,
}

impl SortKey {
    const ALL: [SortKey; 6] = [
        SortKey::Id,
        SortKey::Tenant,
        SortKey::Memory,
        SortKey::Busy,
        SortKey::Queue,
        SortKey::DeviceTime,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SortKey::Id => "id",
            SortKey::Tenant => "tenant",
            SortKey::Memory => "memory",
            SortKey::Busy => "busy",
            SortKey::Queue => "queue p99",
            SortKey::DeviceTime => "device time",
        }
    }

    fn next(self) -> SortKey {
        let i = Self::ALL.iter().position(|&k| k == self).unwrap_or(0);
        Self::ALL[(i + 1) % Self::ALL.len()]
    }
}

/// What a key press did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyOutcome {
    Quit,
    Changed,
    Ignored,
}

/// The view's settings: sort order and filter.
#[derive(Clone, Debug)]
pub struct View {
    pub sort: SortKey,
    /// Largest first (the default for figures) or smallest first.
    pub descending: bool,
    /// Sessions whose tenant, program, QoS, state or id contain this are shown.
    pub filter: String,
    /// Typing a filter (after `/`, until Enter or Esc).
    pub editing: bool,
}

impl Default for View {
    fn default() -> Self {
        Self {
            sort: SortKey::Id,
            descending: false,
            filter: String::new(),
            editing: false,
        }
    }
}

/// The keys, for the footer.
pub const HELP: &str = "q quit  s sort  r reverse  / filter  Esc clear filter";

impl View {
    /// Applies a key: `q` quits, `s` sorts by the next column, `r` reverses, `/` starts a
    /// filter (typed characters, Backspace, Enter to keep, Esc to clear).
    pub fn key(&mut self, c: char) -> KeyOutcome {
        if self.editing {
            match c {
                '\n' | '\r' => self.editing = false,
                '\u{1b}' => {
                    self.editing = false;
                    self.filter.clear();
                }
                '\u{8}' | '\u{7f}' => {
                    self.filter.pop();
                }
                c if !c.is_control() => self.filter.push(c),
                _ => return KeyOutcome::Ignored,
            }
            return KeyOutcome::Changed;
        }
        match c {
            'q' | '\u{3}' => KeyOutcome::Quit,
            's' => {
                self.sort = self.sort.next();
                self.descending = self.sort != SortKey::Id && self.sort != SortKey::Tenant;
                KeyOutcome::Changed
            }
            'r' => {
                self.descending = !self.descending;
                KeyOutcome::Changed
            }
            '/' => {
                self.editing = true;
                self.filter.clear();
                KeyOutcome::Changed
            }
            '\u{1b}' => {
                self.filter.clear();
                KeyOutcome::Changed
            }
            _ => KeyOutcome::Ignored,
        }
    }

    fn matches(&self, s: &SessionSnapshot) -> bool {
        if self.filter.is_empty() {
            return true;
        }
        let f = self.filter.to_lowercase();
        [
            s.tenant.as_str(),
            s.program.as_str(),
            s.qos.as_str(),
            s.state.as_str(),
            &s.id.to_string(),
        ]
        .iter()
        .any(|v| v.to_lowercase().contains(&f))
    }

    /// The sessions to show, in order.
    pub fn sessions<'a>(&self, snap: &'a PoolSnapshot) -> Vec<&'a SessionSnapshot> {
        let mut v: Vec<&SessionSnapshot> =
            snap.sessions.iter().filter(|s| self.matches(s)).collect();
        let cmp_f = |a: f64, b: f64| a.partial_cmp(&b).unwrap_or(std::cmp::Ordering::Equal);
        v.sort_by(|a, b| {
            let o = match self.sort {
                SortKey::Id => a.id.cmp(&b.id),
                SortKey::Tenant => a.tenant.cmp(&b.tenant),
                SortKey::Memory => a.memory_used_bytes.cmp(&b.memory_used_bytes),
                SortKey::Busy => cmp_f(a.busy_ratio, b.busy_ratio),
                SortKey::Queue => cmp_f(a.queue_p99_seconds, b.queue_p99_seconds),
                SortKey::DeviceTime => cmp_f(a.device_seconds, b.device_seconds),
            }
            .then(a.id.cmp(&b.id));
            if self.descending {
                o.reverse()
            } else {
                o
            }
        });
        v
    }
}

/// Whether `snap` is a pool of several nodes (a controller's view) rather than one node's.
fn is_pool(snap: &PoolSnapshot) -> bool {
    snap.role == "controller"
}

/// Where a device or a session is: its device index in a node's view, `node/index` in a
/// controller's.
pub fn place(snap: &PoolSnapshot, node: &str, device: u32) -> String {
    if is_pool(snap) {
        format!("{node}/{device}")
    } else {
        device.to_string()
    }
}

/// The nodes a controller's view holds, with their states (`nodes: a ready, b lost`); `None`
/// for a node's view.
pub fn nodes_line(snap: &PoolSnapshot) -> Option<String> {
    let c = snap.controller.as_ref().filter(|_| is_pool(snap))?;
    let nodes: Vec<String> = c
        .nodes
        .iter()
        .map(|n| format!("{} {}", n.name, n.state))
        .collect();
    Some(format!(
        "nodes: {}",
        if nodes.is_empty() {
            "none registered".to_string()
        } else {
            nodes.join(", ")
        }
    ))
}

/// A session's program and pid; `-` where the view does not carry them (a controller's).
pub fn program(s: &SessionSnapshot) -> String {
    if s.program.is_empty() {
        "-".into()
    } else {
        format!("{} ({})", s.program, s.pid)
    }
}

/// Sessions waiting for capacity.
pub fn pending_count(snap: &PoolSnapshot) -> usize {
    snap.pending.iter().filter(|p| p.state == "pending").count()
}

/// `[#####.....]`, `width` cells inside the brackets.
pub fn bar(ratio: f64, width: usize) -> String {
    let r = if ratio.is_finite() {
        ratio.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let full = (r * width as f64).round() as usize;
    format!("[{}{}]", "#".repeat(full), ".".repeat(width - full))
}

/// Bytes as MiB or GiB, one decimal.
pub fn bytes(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    let b = b as f64;
    if b >= GIB {
        format!("{:.1}G", b / GIB)
    } else {
        format!("{:.0}M", b / (1u64 << 20) as f64)
    }
}

/// Seconds as µs, ms or s.
pub fn seconds(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.0}us", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1}ms", s * 1e3)
    } else {
        format!("{s:.2}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap() -> PoolSnapshot {
        let s = |id, tenant: &str, mem, busy| SessionSnapshot {
            id,
            tenant: tenant.into(),
            program: format!("prog{id}"),
            qos: "medium".into(),
            state: "idle".into(),
            memory_used_bytes: mem,
            busy_ratio: busy,
            ..Default::default()
        };
        PoolSnapshot {
            sessions: vec![s(1, "b", 10, 0.5), s(2, "a", 30, 0.1), s(3, "c", 20, 0.9)],
            ..Default::default()
        }
    }

    fn ids(v: &View, s: &PoolSnapshot) -> Vec<u64> {
        v.sessions(s).iter().map(|s| s.id).collect()
    }

    #[test]
    fn s_cycles_the_sort_and_r_reverses_it() {
        let s = snap();
        let mut v = View::default();
        assert_eq!(ids(&v, &s), [1, 2, 3]);
        assert_eq!(v.key('s'), KeyOutcome::Changed);
        assert_eq!(v.sort, SortKey::Tenant);
        assert_eq!(ids(&v, &s), [2, 1, 3]);
        v.key('s');
        assert_eq!(v.sort, SortKey::Memory);
        assert_eq!(ids(&v, &s), [2, 3, 1], "figures sort largest first");
        v.key('r');
        assert_eq!(ids(&v, &s), [1, 3, 2]);
        v.key('s');
        assert_eq!(ids(&v, &s), [3, 1, 2]);
        assert_eq!(v.key('x'), KeyOutcome::Ignored);
        assert_eq!(v.key('q'), KeyOutcome::Quit);
    }

    #[test]
    fn a_filter_is_typed_after_slash_and_cleared_with_escape() {
        let s = snap();
        let mut v = View::default();
        v.key('/');
        for c in "prog3".chars() {
            v.key(c);
        }
        assert_eq!(v.key('q'), KeyOutcome::Changed, "q is text while typing");
        v.key('\u{7f}');
        v.key('\n');
        assert!(!v.editing);
        assert_eq!(v.filter, "prog3");
        assert_eq!(ids(&v, &s), [3]);
        v.key('\u{1b}');
        assert_eq!(ids(&v, &s), [1, 2, 3]);
    }

    #[test]
    fn a_controllers_view_names_each_devices_node_and_lists_the_nodes() {
        use crate::snapshot::{ControllerSnapshot, NodeSnapshot, PendingSnapshot};
        let node = |name: &str, state: &str| NodeSnapshot {
            name: name.into(),
            state: state.into(),
            address: String::new(),
        };
        let mut pool = PoolSnapshot {
            role: "controller".into(),
            controller: Some(ControllerSnapshot {
                nodes: vec![node("gpu-a", "ready"), node("gpu-b", "lost")],
                ..Default::default()
            }),
            pending: vec![
                PendingSnapshot {
                    state: "pending".into(),
                    ..Default::default()
                },
                PendingSnapshot {
                    state: "refused".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(place(&pool, "gpu-b", 1), "gpu-b/1");
        assert_eq!(
            nodes_line(&pool).as_deref(),
            Some("nodes: gpu-a ready, gpu-b lost")
        );
        assert_eq!(pending_count(&pool), 1);
        let unnamed = SessionSnapshot::default();
        assert_eq!(program(&unnamed), "-");
        // A node's own view (`gpufuse serve` is a pool of one) keeps the device index alone.
        pool.role = "node".into();
        assert_eq!(place(&pool, "gpu-b", 1), "1");
        assert_eq!(nodes_line(&pool), None);
        let named = SessionSnapshot {
            program: "train.py".into(),
            pid: 42,
            ..Default::default()
        };
        assert_eq!(program(&named), "train.py (42)");
    }

    #[test]
    fn figures_read_as_their_units() {
        assert_eq!(bar(0.5, 4), "[##..]");
        assert_eq!(bar(7.0, 2), "[##]");
        assert_eq!(bar(f64::NAN, 2), "[..]");
        assert_eq!(bytes(3 << 30), "3.0G");
        assert_eq!(bytes(64 << 20), "64M");
        assert_eq!(seconds(0.000_25), "250us");
        assert_eq!(seconds(0.0125), "12.5ms");
        assert_eq!(seconds(3.0), "3.00s");
    }
}
