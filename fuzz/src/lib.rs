//! The observer's parsers of outside input, compiled from their own source
//! files (not copies) so that the fuzz targets exercise exactly the code that
//! ships. Each file is std-only apart from the crates listed in Cargo.toml.

#[path = "../../observer/src/attribution/cgroup_path.rs"]
pub mod cgroup_path;

#[path = "../../observer/src/probes/maps.rs"]
pub mod maps;

#[path = "../../observer/src/probes/tracefs.rs"]
pub mod tracefs;

#[path = "../../observer/src/metrics/catalog.rs"]
pub mod catalog;

#[path = "../../observer/src/metrics/families.rs"]
pub mod families;

#[path = "../../observer/src/discovery/ldcache.rs"]
pub mod ldcache;
