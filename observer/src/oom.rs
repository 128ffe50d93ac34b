//! Telling a cgroup-limit OOM kill from a global one. The kernel's
//! `oom:mark_victim` does not say; the memory cgroup's own `oom_kill`
//! counter does (v2 `memory.events`, v1 `memory.oom_control`).
use std::{fs, path::Path};

/// v1 memory hierarchy on hybrid hosts; kubelet mirrors the unified
/// hierarchy's paths in every controller, so the same relative path works.
const V1_MEMORY: &str = "/sys/fs/cgroup/memory";

/// Reads the `oom_kill` counter from a `memory.events` or `memory.oom_control` text.
pub fn parse_oom_kill(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
}

fn oom_kills_at(dir: &Path) -> Option<u64> {
    ["memory.events", "memory.oom_control"]
        .iter()
        .find_map(|f| fs::read_to_string(dir.join(f)).ok().and_then(|t| parse_oom_kill(&t)))
}

/// `memcg` when the cgroup (or an ancestor) has counted an OOM kill of its
/// own, else `global`.
pub fn scope_of_cgroup(cgroup2_root: Option<&Path>, cgroup: Option<&str>) -> &'static str {
    let Some(cgroup) = cgroup else { return "global" };
    let mut roots: Vec<&Path> = vec![Path::new(V1_MEMORY)];
    if let Some(r) = cgroup2_root {
        roots.push(r);
    }
    for root in roots {
        let mut rel = Path::new(cgroup.trim_start_matches('/'));
        loop {
            if rel.as_os_str().is_empty() {
                break; // the root cgroup's counter is the global one
            }
            if oom_kills_at(&root.join(rel)).is_some_and(|n| n > 0) {
                return "memcg";
            }
            rel = rel.parent().unwrap_or(Path::new(""));
        }
    }
    "global"
}

/// Whether the cgroup or an ancestor has `memory.oom.group` set (cgroup v2
/// only; kubelet sets it on every container since 1.28): then one OOM kills
/// every process in it, and those victims are one kill.
pub fn in_oom_group(cgroup2_root: Option<&Path>, cgroup: Option<&str>) -> bool {
    let (Some(root), Some(cgroup)) = (cgroup2_root, cgroup) else { return false };
    let mut rel = Path::new(cgroup.trim_start_matches('/'));
    while !rel.as_os_str().is_empty() {
        if fs::read_to_string(root.join(rel).join("memory.oom.group")).is_ok_and(|t| t.trim() == "1") {
            return true;
        }
        rel = rel.parent().unwrap_or(Path::new(""));
    }
    false
}

/// Scope for a victim still alive: its memory cgroup from /proc/PID/cgroup.
/// `cgroup2_root` is the unified hierarchy's mount, found once at start.
/// `None` when the victim is already gone (a daemon that reads its records
/// late, on a busy node): nothing about its memory is known from here, and
/// its exit's cgroup path decides instead ([`scope_of_cgroup`]).
pub fn victim_scope(pid: u32, cgroup2_root: Option<&Path>) -> Option<&'static str> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    Some(scope_in(&text, cgroup2_root))
}

/// The scope a `/proc/PID/cgroup` text puts a process's memory in.
fn scope_in(text: &str, cgroup2_root: Option<&Path>) -> &'static str {
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let is_memory = controllers.split(',').any(|c| c == "memory");
        if is_memory
            && path != "/"
            && oom_kills_at(&Path::new(V1_MEMORY).join(path.trim_start_matches('/'))).is_some_and(|n| n > 0)
        {
            return "memcg";
        }
        if controllers.is_empty() && path != "/" && scope_of_cgroup(cgroup2_root, Some(path)) == "memcg" {
            return "memcg";
        }
    }
    "global"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_counter_from_both_versions() {
        assert_eq!(parse_oom_kill("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"), Some(2));
        assert_eq!(parse_oom_kill("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"), Some(1));
        assert_eq!(parse_oom_kill("oom_kill_disable 0\nunder_oom 0\n"), None);
    }

    #[test]
    fn a_victim_already_gone_has_no_scope_rather_than_a_global_one() {
        // Pids wrap far below this: no process has it.
        assert_eq!(victim_scope(u32::MAX - 1, None), None);
        assert!(victim_scope(std::process::id(), None).is_some(), "a live process has one");
    }
}
