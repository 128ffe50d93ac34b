//! Commands of `cargo xtask test` that assert nothing about time and run
//! beside the VM boots, whose emulator keeps one of the two cores busy.
use std::{
    fs::{self, File},
    path::PathBuf,
    process::{Child, Command},
    time::SystemTime,
};

use anyhow::{bail, Context, Result};

use crate::{root, step};

/// Commands that run beside the VM boots, each with its output in
/// target/ci/NAME.log; killed if the suite stops early.
#[derive(Default)]
pub struct SideJobs {
    running: Vec<SideJob>,
}

struct SideJob {
    name: &'static str,
    log: PathBuf,
    child: Child,
    started_at: SystemTime,
}

impl SideJobs {
    pub fn start(&mut self, name: &'static str, what: &str, cmd: Command) -> Result<()> {
        let dir = root().join("target/ci");
        fs::create_dir_all(&dir)?;
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| log.display().to_string())?;
        // Lower priority and one build job: the emulator's thread comes first.
        let mut niced = Command::new("nice");
        niced.args(["-n", "10"]).arg(cmd.get_program()).args(cmd.get_args());
        // The caller's environment changes too: cargo() removes xtask's own
        // CARGO_PKG_* variables, without which ring's build script reruns
        // and later release builds start over.
        for (key, value) in cmd.get_envs() {
            match value {
                Some(value) => niced.env(key, value),
                None => niced.env_remove(key),
            };
        }
        niced.env("CARGO_BUILD_JOBS", "1").current_dir(root()).stdout(out.try_clone()?).stderr(out);
        let child = niced.spawn().with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
        step(&format!("{what}: beside the VM boots, output in target/ci/{name}.log"));
        self.running.push(SideJob { name, log, child, started_at: SystemTime::now() });
        Ok(())
    }

    /// Waits for every job; a failure shows the end of its log and fails the
    /// suite once all have ended.
    pub fn finish(&mut self) -> Result<()> {
        let mut failed = Vec::new();
        for mut job in std::mem::take(&mut self.running) {
            let status = job.child.wait()?;
            // It may have ended long before this wait: its log's last write
            // is when it did.
            let took = fs::metadata(&job.log)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|end| end.duration_since(job.started_at).ok())
                .unwrap_or_else(|| job.started_at.elapsed().unwrap_or_default());
            if status.success() {
                step(&format!("{} passed in {:.0?} (beside the VM boots)", job.name, took));
                continue;
            }
            let text = fs::read_to_string(&job.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail_from = lines.len().saturating_sub(40);
            // Why a case of the benchmark could not run is said where it
            // happened, often above the tail: CI's log must show it.
            for line in lines[..tail_from].iter().filter(|l| l.contains("could not run:")) {
                eprintln!("    {line}");
            }
            for line in &lines[tail_from..] {
                eprintln!("    {line}");
            }
            failed.push(format!(
                "{} failed ({status}) after {took:.0?}; its whole output is in {}",
                job.name,
                job.log.display()
            ));
        }
        if !failed.is_empty() {
            bail!("{}", failed.join("; "));
        }
        Ok(())
    }
}

impl Drop for SideJobs {
    fn drop(&mut self) {
        for job in &mut self.running {
            let _ = job.child.kill();
            let _ = job.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_side_job_keeps_the_environment_its_command_was_given() {
        let mut side = SideJobs::default();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo \"${SIDE_SET-unset} ${HOME-unset}\""])
            .env("SIDE_SET", "given")
            .env_remove("HOME");
        side.start("selftest-env", "a job with its own environment", cmd).expect("start");
        side.finish().expect("passes");
        let log = fs::read_to_string(root().join("target/ci/selftest-env.log")).expect("log");
        assert_eq!(log.trim(), "given unset");
    }

    #[test]
    fn a_side_job_that_fails_fails_the_suite_after_the_others_finish() {
        let mut side = SideJobs::default();
        let mut fails = Command::new("sh");
        fails.args(["-c", "echo side-job-output; exit 3"]);
        side.start("selftest-fails", "a job that fails", fails).expect("start");
        side.start("selftest-passes", "a job that passes", Command::new("true")).expect("start");
        let err = side.finish().expect_err("a failed side job must fail the suite").to_string();
        assert!(err.contains("selftest-fails failed"), "{err}");
        let log = fs::read_to_string(root().join("target/ci/selftest-fails.log")).expect("log");
        assert_eq!(log.trim(), "side-job-output");
        assert!(side.running.is_empty());
    }
}
