//! Real cgroups named as kubelet and the container runtimes name them.
use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::Duration,
};

use crate::random_hex;

use crate::out_pid;

pub fn cgroup2_root() -> PathBuf {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    mountinfo
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            if right.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            left.split_whitespace().nth(4).map(PathBuf::from)
        })
        .expect("a cgroup2 mount")
}

/// How the kubelet's cgroup driver and the container runtime name a
/// container's cgroup (see observer/src/attribution/cgroup_path.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// systemd driver, containerd: `.../kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope`.
    SystemdContainerd,
    /// systemd driver, CRI-O: `.../kubepods-burstable-pod<uid_>.slice/crio-<id>.scope`.
    SystemdCrio,
    /// cgroupfs driver, containerd: `/kubepods/burstable/pod<uid>/<id>`.
    CgroupfsContainerd,
    /// cgroupfs driver, CRI-O: `/kubepods/burstable/pod<uid>/crio-<id>`.
    CgroupfsCrio,
}

impl Layout {
    /// The directories from the cgroup2 root down to the container's.
    fn parts(self, pod_uid: &str, container_id: &str) -> Vec<String> {
        let systemd_uid = pod_uid.replace('-', "_");
        let systemd_pod = [
            "kubepods.slice".to_string(),
            "kubepods-burstable.slice".to_string(),
            format!("kubepods-burstable-pod{systemd_uid}.slice"),
        ];
        let cgroupfs_pod = ["kubepods".to_string(), "burstable".to_string(), format!("pod{pod_uid}")];
        let (pod, container) = match self {
            Self::SystemdContainerd => (systemd_pod, format!("cri-containerd-{container_id}.scope")),
            Self::SystemdCrio => (systemd_pod, format!("crio-{container_id}.scope")),
            Self::CgroupfsContainerd => (cgroupfs_pod, container_id.to_string()),
            Self::CgroupfsCrio => (cgroupfs_pod, format!("crio-{container_id}")),
        };
        pod.into_iter().chain([container]).collect()
    }

    /// The `containerID` the kubelet reports for this runtime.
    pub fn container_id_uri(self, container_id: &str) -> String {
        match self {
            Self::SystemdContainerd | Self::CgroupfsContainerd => format!("containerd://{container_id}"),
            Self::SystemdCrio | Self::CgroupfsCrio => format!("cri-o://{container_id}"),
        }
    }
}

/// A cgroup2 directory shaped like a kubelet + container runtime container
/// (systemd driver and containerd unless told otherwise), removed on drop.
/// Directories above it that another `PodCgroup` made stay theirs: a pod's
/// second container must be dropped before its first.
pub struct PodCgroup {
    /// Path below the cgroup2 root, as canaryscope reports it.
    pub rel: String,
    pub dir: PathBuf,
    layout: Layout,
    pod_uid: String,
    container_id: String,
    created: Vec<PathBuf>,
    v1_dirs: Vec<PathBuf>,
    created_v1: Vec<PathBuf>,
}

impl PodCgroup {
    pub fn new(pod_uid: &str, container_id: &str) -> Self {
        Self::with_layout(Layout::SystemdContainerd, pod_uid, container_id)
    }

    /// The container's cgroup as `layout` names it.
    pub fn with_layout(layout: Layout, pod_uid: &str, container_id: &str) -> Self {
        let parts = layout.parts(pod_uid, container_id);
        let mut dir = cgroup2_root();
        let mut created = Vec::new();
        for p in &parts {
            dir.push(p);
            match fs::create_dir(&dir) {
                Ok(()) => created.push(dir.clone()),
                // A parent another test pod made (concurrently) stays theirs.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => panic!("mkdir {}: {e}", dir.display()),
            }
        }
        Self {
            rel: format!("/{}", parts.join("/")),
            dir,
            layout,
            pod_uid: pod_uid.to_string(),
            container_id: container_id.to_string(),
            created,
            v1_dirs: Vec::new(),
            created_v1: Vec::new(),
        }
    }

    /// The container's cgroup id (what the kernel side keys by).
    pub fn id(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(&self.dir).expect("cgroup").ino()
    }

    /// The kubelet's restart of this container: its cgroup is removed (its
    /// processes must have exited) and the new container's is made in the
    /// same pod, whose cgroup stays. The directories above pass to the new
    /// one, which removes them on drop.
    pub fn restarted(mut self, container_id: &str) -> Self {
        assert_eq!(self.created.last(), Some(&self.dir), "a container's cgroup made here");
        self.created.pop();
        remove_dir_waiting(&self.dir);
        assert!(!self.dir.exists(), "{} still there: its processes have not left", self.dir.display());
        let parts = self.layout.parts(&self.pod_uid, container_id);
        let name = parts.last().expect("a container's directory");
        let dir = self.dir.parent().expect("the pod's cgroup").join(name);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let mut created = std::mem::take(&mut self.created);
        created.push(dir.clone());
        Self {
            rel: format!("/{}", parts.join("/")),
            dir,
            layout: self.layout,
            pod_uid: self.pod_uid.clone(),
            container_id: container_id.to_string(),
            created,
            v1_dirs: Vec::new(),
            created_v1: Vec::new(),
        }
    }

    /// The container's full ID, as its runtime made it.
    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    /// The 12-character container id the exporter labels series with.
    pub fn short_container_id(&self) -> String {
        self.container_id.chars().take(12).collect()
    }

    /// A command whose process joins this cgroup (and its v1 limit
    /// cgroups on hybrid hosts) before it execs.
    pub fn command(&self, program: &Path) -> Command {
        let mut files = vec![self.dir.join("cgroup.procs")];
        files.extend(self.v1_dirs.iter().map(|d| d.join("tasks")));
        let mut cmd = Command::new(program);
        // SAFETY: the closure only writes to files, which is fine for a test
        // child between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                for f in &files {
                    fs::write(f, b"0")?;
                }
                Ok(())
            });
        }
        cmd
    }

    /// Pure cgroup v2 hosts (the VM) put limits in the same directory;
    /// hybrid hosts in a v1 controller directory at
    /// the same relative path, as kubelet does.
    fn v1_dir(&mut self, controller: &str) -> Option<PathBuf> {
        let v2_has = fs::read_to_string(cgroup2_root().join("cgroup.controllers"))
            .map(|c| c.split_whitespace().any(|x| x == controller))
            .unwrap_or(false);
        if v2_has {
            // Enable the controller for children along the path.
            let mut dir = cgroup2_root();
            for part in self.rel.trim_start_matches('/').split('/') {
                let _ = fs::write(dir.join("cgroup.subtree_control"), format!("+{controller}"));
                dir.push(part);
            }
            return None;
        }
        let mut dir = PathBuf::from("/sys/fs/cgroup").join(controller);
        for part in self.rel.trim_start_matches('/').split('/') {
            dir.push(part);
            if !dir.exists() {
                fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
                self.created_v1.push(dir.clone());
            }
        }
        self.v1_dirs.push(dir.clone());
        Some(dir)
    }

    pub fn limit_cpu(&mut self, cores: f64) {
        let period = 100_000u64;
        let quota = (cores * period as f64) as u64;
        match self.v1_dir("cpu") {
            Some(d) => {
                fs::write(d.join("cpu.cfs_period_us"), period.to_string()).expect("cfs_period_us");
                fs::write(d.join("cpu.cfs_quota_us"), quota.to_string()).expect("cfs_quota_us");
            }
            None => fs::write(self.dir.join("cpu.max"), format!("{quota} {period}")).expect("cpu.max"),
        }
    }

    pub fn limit_memory(&mut self, bytes: u64) {
        match self.v1_dir("memory") {
            Some(d) => {
                fs::write(d.join("memory.limit_in_bytes"), bytes.to_string()).expect("limit_in_bytes");
                let _ = fs::write(d.join("memory.memsw.limit_in_bytes"), bytes.to_string());
            }
            None => {
                fs::write(self.dir.join("memory.max"), bytes.to_string()).expect("memory.max");
                let _ = fs::write(self.dir.join("memory.swap.max"), "0");
            }
        }
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        for dir in self.created.iter().rev().chain(self.created_v1.iter().rev()) {
            remove_dir_waiting(dir);
        }
    }
}

/// Removes an empty cgroup directory, giving the processes that exited
/// in it a second to leave.
fn remove_dir_waiting(dir: &Path) {
    for _ in 0..50 {
        if fs::remove_dir(dir).is_ok() || !dir.exists() {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A cgroup outside the kubepods hierarchy, as a system service's; removed
/// on drop.
pub struct SystemCgroup {
    pub rel: String,
    pub dir: PathBuf,
}

impl SystemCgroup {
    #[expect(clippy::new_without_default, reason = "making a cgroup is no default value")]
    pub fn new() -> Self {
        let rel = format!("/canaryscope-test-{}.slice", random_hex(8));
        let dir = cgroup2_root().join(&rel[1..]);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Self { rel, dir }
    }

    /// The cgroup id (what the kernel side keys by).
    pub fn id(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(&self.dir).expect("cgroup").ino()
    }

    /// A command whose process joins this cgroup before it execs.
    pub fn command(&self, program: &Path) -> Command {
        command_in(&self.dir, program)
    }
}

/// A command whose process joins the cgroup2 directory `dir` before it execs.
pub fn command_in(dir: &Path, program: &Path) -> Command {
    let procs = dir.join("cgroup.procs");
    let mut cmd = Command::new(program);
    // SAFETY: only a file write between fork and exec.
    unsafe { cmd.pre_exec(move || fs::write(&procs, b"0")) };
    cmd
}

impl Drop for SystemCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs a shell in `cg` that SIGKILLs itself; returns its pid. Its exit is
/// recorded after everything the cgroup did before (see `Tracer::barrier`).
pub fn self_killing_marker(cg: &PodCgroup) -> u64 {
    let out =
        cg.command(Path::new("/bin/sh")).args(["-c", "echo pid=$$; kill -KILL $$"]).output().expect("sh");
    out_pid(&out.stdout)
}
