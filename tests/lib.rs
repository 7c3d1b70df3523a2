//! Shared helpers for troupe integration tests.
