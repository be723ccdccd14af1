//! BM25 over the statistics of one scope.
//!
//! A store's full-text index keeps its statistics (how many documents there are, how
//! many hold a term, how long they are) over every tenant it holds. Scores computed from
//! them would tell one tenant how often a word occurs in the others' memory. So each
//! store finds its candidates with its own index, counts the documents and the documents
//! holding each query term inside the scope alone, and scores the candidates here:
//! every figure that reaches a score comes from the scope's own records.
//!
//! The score is FTS5's form of BM25 (k1 1.2, b 0.75): a term's count in each field is
//! weighted by the field's weight and summed, and a document's length is the sum of its
//! fields' lengths. The inverse document frequency is Lucene's, which is never negative.
//! The average length is taken over the candidates, which are the scope's own records.

use crate::porter;
use std::collections::HashMap;
use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

const K1: f64 = 1.2;
const B: f64 = 0.75;

/// One searched term: the word as the query holds it (stores pass it to their index,
/// which stems it itself) and its stem, which document words are compared with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    pub word: String,
    pub stem: String,
}

/// The searchable terms of a query: [`crate::text::query_terms`], one per distinct stem.
pub fn query_terms(text: &str) -> Vec<Term> {
    let mut seen = std::collections::HashSet::new();
    crate::text::query_terms(text)
        .into_iter()
        .filter_map(|word| {
            let stem = porter::stem(&fold(&word));
            seen.insert(stem.clone()).then_some(Term { word, stem })
        })
        .collect()
}

/// A text as a search cluster indexes it: the Porter stem of every word, lower-cased and
/// folded, separated by spaces. A cluster indexes this with its `whitespace` analyzer,
/// which every node has, so candidates are found by the same stems scoring compares,
/// whatever analysis plugins the node lacks.
pub fn index_terms(text: &str) -> String {
    let mut indexed = String::with_capacity(text.len());
    for word in crate::text::words(text) {
        if !indexed.is_empty() {
            indexed.push(' ');
        }
        indexed.push_str(&porter::stem(&fold(&word.to_lowercase())));
    }
    indexed
}

/// How many records of one tier the scope holds, and how many of them hold each term
/// (in the same order as the terms).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScopeStatistics {
    pub documents: u64,
    pub containing: Vec<u64>,
}

/// One candidate's searched fields, each with its weight.
pub type Fields<'a> = Vec<(&'a str, f64)>;

/// The BM25 score of each candidate, in order.
pub fn scores(terms: &[Term], statistics: &ScopeStatistics, candidates: &[Fields<'_>]) -> Vec<f64> {
    if candidates.is_empty() || terms.is_empty() {
        return vec![0.0; candidates.len()];
    }
    let mut stems: HashMap<&str, Option<usize>> = HashMap::new();
    let counted: Vec<(Vec<f64>, f64)> = candidates
        .iter()
        .map(|fields| {
            let mut frequencies = vec![0.0; terms.len()];
            let mut length = 0.0;
            for (text, weight) in fields {
                for word in crate::text::words(text) {
                    length += 1.0;
                    let index = *stems.entry(word).or_insert_with(|| term_of(terms, word));
                    if let Some(index) = index {
                        frequencies[index] += weight;
                    }
                }
            }
            (frequencies, length)
        })
        .collect();
    let average = counted.iter().map(|(_, length)| length).sum::<f64>() / counted.len() as f64;
    let average = if average > 0.0 { average } else { 1.0 };
    // A record written between the count and the search may hold a term the count missed.
    let documents = statistics.documents.max(candidates.len() as u64) as f64;
    let weights: Vec<f64> = (0..terms.len())
        .map(|index| {
            let containing = statistics.containing.get(index).copied().unwrap_or(0) as f64;
            let containing = containing.clamp(0.0, documents);
            (1.0 + (documents - containing + 0.5) / (containing + 0.5)).ln()
        })
        .collect();
    counted
        .into_iter()
        .map(|(frequencies, length)| {
            let norm = K1 * (1.0 - B + B * length / average);
            frequencies
                .iter()
                .zip(&weights)
                .filter(|(frequency, _)| **frequency > 0.0)
                .map(|(frequency, weight)| weight * frequency * (K1 + 1.0) / (frequency + norm))
                .sum()
        })
        .collect()
}

/// The index of the term a document word stems to, if any. Stemming keeps a word's
/// first letter and never lengthens it, so most words are ruled out before stemming.
fn term_of(terms: &[Term], word: &str) -> Option<usize> {
    let folded = fold(&word.to_lowercase());
    let first = folded.chars().next()?;
    let plausible = terms
        .iter()
        .any(|term| term.stem.starts_with(first) && term.stem.len() <= folded.len());
    if !plausible {
        return None;
    }
    let stem = porter::stem(&folded);
    terms.iter().position(|term| term.stem == stem)
}

/// Lower-case text without diacritics ("Zoë" and "zoe" are one word), as the indexes
/// fold them.
fn fold(text: &str) -> String {
    if text.is_ascii() {
        return text.to_owned();
    }
    text.nfd().filter(|c| !is_combining_mark(*c)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statistics(documents: u64, containing: &[u64]) -> ScopeStatistics {
        ScopeStatistics {
            documents,
            containing: containing.to_vec(),
        }
    }

    #[test]
    fn query_terms_keep_one_word_per_stem() {
        let terms = query_terms("Running a marathon, the runs and the RUN in Zoë's town");
        let stems: Vec<&str> = terms.iter().map(|term| term.stem.as_str()).collect();
        assert_eq!(stems, vec!["run", "marathon", "zoe", "town"]);
        assert_eq!(terms[0].word, "running");
    }

    #[test]
    fn indexed_terms_are_the_stems_queries_search_for() {
        let indexed = index_terms("Running, in Zoë's RUNS!");
        assert_eq!(indexed, "run in zoe s run");
        let terms = query_terms("runner's runs zoe");
        assert!(
            terms
                .iter()
                .all(|term| term.stem == "runner" || indexed.split(' ').any(|word| word == term.stem))
        );
        assert_eq!(index_terms(""), "");
    }

    #[test]
    fn scores_follow_bm25_on_a_worked_example() {
        let terms = query_terms("marathon");
        let candidates = vec![
            vec![("training for a marathon", 1.0)],
            vec![("marathon marathon", 1.0)],
        ];
        let got = scores(&terms, &statistics(10, &[2]), &candidates);
        // idf = ln(1 + 8.5 / 2.5); lengths 4 and 2, average 3.
        let idf = (1.0 + 8.5 / 2.5_f64).ln();
        let expected = |tf: f64, length: f64| idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / 3.0));
        assert!((got[0] - expected(1.0, 4.0)).abs() < 1e-12, "{got:?}");
        assert!((got[1] - expected(2.0, 2.0)).abs() < 1e-12, "{got:?}");
    }

    #[test]
    fn rarer_terms_weigh_more_and_stems_and_diacritics_match() {
        let terms = query_terms("ran cafés marathons");
        let candidates = vec![vec![("the cafe", 1.0)], vec![("a marathon", 1.0)]];
        let common_cafe = scores(&terms, &statistics(100, &[0, 90, 5]), &candidates);
        assert!(common_cafe[1] > common_cafe[0], "{common_cafe:?}");
        let rare_cafe = scores(&terms, &statistics(100, &[0, 5, 90]), &candidates);
        assert!(rare_cafe[0] > rare_cafe[1], "{rare_cafe:?}");
        assert!(common_cafe.iter().all(|score| *score > 0.0));
    }

    #[test]
    fn weighted_fields_count_their_terms_at_their_weight() {
        let terms = query_terms("lisbon");
        let own = vec![vec![("lisbon", 1.0), ("a question", 0.5)]];
        let context = vec![vec![("a question", 1.0), ("lisbon", 0.5)]];
        let stats = statistics(5, &[1]);
        assert!(scores(&terms, &stats, &own)[0] > scores(&terms, &stats, &context)[0]);
        assert!(scores(&terms, &stats, &context)[0] > 0.0);
    }

    #[test]
    fn counts_are_bounded_and_empty_input_scores_nothing() {
        let terms = query_terms("lisbon");
        let candidates = vec![vec![("lisbon", 1.0)]];
        // A count of 0 documents (a race with a write) still scores the candidate.
        let raced = scores(&terms, &statistics(0, &[7]), &candidates);
        assert!(raced[0].is_finite() && raced[0] > 0.0);
        assert_eq!(scores(&[], &statistics(3, &[]), &candidates), vec![0.0]);
        assert!(scores(&terms, &statistics(3, &[1]), &[]).is_empty());
    }
}
