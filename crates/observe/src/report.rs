//! The cost report's formats (`gpufuse report`): a table for people, CSV and JSON for
//! spreadsheets and scripts; and the `--since` durations it takes.

use std::fmt::Write;

use crate::history::Report;

/// `90s`, `15m`, `2h`, `1d` or a number of seconds.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 90s, 15m, 1h, 1d)"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        other => return Err(format!("unknown unit {other:?} in {s:?} (s, m, h or d)")),
    };
    n.checked_mul(scale)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{s:?} is not a duration of at least a second"))
}

const HEADER: [&str; 8] = [
    "tenant",
    "sessions",
    "device_hours_promised",
    "device_hours_used",
    "vram_gib_hours",
    "cost",
    "whole_gpu_hours",
    "whole_gpu_cost",
];

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One line per tenant, then a `pool` line (its utilization in `device_hours_used` over
/// `device_hours_promised`'s column: capacity).
pub fn to_csv(r: &Report) -> String {
    let mut out = HEADER.join(",");
    out.push('\n');
    for t in &r.tenants {
        let _ = writeln!(
            out,
            "{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6}",
            csv_field(&t.tenant),
            t.sessions,
            t.device_hours_promised,
            t.device_hours_used,
            t.vram_gib_hours,
            t.cost,
            t.whole_gpu_hours,
            t.whole_gpu_cost
        );
    }
    out
}

/// The report as a table, with the pool's utilization and the comparison with whole GPUs.
pub fn to_text(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "usage from {} to {} (Unix seconds; {:.0} minutes), prices in {}",
        r.from,
        r.to,
        (r.to - r.from) as f64 / 60.0,
        r.currency
    );
    let _ = writeln!(
        out,
        "{:<20} {:>8} {:>12} {:>12} {:>12} {:>10} {:>12} {:>12}",
        "tenant",
        "sessions",
        "dev-h prom.",
        "dev-h used",
        "VRAM GiB-h",
        "cost",
        "whole GPU-h",
        "whole cost"
    );
    for t in &r.tenants {
        let _ = writeln!(
            out,
            "{:<20} {:>8} {:>12.4} {:>12.4} {:>12.3} {:>10.4} {:>12.4} {:>12.4}",
            t.tenant,
            t.sessions,
            t.device_hours_promised,
            t.device_hours_used,
            t.vram_gib_hours,
            t.cost,
            t.whole_gpu_hours,
            t.whole_gpu_cost
        );
    }
    if r.tenants.is_empty() {
        let _ = writeln!(out, "(no sessions in this period)");
    }
    let _ = writeln!(
        out,
        "pool: {:.4} of {:.4} device-hours used ({:.1}% utilization); cost {:.4} {}, on whole GPUs {:.4} {}{}",
        r.pool_device_hours_used,
        r.pool_device_hours,
        100.0 * r.pool_utilization,
        r.cost,
        r.currency,
        r.whole_gpu_cost,
        r.currency,
        if r.whole_gpu_cost > 0.0 {
            format!(" ({:.0}% saved)", 100.0 * (1.0 - r.cost / r.whole_gpu_cost))
        } else {
            String::new()
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::TenantReport;

    #[test]
    fn durations_take_a_unit_and_refuse_nonsense() {
        assert_eq!(parse_duration("90"), Ok(90));
        assert_eq!(parse_duration("90s"), Ok(90));
        assert_eq!(parse_duration("15m"), Ok(900));
        assert_eq!(parse_duration("2h"), Ok(7200));
        assert_eq!(parse_duration("1d"), Ok(86_400));
        assert!(parse_duration("1w").unwrap_err().contains("\"w\""));
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }

    #[test]
    fn csv_quotes_what_needs_it_and_has_a_line_per_tenant() {
        let r = Report {
            tenants: vec![TenantReport {
                tenant: "a,\"b\"".into(),
                sessions: 2,
                cost: 1.5,
                ..Default::default()
            }],
            ..Default::default()
        };
        let csv = to_csv(&r);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("tenant,sessions,"));
        assert!(lines[1].starts_with("\"a,\"\"b\"\"\",2,"), "{csv}");
        assert!(to_text(&r).contains("a,\"b\""));
    }
}
