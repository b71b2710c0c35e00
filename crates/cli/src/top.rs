//! `gpufuse top`: devices and sessions, refreshed each second, in the terminal (ratatui over
//! crossterm). What is shown and in what order is `gpufuse_observe::top`; this draws it.

use std::time::{Duration, Instant};

use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use gpufuse_observe::top::{
    bar, bytes, nodes_line, pending_count, place, program, seconds, KeyOutcome, View, HELP,
};
use gpufuse_observe::PoolSnapshot;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table};

#[derive(clap::Args)]
pub struct TopArgs {
    /// The node to watch, or a controller (the pool: its nodes, their devices, the sessions
    /// placed and waiting), as for `gpufuse status`.
    #[arg(long, env = "GPUFUSE_SERVER", required_unless_present = "http")]
    server: Option<gpufuse_transport::Address>,
    /// Read the richer figures (tenants, throttled time, promised memory) from a process's
    /// `--http` address instead.
    #[arg(long, value_name = "ADDR", conflicts_with = "server")]
    http: Option<String>,
    #[command(flatten)]
    pub tls: crate::tls::ClientTlsArgs,
    #[arg(long, env = "GPUFUSE_TOKEN", default_value = "")]
    token: String,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
}

/// One snapshot from wherever `a` points.
pub fn fetch(a: &TopArgs) -> anyhow::Result<PoolSnapshot> {
    match (&a.http, &a.server) {
        (Some(http), _) => crate::report::get_json(http, "/api/v1/snapshot"),
        (None, Some(server)) => {
            use gpufuse_client::Connection;
            let hello = Connection::hello(
                gpufuse_proto::SessionKind::Status,
                a.token.clone(),
                Default::default(),
            );
            snapshot_of(Connection::one_shot(server, &hello)?, &server.to_string())
        }
        (None, None) => anyhow::bail!("give --server or --http"),
    }
}

/// A status answer as a snapshot: a node's (`Status`) or a controller's pool (`PoolStatus`:
/// its nodes, their devices, the placed sessions and the pending ones).
fn snapshot_of(reply: gpufuse_proto::ServerHello, server: &str) -> anyhow::Result<PoolSnapshot> {
    use gpufuse_client::ClientError;
    match reply {
        gpufuse_proto::ServerHello::Status(s) => Ok(from_status(&s, server)),
        gpufuse_proto::ServerHello::PoolStatus(p) => {
            Ok(gpufuse_controller::observed::to_snapshot(&p, server))
        }
        gpufuse_proto::ServerHello::Refused { reason } => Err(ClientError::Refused(reason).into()),
        _ => Err(ClientError::UnexpectedReply.into()),
    }
}

/// A node's status answer as a snapshot (the fields the status protocol carries).
fn from_status(s: &gpufuse_proto::NodeStatus, node: &str) -> PoolSnapshot {
    PoolSnapshot {
        role: "node".into(),
        host: node.to_string(),
        compute_policy: s.compute_policy.name().into(),
        devices: s
            .devices
            .iter()
            .map(|d| gpufuse_observe::DeviceSnapshot {
                node: node.to_string(),
                index: d.index,
                uuid: gpufuse_observe::snapshot::uuid_string(&d.uuid),
                model: d.name.clone(),
                kind: match d.kind {
                    gpufuse_proto::DeviceKind::Cuda => "cuda",
                    gpufuse_proto::DeviceKind::Emulated => "emu",
                }
                .into(),
                memory_total_bytes: d.total_bytes,
                memory_used_bytes: d.used_bytes,
                busy_ratio: f64::from(d.utilization_percent) / 100.0,
                sessions: s.sessions.iter().filter(|x| x.device == d.index).count() as u32,
                ..Default::default()
            })
            .collect(),
        sessions: s
            .sessions
            .iter()
            .map(|x| gpufuse_observe::SessionSnapshot {
                id: x.id.get(),
                node: node.to_string(),
                device: x.device,
                tenant: x.subject.clone().unwrap_or_else(|| "-".into()),
                qos: x.qos.name().into(),
                program: x.program.clone(),
                pid: x.pid,
                memory_used_bytes: x.used_bytes,
                memory_limit_bytes: x.limit_bytes,
                compute_share: x.compute_percent.map(|c| f64::from(c) / 100.0),
                device_seconds: x.device_time_us as f64 / 1e6,
                busy_ratio: f64::from(x.utilization_percent) / 100.0,
                queue_p50_seconds: x.queue_p50_us as f64 / 1e6,
                queue_p99_seconds: x.queue_p99_us as f64 / 1e6,
                state: gpufuse_observe::snapshot::session_state(
                    x.on_device,
                    x.utilization_percent > 0,
                )
                .into(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

pub fn top(a: TopArgs) -> anyhow::Result<()> {
    let interval = Duration::from_secs_f64(a.interval.clamp(0.1, 60.0));
    // The first fetch happens before the screen is taken: a wrong address is a plain error.
    let mut snap = fetch(&a);
    if let Err(e) = &snap {
        anyhow::bail!("{e:#}");
    }
    let mut terminal = ratatui::init();
    let result = (|| -> anyhow::Result<()> {
        let mut view = View::default();
        let mut next = Instant::now() + interval;
        let where_ = a
            .http
            .clone()
            .unwrap_or_else(|| a.server.as_ref().map(|s| s.to_string()).unwrap_or_default());
        loop {
            terminal.draw(|f| draw(f, &where_, &snap, &view))?;
            let wait = next.saturating_duration_since(Instant::now());
            if event::poll(wait)? {
                if let Event::Key(k) = event::read()? {
                    if k.kind != KeyEventKind::Press {
                        continue;
                    }
                    let c = match k.code {
                        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                            '\u{3}'
                        }
                        KeyCode::Char(c) => c,
                        KeyCode::Enter => '\n',
                        KeyCode::Esc => '\u{1b}',
                        KeyCode::Backspace => '\u{7f}',
                        _ => continue,
                    };
                    if view.key(c) == KeyOutcome::Quit {
                        return Ok(());
                    }
                }
                continue;
            }
            snap = fetch(&a);
            next = Instant::now() + interval;
        }
    })();
    ratatui::restore();
    result
}

fn draw(f: &mut ratatui::Frame, where_: &str, snap: &anyhow::Result<PoolSnapshot>, view: &View) {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let s = match snap {
        Ok(s) => s,
        Err(e) => {
            f.render_widget(
                Paragraph::new(format!("gpufuse top: {where_}: {e:#}\n\n{HELP}")),
                f.area(),
            );
            return;
        }
    };
    let nodes = nodes_line(s);
    let rows = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(u16::from(nodes.is_some())),
        Constraint::Length(s.devices.len() as u16 + 3),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .split(f.area());
    let busy = if s.devices.is_empty() {
        0.0
    } else {
        s.devices.iter().map(|d| d.busy_ratio).sum::<f64>() / s.devices.len() as f64
    };
    f.render_widget(
        Paragraph::new(Line::styled(
            format!(
                "gpufuse top  {where_}  {}devices {}  sessions {}  pending {}  busy {:.0}%",
                // A controller places sessions; the launch-queue policy is each node's.
                if s.compute_policy.is_empty() {
                    String::new()
                } else {
                    format!("policy {}  ", s.compute_policy)
                },
                s.devices.len(),
                s.sessions.len(),
                pending_count(s),
                100.0 * busy
            ),
            bold,
        )),
        rows[0],
    );
    if let Some(n) = nodes {
        f.render_widget(Paragraph::new(n), rows[1]);
    }
    let gpu_width = s
        .devices
        .iter()
        .map(|d| place(s, &d.node, d.index).len())
        .max()
        .unwrap_or(0)
        .max(3) as u16;
    let devices = Table::new(
        s.devices.iter().map(|d| {
            let mem = d.memory_used_bytes as f64 / d.memory_total_bytes.max(1) as f64;
            Row::new(vec![
                Cell::from(place(s, &d.node, d.index)),
                Cell::from(d.model.clone()),
                Cell::from(format!(
                    "{} {}/{}",
                    bar(mem, 20),
                    bytes(d.memory_used_bytes),
                    bytes(d.memory_total_bytes)
                )),
                Cell::from(format!(
                    "{} {:>3.0}%",
                    bar(d.busy_ratio, 10),
                    100.0 * d.busy_ratio
                )),
                Cell::from(d.sessions.to_string()),
            ])
        }),
        [
            Constraint::Length(gpu_width),
            Constraint::Length(24),
            Constraint::Length(36),
            Constraint::Length(18),
            Constraint::Length(8),
        ],
    )
    .header(Row::new(["gpu", "model", "memory", "busy", "sessions"]).style(bold))
    .block(Block::bordered().title(" devices "));
    f.render_widget(devices, rows[2]);
    let shown = view.sessions(s);
    let sessions = Table::new(
        shown.iter().map(|x| {
            let mem = match x.memory_limit_bytes {
                Some(l) => format!(
                    "{} {}/{}",
                    bar(x.memory_used_bytes as f64 / l.max(1) as f64, 10),
                    bytes(x.memory_used_bytes),
                    bytes(l)
                ),
                None => format!("{:>12} {}", "", bytes(x.memory_used_bytes)),
            };
            Row::new(vec![
                Cell::from(format!("#{}", x.id)),
                Cell::from(x.tenant.clone()),
                Cell::from(program(x)),
                Cell::from(place(s, &x.node, x.device)),
                Cell::from(x.qos.clone()),
                Cell::from(
                    x.compute_share
                        .map_or("-".into(), |c| format!("{:.0}%", 100.0 * c)),
                ),
                Cell::from(mem),
                Cell::from(format!("{:>3.0}%", 100.0 * x.busy_ratio)),
                Cell::from(seconds(x.device_seconds)),
                Cell::from(format!(
                    "{}/{}",
                    seconds(x.queue_p50_seconds),
                    seconds(x.queue_p99_seconds)
                )),
                Cell::from(x.state.clone()),
            ])
        }),
        [
            Constraint::Length(6),
            Constraint::Length(10),
            Constraint::Min(16),
            Constraint::Length(gpu_width),
            Constraint::Length(8),
            Constraint::Length(5),
            Constraint::Length(26),
            Constraint::Length(5),
            Constraint::Length(9),
            Constraint::Length(15),
            Constraint::Length(7),
        ],
    )
    .header(
        Row::new([
            "id",
            "tenant",
            "program",
            "gpu",
            "qos",
            "share",
            "memory",
            "busy",
            "dev time",
            "queue p50/p99",
            "state",
        ])
        .style(bold),
    )
    .block(Block::bordered().title(format!(
        " sessions: {} shown, sorted by {}{}{} ",
        shown.len(),
        view.sort.name(),
        if view.descending { " (desc)" } else { "" },
        if view.filter.is_empty() && !view.editing {
            String::new()
        } else {
            format!(
                ", filter /{}{}",
                view.filter,
                if view.editing { "_" } else { "" }
            )
        }
    )));
    f.render_widget(sessions, rows[3]);
    f.render_widget(Paragraph::new(HELP), rows[4]);
}
