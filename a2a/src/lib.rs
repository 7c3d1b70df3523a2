//! A2A (the Agent2Agent protocol) in troupe.
//!
//! - [`model`], [`version`], [`wire`]: the protocol's data, method names and JSON shapes
//!   (1.0 and 0.3), shared by the endpoint `troupe serve` answers on (troupe-service) and
//!   the client.
//! - [`client`]: a client of remote A2A agents (JSON-RPC, SSE streams).
//! - [`provider`]: the `a2a` agent provider built on that client: a remote agent as a
//!   sub-agent of a troupe session.
#![forbid(unsafe_code)]

pub mod client;
pub mod metrics;
pub mod model;
pub mod provider;
pub mod version;
pub mod wire;

pub use client::{A2aClient, ClientError, ClientOptions};
pub use provider::{A2aProviderFactory, A2aSettings};

/// Registers the client's metrics (descriptions, every series at 0).
pub fn describe_metrics() {
    metrics::describe();
}
