//! Several troupe nodes over one PostgreSQL database: session leases with fencing tokens.
//! Run them alone with `cargo nextest run -p troupe-tests -E 'test(/suite::cluster/)'`.

mod fencing;
