//! The observer's parsers of outside input, compiled from their own source
//! files (not copies) so that the fuzz targets exercise exactly the code that
//! ships. Each file is std-only apart from the crates listed in Cargo.toml.

#[path = "../../observer/src/attribution/cgroup_path.rs"]
pub mod cgroup_path;

#[path = "../../observer/src/procfs.rs"]
pub mod maps;

#[path = "../../observer/src/probes/tracefs.rs"]
pub mod tracefs;

#[path = "../../observer/src/attribution/label_names.rs"]
pub mod label_names;

/// The declarations name their label list where the observer defines it.
pub mod attribution {
    pub use super::label_names;
}

/// What a metric family is; the families' own files (and the catalog that
/// lists them) need the rest of the observer.
#[path = "../../observer/src/metrics/decl.rs"]
pub mod decl;

#[path = "../../observer/src/metrics/families.rs"]
pub mod families;

#[path = "../../observer/src/discovery/ldcache.rs"]
pub mod ldcache;

#[path = "../../observer/src/judge/request.rs"]
pub mod request;

/// HTTP on hyper, with the servers' limits.
#[path = "../../observer/src/web/mod.rs"]
pub mod web;

/// The judge's HTTP, over `request` (its `super`).
#[path = "../../observer/src/judge/http.rs"]
pub mod judge_http;
