//! The split of a text into pieces before byte-pair merging, exactly as tiktoken's regexes
//! split it, without a regex engine: compiling the patterns with fancy-regex cost every
//! process 1–3 MiB and a few milliseconds, most of it Unicode tables and matcher code that a
//! one-turn `troupe chat --once` touched only for that.
//!
//! Each pattern is an alternation tried in order at the end of the previous piece; the first
//! alternative that matches gives the piece. Every character starts a match of some
//! alternative, so the pieces cover the text. The functions below follow the alternatives one
//! by one, with what backtracking would do worked out per construct (a greedy run followed by
//! something it may have to give back). The patterns, as tiktoken-rs 0.12.1 defines them:
//!
//! - r50k_base and p50k_base:
//!   `'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s`
//! - cl100k_base:
//!   `'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s`
//! - o200k_base: `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`
//!   `|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`
//!   `|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//!
//! The Unicode classes come from the tables of regex-syntax, the parser of the reference's
//! regex engine (`build.rs` writes them), and the tests check the split equals the reference
//! regexes' on arbitrary text.

/// Character classes as bits; every character is in exactly one.
type Set = u8;
/// Not a letter, number, mark or whitespace.
const OTHER: Set = 1 << 0;
/// `\p{Lu}`, `\p{Lt}`.
const UPPER: Set = 1 << 1;
/// `\p{Ll}`.
const LOWER: Set = 1 << 2;
/// `\p{Lm}`, `\p{Lo}`: letters without case.
const UNCASED: Set = 1 << 3;
/// `\p{M}`.
const MARK: Set = 1 << 4;
/// `\p{N}`.
const NUMBER: Set = 1 << 5;
/// `\s` but `\r` and `\n`.
const SPACE: Set = 1 << 6;
/// `\r`, `\n`.
const NEWLINE: Set = 1 << 7;

/// `\p{L}`.
const LETTER: Set = UPPER | LOWER | UNCASED;
/// `\s`.
const WHITESPACE: Set = SPACE | NEWLINE;
/// `[^\r\n\p{L}\p{N}]`.
const NOT_LETTER_NUMBER_NEWLINE: Set = OTHER | MARK | SPACE;
/// `[^\s\p{L}\p{N}]`.
const PUNCTUATION: Set = OTHER | MARK;
/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`.
const CAPITAL: Set = UPPER | UNCASED | MARK;
/// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`.
const SMALL: Set = LOWER | UNCASED | MARK;

// `CHAR_CLASSES`: sorted `start << 8 | class` of each run of characters of one class.
include!(concat!(env!("OUT_DIR"), "/char_classes.rs"));

/// The classes of the ASCII characters, read from the table at compile time.
const ASCII: [Set; 128] = {
    let mut table = [OTHER; 128];
    let mut run = 0;
    let mut c = 0;
    while c < 128 {
        while run + 1 < CHAR_CLASSES.len() && CHAR_CLASSES[run + 1] >> 8 <= c as u32 {
            run += 1;
        }
        table[c] = CHAR_CLASSES[run] as u8;
        c += 1;
    }
    table
};

/// The class of `c`.
fn class_of(c: char) -> Set {
    let c = c as u32;
    if let Some(&class) = ASCII.get(c as usize) {
        return class;
    }
    let run = CHAR_CLASSES.partition_point(|&entry| entry >> 8 <= c);
    CHAR_CLASSES
        .get(run.wrapping_sub(1))
        .map_or(OTHER, |&entry| entry as u8)
}

/// Which encoding's split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pattern {
    /// r50k_base and p50k_base.
    R50k,
    Cl100k,
    O200k,
}

/// The pieces of `text`, in order; together they are the whole text.
pub(super) fn pieces(pattern: Pattern, text: &str) -> Pieces<'_> {
    Pieces {
        text,
        at: 0,
        pattern,
    }
}

/// The iterator [`pieces`] returns.
pub(super) struct Pieces<'a> {
    text: &'a str,
    at: usize,
    pattern: Pattern,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let text = Text(self.text);
        let (c, class) = text.at(self.at)?;
        let end = match self.pattern {
            Pattern::R50k => r50k(text, self.at, c, class),
            Pattern::Cl100k => cl100k(text, self.at, c, class),
            Pattern::O200k => o200k(text, self.at, c, class),
        };
        // Never empty, whatever happens: at least the character the piece starts with.
        let end = end.max(self.at + c.len_utf8());
        let piece = self.text.get(self.at..end)?;
        self.at = end;
        Some(piece)
    }
}

/// A text read a character at a time, by byte offset.
#[derive(Clone, Copy)]
struct Text<'a>(&'a str);

impl Text<'_> {
    /// The character at byte `i` and its class; `None` at the end.
    fn at(self, i: usize) -> Option<(char, Set)> {
        let byte = *self.0.as_bytes().get(i)?;
        if byte.is_ascii() {
            return Some((char::from(byte), ASCII[usize::from(byte)]));
        }
        let c = self.0.get(i..)?.chars().next()?;
        Some((c, class_of(c)))
    }

    /// Whether the character at `i` is in `set`.
    fn is(self, i: usize, set: Set) -> bool {
        self.at(i).is_some_and(|(_, class)| class & set != 0)
    }

    /// The end of the longest run of characters in `set` from `i`.
    fn run(self, mut i: usize, set: Set) -> usize {
        while let Some((c, class)) = self.at(i)
            && class & set != 0
        {
            i += c.len_utf8();
        }
        i
    }

    /// The end of the run of at most `most` characters in `set` from `i`.
    fn run_of_at_most(self, mut i: usize, set: Set, most: usize) -> usize {
        for _ in 0..most {
            match self.at(i) {
                Some((c, class)) if class & set != 0 => i += c.len_utf8(),
                _ => break,
            }
        }
        i
    }

    /// The end of the longest run of `\r`, `\n` (and `/` if `slash`) from `i`.
    fn line_ends(self, mut i: usize, slash: bool) -> usize {
        while let Some(&byte) = self.0.as_bytes().get(i)
            && (byte == b'\r' || byte == b'\n' || (slash && byte == b'/'))
        {
            i += 1;
        }
        i
    }

    /// ` ?X`, X a class: where the X starts, after an optional space (`c` at `i` is the
    /// character there, of class `class`), if it is there.
    fn after_optional_space(self, i: usize, c: char, class: Set, set: Set) -> Option<usize> {
        if c == ' ' && self.is(i + 1, set) {
            Some(i + 1)
        } else if class & set != 0 {
            Some(i)
        } else {
            None
        }
    }

    /// An apostrophe at `i` followed by one of the contractions `s d m t ll ve re`
    /// (case-insensitive if `fold`, as `(?i)` reads them): the end of the contraction.
    fn contraction(self, i: usize, fold: bool) -> Option<usize> {
        if self.0.as_bytes().get(i) != Some(&b'\'') {
            return None;
        }
        let (first, _) = self.at(i + 1)?;
        let second_at = i + 1 + first.len_utf8();
        if ['s', 'd', 'm', 't']
            .into_iter()
            .any(|l| same_letter(first, l, fold))
        {
            return Some(second_at);
        }
        let (second, _) = self.at(second_at)?;
        let pair = [('l', 'l'), ('v', 'e'), ('r', 'e')]
            .into_iter()
            .any(|(a, b)| same_letter(first, a, fold) && same_letter(second, b, fold));
        pair.then(|| second_at + second.len_utf8())
    }

    /// The run of whitespace from `i`: its end, the end of its last `\r` or `\n` if any, and
    /// where its last character starts.
    fn whitespace(self, mut i: usize) -> Whitespace {
        let mut run = Whitespace {
            end: i,
            after_last_newline: None,
            last_start: i,
        };
        while let Some((c, class)) = self.at(i)
            && class & WHITESPACE != 0
        {
            run.last_start = i;
            i += c.len_utf8();
            if class == NEWLINE {
                run.after_last_newline = Some(i);
            }
        }
        run.end = i;
        run
    }

    fn len(self) -> usize {
        self.0.len()
    }
}

/// Whether `c` is the lowercase ASCII `letter`, or with `fold` a character `(?i)` takes for
/// it (Unicode's simple case folding: the capital, and the long s for an s).
fn same_letter(c: char, letter: char, fold: bool) -> bool {
    c == letter || fold && (c == letter.to_ascii_uppercase() || (letter == 's' && c == 'ſ'))
}

struct Whitespace {
    end: usize,
    after_last_newline: Option<usize>,
    last_start: usize,
}

/// r50k_base: `'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s`.
fn r50k(text: Text<'_>, i: usize, c: char, class: Set) -> usize {
    if let Some(end) = text.contraction(i, false) {
        return end;
    }
    for set in [LETTER, NUMBER, PUNCTUATION] {
        if let Some(start) = text.after_optional_space(i, c, class, set) {
            return text.run(start, set);
        }
    }
    let run = text.whitespace(i);
    if run.end == text.len() {
        // \s++$
        run.end
    } else if run.last_start > i {
        // \s+(?!\S): all but the last, which the next piece takes.
        run.last_start
    } else {
        // \s
        i + c.len_utf8()
    }
}

/// cl100k_base: `'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|
/// ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s`.
fn cl100k(text: Text<'_>, i: usize, c: char, class: Set) -> usize {
    if let Some(end) = text.contraction(i, true) {
        return end;
    }
    let next = i + c.len_utf8();
    // The optional prefix is possessive, but it and \p{L} exclude each other: taking it or
    // not never decides a match.
    if class & NOT_LETTER_NUMBER_NEWLINE != 0 && text.is(next, LETTER) {
        return text.run(next, LETTER);
    }
    if class & LETTER != 0 {
        return text.run(i, LETTER);
    }
    if class & NUMBER != 0 {
        return text.run_of_at_most(i, NUMBER, 3);
    }
    if let Some(start) = text.after_optional_space(i, c, class, PUNCTUATION) {
        return text.line_ends(text.run(start, PUNCTUATION), false);
    }
    let run = text.whitespace(i);
    if run.end == text.len() {
        // \s++$
        run.end
    } else if let Some(end) = run.after_last_newline {
        // \s*[\r\n]: backtracking stops at the last line end of the run.
        end
    } else if run.last_start > i {
        // \s+(?!\S)
        run.last_start
    } else {
        // \s
        next
    }
}

/// o200k_base, see the module documentation.
fn o200k(text: Text<'_>, i: usize, c: char, class: Set) -> usize {
    let next = i + c.len_utf8();
    let prefixed = class & NOT_LETTER_NUMBER_NEWLINE != 0;
    // [^\r\n\p{L}\p{N}]?[CAPITAL]*[SMALL]+ then a contraction, with the prefix and without.
    for start in [prefixed.then_some(next), Some(i)].into_iter().flatten() {
        if let Some(end) = capitals_then_smalls(text, start) {
            return text.contraction(end, true).unwrap_or(end);
        }
    }
    // [^\r\n\p{L}\p{N}]?[CAPITAL]+[SMALL]* then a contraction.
    for start in [prefixed.then_some(next), Some(i)].into_iter().flatten() {
        if text.is(start, CAPITAL) {
            let end = text.run(text.run(start, CAPITAL), SMALL);
            return text.contraction(end, true).unwrap_or(end);
        }
    }
    if class & NUMBER != 0 {
        return text.run_of_at_most(i, NUMBER, 3);
    }
    if let Some(start) = text.after_optional_space(i, c, class, PUNCTUATION) {
        return text.line_ends(text.run(start, PUNCTUATION), true);
    }
    let run = text.whitespace(i);
    if let Some(end) = run.after_last_newline {
        // \s*[\r\n]+: backtracking stops at the last line end of the run.
        end
    } else if run.end == text.len() || run.last_start == i {
        // \s+(?!\S) to the end of the text, or \s+ of one character.
        run.end
    } else {
        // \s+(?!\S): all but the last.
        run.last_start
    }
}

/// `[CAPITAL]*[SMALL]+` from `i`: where it ends, if it matches. The two classes share the
/// uncased letters and the marks, so the greedy capitals may have to give some back.
fn capitals_then_smalls(text: Text<'_>, i: usize) -> Option<usize> {
    let mut at = i;
    // The end of the last character of the capitals' run that is also a small one.
    let mut after_last_small = None;
    while let Some((c, class)) = text.at(at)
        && class & CAPITAL != 0
    {
        at += c.len_utf8();
        if class & SMALL != 0 {
            after_last_small = Some(at);
        }
    }
    if text.is(at, SMALL) {
        // The capitals keep their whole run; the smalls run on from its end.
        Some(text.run(at, SMALL))
    } else {
        // The smalls are the last shared character; what follows it is not small.
        after_last_small
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fancy_regex::Regex;
    use proptest::prelude::*;
    use std::sync::LazyLock;

    /// The patterns tiktoken-rs 0.12.1 splits with (`tiktoken_ext/openai_public.rs`).
    const R50K_PATTERN: &str =
        "'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^\\s\\p{L}\\p{N}]++|\\s++$|\\s+(?!\\S)|\\s";
    const CL100K_PATTERN: &str = "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s";
    const O200K_PATTERN: &str = concat!(
        r#"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"#,
        "|",
        r#"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"#,
        "|",
        r#"\p{N}{1,3}"#,
        "|",
        r#" ?[^\s\p{L}\p{N}]+[\r\n/]*"#,
        "|",
        r#"\s*[\r\n]+"#,
        "|",
        r#"\s+(?!\S)"#,
        "|",
        r#"\s+"#
    );

    const ALL: [Pattern; 3] = [Pattern::R50k, Pattern::Cl100k, Pattern::O200k];

    fn regex(pattern: Pattern) -> &'static Regex {
        static R50K: LazyLock<Regex> = LazyLock::new(|| Regex::new(R50K_PATTERN).unwrap());
        static CL100K: LazyLock<Regex> = LazyLock::new(|| Regex::new(CL100K_PATTERN).unwrap());
        static O200K: LazyLock<Regex> = LazyLock::new(|| Regex::new(O200K_PATTERN).unwrap());
        match pattern {
            Pattern::R50k => &R50K,
            Pattern::Cl100k => &CL100K,
            Pattern::O200k => &O200K,
        }
    }

    /// The reference's split: the regex's matches.
    fn regex_pieces(pattern: Pattern, text: &str) -> Vec<&str> {
        regex(pattern)
            .find_iter(text)
            .map(|m| m.unwrap().as_str())
            .collect()
    }

    fn same_split(pattern: Pattern, text: &str) -> Result<(), TestCaseError> {
        let ours: Vec<&str> = pieces(pattern, text).collect();
        prop_assert_eq!(
            ours,
            regex_pieces(pattern, text),
            "{:?}: {:?}",
            pattern,
            text
        );
        Ok(())
    }

    /// Every character of Unicode, each once.
    fn every_char() -> impl Iterator<Item = char> {
        (0..=u32::from(char::MAX)).filter_map(char::from_u32)
    }

    /// Every class predicate the split uses equals the regex class it stands for, on every
    /// character (one regex scan of all of them: each match is one character).
    #[test]
    fn classes_equal_the_regex_classes_on_every_character() {
        let text: String = every_char().collect();
        for (pattern, set) in [
            (r"\p{L}", LETTER),
            (r"\p{N}", NUMBER),
            (r"\p{M}", MARK),
            (r"\s", WHITESPACE),
            (r"[\r\n]", NEWLINE),
            (r"[^\r\n\p{L}\p{N}]", NOT_LETTER_NUMBER_NEWLINE),
            (r"[^\s\p{L}\p{N}]", PUNCTUATION),
            (r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", CAPITAL),
            (r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]", SMALL),
        ] {
            let matched: Vec<char> = Regex::new(pattern)
                .unwrap()
                .find_iter(&text)
                .flat_map(|m| m.unwrap().as_str().chars())
                .collect();
            let ours: Vec<char> = every_char().filter(|&c| class_of(c) & set != 0).collect();
            assert_eq!(matched.len(), ours.len(), "{pattern}");
            assert!(matched == ours, "{pattern}: the classes differ");
        }
        // Exactly one class each.
        assert!(every_char().all(|c| class_of(c).count_ones() == 1));
    }

    /// `(?i)` reads a contraction's letters with Unicode's simple case folding: the long s
    /// is an s; no other character stands for one of these letters.
    #[test]
    fn contraction_letters_fold_as_the_regex_folds_them() {
        let text: String = every_char().collect();
        for letter in ['s', 'd', 'm', 't', 'l', 'v', 'e', 'r'] {
            let folded: Vec<char> = Regex::new(&format!("(?i:{letter})"))
                .unwrap()
                .find_iter(&text)
                .flat_map(|m| m.unwrap().as_str().chars())
                .collect();
            let ours: Vec<char> = every_char()
                .filter(|&c| same_letter(c, letter, true))
                .collect();
            assert_eq!(ours, folded, "{letter}");
            let exact: Vec<char> = every_char()
                .filter(|&c| same_letter(c, letter, false))
                .collect();
            assert_eq!(exact, [letter]);
        }
    }

    #[test]
    fn the_corpus_splits_as_the_regexes_split_it() {
        let corpus = include_str!("corpus.txt");
        for pattern in ALL {
            same_split(pattern, corpus).unwrap();
            for line in corpus.split_inclusive('\n') {
                same_split(pattern, line).unwrap();
            }
        }
    }

    #[test]
    fn edge_cases_split_as_the_regexes_split_them() {
        let cases = [
            "",
            " ",
            "  ",
            "\n",
            " \n ",
            "a \n",
            "a  b",
            "a \t\nb",
            "x\r\n\r\n  y",
            "don't DON'T Don'ſ I'LL we've they'Re",
            "'s 's'' ''s",
            "ǅemo ǅ ǈa ʰa aʰ ʰʰ Aʰ aA Aa AAa",
            "e\u{301}\u{301}x \u{301} \u{301}a A\u{301}B \u{301}\u{301}",
            "1234567 ١٢٣٤ ⅫⅫ ½½½½",
            " !!\n//\n/ ?\r\n\r\n",
            "  \u{a0}\u{3000}x\u{85}\u{85}",
            "end   ",
            "end\n\n",
            "\t\tx",
            "(hello) [WORLD]",
            "你好，世界。",
            "👩\u{200d}💻 🇫🇷",
        ];
        for text in cases {
            for pattern in ALL {
                same_split(pattern, text).unwrap();
            }
        }
    }

    /// Characters drawn to hit every class and every literal of the patterns.
    fn tricky_char() -> impl Strategy<Value = char> {
        prop_oneof![
            proptest::sample::select(vec![
                ' ', ' ', '\'', '\'', '/', '\r', '\n', '\t', '\u{b}', '\u{a0}', '\u{85}',
                '\u{2028}', '\u{3000}', 's', 'S', 'ſ', 'l', 'L', 'v', 'e', 'E', 'r', 'd', 'm', 't',
                'T', 'a', 'A', 'ǅ', 'ʰ', 'ª', '中', 'ー', '\u{301}', '\u{903}', '\u{20dd}', '0',
                '9', '٣', 'Ⅻ', '½', '.', ',', '!', '(', '-', '€', '\0', '\u{feff}', '\u{200d}',
                '🦀',
            ]),
            any::<char>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4_000))]

        #[test]
        fn arbitrary_text_splits_as_the_regexes_split_it(text in any::<String>()) {
            for pattern in ALL {
                same_split(pattern, &text)?;
            }
        }

        #[test]
        fn tricky_text_splits_as_the_regexes_split_it(
            chars in proptest::collection::vec(tricky_char(), 0..64),
        ) {
            let text: String = chars.into_iter().collect();
            for pattern in ALL {
                same_split(pattern, &text)?;
            }
        }
    }
}
