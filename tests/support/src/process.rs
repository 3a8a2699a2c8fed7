//! This process's own CPU time and memory, as the benches report them (Linux /proc).

use std::time::Duration;

/// The fields of /proc/self/stat after the command name, as numbers (0 where not one): index 0
/// is field 3 (state), so utime (field 14) is index 11.
fn stat_fields() -> Vec<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect()
}

fn ticks(indexes: &[usize]) -> Duration {
    let fields = stat_fields();
    let sum: u64 = indexes
        .iter()
        .map(|&i| fields.get(i).copied().unwrap_or(0))
        .sum();
    // Clock ticks of 10 ms (USER_HZ 100).
    Duration::from_millis(sum * 10)
}

/// User and system CPU time of this process.
pub fn cpu_time() -> Duration {
    ticks(&[11, 12])
}

/// User and system CPU time of the child processes this process waited for (helm).
pub fn children_cpu_time() -> Duration {
    ticks(&[13, 14])
}

/// A `/proc/self/status` field in KiB (`VmHWM:` the peak RSS, `VmRSS:` the RSS now).
pub fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
