//! What every family's rendering reads besides its own state: who the
//! series belong to (the label table, and per revision the owners) and
//! which exposition is being written.
use super::{
    decl::View,
    revision::{Owners, Retired},
    series::Series,
};

pub struct Render<'a> {
    pub series: &'a Series,
    pub owners: Owners<'a>,
    /// What purged pods left to their revisions' shared series.
    pub retired: &'a Retired,
    pub view: View,
}

impl<'a> Render<'a> {
    pub fn new(series: &'a Series, retired: &'a Retired, view: View) -> Self {
        Self { series, owners: Owners::new(series, retired, view), retired, view }
    }
}

/// A workload family's label values: the six workload labels, then `extra`.
pub fn workload_values<'a>(labels: [&'a str; 6], extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = labels.to_vec();
    v.extend_from_slice(extra);
    v
}
