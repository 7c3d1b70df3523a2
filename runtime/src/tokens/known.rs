//! Token counts of the prompt parts troupe writes itself (the default instructions, the
//! built-in tools' names, descriptions and parameter schemas) in every encoding, fixed in the
//! source. These parts are counted before every model call (T5); read from here, a one-turn
//! `troupe chat --once` does not read the rank table for them, where counting their few
//! hundred tokens mapped nearly every page of it (2.4 MB for o200k_base).
//!
//! A text is recognised by its length and hash. A built-in text that changes no longer
//! matches and is counted like any other; `known_counts_are_the_built_in_texts_counts` then
//! fails and prints the table to put here.

use super::{Encoding, layout};

/// Each text's length, hash ([`layout::hash`]) and counts in the order of [`Encoding::ALL`].
type Known = (usize, u64, [u32; 4]);

const KNOWN: &[Known] = &[
    (258, 0x30a295632d3cd346, [53, 53, 54, 54]), // You are a careful coding and chat assist
    (416, 0x3bfea199088dad32, [91, 91, 94, 94]), // You are a careful coding and chat assist
    (5, 0x9a6276305195dbcf, [1, 1, 1, 1]),       // shell
    (218, 0xacb0d5ba16c14648, [44, 44, 51, 51]), // Runs a command and returns its exit code
    (508, 0xbd6610754b3aa3b9, [121, 117, 123, 123]), // {"additionalProperties":false,"propertie
    (11, 0x993cab57ad3996a7, [2, 2, 3, 3]),      // update_plan
    (128, 0x70f51cd85f3a705a, [27, 27, 30, 30]), // Records the plan for the current task: o
    (419, 0x558452028a70f621, [96, 90, 98, 98]), // {"additionalProperties":false,"propertie
    (11, 0x86b7c172d7bdae57, [2, 2, 3, 3]),      // apply_patch
    (466, 0x3c501681cbd690ec, [122, 121, 128, 128]), // Edits files with a patch. The patch star
    (184, 0x3e3a6a1bfcc6552e, [43, 42, 44, 44]), // {"additionalProperties":false,"propertie
];

/// The count of `text` in `encoding` if it is one of the built-in texts.
pub(super) fn count(encoding: Encoding, text: &str) -> Option<usize> {
    let mut candidates = KNOWN.iter().filter(|k| k.0 == text.len()).peekable();
    candidates.peek()?;
    let hash = layout::hash(text.as_bytes());
    candidates
        .find(|k| k.1 == hash)
        .and_then(|k| k.2.get(encoding as usize))
        .map(|&n| n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use troupe_actors::context::choose_instructions;
    use troupe_actors::tools::{ToolPrefs, builtin_tools};

    /// Every text troupe puts in a prompt of its own accord.
    fn built_in_texts() -> Vec<String> {
        let mut texts = vec![
            choose_instructions(None, None, true),
            choose_instructions(None, None, false),
        ];
        let every_tool = ToolPrefs {
            shell: true,
            plan: true,
            apply_patch: true,
            web_search: true,
        };
        for tool in builtin_tools(&every_tool) {
            texts.extend([tool.name, tool.description, tool.parameters.0.to_string()]);
        }
        texts
    }

    /// The table the built-in texts make now.
    fn expected() -> Vec<(Known, String)> {
        built_in_texts()
            .into_iter()
            .map(|text| {
                let counts =
                    Encoding::ALL.map(|e| u32::try_from(e.bpe().count_uncached(&text)).unwrap());
                let what = text
                    .chars()
                    .take(40)
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect();
                ((text.len(), layout::hash(text.as_bytes()), counts), what)
            })
            .collect()
    }

    /// The table holds exactly the built-in texts, each with the counts the tokenizer gives
    /// it: a text that changed (or a new one) fails here with the table to put in its place.
    #[test]
    fn known_counts_are_the_built_in_texts_counts() {
        let expected = expected();
        let table: Vec<Known> = expected.iter().map(|(known, _)| *known).collect();
        if table != KNOWN {
            let mut source = String::from("const KNOWN: &[Known] = &[\n");
            for ((len, hash, counts), what) in &expected {
                source.push_str(&format!(
                    "    ({len}, 0x{hash:016x}, {counts:?}), // {what}\n"
                ));
            }
            source.push_str("];\n");
            panic!(
                "the built-in prompt texts changed; in runtime/src/tokens/known.rs put\n{source}"
            );
        }
    }

    #[test]
    fn built_in_texts_are_read_from_the_table() {
        for text in built_in_texts() {
            for encoding in Encoding::ALL {
                assert_eq!(
                    count(encoding, &text),
                    Some(encoding.bpe().count_uncached(&text)),
                    "{encoding}: {text}"
                );
            }
        }
        // Other texts, of a built-in text's length or not, are not.
        let instructions = choose_instructions(None, None, true);
        let same_length = instructions.replace('a', "b");
        assert_eq!(count(Encoding::O200kBase, &same_length), None);
        assert_eq!(count(Encoding::O200kBase, "say hi"), None);
    }
}
