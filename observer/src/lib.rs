//! canaryscope's observer as a library: the `canaryscope` binary is a thin
//! command line over it, and each subcommand module owns its arguments.
//!
//! Data flows one way. The kernel side writes records into a ring buffer and
//! aggregates into maps ([`probes`] loads and attaches it); [`pipeline`] reads
//! the records, decodes and attributes them to cgroups, probes GPU runtime
//! libraries as processes reveal them ([`discovery`]), and returns events;
//! [`event_loop`] drives it for [`trace`] (print) and [`run`] (count for
//! Prometheus through [`metrics`]).
//!
//! Modules import downward only: `cargo xtask layers` keeps the layers of
//! docs/ARCHITECTURE.md, and no function outside tests is longer than
//! clippy.toml's `too-many-lines-threshold` (the workspace's lints).
#![cfg_attr(test, allow(clippy::too_many_lines, reason = "a unit test reads as one story, top to bottom"))]
pub mod attribution;
pub mod check;
pub mod cli;
pub mod clock;
pub mod config;
pub mod cpu;
pub mod discovery;
pub mod error;
pub mod event_loop;
pub mod events;
pub mod exit_cause;
pub mod gate;
pub mod gpu_library;
pub mod http;
pub mod judge;
pub mod metrics;
pub mod names;
pub mod oom;
pub mod pipeline;
pub mod probes;
pub mod procfs;
pub mod render;
pub mod run;
pub mod top;
pub mod trace;
pub mod web;
