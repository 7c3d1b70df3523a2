//! Several troupe nodes over one PostgreSQL database: session leases with fencing tokens, and
//! sessions taken over when their node dies.
//! Run them alone with `cargo nextest run -p troupe-tests -E 'test(/suite::cluster/)'`.

mod failover;
mod fencing;
