//! `cargo xtask image`: the container image the DaemonSet runs, as an OCI archive.
//!
//! The image is `FROM scratch`: a root filesystem made here holding
//! `/usr/bin/canaryscope`, exactly the shared libraries it loads (glibc's, from
//! `ldd`, at the paths the loader looks them up, ELF interpreter included) and
//! empty `/proc`, `/sys` and `/tmp` for the DaemonSet's mounts. No shell, no
//! package manager. buildah turns it into `canaryscope:0.1.0` and writes
//! `target/image/canaryscope.oci.tar`, which `ctr images import` loads.
//!
//! buildah runs as root with the vfs driver (no registry, no daemon, no overlay
//! mounts needed) and keeps all of its state under target/image/storage.
//!
//! [`check`] then reads the archive back the way a runtime would (index →
//! manifest → config and layers), checks the config and the size, unpacks the
//! layer and runs the binary from that root filesystem under chroot.
use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Instant,
};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use crate::{root, step};

const NAME: &str = "canaryscope";
/// The workspace version (xtask inherits it: `version.workspace = true`).
const VERSION: &str = env!("CARGO_PKG_VERSION");
const BINARY: &str = "/usr/bin/canaryscope";
const PORT: &str = "9464/tcp";
/// Archive size limit: the image is a ~17 MB binary and glibc, gzip-compressed.
const MAX_COMPRESSED: u64 = 30 * 1024 * 1024;
/// Working container name; fixed so that a run interrupted halfway is cleaned up by the next.
const WORKING_CONTAINER: &str = "canaryscope-image-build";

fn image_dir() -> PathBuf {
    root().join("target/image")
}

pub fn archive_path() -> PathBuf {
    image_dir().join("canaryscope.oci.tar")
}

/// Build the binary and the image, then check the image.
pub fn run() -> Result<()> {
    let started = Instant::now();
    require_root()?;
    let buildah = Buildah::new()?;
    let bin = crate::build()?;
    let archive = build_image(&buildah, &bin)?;
    eprintln!("    image built in {:.1?}", started.elapsed());
    let checked = Instant::now();
    check(&archive)?;
    eprintln!("    image checked in {:.1?}", checked.elapsed());
    step(&format!("image {} ready in {:.1?}", rel(&archive), started.elapsed()));
    Ok(())
}

fn require_root() -> Result<()> {
    let status = fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    let euid = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().nth(1));
    if euid != Some("0") {
        bail!("the image task runs buildah (vfs storage), chroot and mount namespaces: run it as root");
    }
    Ok(())
}

/// buildah with its storage kept inside the repository.
struct Buildah {
    storage: PathBuf,
    runroot: PathBuf,
    policy: PathBuf,
}

impl Buildah {
    fn new() -> Result<Self> {
        match Command::new("buildah").arg("--version").output() {
            Ok(out) if out.status.success() => {
                eprintln!("    using {}", String::from_utf8_lossy(&out.stdout).trim());
            }
            Ok(out) => bail!(
                "`buildah --version` failed ({}): {}; run scripts/setup.sh",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => bail!("buildah is not installed ({e}): run scripts/setup.sh"),
        }
        let dir = image_dir();
        let buildah = Buildah {
            storage: dir.join("storage/root"),
            runroot: dir.join("storage/run"),
            policy: dir.join("storage/policy.json"),
        };
        fs::create_dir_all(&buildah.runroot).with_context(|| format!("cannot create {}", rel(&dir)))?;
        // Our own signature policy, so that the copy from local storage into the
        // archive does not depend on the host's /etc/containers/policy.json.
        fs::write(&buildah.policy, "{\"default\": [{\"type\": \"insecureAcceptAnything\"}]}\n")
            .with_context(|| format!("cannot write {}", rel(&buildah.policy)))?;
        Ok(buildah)
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("buildah");
        cmd.arg("--root").arg(&self.storage).arg("--runroot").arg(&self.runroot);
        cmd.args(["--storage-driver", "vfs"]).args(args);
        cmd
    }

    fn run(&self, args: &[&str]) -> Result<()> {
        crate::run(&mut self.cmd(args))
    }

    fn output(&self, args: &[&str]) -> Result<String> {
        let out = output(&mut self.cmd(args))?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// Runs a command from the workspace root, capturing its output, failing on a
/// non-zero exit with the command and its stderr in the message.
fn output(cmd: &mut Command) -> Result<Output> {
    let shown = format!("{cmd:?}").replace('"', "");
    let out = cmd.current_dir(root()).output().with_context(|| format!("cannot start {shown}"))?;
    if !out.status.success() {
        bail!("{shown} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out)
}

fn build_image(buildah: &Buildah, bin: &Path) -> Result<PathBuf> {
    let rootfs = image_dir().join("rootfs");
    step(&format!("image: root filesystem in {} (binary, its shared libraries, mount points)", rel(&rootfs)));
    let files = make_rootfs(bin, &rootfs)?;
    let mut total = 0;
    for file in &files {
        let size = fs::metadata(rootfs.join(file.trim_start_matches('/')))?.len();
        total += size;
        eprintln!("    {file:<45} {}", mib(size));
    }
    eprintln!("    {} files, {} uncompressed", files.len(), mib(total));

    step("image: buildah from scratch (vfs storage in target/image/storage)");
    // Left over by an interrupted run (the storage is ours alone, so --all is safe).
    buildah.output(&["rm", "--all"])?;
    let ctr = buildah.output(&["from", "--name", WORKING_CONTAINER, "scratch"])?;
    let result = fill_and_commit(buildah, &ctr, &rootfs);
    step(&format!("image: removing working container {ctr}"));
    let removed = buildah.output(&["rm", &ctr]);
    let image = result?;
    removed?;
    // The previous build's image, untagged by this commit.
    let pruned = buildah.output(&["rmi", "--prune"])?;
    if !pruned.is_empty() {
        eprintln!("    removed the previous image {}", pruned.replace('\n', ", "));
    }

    let archive = archive_path();
    let dest = format!("oci-archive:{}:docker.io/library/{image}", archive.display());
    step(&format!("image: buildah push {image} {}", dest.replace(&format!("{}/", root().display()), "")));
    if archive.exists() {
        fs::remove_file(&archive).with_context(|| format!("cannot remove the old {}", rel(&archive)))?;
    }
    let policy = buildah.policy.to_string_lossy().into_owned();
    buildah.run(&["push", "--signature-policy", &policy, "--format", "oci", "--quiet", &image, &dest])?;
    let size =
        fs::metadata(&archive).with_context(|| format!("buildah push wrote no {}", rel(&archive)))?.len();
    eprintln!("    wrote {}: {} (root filesystem {} uncompressed)", rel(&archive), mib(size), mib(total));
    Ok(archive)
}

/// Copies the root filesystem into the working container, configures and commits it.
fn fill_and_commit(buildah: &Buildah, ctr: &str, rootfs: &Path) -> Result<String> {
    step("image: copying the root filesystem in and setting the config");
    let src = rootfs.to_string_lossy().into_owned();
    buildah.run(&["copy", "--quiet", "--chown", "0:0", ctr, &src, "/"])?;
    let image = format!("{NAME}:{VERSION}");
    let title = format!("org.opencontainers.image.title={NAME}");
    let version = format!("org.opencontainers.image.version={VERSION}");
    let description = "org.opencontainers.image.description=Node-level eBPF observer for GPU and CPU \
                       inference workloads (Prometheus exporter on :9464)";
    buildah.run(&[
        "config",
        "--entrypoint",
        &format!("[\"{BINARY}\"]"),
        "--cmd",
        "[\"run\"]",
        // Root on purpose: loading eBPF programs and attaching probes needs
        // CAP_BPF and CAP_PERFMON (plus CAP_SYS_PTRACE / CAP_DAC_READ_SEARCH to
        // read other containers' libraries), and capabilities granted to the
        // container only take effect for uid 0; a non-root user would need file
        // capabilities, which a FROM-scratch archive cannot carry reliably. The
        // DaemonSet drops all other capabilities and makes the root filesystem
        // read-only.
        "--user",
        "0:0",
        "--port",
        PORT,
        "--env",
        "CANARYSCOPE_LISTEN=0.0.0.0:9464",
        "--workingdir",
        "/",
        "--label",
        &title,
        "--label",
        &version,
        "--label",
        description,
        ctr,
    ])?;
    step(&format!("image: buildah commit {image}"));
    let id = buildah.output(&["commit", "--quiet", "--format", "oci", ctr, &image])?;
    eprintln!("    image id {id}");
    Ok(image)
}

/// Writes the root filesystem; returns the files in it (image paths).
fn make_rootfs(bin: &Path, rootfs: &Path) -> Result<Vec<String>> {
    if rootfs.exists() {
        fs::remove_dir_all(rootfs).with_context(|| format!("cannot remove the old {}", rel(rootfs)))?;
    }
    let mut files = vec![BINARY.to_string()];
    files.extend(shared_libraries(bin)?);
    for file in &files {
        let src = if file == BINARY { bin.to_path_buf() } else { PathBuf::from(file) };
        let dest = rootfs.join(file.trim_start_matches('/'));
        fs::create_dir_all(dest.parent().expect("an absolute path has a parent"))?;
        // fs::copy follows symlinks (e.g. /lib64/ld-linux-x86-64.so.2 ->
        // /lib/x86_64-linux-gnu/...): the image holds a regular file at the path
        // the loader opens, so /lib being a symlink to usr/lib on the host
        // (merged /usr) does not matter.
        fs::copy(&src, &dest).with_context(|| format!("cannot copy {} to {}", src.display(), rel(&dest)))?;
        let mode = if file == BINARY { 0o755 } else { fs::metadata(&src)?.permissions().mode() & 0o755 };
        fs::set_permissions(&dest, fs::Permissions::from_mode(mode))?;
    }
    // Mount points for the host's /proc, /sys and a tmpfs: the DaemonSet's root
    // filesystem is read-only, so they must exist in the image.
    for (dir, mode) in [("proc", 0o555), ("sys", 0o555), ("tmp", 0o1777)] {
        let path = rootfs.join(dir);
        fs::create_dir_all(&path)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
    }
    Ok(files)
}

/// The shared libraries `bin` loads, from `ldd`, plus its ELF interpreter.
fn shared_libraries(bin: &Path) -> Result<Vec<String>> {
    let out = Command::new("ldd").arg(bin).output().context("cannot start ldd (libc-bin)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = BTreeSet::new();
    for line in text.lines() {
        let line = line.trim();
        if line.contains("statically linked") || line.contains("not a dynamic executable") {
            continue;
        }
        if line.contains("not found") {
            bail!("ldd {}: {line}", bin.display());
        }
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`,
        // `/lib64/ld-linux-x86-64.so.2 (0x...)`, `linux-vdso.so.1 (0x...)` (in the kernel).
        let path = line.split("=>").last().unwrap_or(line).split_whitespace().next().unwrap_or("");
        if path.starts_with('/') {
            libs.insert(path.to_string());
        }
    }
    if !out.status.success() && libs.is_empty() && !text.contains("statically linked") {
        bail!(
            "ldd {} failed ({}): {}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    if let Some(interp) = elf_interpreter(bin)? {
        eprintln!("    ELF interpreter {interp}");
        libs.insert(interp);
    }
    Ok(libs.into_iter().collect())
}

/// PT_INTERP of a 64-bit little-endian ELF file.
fn elf_interpreter(bin: &Path) -> Result<Option<String>> {
    let data = fs::read(bin).with_context(|| format!("cannot read {}", bin.display()))?;
    ensure!(
        data.len() > 64 && data.starts_with(b"\x7fELF\x02\x01"),
        "{} is not a 64-bit LE ELF",
        bin.display()
    );
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(data[o..o + 8].try_into().expect("8 bytes")) as usize;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        ensure!(ph + 56 <= data.len(), "{}: program header {i} out of bounds", bin.display());
        if u32::from_le_bytes(data[ph..ph + 4].try_into().expect("4 bytes")) == 3 {
            let (offset, size) = (u64_at(ph + 8), u64_at(ph + 32));
            let raw = data.get(offset..offset + size).context("PT_INTERP out of bounds")?;
            let interp = String::from_utf8_lossy(raw).trim_end_matches('\0').to_string();
            return Ok(Some(interp));
        }
    }
    Ok(None)
}

/// Reads an OCI archive back and runs the binary from its root filesystem.
pub fn check(archive: &Path) -> Result<()> {
    require_root()?;
    let unpacked = image_dir().join("oci-check");
    step(&format!("image check: unpacking {} into {}", rel(archive), rel(&unpacked)));
    fresh_dir(&unpacked)?;
    crate::run(Command::new("tar").arg("-xf").arg(archive).arg("-C").arg(&unpacked))?;
    let (manifest_desc, manifest, config) = read_manifest(&unpacked)?;
    step("image check: config");
    check_config(&config)?;
    step("image check: size");
    let layers = manifest["layers"].as_array().context("manifest has no layers")?;
    check_size(archive, &manifest_desc, &manifest, layers)?;

    let rootfs = image_dir().join("rootfs-check");
    step(&format!("image check: extracting the layer(s) into {}", rel(&rootfs)));
    fresh_dir(&rootfs)?;
    for layer in layers {
        let media = layer["mediaType"].as_str().unwrap_or("");
        let flags = match media {
            m if m.ends_with(".tar+gzip") || m.ends_with(".tar.gzip") => "-xzf",
            m if m.ends_with(".tar") => "-xf",
            m => bail!("layer media type {m:?} is neither tar nor tar+gzip"),
        };
        let path = blob_path(&unpacked, layer)?;
        eprintln!("    {media} {}", mib(layer["size"].as_u64().unwrap_or(0)));
        // As root, tar keeps the owners and modes recorded in the layer.
        crate::run(Command::new("tar").args(["--numeric-owner", flags]).arg(&path).arg("-C").arg(&rootfs))?;
    }
    check_rootfs(&rootfs)?;

    step("image check: chroot <rootfs> /usr/bin/canaryscope --version");
    let out = output(Command::new("chroot").arg(&rootfs).args([BINARY, "--version"]))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    eprintln!("    {version}");
    ensure!(
        version == format!("{NAME} {VERSION}"),
        "--version printed {version:?}, not \"{NAME} {VERSION}\""
    );
    check_probes_from_image(&rootfs)
}

/// The manifest (through an image index, if any), its descriptor and the
/// image config, from an unpacked OCI archive.
fn read_manifest(unpacked: &Path) -> Result<(Value, Value, Value)> {
    let index = read_json(&unpacked.join("index.json"))?;
    let mut manifest_desc = index["manifests"].get(0).cloned().context("index.json lists no manifest")?;
    let name = manifest_desc["annotations"]["org.opencontainers.image.ref.name"].as_str().unwrap_or("");
    eprintln!("    reference name: {name}");
    ensure!(name == format!("docker.io/library/{NAME}:{VERSION}"), "unexpected reference name {name:?}");
    let mut manifest = blob_json(unpacked, &manifest_desc)?;
    // An image index (multi-platform) nests the manifest one level down.
    while manifest["mediaType"].as_str() == Some("application/vnd.oci.image.index.v1+json") {
        manifest_desc = manifest["manifests"].get(0).cloned().context("nested index lists no manifest")?;
        manifest = blob_json(unpacked, &manifest_desc)?;
    }
    let config = blob_json(unpacked, &manifest["config"])?;
    Ok((manifest_desc, manifest, config))
}

/// Entrypoint, command, user, port, environment and version label: what
/// the DaemonSet relies on.
fn check_config(config: &Value) -> Result<()> {
    let c = &config["config"];
    eprintln!(
        "    os/arch     {}/{}",
        config["os"].as_str().unwrap_or("?"),
        config["architecture"].as_str().unwrap_or("?")
    );
    eprintln!("    entrypoint  {}", c["Entrypoint"]);
    eprintln!("    cmd         {}", c["Cmd"]);
    eprintln!("    user        {}", c["User"]);
    eprintln!("    ports       {}", c["ExposedPorts"]);
    eprintln!("    env         {}", c["Env"]);
    eprintln!("    labels      {}", c["Labels"]);
    ensure!(
        c["Entrypoint"] == serde_json::json!([BINARY]),
        "entrypoint is {}, not [{BINARY:?}]",
        c["Entrypoint"]
    );
    ensure!(c["Cmd"] == serde_json::json!(["run"]), "cmd is {}, not [\"run\"]", c["Cmd"]);
    ensure!(c["User"] == "0:0", "user is {}, not \"0:0\"", c["User"]);
    ensure!(c["ExposedPorts"].get(PORT).is_some(), "port {PORT} is not exposed: {}", c["ExposedPorts"]);
    ensure!(
        c["Env"].as_array().is_some_and(|e| e.iter().any(|v| v == "CANARYSCOPE_LISTEN=0.0.0.0:9464")),
        "CANARYSCOPE_LISTEN is not set: {}",
        c["Env"]
    );
    ensure!(
        c["Labels"]["org.opencontainers.image.version"] == VERSION,
        "label org.opencontainers.image.version is {}, not {VERSION}",
        c["Labels"]["org.opencontainers.image.version"]
    );
    Ok(())
}

/// The image, compressed, under `MAX_COMPRESSED`, by its blobs and by the
/// archive file.
fn check_size(archive: &Path, manifest_desc: &Value, manifest: &Value, layers: &[Value]) -> Result<()> {
    ensure!(!layers.is_empty(), "manifest has no layers");
    let blobs: u64 = [manifest_desc, &manifest["config"]]
        .into_iter()
        .chain(layers)
        .map(|d| d["size"].as_u64().unwrap_or(0))
        .sum();
    let archive_size = fs::metadata(archive)?.len();
    eprintln!("    compressed image (manifest, config, {} layer(s)): {}", layers.len(), mib(blobs));
    eprintln!("    archive file: {}", mib(archive_size));
    ensure!(
        blobs.max(archive_size) < MAX_COMPRESSED,
        "image is {} compressed (archive {}): over the {} limit",
        mib(blobs),
        mib(archive_size),
        mib(MAX_COMPRESSED)
    );
    Ok(())
}

/// `canaryscope check --json` from the image's root filesystem: the
/// families every kernel this runs on offers must attach from inside it.
fn check_probes_from_image(rootfs: &Path) -> Result<()> {
    step("image check: canaryscope check --json from the image's root filesystem (host /proc, /sys; tmpfs /tmp)");
    // A private mount namespace (unshare makes its propagation private): the
    // bind mounts and the tmpfs vanish with it, nothing is left mounted.
    let script = "mount --rbind /proc \"$1/proc\" && mount --rbind /sys \"$1/sys\" && \
                  mount -t tmpfs none \"$1/tmp\" && exec chroot \"$1\" /usr/bin/canaryscope check --json";
    let mut cmd = Command::new("timeout");
    cmd.args(["120", "unshare", "--mount", "--fork", "sh", "-c", script, "sh"]).arg(rootfs);
    let shown = format!("unshare --mount --fork sh -c '...; chroot {} {BINARY} check --json'", rel(rootfs));
    let out = cmd.current_dir(root()).output().with_context(|| format!("cannot start {shown}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // 1 means no probe attached at all: an image that observes nothing fails.
    if out.status.code() != Some(0) {
        bail!("{shown} failed ({}):\n{stderr}{stdout}", out.status);
    }
    let report: Value = serde_json::from_str(&stdout)
        .with_context(|| format!("{shown} did not print JSON:\n{stdout}\n{stderr}"))?;
    let facilities =
        report["facilities"].as_array().with_context(|| format!("no \"facilities\" in:\n{stdout}"))?;

    for f in facilities {
        let ok = if f["ok"] == true { "ok " } else { "no " };
        eprintln!(
            "    {ok} {:<11} {}",
            f["name"].as_str().unwrap_or("?"),
            f["detail"].as_str().unwrap_or("")
        );
    }
    let probes = report["probes"].as_array().with_context(|| format!("no \"probes\" in:\n{stdout}"))?;
    let attached = |target: &str| probes.iter().any(|p| p["target"] == target && p["attached"] == true);
    eprintln!(
        "    probes: {} of {} attach from inside the image",
        probes.iter().filter(|p| p["attached"] == true).count(),
        probes.len()
    );
    // The families every kernel this runs on offers: exits and crashes,
    // the scheduler, and GPU library discovery.
    let missing: Vec<&str> = ["sched_process_exit", "signal_generate", "sched_switch", "sched_process_exec"]
        .into_iter()
        .filter(|t| !attached(t))
        .collect();
    ensure!(missing.is_empty(), "from inside the image these probes did not attach: {missing:?}\n{stdout}");
    Ok(())
}

/// Every file is the binary or a shared library; the mount points are empty.
fn check_rootfs(rootfs: &Path) -> Result<()> {
    let mut files = Vec::new();
    walk(rootfs, rootfs, &mut files)?;
    files.sort();
    for (path, size) in &files {
        eprintln!("    {path:<45} {}", mib(*size));
        let name = path.rsplit('/').next().unwrap_or(path);
        ensure!(!name.starts_with(".wh."), "layer whiteout {path}: expected a single FROM-scratch layer");
        ensure!(
            path == BINARY || name.contains(".so"),
            "unexpected file {path} (only the binary and its libraries)"
        );
    }
    ensure!(files.iter().any(|(p, _)| p == BINARY), "{BINARY} is missing");
    for dir in ["proc", "sys", "tmp"] {
        let path = rootfs.join(dir);
        ensure!(path.is_dir(), "/{dir} is missing");
        ensure!(fs::read_dir(&path)?.next().is_none(), "/{dir} is not empty");
    }
    eprintln!("    {} files, /proc /sys /tmp empty, no shell", files.len());
    Ok(())
}

fn walk(base: &Path, dir: &Path, files: &mut Vec<(String, u64)>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.path().symlink_metadata()?;
        if meta.is_dir() {
            walk(base, &entry.path(), files)?;
        } else {
            let path = format!("/{}", entry.path().strip_prefix(base)?.display());
            files.push((path, meta.len()));
        }
    }
    Ok(())
}

fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("cannot remove the old {}", rel(dir)))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", rel(dir)))
}

fn read_json(path: &Path) -> Result<Value> {
    let text = fs::read_to_string(path).with_context(|| format!("cannot read {}", rel(path)))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", rel(path)))
}

/// blobs/<algorithm>/<hex> of a descriptor, checked against its digest and size.
fn blob_path(layout: &Path, desc: &Value) -> Result<PathBuf> {
    let digest = desc["digest"].as_str().with_context(|| format!("descriptor without a digest: {desc}"))?;
    let (algorithm, hex) = digest.split_once(':').with_context(|| format!("malformed digest {digest}"))?;
    ensure!(algorithm == "sha256", "unsupported digest algorithm in {digest}");
    let path = layout.join("blobs").join(algorithm).join(hex);
    let size =
        fs::metadata(&path).with_context(|| format!("blob {digest} is missing from the archive"))?.len();
    ensure!(
        desc["size"].as_u64() == Some(size),
        "blob {digest} is {size} bytes, descriptor says {}",
        desc["size"]
    );
    let out = output(Command::new("sha256sum").arg(&path))?;
    let sum = String::from_utf8_lossy(&out.stdout);
    ensure!(sum.split_whitespace().next() == Some(hex), "blob {digest} does not match its digest");
    Ok(path)
}

fn blob_json(layout: &Path, desc: &Value) -> Result<Value> {
    read_json(&blob_path(layout, desc)?)
}

fn rel(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}
