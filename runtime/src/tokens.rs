//! A real tokenizer behind the [`TokenCounter`] port (T5): OpenAI's BPE encodings, counted
//! exactly as tiktoken counts them, from rank tables compiled into the binary (no network,
//! no files; see `build.rs` and `tokens/bpe.rs`).
//!
//! Nothing is built per process: the text is split as the encoding's regex splits it by
//! hand-written code over Unicode tables compiled in (`tokens/split.rs`), and ranks are read
//! in place, so a one-shot process pays no tokenizer start-up. Long texts already counted (the
//! instructions, tool schemas and history items counted again before every model call) are
//! remembered per encoding (`tokens/memo.rs`); the texts troupe writes itself (the default
//! instructions, the built-in tools) have their counts in the source (`tokens/known.rs`).
//!
//! Text is counted as ordinary text: a `<|endoftext|>` inside a user message is five plain
//! tokens, not one special token, which is what a provider bills for such a message.

mod bpe;
mod known;
mod layout;
mod memo;
mod split;

use std::fmt;
use troupe_actors::ports::TokenCounter;
use troupe_proto::AgentError;

/// The encodings this counter knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// GPT-4o, GPT-4.1, GPT-5 and the o-series.
    O200kBase,
    /// GPT-4, GPT-3.5 and the third-generation embeddings.
    Cl100kBase,
    /// Codex and `text-davinci-002/003`.
    P50kBase,
    /// GPT-3 (`davinci`, ...), also known as `gpt2`.
    R50kBase,
}

impl Encoding {
    /// Every encoding, for listings and `--tokenizer-model` help.
    pub const ALL: [Encoding; 4] = [
        Self::O200kBase,
        Self::Cl100kBase,
        Self::P50kBase,
        Self::R50kBase,
    ];

    /// The name tiktoken uses.
    pub const fn name(self) -> &'static str {
        match self {
            Self::O200kBase => "o200k_base",
            Self::Cl100kBase => "cl100k_base",
            Self::P50kBase => "p50k_base",
            Self::R50kBase => "r50k_base",
        }
    }

    /// The encoding called `name` (exact tiktoken name).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.name() == name)
    }

    /// The encoding's ranks and split pattern.
    fn bpe(self) -> &'static bpe::Bpe {
        match self {
            Self::O200kBase => &bpe::O200K_BASE,
            Self::Cl100kBase => &bpe::CL100K_BASE,
            Self::P50kBase => &bpe::P50K_BASE,
            Self::R50kBase => &bpe::R50K_BASE,
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Model-name prefixes and their encodings, most specific first (`gpt-4o` before `gpt-4`).
const MODEL_PREFIXES: &[(&str, Encoding)] = &[
    ("gpt-4o", Encoding::O200kBase),
    ("chatgpt-4o", Encoding::O200kBase),
    ("gpt-4.1", Encoding::O200kBase),
    ("gpt-4.5", Encoding::O200kBase),
    ("gpt-5", Encoding::O200kBase),
    // gpt-oss uses o200k_harmony: the same ranks as o200k_base plus special tokens, which
    // ordinary text never produces.
    ("gpt-oss", Encoding::O200kBase),
    ("o1", Encoding::O200kBase),
    ("o3", Encoding::O200kBase),
    ("o4", Encoding::O200kBase),
    ("gpt-4", Encoding::Cl100kBase),
    ("gpt-3.5", Encoding::Cl100kBase),
    ("gpt-35", Encoding::Cl100kBase),
    ("text-embedding-3", Encoding::Cl100kBase),
    ("text-embedding-ada-002", Encoding::Cl100kBase),
];

/// Counts tokens with a tiktoken encoding. Cheap to clone and copy: the tables are static.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TiktokenCounter {
    encoding: Encoding,
    /// False when the model is not one of OpenAI's and the encoding only approximates its
    /// tokenizer (llama, qwen, mistral... behind an OpenAI-compatible server).
    exact: bool,
    /// Chosen for a model (not named in the configuration): a conversation with another
    /// model gets that model's counter.
    follows_model: bool,
}

impl TiktokenCounter {
    /// The counter for a model name. A provider prefix (`openai/gpt-4o`) and letter case are
    /// ignored. Models that are not OpenAI's get `cl100k_base` as an approximation, with
    /// [`is_exact`](Self::is_exact) false.
    pub fn for_model(model: &str) -> Self {
        let name = model
            .rsplit('/')
            .next()
            .unwrap_or(model)
            .to_ascii_lowercase();
        match MODEL_PREFIXES.iter().find(|(p, _)| name.starts_with(p)) {
            Some(&(_, encoding)) => Self {
                encoding,
                exact: true,
                follows_model: true,
            },
            None => Self {
                follows_model: true,
                encoding: Encoding::Cl100kBase,
                exact: false,
            },
        }
    }

    /// The counter a `--tokenizer-model` value names: an encoding (`o200k_base`, ...) or an
    /// OpenAI model name (mapped to its encoding, as [`for_model`](Self::for_model) does).
    /// Anything else is `InvalidInput` listing what is accepted: a name the counter does not
    /// know is never silently approximated.
    pub fn named(name: &str) -> Result<Self, AgentError> {
        if let Some(encoding) = Encoding::from_name(name) {
            return Ok(Self {
                encoding,
                exact: true,
                follows_model: false,
            });
        }
        let counter = Self::for_model(name);
        if counter.exact {
            return Ok(Self {
                follows_model: false,
                ..counter
            });
        }
        Err(AgentError::invalid(format!(
            "unknown tokenizer `{name}`: give an encoding ({}), an OpenAI model name ({}, ...) \
             or `approx` (four bytes a token)",
            Encoding::ALL.map(Encoding::name).join(", "),
            MODEL_PREFIXES
                .iter()
                .map(|(prefix, _)| *prefix)
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }

    /// The counter for an encoding name (`cl100k_base`, `o200k_base`, `p50k_base`,
    /// `r50k_base`), as given to `--tokenizer-model`.
    pub fn by_encoding(name: &str) -> Result<Self, AgentError> {
        match Encoding::from_name(name) {
            Some(encoding) => Ok(Self {
                encoding,
                exact: true,
                follows_model: false,
            }),
            None => Err(AgentError::invalid(format!(
                "unknown tokenizer encoding `{name}` (known: {})",
                Encoding::ALL.map(Encoding::name).join(", ")
            ))),
        }
    }

    /// The encoding used.
    pub const fn encoding_kind(&self) -> Encoding {
        self.encoding
    }

    /// Whether the encoding is the model's own (false: an approximation).
    pub const fn is_exact(&self) -> bool {
        self.exact
    }

    /// Tokens of `text`, counted now: long texts counted before are not looked up, nor
    /// remembered. For measuring the counter itself.
    pub fn count_fresh(&self, text: &str) -> usize {
        self.encoding.bpe().count_uncached(text)
    }
}

impl TokenCounter for TiktokenCounter {
    fn encoding(&self) -> &str {
        self.encoding.name()
    }

    fn count(&self, text: &str) -> usize {
        known::count(self.encoding, text).unwrap_or_else(|| self.encoding.bpe().count(text))
    }

    fn of_model(&self, model: &str) -> Option<std::sync::Arc<dyn TokenCounter>> {
        self.follows_model.then(|| {
            std::sync::Arc::new(Self::for_model(model)) as std::sync::Arc<dyn TokenCounter>
        })
    }
}

#[cfg(test)]
mod reference_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_proto::ErrorKind;

    fn count(encoding: &str, text: &str) -> usize {
        TiktokenCounter::by_encoding(encoding).unwrap().count(text)
    }

    #[test]
    fn hello_world_is_two_tokens() {
        assert_eq!(count("cl100k_base", "hello world"), 2);
        assert_eq!(count("o200k_base", "hello world"), 2);
        assert_eq!(count("cl100k_base", ""), 0);
    }

    /// Counts published in OpenAI's cookbook ("How to count tokens with tiktoken").
    #[test]
    fn counts_match_published_examples() {
        let cases = [
            ("tiktoken is great!", [6, 6, 6, 6]),
            ("antidisestablishmentarianism", [5, 5, 6, 6]),
            ("2 + 2 = 4", [5, 5, 7, 7]),
            ("お誕生日おめでとう", [14, 14, 9, 8]),
        ];
        for (text, counts) in cases {
            for (encoding, expected) in ["r50k_base", "p50k_base", "cl100k_base", "o200k_base"]
                .into_iter()
                .zip(counts)
            {
                assert_eq!(count(encoding, text), expected, "{encoding}: {text:?}");
            }
        }
    }

    #[test]
    fn non_ascii_text_is_counted_by_the_encoding() {
        // The larger vocabulary packs CJK and Cyrillic tighter.
        for text in ["帮我读 README", "Привет, мир!", "naïve café ☕"] {
            let cl = count("cl100k_base", text);
            let o2 = count("o200k_base", text);
            assert!(o2 <= cl, "{text:?}: o200k {o2} > cl100k {cl}");
            assert!(o2 > 0);
        }
        // Byte-level BPE: a lone emoji is never more tokens than its UTF-8 bytes.
        assert!(count("cl100k_base", "🦀") <= "🦀".len());
    }

    #[test]
    fn special_tokens_are_ordinary_text() {
        let counter = TiktokenCounter::by_encoding("cl100k_base").unwrap();
        assert!(counter.count("<|endoftext|>") > 1);
    }

    #[test]
    fn model_names_choose_the_encoding() {
        let table = [
            ("gpt-4o", "o200k_base", true),
            ("gpt-4o-mini-2024-07-18", "o200k_base", true),
            ("chatgpt-4o-latest", "o200k_base", true),
            ("gpt-4.1-nano", "o200k_base", true),
            ("gpt-5", "o200k_base", true),
            ("gpt-5-mini", "o200k_base", true),
            ("o1-preview", "o200k_base", true),
            ("o3-mini", "o200k_base", true),
            ("o4-mini", "o200k_base", true),
            ("openai/GPT-4o", "o200k_base", true),
            ("gpt-4", "cl100k_base", true),
            ("gpt-4-turbo", "cl100k_base", true),
            ("gpt-4-32k-0314", "cl100k_base", true),
            ("gpt-3.5-turbo", "cl100k_base", true),
            ("gpt-35-turbo", "cl100k_base", true),
            ("text-embedding-3-small", "cl100k_base", true),
            ("llama3.1:8b", "cl100k_base", false),
            ("qwen2.5-coder", "cl100k_base", false),
            ("mistral-large-latest", "cl100k_base", false),
            ("", "cl100k_base", false),
        ];
        for (model, encoding, exact) in table {
            let counter = TiktokenCounter::for_model(model);
            assert_eq!(counter.encoding(), encoding, "{model}");
            assert_eq!(counter.is_exact(), exact, "{model}");
        }
    }

    #[test]
    fn every_encoding_name_round_trips() {
        for encoding in Encoding::ALL {
            let counter = TiktokenCounter::by_encoding(encoding.name()).unwrap();
            assert_eq!(counter.encoding(), encoding.name());
            assert_eq!(counter.encoding_kind(), encoding);
            assert!(counter.is_exact());
        }
    }

    #[test]
    fn tokenizer_names_are_encodings_or_openai_models() {
        for (name, encoding) in [
            ("o200k_base", "o200k_base"),
            ("cl100k_base", "cl100k_base"),
            ("p50k_base", "p50k_base"),
            ("r50k_base", "r50k_base"),
            ("gpt-4o", "o200k_base"),
            ("openai/gpt-4.1-mini", "o200k_base"),
            ("gpt-3.5-turbo", "cl100k_base"),
        ] {
            let counter = TiktokenCounter::named(name).unwrap();
            assert_eq!(counter.encoding(), encoding, "{name}");
            assert!(counter.is_exact(), "{name}");
        }
        for name in ["o200k", "llama3.1:8b", "", "approx"] {
            let err = TiktokenCounter::named(name).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{name}");
            let text = err.to_string();
            assert!(
                text.contains("o200k_base") && text.contains("gpt-4o") && text.contains("approx"),
                "{text}"
            );
        }
    }

    #[test]
    fn unknown_encoding_is_invalid_input() {
        let err = TiktokenCounter::by_encoding("gpt-4o").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("cl100k_base"), "{err}");
    }

    #[test]
    fn counts_history_items_through_the_port() {
        let counter: &dyn TokenCounter = &TiktokenCounter::for_model("gpt-4o");
        let item = troupe_proto::HistoryItem::user("hello world");
        // Two tokens of text plus the per-message frame.
        assert_eq!(counter.count_item(&item), 2 + 4);
    }
}
