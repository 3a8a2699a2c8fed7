//! sequenced: deploys Helm charts in dependency order.
//!
//! The data flow (DESIGN.md): chart source -> resolve -> render -> plan ([`pipeline`]) ->
//! lifecycle ([`rollout`], pure) -> cluster, executed by the [`controller`].
//! This crate holds every stage; `main.rs` only parses the command line.

pub mod api;
pub mod chart;
pub mod cli;
pub mod cluster;
pub mod controller;
pub mod digest;
pub mod helm;
pub mod history;
pub mod kubectl;
pub mod lock;
pub mod metrics;
pub mod pipeline;
pub mod plan;
pub mod readiness;
pub mod render;
pub mod rollout;
pub mod yaml;
