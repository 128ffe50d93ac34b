//! PLACEHOLDER: the simulation is being written here.
#[derive(serde::Serialize)]
pub struct SimReport {}
pub struct SimConfig {}
impl SimConfig {
    pub fn default_for_share(_share: f64) -> Self {
        Self {}
    }
}
pub fn simulate(_cfg: &SimConfig) -> SimReport {
    SimReport {}
}
