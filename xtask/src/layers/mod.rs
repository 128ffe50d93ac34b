//! `cargo xtask layers`: the observer's modules import downward only.
//!
//! Every top-level module of `observer/src` sits in one layer. An import may
//! name its own layer or one below; within a layer, modules must not import
//! each other in a circle. A few arrows are named outright because they are
//! the ones a change is most tempted to add (see docs/ARCHITECTURE.md).
mod imports;

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Result};
pub use imports::{read_crate, Import};

/// Layers from the bottom up; a module not listed here is an error, so a new
/// module is placed on purpose.
pub const LAYERS: &[(&str, &[&str])] = &[
    ("leaves", &["error", "config", "clock", "names", "procfs", "cpu", "oom", "gpu_library", "http", "web"]),
    ("attribution", &["attribution"]),
    ("events", &["events", "exit_cause"]),
    ("probes", &["probes"]),
    ("discovery", &["discovery"]),
    ("pipeline", &["pipeline", "event_loop"]),
    ("consumers", &["metrics", "gate", "render"]),
    ("commands", &["run", "trace", "top", "check", "judge"]),
    ("cli", &["cli"]),
];

const COMMANDS: &[&str] = &["run", "trace", "top", "check", "judge"];

/// Arrows that must never exist, whatever the layers say: (from, to, why).
fn forbidden(from: &str, to: &str) -> Option<&'static str> {
    let data_path = ["probes", "discovery", "pipeline", "attribution"];
    if to == "cli" {
        return Some("nothing imports the command line; it imports everything");
    }
    if COMMANDS.contains(&to) && from != "cli" {
        return Some("only cli/ names a command; share code through a lower layer");
    }
    if from == "probes" && to == "discovery" {
        return Some("probes only load and attach; discovery decides what to probe");
    }
    if data_path.contains(&from) && ["metrics", "gate"].contains(&to) {
        return Some("the data path does not know its consumers");
    }
    if from == "config" && to != "error" {
        return Some("config is a leaf: it may name only error");
    }
    None
}

/// The top-level module a module path belongs to (`""` for the crate root).
fn top(module: &[String]) -> &str {
    module.first().map_or("", String::as_str)
}

fn layer_of(top: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, members)| members.contains(&top))
}

/// What is wrong with the crate's imports, one line each.
pub fn problems(imports: &[Import], root_files: &BTreeSet<String>) -> Vec<String> {
    let mut found = Vec::new();
    for name in root_files {
        if layer_of(name).is_none() {
            found.push(format!("module `{name}` is in no layer: place it in xtask/src/layers/mod.rs LAYERS"));
        }
    }
    let mut graph: BTreeMap<&str, BTreeMap<&str, &Import>> = BTreeMap::new();
    for import in imports {
        let (from, to) = (top(&import.from), top(&import.to));
        if from.is_empty() || to.is_empty() || from == to {
            continue;
        }
        let at = format!("{}:{}", shown(&import.file), import.line);
        if let Some(why) = forbidden(from, to) {
            found.push(format!("{at}: `{}` makes {from} import {to}: {why}", import.written));
        } else if let (Some(a), Some(b)) = (layer_of(from), layer_of(to)) {
            if b > a {
                found.push(format!(
                    "{at}: `{}` makes {from} (layer {}) import {to} (layer {}), which is above it",
                    import.written, LAYERS[a].0, LAYERS[b].0
                ));
            }
        }
        graph.entry(from).or_default().entry(to).or_insert(import);
    }
    for cycle in cycles(&graph) {
        let mut line = format!("import cycle: {}", cycle.join(" -> "));
        for pair in cycle.windows(2) {
            let import = graph[pair[0]][pair[1]];
            line.push_str(&format!("\n    {}:{}: `{}`", shown(&import.file), import.line, import.written));
        }
        found.push(line);
    }
    found
}

/// A file as the workspace names it.
fn shown(file: &std::path::Path) -> String {
    file.strip_prefix(crate::root()).unwrap_or(file).display().to_string()
}

/// One shortest cycle through each module that is on one, each cycle once.
fn cycles<'a>(graph: &BTreeMap<&'a str, BTreeMap<&'a str, &Import>>) -> Vec<Vec<&'a str>> {
    let mut seen: BTreeSet<BTreeSet<&str>> = BTreeSet::new();
    let mut found = Vec::new();
    for &start in graph.keys() {
        // Breadth-first from start's successors back to start.
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut closed = false;
        while let Some(node) = queue.pop_front() {
            for &next in graph.get(node).into_iter().flat_map(|n| n.keys()) {
                if next == start {
                    came_from.insert(start, node);
                    closed = true;
                    break;
                }
                if let std::collections::btree_map::Entry::Vacant(slot) = came_from.entry(next) {
                    slot.insert(node);
                    queue.push_back(next);
                }
            }
            if closed {
                break;
            }
        }
        if !closed {
            continue;
        }
        let mut cycle = vec![start];
        let mut node = came_from[start];
        while node != start {
            cycle.push(node);
            node = came_from[node];
        }
        cycle.push(start);
        cycle.reverse();
        if seen.insert(cycle.iter().copied().collect()) {
            found.push(cycle);
        }
    }
    found
}

/// The check as the suite runs it, over observer/src.
pub fn check() -> Result<()> {
    let src = crate::root().join("observer/src");
    let imports = read_crate(&src.join("lib.rs"))?;
    let root_files = std::fs::read_dir(&src)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let module = name.strip_suffix(".rs").map(str::to_string).unwrap_or(name);
            (!["lib", "main"].contains(&module.as_str())).then_some(module)
        })
        .collect();
    let problems = problems(&imports, &root_files);
    if problems.is_empty() {
        eprintln!("    {} imports between modules, all downward, no cycle", imports.len());
        return Ok(());
    }
    for problem in &problems {
        eprintln!("{problem}");
    }
    bail!("{} layering problems in observer/src (see docs/ARCHITECTURE.md)", problems.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate written to a temporary folder: (path under src/, text).
    fn crate_of(name: &str, files: &[(&str, &str)]) -> (std::path::PathBuf, Vec<Import>) {
        let src = std::env::temp_dir().join(format!("layers-{name}-{}", std::process::id())).join("src");
        let _ = std::fs::remove_dir_all(&src);
        for (path, text) in files {
            let file = src.join(path);
            std::fs::create_dir_all(file.parent().expect("a folder")).expect("mkdir");
            std::fs::write(&file, text).expect("write");
        }
        let imports = read_crate(&src.join("lib.rs")).expect("reads");
        (src, imports)
    }

    fn roots(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_downward_import_passes() {
        let (_, imports) = crate_of(
            "down",
            &[
                ("lib.rs", "pub mod config;\npub mod probes;\n"),
                ("config.rs", "pub struct Families;\n"),
                ("probes/mod.rs", "use crate::config::Families;\npub fn f(_: Families) {}\n"),
            ],
        );
        assert_eq!(problems(&imports, &roots(&["config", "probes"])), Vec::<String>::new());
    }

    #[test]
    fn a_forbidden_arrow_is_named_with_its_file_even_through_a_re_export() {
        let (_, imports) = crate_of(
            "forbidden",
            &[
                ("lib.rs", "pub mod gate;\npub mod attribution;\n"),
                ("gate/mod.rs", "mod consts;\npub use consts::CONDITION_TYPE;\n"),
                ("gate/consts.rs", "pub const CONDITION_TYPE: &str = \"x\";\n"),
                ("attribution/kube.rs", "pub fn f() -> &'static str {\n    crate::gate::CONDITION_TYPE\n}\n"),
                ("attribution/mod.rs", "pub mod kube;\n"),
            ],
        );
        let found = problems(&imports, &roots(&["gate", "attribution"]));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("attribution/kube.rs:2") && found[0].contains("crate::gate::CONDITION_TYPE")
        );
        assert!(found[0].contains("the data path does not know its consumers"), "{}", found[0]);
    }

    #[test]
    fn a_cycle_in_one_layer_and_a_path_in_a_macro_are_found() {
        let (_, imports) = crate_of(
            "cycle",
            &[
                ("lib.rs", "pub mod metrics;\npub mod gate;\n"),
                ("metrics.rs", "pub fn m() { crate::gate::g() }\n"),
                ("gate.rs", "pub fn g() { eprintln!(\"{}\", crate::metrics::NAME) }\n"),
            ],
        );
        let found = problems(&imports, &roots(&["metrics", "gate"]));
        assert!(found.iter().any(|p| p.starts_with("import cycle: gate -> metrics -> gate")), "{found:?}");
    }

    #[test]
    fn an_upward_import_and_an_unplaced_module_are_refused() {
        let (_, imports) = crate_of(
            "up",
            &[
                ("lib.rs", "pub mod events;\npub mod pipeline;\npub mod extra;\n"),
                ("events.rs", "use super::pipeline::Pipeline;\n"),
                ("pipeline.rs", "pub struct Pipeline;\n"),
                ("extra.rs", ""),
            ],
        );
        let found = problems(&imports, &roots(&["events", "pipeline", "extra"]));
        assert!(found.iter().any(|p| p.contains("`extra` is in no layer")), "{found:?}");
        assert!(
            found.iter().any(|p| p.contains("events (layer events) import pipeline (layer pipeline)")),
            "{found:?}"
        );
    }
}
