//! Finding GPU runtime library files before their first call: ahead of
//! time from what a process's loader could find (`ahead`, `ldcache`), at
//! the mapping of an unknown runtime file, and, opt-in, by holding the
//! mapping process until its probes exist (`hold`; for chosen pods from
//! their cgroup's creation, `hold_scope`). `tracker` decides what
//! to probe and keeps the kernel side's list of known files current; `hot`
//! decides which processes also get the hot tier of GPU functions.
pub mod ahead;
pub mod code_ranges;
pub mod hold;
pub mod hold_scope;
pub mod hot;
pub mod ldcache;
pub mod load_failure;
pub mod scan;
pub mod tracker;
