//! The workload labels every workload family carries first, in this order:
//! the schema of what attribution finds. Its own std-only file, so the
//! fuzzed metric catalog can name it where it is defined.

/// The workload labels every workload family carries first, in this order.
pub const LABEL_NAMES: [&str; 6] = ["namespace", "pod", "container", "workload", "revision", "track"];

/// The labels of a series kept per revision on a node rather than per pod:
/// the workload labels without `pod` and `container`, in the same order.
/// Pods of one revision share such a series, which is what keeps a node's
/// successful calls and latency histograms from growing with its pods.
pub const REVISION_LABEL_NAMES: [&str; 4] = ["namespace", "workload", "revision", "track"];
