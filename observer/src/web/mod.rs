//! HTTP/1.1 over hyper for the exporter (`metrics/server.rs`), the judge
//! (`judge/http.rs`) and the clients that read them or Prometheus
//! (`metrics/fetch.rs`, `judge/prometheus.rs`). hyper parses and writes the
//! protocol; what is ours is the limits a server facing the cluster's
//! network needs, and one GET with a size cap.
pub mod client;
pub mod server;
