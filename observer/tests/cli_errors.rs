//! Bad input gets one clear line and exit status 2, never a backtrace.

use std::process::Command;
use test_support::canaryscope;

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(canaryscope()).args(args).output().expect("run canaryscope");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn missing_library_is_a_usage_error() {
    let (code, err) = run(&["trace", "--lib", "/nonexistent/libamdhip64.so"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("--lib /nonexistent/libamdhip64.so"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn malformed_flags_are_usage_errors() {
    let (code, err) = run(&["trace", "--stall-threshold", "ten"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("ten"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    let (code, err) = run(&["trace", "--no-such-flag"]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("--no-such-flag") && err.contains("--help"), "names it and the way out: {err}");
    let (code, err) = run(&["frobnicate"]);
    assert_eq!(code, 2);
    assert!(err.contains("frobnicate"), "{err}");
    // Help is no error.
    let (code, _) = run(&["--help"]);
    assert_eq!(code, 0);
}

#[test]
fn bad_hot_call_settings_are_usage_errors() {
    for args in [
        &["trace", "--hot-calls", "some"][..],
        &["run", "--hot-calls", "some"],
        &["run", "--hot-window", "soon"],
        &["run", "--hot-window", "200ms"],
        &["trace", "--hot-detail", "deep"],
        &["run", "--hot-detail", "deep"],
        &["run", "--cgroup", "solver.slice"],
        &["run", "--cgroup", "/sys/fs/cgroup/solver.slice"],
    ] {
        let (code, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(err.contains(args[1]) && err.contains(args[2]), "{args:?} names flag and value: {err}");
    }
    let (code, err) = run(&["run", "--hot-calls", "none", "--help"]);
    assert_eq!(code, 0, "{err}");
}

#[test]
#[ignore = "needs root to drop to another user; run by `cargo xtask test`"]
fn running_without_root_says_so() {
    test_support::assert_root();
    // Run as `nobody` through setuid in pre_exec, from a world-readable copy:
    // the checkout may sit under a directory `nobody` cannot enter (/root).
    use std::os::unix::{fs::PermissionsExt, process::CommandExt};
    let dir = std::env::temp_dir().join(format!("canaryscope-nobody-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    let bin = dir.join("canaryscope");
    std::fs::copy(canaryscope(), &bin).expect("copy the binary");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod binary");
    let mut cmd = Command::new(&bin);
    cmd.arg("trace").current_dir("/");
    // SAFETY: setgid/setuid between fork and exec are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("run as nobody");
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("needs root"), "{err}");
}

#[test]
fn unknown_probe_families_are_usage_errors() {
    for cmd in ["trace", "run"] {
        let (code, err) = run(&[cmd, "--probes", "gpu,kprobes"]);
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(err.contains("`kprobes`") && err.contains("gpu, kfd, cpu, exits"), "{cmd}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let (code, err) = run(&["trace", "--probes", "cpu", "--lib", "/bin/true"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--lib needs the gpu probes"), "{err}");
}

#[test]
fn top_from_a_bad_or_unreachable_url_is_a_usage_error() {
    let (code, err) = run(&["top", "--from", "ftp://node-a:9464", "--once"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("http://HOST[:PORT]"), "says what a URL looks like: {err}");
    // Bound then dropped: nothing listens there.
    let port = test_support::free_port();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let (code, err) = run(&["top", "--from", &url, "--once", "--json"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains(&url) && err.contains("cannot reach"), "{err}");
    let (code, err) = run(&["top", "--json"]);
    assert_eq!(code, 2, "--json needs --once: {err}");
}

/// What `--help` says, against the text kept in tests/data/cli: scripts and
/// runbooks quote it, so a change is made on purpose. `CANARYSCOPE_BLESS=1`
/// rewrites the files after such a change.
#[test]
fn help_of_each_command_is_as_kept() {
    let kept = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cli");
    for command in ["trace", "run", "top", "judge"] {
        let out = Command::new(canaryscope())
            .args([command, "--help"])
            .env_remove("COLUMNS")
            .output()
            .expect("help");
        assert_eq!(out.status.code(), Some(0));
        let help = String::from_utf8(out.stdout).expect("utf-8");
        let file = kept.join(format!("{command}-help.txt"));
        if std::env::var_os("CANARYSCOPE_BLESS").is_some() {
            std::fs::write(&file, &help).expect("write the kept help");
            continue;
        }
        let expected = std::fs::read_to_string(&file).expect("kept help");
        assert!(help == expected, "{command} --help changed:\n{}", first_difference(&expected, &help));
    }
}

/// The first line where two texts part, with its neighbours.
fn first_difference(expected: &str, got: &str) -> String {
    let (expected, got): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), got.lines().collect());
    let at = expected.iter().zip(&got).position(|(a, b)| a != b).unwrap_or(expected.len().min(got.len()));
    let window = |lines: &[&str]| lines[at.saturating_sub(2)..(at + 3).min(lines.len())].join("\n");
    format!("line {}\n--- kept\n{}\n--- now\n{}", at + 1, window(&expected), window(&got))
}

#[test]
fn each_probing_command_refuses_a_bad_probe_value_in_its_own_words() {
    // trace and top: clap's words; run: the words its config file's value
    // gets too, since the two are checked after they are merged.
    for (command, words) in [
        ("trace", "invalid value 'ten' for '--stall-threshold <STALL_THRESHOLD>': `ten` is not a duration"),
        ("top", "invalid value 'ten' for '--stall-threshold <STALL_THRESHOLD>': `ten` is not a duration"),
        ("run", "canaryscope: --stall-threshold: `ten` is not a duration (try 10s, 500ms, 2m)\n"),
    ] {
        let (code, err) = run(&[command, "--stall-threshold", "ten"]);
        assert_eq!(code, 2, "{command}: {err}");
        assert!(err.contains(words), "{command}: {err}");
    }
    let config = std::env::temp_dir().join(format!("canaryscope-bad-probes-{}.toml", std::process::id()));
    std::fs::write(&config, "probes = \"gpu,x\"\n").expect("write config");
    let (code, err) = run(&["run", "--config", config.to_str().expect("utf-8")]);
    let (flag_code, flag_err) = run(&["run", "--probes", "gpu,x"]);
    let _ = std::fs::remove_file(&config);
    assert_eq!((code, flag_code), (2, 2), "{err} {flag_err}");
    assert_eq!(err, flag_err, "the file's value and the flag are refused alike");
    assert!(err.contains("--probes: unknown probe family `x`"), "{err}");
}
