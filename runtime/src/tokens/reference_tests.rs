//! The counter against tiktoken-rs itself: the same counts on random text and on a fixed
//! corpus of prose, code and JSON in many scripts.

use super::*;
use proptest::prelude::*;
use tiktoken_rs::CoreBPE;

const CORPUS: &str = include_str!("corpus.txt");

fn reference(encoding: Encoding) -> &'static CoreBPE {
    match encoding {
        Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        Encoding::P50kBase => tiktoken_rs::p50k_base_singleton(),
        Encoding::R50kBase => tiktoken_rs::r50k_base_singleton(),
    }
}

fn counter(encoding: Encoding) -> TiktokenCounter {
    TiktokenCounter::by_encoding(encoding.name()).unwrap()
}

/// The corpus, whole and line by line (lines keep their `\n` or `\r\n`), counts as tiktoken
/// counts it; the totals are pinned so a change on either side shows.
#[test]
fn fixed_corpus_counts_exactly() {
    let totals = [
        (Encoding::O200kBase, 1185),
        (Encoding::Cl100kBase, 1360),
        (Encoding::P50kBase, 1716),
        (Encoding::R50kBase, 1779),
    ];
    for (encoding, total) in totals {
        let counter = counter(encoding);
        let reference = reference(encoding);
        for line in CORPUS.split_inclusive('\n') {
            assert_eq!(
                counter.count(line),
                reference.encode_ordinary(line).len(),
                "{encoding}: {line:?}"
            );
        }
        assert_eq!(
            counter.count(CORPUS),
            reference.encode_ordinary(CORPUS).len(),
            "{encoding}"
        );
        assert_eq!(counter.count(CORPUS), total, "{encoding}");
    }
}

/// Fragments that exercise every branch of the split patterns.
fn fragment() -> impl Strategy<Value = String> {
    let words = proptest::sample::select(vec![
        "the",
        "The",
        "HELLO",
        "world",
        "naïve",
        "café",
        "Straße",
        "Œuvre",
        "ÉCOLE",
        "x",
        "I",
        "don",
        "antidisestablishmentarianism",
        "tiktoken",
        "getHTTPResponse",
        "snake_case",
    ]);
    let contractions = proptest::sample::select(vec![
        "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "'", "''", "’s",
    ]);
    let spaces = proptest::sample::select(vec![
        " ",
        "  ",
        "   ",
        "\n",
        "\n\n",
        "\t",
        "\t\t",
        "\r\n",
        " \n",
        "\n ",
        " \t\n",
        "\u{a0}",
        "\u{3000}",
        "    \n    ",
    ]);
    let punctuation = proptest::sample::select(vec![
        ".",
        ",",
        "!",
        "?",
        "...",
        "--",
        "(",
        ")",
        "{",
        "}",
        "[",
        "]",
        "\"",
        "<|endoftext|>",
        "//",
        "/*",
        "*/",
        "=>",
        "->",
        "::",
        "#",
        "@",
        "$",
        "%",
        "&",
        "|",
        "\\",
        "~",
        "`",
        "«",
        "—",
        "…",
    ]);
    let code = proptest::sample::select(vec![
        "fn main() {\n    println!(\"hi\");\n}\n",
        "if (x != null && y >= 0) { return x; }",
        "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
        "def f(a, b=None):\n\treturn a or b\n",
        "<a href=\"/x?y=1&z=2\">link</a>",
        "SELECT * FROM t WHERE id = 42;",
        "$ ls -la /usr/local/bin | grep -v '^d'",
    ]);
    let cjk = proptest::sample::select(vec![
        "お誕生日",
        "おめでとう",
        "東京",
        "帮我读",
        "中文",
        "한국어",
        "カタカナ",
        "漢字",
    ]);
    let emoji = proptest::sample::select(vec!["🦀", "🚀", "👩‍💻", "👍🏽", "🇫🇷", "❤️", "1️⃣", "😀😃😄"]);
    prop_oneof![
        4 => words.prop_map(str::to_owned),
        2 => contractions.prop_map(str::to_owned),
        4 => spaces.prop_map(str::to_owned),
        2 => "[0-9]{1,12}",
        3 => punctuation.prop_map(str::to_owned),
        1 => code.prop_map(str::to_owned),
        2 => cjk.prop_map(str::to_owned),
        1 => emoji.prop_map(str::to_owned),
        2 => "[a-zA-Z]{1,8}",
        1 => "[à-ÿĀ-ž]{1,6}",
        1 => any::<char>().prop_map(String::from),
        // Runs long enough for the large-piece merge.
        1 => ("[a-z =.\\n]", 20..150_usize).prop_map(|(c, n)| c.repeat(n)),
    ]
}

fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(fragment(), 0..40).prop_map(|parts| parts.concat())
}

fn agrees_with_reference(encoding: Encoding, text: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        counter(encoding).count(text),
        reference(encoding).encode_ordinary(text).len(),
        "{}: {:?}",
        encoding,
        text
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn o200k_counts_match_tiktoken(text in text()) {
        agrees_with_reference(Encoding::O200kBase, &text)?;
    }

    #[test]
    fn cl100k_counts_match_tiktoken(text in text()) {
        agrees_with_reference(Encoding::Cl100kBase, &text)?;
    }

    #[test]
    fn p50k_counts_match_tiktoken(text in text()) {
        agrees_with_reference(Encoding::P50kBase, &text)?;
    }

    #[test]
    fn r50k_counts_match_tiktoken(text in text()) {
        agrees_with_reference(Encoding::R50kBase, &text)?;
    }
}
