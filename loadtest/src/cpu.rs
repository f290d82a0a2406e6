//! CPU time of a process and its descendants, from Linux's `/proc`: what a
//! proxy under test spent while one step of a sweep ran (the proxy's own
//! processes, workers included, found by parent id; nothing else).

use std::collections::HashMap;

/// Ticks (`utime + stime` of the process and, for exited children it
/// waited for, `cutime + cstime`) summed over `root` and every process
/// descended from it; `None` when `root` is not running or `/proc` cannot
/// be read.
pub fn tree_ticks(root: u32) -> Option<u64> {
    let mut parent = HashMap::new();
    let mut ticks = HashMap::new();
    for entry in std::fs::read_dir("/proc").ok()? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        if let Some((ppid, t)) = parse_stat(&stat) {
            parent.insert(pid, ppid);
            ticks.insert(pid, t);
        }
    }
    ticks.get(&root)?;
    let descends = |mut pid: u32| {
        for _ in 0..64 {
            if pid == root {
                return true;
            }
            match parent.get(&pid) {
                Some(&p) if p != 0 && p != pid => pid = p,
                _ => return false,
            }
        }
        false
    };
    Some(ticks.iter().filter(|(&pid, _)| descends(pid)).map(|(_, &t)| t).sum())
}

/// Resident set size (`VmRSS`) summed over `root` and every process
/// descended from it, KiB; `None` when `root` is not running.
pub fn tree_rss_kib(root: u32) -> Option<u64> {
    let mut parent = HashMap::new();
    let mut rss = HashMap::new();
    for entry in std::fs::read_dir("/proc").ok()? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        let Some((ppid, _)) = parse_stat(&stat) else { continue };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        parent.insert(pid, ppid);
        rss.insert(pid, kib);
    }
    rss.get(&root)?;
    let descends = |mut pid: u32| {
        for _ in 0..64 {
            if pid == root {
                return true;
            }
            match parent.get(&pid) {
                Some(&p) if p != 0 && p != pid => pid = p,
                _ => return false,
            }
        }
        false
    };
    Some(rss.iter().filter(|(&pid, _)| descends(pid)).map(|(_, &k)| k).sum())
}

/// Clock ticks per second (`getconf CLK_TCK`: 100 on Linux).
pub const TICKS_PER_S: f64 = 100.0;

/// (ppid, utime + stime + cutime + cstime) of one `/proc/PID/stat` line.
/// The command name (field 2) may hold spaces and parentheses: fields are
/// counted from the last `)`.
fn parse_stat(stat: &str) -> Option<(u32, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17).
    let num = |i: usize| f.get(i - 3)?.parse::<i64>().ok();
    let ppid = u32::try_from(num(4)?).ok()?;
    let t = num(14)? + num(15)? + num(16)?.max(0) + num(17)?.max(0);
    Some((ppid, u64::try_from(t).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_a_strange_name_parses() {
        let line = "4242 (a (weird) name) S 17 4242 4242 0 -1 4194560 1 0 0 0 30 12 5 3 20 0 1 0 1 0 0";
        assert_eq!(parse_stat(line), Some((17, 30 + 12 + 5 + 3)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_is_counted_and_a_missing_one_is_none() {
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        assert!(tree_ticks(std::process::id()).is_some());
        assert_eq!(tree_ticks(u32::MAX - 1), None);
        // This process holds at least a few MiB resident.
        assert!(tree_rss_kib(std::process::id()).is_some_and(|k| k > 1024));
        assert_eq!(tree_rss_kib(u32::MAX - 1), None);
    }
}
