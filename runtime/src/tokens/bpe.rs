//! tiktoken's ordinary encoding, counted over rank tables compiled into the binary by
//! `build.rs`: nothing is built at run time, so the first count costs no more than the next
//! instead of tiktoken's 85–215 ms and tens of MiB.
//!
//! Counting follows tiktoken step by step, so counts are the same: the text is split as the
//! encoding's regex splits it (`split.rs`); a piece that is a token counts one; any other
//! piece starts as single bytes, and the adjacent pair whose concatenation has the lowest rank
//! (leftmost on ties) is merged until no pair is a token; the parts that remain are counted.

use super::layout;
use super::split::{self, Pattern};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

type Rank = u32;

/// No merge: the pair is not a token.
const NO_RANK: Rank = Rank::MAX;

/// Pieces shorter than this merge in a small array scanned linearly (tiktoken's fast path);
/// longer ones use a heap, which keeps a megabyte without spaces from going quadratic.
const SMALL_PIECE: usize = 100;

/// The table files `build.rs` wrote for encoding `$name`.
macro_rules! table {
    ($name:literal) => {
        Table {
            records: include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".records")),
            buckets: include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".buckets")),
        }
    };
}

pub(super) static O200K_BASE: Bpe = Bpe::new(table!("o200k_base"), Pattern::O200k);
pub(super) static CL100K_BASE: Bpe = Bpe::new(table!("cl100k_base"), Pattern::Cl100k);
pub(super) static P50K_BASE: Bpe = Bpe::new(table!("p50k_base"), Pattern::R50k);
pub(super) static R50K_BASE: Bpe = Bpe::new(table!("r50k_base"), Pattern::R50k);

/// One encoding: its ranks and its split.
pub(super) struct Bpe {
    table: Table,
    pattern: Pattern,
    /// Counts of long texts seen before (instructions, tool schemas, history items).
    memo: super::memo::Memo,
}

impl Bpe {
    const fn new(table: Table, pattern: Pattern) -> Self {
        Self {
            table,
            pattern,
            memo: super::memo::Memo::new(),
        }
    }

    /// Tokens of `text` encoded as ordinary text (special tokens are plain text); a long
    /// text counted before is not counted again.
    pub(super) fn count(&self, text: &str) -> usize {
        self.memo
            .get_or_count(text, |text| self.count_uncached(text))
    }

    /// Tokens of `text`, counted now (the memo neither read nor written).
    pub(super) fn count_uncached(&self, text: &str) -> usize {
        split::pieces(self.pattern, text)
            .map(|piece| self.count_piece(piece.as_bytes()))
            .sum()
    }

    /// Tokens of one piece of the split.
    fn count_piece(&self, piece: &[u8]) -> usize {
        match piece.len() {
            0 => 0,
            // Every single byte is a token (build.rs checks).
            1 => 1,
            _ if self.table.rank(piece).is_some() => 1,
            n if n < SMALL_PIECE => self.merge_small(piece),
            _ => self.merge_large(piece),
        }
    }

    fn pair_rank(&self, bytes: &[u8]) -> Rank {
        self.table.rank(bytes).unwrap_or(NO_RANK)
    }

    /// tiktoken's `_byte_pair_merge`, counting the parts: `parts[i]` is (start of part i, rank
    /// of part i joined with part i + 1), with a sentinel for the end.
    fn merge_small(&self, piece: &[u8]) -> usize {
        debug_assert!((2..SMALL_PIECE).contains(&piece.len()));
        // Starts fit in u32 (they are below 100); the smaller array is cheaper to set up.
        let mut parts = [(0_u32, NO_RANK); SMALL_PIECE + 1];
        let mut len = piece.len() + 1;
        let mut min = (NO_RANK, 0);
        for (i, part) in parts.iter_mut().enumerate().take(len) {
            let rank = if i + 2 <= piece.len() {
                self.pair_rank(&piece[i..i + 2])
            } else {
                NO_RANK
            };
            if rank < min.0 {
                min = (rank, i);
            }
            *part = (i as u32, rank);
        }
        // The rank of part i joined with the one after it, once part i + 1 is merged away.
        let rank_after_merge = |parts: &[(u32, Rank)], len: usize, i: usize| {
            if i + 3 < len {
                self.pair_rank(&piece[parts[i].0 as usize..parts[i + 3].0 as usize])
            } else {
                NO_RANK
            }
        };
        while min.0 != NO_RANK {
            let i = min.1;
            if i > 0 {
                parts[i - 1].1 = rank_after_merge(&parts, len, i - 1);
            }
            parts[i].1 = rank_after_merge(&parts, len, i);
            parts.copy_within(i + 2..len, i + 1);
            len -= 1;
            min = (NO_RANK, 0);
            for (j, &(_, rank)) in parts[..len - 1].iter().enumerate() {
                if rank < min.0 {
                    min = (rank, j);
                }
            }
        }
        len - 1
    }

    /// tiktoken's `_byte_pair_merge_large`, counting the parts: a linked list of parts and a
    /// heap of candidate merges, stale entries skipped when popped.
    fn merge_large(&self, piece: &[u8]) -> usize {
        struct Part {
            prev: usize,
            end: usize,
            next_end: usize,
            next_rank: Rank,
        }
        let mut state: Vec<Part> = (0..piece.len())
            .map(|i| Part {
                prev: i.wrapping_sub(1),
                end: i + 1,
                next_end: i + 2,
                next_rank: NO_RANK,
            })
            .collect();
        let mut heap = BinaryHeap::with_capacity(piece.len());
        for i in 0..piece.len() - 1 {
            let rank = self.pair_rank(&piece[i..i + 2]);
            if rank != NO_RANK {
                heap.push(Merge { start: i, rank });
                state[i].next_rank = rank;
            }
        }
        let potential_merge =
            |state: &mut [Part], heap: &mut BinaryHeap<Merge>, start: usize, next_end: usize| {
                state[start].next_end = next_end;
                state[start].next_rank = NO_RANK;
                if next_end <= piece.len() {
                    let rank = self.pair_rank(&piece[start..next_end]);
                    if rank != NO_RANK {
                        heap.push(Merge { start, rank });
                        state[start].next_rank = rank;
                    }
                }
            };
        while let Some(left) = heap.pop() {
            if left.rank != state[left.start].next_rank {
                continue;
            }
            let left_start = left.start;
            let right_start = state[left_start].end;
            let right_end = state[left_start].next_end;
            let right_next_end = state[right_start].next_end;
            state[left_start].end = right_end;
            potential_merge(&mut state, &mut heap, left_start, right_next_end);
            if right_end < state.len() {
                state[right_end].prev = left_start;
            }
            if left_start > 0 {
                let prev_start = state[left_start].prev;
                potential_merge(&mut state, &mut heap, prev_start, right_end);
            }
            state[right_start].next_rank = NO_RANK;
        }
        let mut count = 0;
        let mut i = 0;
        while i < state.len() {
            count += 1;
            i = state[i].end;
        }
        count
    }
}

/// A candidate merge in [`Bpe::merge_large`]; the heap pops the lowest rank, leftmost first.
#[derive(PartialEq, Eq)]
struct Merge {
    start: usize,
    rank: Rank,
}

impl Ord for Merge {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.start.cmp(&self.start))
    }
}

impl PartialOrd for Merge {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// An encoding's mergeable ranks: a hash table from token bytes to rank, in the layout
/// `layout.rs` describes.
struct Table {
    records: &'static [u8],
    buckets: &'static [u8],
}

impl Table {
    /// The rank of the token `bytes`, if it is one.
    fn rank(&self, bytes: &[u8]) -> Option<Rank> {
        // Longer than any token, and too long for the length field of a header.
        if bytes.len() > layout::MAX_LEN {
            return None;
        }
        let hash = layout::hash(bytes);
        let bucket = layout::bucket(hash, self.buckets.len() / 4 - 1);
        let key = layout::key(bytes.len(), hash);
        let mut at = u32_at(self.buckets, bucket) as usize;
        let end = u32_at(self.buckets, bucket + 1) as usize;
        while at < end {
            let header = u32_at_byte(self.records, at);
            let len = layout::len_of(header);
            if layout::key_of(header) == key
                && self
                    .records
                    .get(at + 4..at + 4 + len)
                    .is_some_and(|token| same_bytes(token, bytes))
            {
                return Some(layout::rank_of(header));
            }
            at += 4 + len;
        }
        None
    }

    /// Every (bytes, rank) in the table, bucket by bucket.
    #[cfg(test)]
    fn tokens(&self) -> impl Iterator<Item = (&'static [u8], Rank)> {
        let records = self.records;
        let mut at = 0;
        std::iter::from_fn(move || {
            (at < records.len()).then(|| {
                let header = u32_at_byte(records, at);
                let len = layout::len_of(header);
                let token = &records[at + 4..at + 4 + len];
                at += 4 + len;
                (token, layout::rank_of(header))
            })
        })
    }
}

/// `a == b`, a word at a time: tokens are short, and a call to `memcmp` for each costs more
/// than the comparison.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut a, mut b) = (a, b);
    while let (Some((x, a_tail)), Some((y, b_tail))) =
        (a.split_first_chunk::<8>(), b.split_first_chunk::<8>())
    {
        if x != y {
            return false;
        }
        (a, b) = (a_tail, b_tail);
    }
    a.iter().zip(b).all(|(x, y)| x == y)
}

/// The `i`th little-endian u32 of a table.
fn u32_at(table: &[u8], i: usize) -> u32 {
    u32_at_byte(table, 4 * i)
}

/// The little-endian u32 at byte `at` of a table (0 past its end, which no lookup reaches).
fn u32_at_byte(table: &[u8], at: usize) -> u32 {
    table
        .get(at..)
        .and_then(<[u8]>::first_chunk)
        .map_or(0, |b| u32::from_le_bytes(*b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Case = (
        &'static str,
        &'static Bpe,
        &'static tiktoken_rs::CoreBPE,
        usize,
    );

    /// Each encoding, its reference and its number of ordinary tokens.
    fn all() -> [Case; 4] {
        [
            (
                "o200k_base",
                &O200K_BASE,
                tiktoken_rs::o200k_base_singleton(),
                199_998,
            ),
            (
                "cl100k_base",
                &CL100K_BASE,
                tiktoken_rs::cl100k_base_singleton(),
                100_256,
            ),
            (
                "p50k_base",
                &P50K_BASE,
                tiktoken_rs::p50k_base_singleton(),
                50_280,
            ),
            (
                "r50k_base",
                &R50K_BASE,
                tiktoken_rs::r50k_base_singleton(),
                50_256,
            ),
        ]
    }

    /// Every table holds exactly tiktoken's mergeable ranks and finds each by its bytes.
    #[test]
    fn tables_hold_every_rank_of_the_reference() {
        for (name, bpe, reference, size) in all() {
            let table = &bpe.table;
            let mut ranks = Vec::new();
            for (token, rank) in table.tokens() {
                assert_eq!(reference.decode_bytes(&[rank]).unwrap(), token, "{name}");
                assert_eq!(table.rank(token), Some(rank), "{name}: {token:?}");
                ranks.push(rank);
            }
            ranks.sort_unstable();
            ranks.dedup();
            assert_eq!(ranks.len(), size, "{name}");
            // Every rank the reference decodes, bar its special tokens, is in the table.
            let special: Vec<Rank> = reference
                .special_tokens()
                .into_iter()
                .flat_map(|s| reference.encode_with_special_tokens(s))
                .collect();
            let top = ranks.last().copied().unwrap_or_default();
            let missing = (0..top + 5_000).find(|rank| {
                ranks.binary_search(rank).is_err()
                    && !special.contains(rank)
                    && reference.decode_bytes(&[*rank]).is_ok()
            });
            assert_eq!(missing, None, "{name}");
            assert_eq!(table.rank(b"\xff\xfe\xfd not a token \xff"), None);
            assert_eq!(table.rank(b""), None);
            // Longer than any token (128 bytes at most): never taken for one it starts with.
            for (token, _) in table.tokens().take(2_000) {
                for extra in [128, 200, 255, 256, 300] {
                    let longer = [token, &vec![b'x'; extra][..]].concat();
                    assert_eq!(table.rank(&longer), None, "{name}: {longer:?}");
                }
            }
        }
    }

    #[test]
    fn long_pieces_take_the_heap_path_and_match_the_reference() {
        let texts = [
            "a".repeat(1000),
            "antidisestablishmentarianism".repeat(20),
            "お誕生日おめでとう".repeat(30),
            "=".repeat(257),
            " ".repeat(500),
            "🦀".repeat(64),
        ];
        for (name, bpe, reference, _) in all() {
            for text in &texts {
                assert_eq!(
                    bpe.count(text),
                    reference.encode_ordinary(text).len(),
                    "{name}: {:?}",
                    &text[..20]
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Below 100 bytes both merge loops apply and must agree, on arbitrary bytes.
        #[test]
        fn small_and_large_merges_agree(
            piece in proptest::collection::vec(
                prop_oneof![any::<u8>(), proptest::sample::select(b" etaoinshr".to_vec())],
                2..SMALL_PIECE,
            ),
        ) {
            for (name, bpe, _, _) in all() {
                prop_assert_eq!(bpe.merge_small(&piece), bpe.merge_large(&piece), "{}", name);
            }
        }
    }
}
