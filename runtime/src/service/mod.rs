//! The HTTP service: its APIs and protocol endpoints.

pub mod a2a;
