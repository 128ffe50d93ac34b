//! The workload labels every workload family carries first, in this order:
//! the schema of what attribution finds. Its own std-only file, so the
//! fuzzed metric catalog can name it where it is defined.

/// The workload labels every workload family carries first, in this order.
pub const LABEL_NAMES: [&str; 6] = ["namespace", "pod", "container", "workload", "revision", "track"];
