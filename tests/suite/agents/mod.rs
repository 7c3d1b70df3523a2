//! Agents (A1–A4): definitions, bindings, dispatch, routing and the bounds that keep
//! dispatches from locking themselves.

mod cli;
