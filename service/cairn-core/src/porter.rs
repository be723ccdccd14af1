//! The Porter stemmer (M.F. Porter, 1980), as in its author's reference implementation
//! with its two departures from the paper ("-bli" becomes "-ble" and "-logi" becomes
//! "-log"). SQLite's FTS5 `porter` tokenizer and Lucene's `porter_stem` filter use
//! the same algorithm, so a term stemmed here meets the terms those indexes hold.

/// Tokens longer than this pass through unstemmed, as FTS5 leaves them.
const MAX_STEMMED: usize = 64;

/// The stem of one lower-case token. Bytes other than `a`–`z` count as consonants and
/// are never changed, so any UTF-8 token stays valid.
pub fn stem(token: &str) -> String {
    if token.len() < 3 || token.len() > MAX_STEMMED {
        return token.to_owned();
    }
    let mut stemmer = Stemmer {
        b: token.as_bytes().to_vec(),
        len: token.len(),
        stem: 0,
    };
    stemmer.step1ab();
    if stemmer.len > 1 {
        stemmer.step1c();
        stemmer.step2();
        stemmer.step3();
        stemmer.step4();
        stemmer.step5();
    }
    stemmer.b.truncate(stemmer.len);
    String::from_utf8(stemmer.b).unwrap_or_else(|_| token.to_owned())
}

/// The word in `b[..len]`; a matched suffix leaves the stem `b[..stem]`.
struct Stemmer {
    b: Vec<u8>,
    len: usize,
    stem: usize,
}

impl Stemmer {
    fn is_consonant(&self, i: usize) -> bool {
        match self.b[i] {
            b'a' | b'e' | b'i' | b'o' | b'u' => false,
            b'y' => i == 0 || !self.is_consonant(i - 1),
            _ => true,
        }
    }

    /// The number of vowel-consonant sequences in the stem.
    fn measure(&self) -> usize {
        (1..self.stem)
            .filter(|&i| self.is_consonant(i) && !self.is_consonant(i - 1))
            .count()
    }

    fn vowel_in_stem(&self) -> bool {
        (0..self.stem).any(|i| !self.is_consonant(i))
    }

    fn double_consonant(&self, i: usize) -> bool {
        i >= 1 && self.b[i] == self.b[i - 1] && self.is_consonant(i)
    }

    /// Consonant-vowel-consonant ending at `i`, the last consonant not w, x or y.
    fn cvc(&self, i: usize) -> bool {
        i >= 2
            && self.is_consonant(i)
            && !self.is_consonant(i - 1)
            && self.is_consonant(i - 2)
            && !matches!(self.b[i], b'w' | b'x' | b'y')
    }

    /// Whether the word ends with `suffix`; if so, the stem is what precedes it.
    fn ends(&mut self, suffix: &str) -> bool {
        let suffix = suffix.as_bytes();
        if !self.b[..self.len].ends_with(suffix) {
            return false;
        }
        self.stem = self.len - suffix.len();
        true
    }

    /// Replaces the suffix after the stem with `replacement`.
    fn set_to(&mut self, replacement: &str) {
        self.b.truncate(self.stem);
        self.b.extend_from_slice(replacement.as_bytes());
        self.len = self.stem + replacement.len();
    }

    /// Replaces the first of `rules` whose suffix the word ends with, when the stem has
    /// a measure above 0 (only that rule is tried, even when its condition fails).
    fn first_rule(&mut self, rules: &[(&str, &str)]) {
        if let Some((_, replacement)) = rules.iter().find(|(suffix, _)| self.ends(suffix))
            && self.measure() > 0
        {
            self.set_to(replacement);
        }
    }

    /// Plurals and -ed or -ing.
    fn step1ab(&mut self) {
        if self.b[self.len - 1] == b's' {
            if self.ends("sses") {
                self.len -= 2;
            } else if self.ends("ies") {
                self.set_to("i");
            } else if self.b[self.len - 2] != b's' {
                self.len -= 1;
            }
        }
        if self.ends("eed") {
            if self.measure() > 0 {
                self.len -= 1;
            }
        } else if (self.ends("ed") || self.ends("ing")) && self.vowel_in_stem() {
            self.len = self.stem;
            if self.ends("at") {
                self.set_to("ate");
            } else if self.ends("bl") {
                self.set_to("ble");
            } else if self.ends("iz") {
                self.set_to("ize");
            } else if self.double_consonant(self.len - 1) {
                if !matches!(self.b[self.len - 1], b'l' | b's' | b'z') {
                    self.len -= 1;
                }
            } else if self.measure() == 1 && self.cvc(self.len - 1) {
                self.set_to("e");
            }
        }
    }

    /// A final y becomes i when the stem has a vowel.
    fn step1c(&mut self) {
        if self.ends("y") && self.vowel_in_stem() {
            self.b[self.len - 1] = b'i';
        }
    }

    /// Double suffixes to single ones.
    fn step2(&mut self) {
        let rules: &[(&str, &str)] = match self.b[self.len - 2] {
            b'a' => &[("ational", "ate"), ("tional", "tion")],
            b'c' => &[("enci", "ence"), ("anci", "ance")],
            b'e' => &[("izer", "ize")],
            b'l' => &[
                ("bli", "ble"),
                ("alli", "al"),
                ("entli", "ent"),
                ("eli", "e"),
                ("ousli", "ous"),
            ],
            b'o' => &[("ization", "ize"), ("ation", "ate"), ("ator", "ate")],
            b's' => &[
                ("alism", "al"),
                ("iveness", "ive"),
                ("fulness", "ful"),
                ("ousness", "ous"),
            ],
            b't' => &[("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")],
            b'g' => &[("logi", "log")],
            _ => &[],
        };
        self.first_rule(rules);
    }

    /// -ic-, -full, -ness and the like.
    fn step3(&mut self) {
        let rules: &[(&str, &str)] = match self.b[self.len - 1] {
            b'e' => &[("icate", "ic"), ("ative", ""), ("alize", "al")],
            b'i' => &[("iciti", "ic")],
            b'l' => &[("ical", "ic"), ("ful", "")],
            b's' => &[("ness", "")],
            _ => &[],
        };
        self.first_rule(rules);
    }

    /// Removes -ant, -ence and the like from a stem of measure above 1.
    fn step4(&mut self) {
        let found = match self.b[self.len - 2] {
            b'a' => self.ends("al"),
            b'c' => self.ends("ance") || self.ends("ence"),
            b'e' => self.ends("er"),
            b'i' => self.ends("ic"),
            b'l' => self.ends("able") || self.ends("ible"),
            b'n' => self.ends("ant") || self.ends("ement") || self.ends("ment") || self.ends("ent"),
            b'o' => {
                (self.ends("ion") && self.stem >= 1 && matches!(self.b[self.stem - 1], b's' | b't'))
                    || self.ends("ou")
            }
            b's' => self.ends("ism"),
            b't' => self.ends("ate") || self.ends("iti"),
            b'u' => self.ends("ous"),
            b'v' => self.ends("ive"),
            b'z' => self.ends("ize"),
            _ => false,
        };
        if found && self.measure() > 1 {
            self.len = self.stem;
        }
    }

    /// A final -e, and -ll to -l, on long enough stems.
    fn step5(&mut self) {
        self.stem = self.len;
        if self.b[self.len - 1] == b'e' {
            let measure = self.measure();
            if measure > 1 || (measure == 1 && !self.cvc(self.len - 2)) {
                self.len -= 1;
            }
        }
        if self.b[self.len - 1] == b'l' && self.double_consonant(self.len - 1) && self.measure() > 1 {
            self.len -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::stem;

    #[test]
    fn stems_the_examples_of_the_paper_and_the_reference_departures() {
        for (word, expected) in [
            ("caresses", "caress"),
            ("ponies", "poni"),
            ("ties", "ti"),
            ("cats", "cat"),
            ("feed", "feed"),
            ("agreed", "agre"),
            ("plastered", "plaster"),
            ("motoring", "motor"),
            ("sing", "sing"),
            ("conflated", "conflat"),
            ("troubled", "troubl"),
            ("sized", "size"),
            ("hopping", "hop"),
            ("falling", "fall"),
            ("filing", "file"),
            ("happy", "happi"),
            ("relational", "relat"),
            ("conditional", "condit"),
            ("generalizations", "gener"),
            ("possibly", "possibl"),
            ("archaeology", "archaeolog"),
            ("electrical", "electr"),
            ("hopefulness", "hope"),
            ("adjustment", "adjust"),
            ("adoption", "adopt"),
            ("controll", "control"),
            ("rate", "rate"),
            ("running", "run"),
            ("marathon", "marathon"),
            ("2024", "2024"),
            ("is", "is"),
        ] {
            assert_eq!(stem(word), expected, "{word}");
        }
    }

    #[test]
    fn non_ascii_bytes_are_left_alone_and_stay_valid() {
        assert_eq!(stem("zoë"), "zoë");
        assert_eq!(stem("köln"), "köln");
        assert_eq!(stem("naïvely"), "naïv");
    }
}
