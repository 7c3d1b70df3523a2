//! The layout of the rank tables, shared by `build.rs` (which writes them) and `bpe.rs` (which
//! reads them), so the two cannot disagree on the hash or the packing.
//!
//! A hash table in two files per encoding `name`:
//! - `name.records`: the tokens, grouped by hash bucket, each as a little-endian u32 header
//!   ([`header`]: rank, length and a few bits of the hash) followed by its bytes; within a
//!   bucket, lower ranks first;
//! - `name.buckets`: little-endian u32s, the offset in `name.records` where each bucket
//!   starts, and one past the end. About [`TOKENS_PER_BUCKET`] tokens a bucket.
//!
//! The layout is this dense because every page of a table that a count touches stays in the
//! process's resident memory, and the kernel maps a file's pages 64 KiB or more at a time: a
//! prompt of a few hundred tokens already touches most of any table it reads at random. A
//! lookup reads one bucket offset and one run of records (a cache line or two), so the tables
//! are little more than the token bytes themselves (2.4 MB for o200k_base, 1.1 MB for
//! cl100k_base).

/// Average tokens a bucket: a lookup that misses compares this many headers (about a cache
/// line); fewer would grow `name.buckets`, more would slow every lookup.
pub const TOKENS_PER_BUCKET: usize = 4;

const RANK_BITS: u32 = 18;
const LEN_BITS: u32 = 8;

/// The largest rank and token length a header holds (o200k_base: ranks below 200,000, tokens
/// of at most 128 bytes).
#[allow(dead_code)] // the writer's side, used by build.rs
pub const MAX_RANK: u32 = (1 << RANK_BITS) - 1;
pub const MAX_LEN: usize = (1 << LEN_BITS) - 1;

/// The header of the token of rank `rank`, `len` bytes long, hashing to `hash`.
#[allow(dead_code)] // the writer's side, used by build.rs
pub fn header(rank: u32, len: usize, hash: u64) -> u32 {
    key(len, hash) | rank
}

/// The part of a header that a lookup for `len` bytes (at most [`MAX_LEN`]) hashing to `hash`
/// must match before comparing bytes: the length and six bits of the hash that [`bucket`]
/// does not use.
pub fn key(len: usize, hash: u64) -> u32 {
    let tag = (hash as u32) >> (RANK_BITS + LEN_BITS);
    (tag << (RANK_BITS + LEN_BITS)) | ((len as u32) << RANK_BITS)
}

/// [`key`] of a header.
pub fn key_of(header: u32) -> u32 {
    header & !((1 << RANK_BITS) - 1)
}

/// The rank in a header.
pub fn rank_of(header: u32) -> u32 {
    header & ((1 << RANK_BITS) - 1)
}

/// The token length in a header.
pub fn len_of(header: u32) -> usize {
    ((header >> RANK_BITS) & ((1 << LEN_BITS) - 1)) as usize
}

/// Buckets for `tokens` tokens.
#[allow(dead_code)] // the writer's side, used by build.rs
pub fn bucket_count(tokens: usize) -> usize {
    tokens.div_ceil(TOKENS_PER_BUCKET)
}

/// The bucket of `hash` among `buckets`: the high half of the hash scaled to the count.
pub fn bucket(hash: u64, buckets: usize) -> usize {
    (((hash >> 32) * buckets as u64) >> 32) as usize
}

/// Eight bytes at a time, then murmur3's finaliser so every output bit depends on every byte.
pub fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = bytes.len() as u64;
    let mut rest = bytes;
    while let Some((word, tail)) = rest.split_first_chunk::<8>() {
        h = (h.rotate_left(23) ^ u64::from_le_bytes(*word)).wrapping_mul(K);
        rest = tail;
    }
    let mut word = 0;
    for (i, &b) in rest.iter().enumerate() {
        word |= u64::from(b) << (8 * i);
    }
    h = (h.rotate_left(23) ^ word).wrapping_mul(K);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}
