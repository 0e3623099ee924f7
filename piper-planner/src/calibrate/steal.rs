//! CPU time a virtual machine's host gave to other guests while a measurement ran (`steal` in Linux's
//! `/proc/stat`). On a shared cloud host it comes and goes within minutes, and a step measured while it
//! is high runs slower by about that share: calibrating or validating then measures the neighbours, not
//! the runtime. Calibration and validation report it, and warn above [`STEAL_WARN`].

/// The steal share above which measured figures are flagged as taken under contention.
pub const STEAL_WARN: f64 = 0.05;

/// Cumulative CPU time (all CPUs, in the kernel's ticks): stolen and total.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuTicks {
    pub steal: u64,
    pub total: u64,
}

/// The aggregate `cpu` line of `/proc/stat` (`user nice system idle iowait irq softirq steal …`);
/// `None` for anything else. Guest time is already inside user and nice, so it is not added again.
pub fn parse_cpu_line(line: &str) -> Option<CpuTicks> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let ticks: Vec<u64> = fields.take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    (ticks.len() == 8).then(|| CpuTicks { steal: ticks[7], total: ticks.iter().sum() })
}

/// A stopwatch of stolen time from now; `None` inside where `/proc/stat` cannot be read (not Linux).
#[derive(Clone, Copy, Debug)]
pub struct StealClock {
    start: Option<CpuTicks>,
}

impl StealClock {
    pub fn start() -> Self {
        StealClock { start: read() }
    }

    /// Stolen ÷ all CPU time since [`StealClock::start`]; `None` when unknown or no time passed.
    pub fn share(&self) -> Option<f64> {
        let (a, b) = (self.start?, read()?);
        let total = b.total.checked_sub(a.total).filter(|t| *t > 0)?;
        Some(b.steal.saturating_sub(a.steal) as f64 / total as f64)
    }
}

fn read() -> Option<CpuTicks> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines().next().and_then(parse_cpu_line)
}

/// One line for `share`: the figure, and above [`STEAL_WARN`] what it means for the measurements.
pub fn report(share: f64, what: &str) -> String {
    let line =
        format!("CPU time stolen by other guests of this virtual machine's host during {what}: {:.1}%", 100.0 * share);
    if share > STEAL_WARN {
        format!(
            "{line} — above {:.0}%: the figures are slower than the machine alone; run again when it is quieter",
            100.0 * STEAL_WARN
        )
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_line_sums_eight_fields_and_keeps_steal() {
        let t = parse_cpu_line("cpu  2054398 11 221970 2954793 10495 0 1184 22413 0 0").unwrap();
        assert_eq!(t, CpuTicks { steal: 22413, total: 2054398 + 11 + 221970 + 2954793 + 10495 + 1184 + 22413 });
        assert_eq!(parse_cpu_line("cpu0 1 2 3 4 5 6 7 8"), None);
        assert_eq!(parse_cpu_line("cpu 1 2 3"), None);
        assert_eq!(parse_cpu_line("cpu 1 2 x 4 5 6 7 8"), None);
    }

    #[test]
    fn the_report_warns_only_above_the_threshold() {
        assert!(!report(0.01, "the calibration").contains("quieter"));
        let warned = report(0.12, "the calibration");
        assert!(warned.contains("12.0%") && warned.contains("quieter"), "{warned}");
    }

    /// On Linux the clock reads a share in [0, 1] once time has passed.
    #[test]
    fn the_clock_reads_a_share_on_linux() {
        let clock = StealClock::start();
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        if cfg!(target_os = "linux") {
            let share = clock.share().expect("/proc/stat");
            assert!((0.0..=1.0).contains(&share), "{share}");
        }
    }
}
