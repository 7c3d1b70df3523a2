//! One integration test binary (link once).
