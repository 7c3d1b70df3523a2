//! A2A (the Agent2Agent protocol) in troupe.
//!
//! - [`model`], [`version`], [`wire`]: the protocol's data, method names and JSON shapes
//!   (1.0 and 0.3), shared by the endpoint `troupe serve` answers on (troupe-service) and
//!   the client.
#![forbid(unsafe_code)]

pub mod model;
pub mod version;
pub mod wire;
