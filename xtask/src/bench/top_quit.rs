//! `canaryscope top` driven as a person drives it: in a terminal (a tmux
//! pane of its own server), quit with the q key. What is measured is the
//! wait between the key and the pane's process being gone, the moment a
//! shell would print its prompt.
use std::{
    path::{Path, PathBuf},
    process::Command,
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::Env;

/// A tmux server on a socket in a scratch directory, so that nothing is
/// left in tmux's shared socket directory; killed on drop.
struct Pane {
    socket: PathBuf,
}

impl Pane {
    fn start(dir: &Path, command: &str) -> Result<Self> {
        let conf = dir.join("tmux.conf");
        // The pane stays after its process exits, so the exit can be seen
        // and what it printed last read.
        std::fs::write(&conf, "set -g remain-on-exit on\n")?;
        let pane = Self { socket: dir.join("socket") };
        let conf = conf.to_str().context("a UTF-8 scratch path")?;
        let out = pane
            .tmux(&["-f", conf, "new-session", "-d", "-s", "top", "-x", "160", "-y", "40", command])
            .output()
            .context("tmux (scripts/setup.sh installs it)")?;
        if !out.status.success() {
            bail!("tmux new-session: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(pane)
    }

    fn tmux(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("tmux");
        cmd.arg("-S").arg(&self.socket).args(args).env("TERM", "xterm-256color");
        cmd
    }

    fn query(&self, args: &[&str]) -> Result<String> {
        let out = self.tmux(args).output()?;
        if !out.status.success() {
            bail!("tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn screen(&self) -> Result<String> {
        self.query(&["capture-pane", "-p", "-t", "top"])
    }

    fn dead(&self) -> Result<bool> {
        Ok(self.query(&["display-message", "-p", "-t", "top", "#{pane_dead}"])?.trim() == "1")
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]).output();
    }
}

/// Starts `top` in a pane, waits for its first screen, runs `meanwhile`
/// (what it should have probed when it quits), sends q and returns the ms
/// until its process was gone, with everything the pane shows then (its
/// last words on stderr included).
pub(super) fn quit_after(
    env: &Env,
    dir: &Path,
    meanwhile: impl FnOnce() -> Result<()>,
) -> Result<(f64, String)> {
    let pane = Pane::start(dir, &format!("{} top", env.bin.display()))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pane.screen()?.contains("q quit") {
        if pane.dead()? || Instant::now() > deadline {
            bail!("top showed no screen within 60 s: {}", pane.screen()?);
        }
        sleep(Duration::from_millis(20));
    }
    meanwhile()?;
    let sent = Instant::now();
    pane.query(&["send-keys", "-t", "top", "q"])?;
    while !pane.dead()? {
        if sent.elapsed() > Duration::from_secs(60) {
            bail!("top still runs 60 s after q: {}", pane.screen()?);
        }
        sleep(Duration::from_millis(2));
    }
    let took = sent.elapsed().as_secs_f64() * 1e3;
    Ok((took, pane.query(&["capture-pane", "-p", "-S", "-", "-t", "top"])?))
}
