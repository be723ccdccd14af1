//! The time a question asks about, from the words that say it: "in June", "on May 3,
//! 2023", "between August 11 and August 15, 2023", "in 2022", "summer 2021", "last
//! week", "yesterday", "three days ago".
//!
//! A date, a range of dates, a month or a season with its year, a year, and a time
//! counted back are periods ([`When::Between`]); a month or a day without its year is
//! that month or day of any year ([`When::Recurring`]), and a season without its year
//! those months of any year ([`When::Season`]), since the question does not say which.
//! Recall prefers the memories whose event time falls in it (see
//! `cairn_app::Settings::time_boost`); a question that names no time, or only words
//! that are not a time ("may" and "march" in lower case, a month alone outside "in
//! June" and the like, which may be a name), has none.

use chrono::{DateTime, Datelike, Duration, Months, NaiveDate, TimeZone, Utc};

/// The time a question asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// From `.0` (included) to `.1` (excluded).
    Between(DateTime<Utc>, DateTime<Utc>),
    /// A month (1–12), and a day of it when given, of any year.
    Recurring { month: u32, day: Option<u32> },
    /// The months from `first` to `last` (1–12, through the new year when `last` comes
    /// before `first`) of any year: a season named without its year.
    Season { first: u32, last: u32 },
}

impl When {
    /// Whether `at` falls in it.
    pub fn holds(&self, at: DateTime<Utc>) -> bool {
        match *self {
            When::Between(from, to) => from <= at && at < to,
            When::Recurring { month, day } => at.month() == month && day.is_none_or(|day| at.day() == day),
            When::Season { first, last } if first <= last => (first..=last).contains(&at.month()),
            When::Season { first, last } => at.month() >= first || at.month() <= last,
        }
    }
}

const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// Month names a question writes capitalised, in full or cut to three or four letters
/// ("May", "Sept."); the lower-case words "may" and "march" are verbs, not months.
fn month_of(word: &str) -> Option<u32> {
    if !word.chars().next().is_some_and(char::is_uppercase) {
        return None;
    }
    let lower = word.trim_end_matches('.').to_lowercase();
    MONTHS
        .iter()
        .position(|month| {
            *month == lower || ((3..=4).contains(&lower.len()) && month.starts_with(lower.as_str()))
        })
        .and_then(|index| u32::try_from(index + 1).ok())
}

/// Words after which a month name alone is a time ("in May"); without one, "May" or
/// "June" could be someone's name, or a verb.
const BEFORE_A_MONTH: [&str; 12] = [
    "in", "during", "since", "from", "of", "early", "late", "mid", "by", "until", "before", "after",
];

/// A day of the month: "3", "3rd", "21st".
fn day_of(word: &str) -> Option<u32> {
    let digits = word.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &word[digits.len()..];
    if !["", "st", "nd", "rd", "th"].contains(&suffix.to_lowercase().as_str()) {
        return None;
    }
    digits.parse::<u32>().ok().filter(|day| (1..=31).contains(day))
}

/// A year: four digits from 1900 to 2199.
fn year_of(word: &str) -> Option<i32> {
    (word.len() == 4)
        .then(|| word.parse::<i32>().ok())
        .flatten()
        .filter(|year| (1900..2200).contains(year))
}

/// Small numbers written as words or digits ("three days ago", "2 weeks ago").
fn count_of(word: &str) -> Option<u32> {
    const WORDS: [&str; 12] = [
        "a", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    ];
    let lower = word.to_lowercase();
    WORDS
        .iter()
        .position(|candidate| *candidate == lower)
        .map(|index| u32::try_from(index.max(1)).unwrap_or(1))
        .or_else(|| {
            lower
                .parse::<u32>()
                .ok()
                .filter(|count| (1..=100).contains(count))
        })
}

fn midnight(date: NaiveDate) -> DateTime<Utc> {
    Utc.from_utc_datetime(&date.and_time(chrono::NaiveTime::MIN))
}

fn month_start(year: i32, month: u32) -> Option<DateTime<Utc>> {
    NaiveDate::from_ymd_opt(year, month, 1).map(midnight)
}

/// The period from `from` spanning `months` calendar months.
fn months_from(from: DateTime<Utc>, months: u32) -> Option<When> {
    Some(When::Between(from, from.checked_add_months(Months::new(months))?))
}

fn day(date: NaiveDate) -> When {
    When::Between(midnight(date), midnight(date) + Duration::days(1))
}

/// The time `question` asks about, counting back from `now`; `None` when it names none.
/// A date the question names wins over a time counted back, which then counts back from
/// that date instead ("last weekend before April 10, 2023").
pub fn asked(question: &str, now: DateTime<Utc>) -> Option<When> {
    let words: Vec<&str> = question
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | '?' | '!' | ';' | '(' | ')' | '"'))
        .filter(|word| !word.is_empty())
        .collect();
    let lower: Vec<String> = words.iter().map(|word| word.to_lowercase()).collect();
    let question = Words { words, lower };
    match question.named() {
        Some(When::Between(from, to)) => Some(
            question
                .counted_back(from)
                .filter(|_| to - from <= Duration::days(1))
                .unwrap_or(When::Between(from, to)),
        ),
        Some(recurring) => Some(recurring),
        None => question.counted_back(now),
    }
}

/// A question's words, as written and in lower case.
struct Words<'a> {
    words: Vec<&'a str>,
    lower: Vec<String>,
}

/// A date as a question writes it: a month, and a day and a year when given.
struct Written {
    month: u32,
    day: Option<u32>,
    year: Option<i32>,
    /// The index of the word after it.
    next: usize,
}

/// Seasons by their months (meteorological, northern hemisphere): the first and last.
const SEASONS: [(&str, u32, u32); 5] = [
    ("spring", 3, 5),
    ("summer", 6, 8),
    ("autumn", 9, 11),
    ("fall", 9, 11),
    ("winter", 12, 2),
];

impl Words<'_> {
    fn at(&self, index: usize) -> &str {
        self.words.get(index).copied().unwrap_or("")
    }

    fn previous(&self, index: usize) -> Option<&str> {
        index.checked_sub(1).map(|before| self.lower[before].as_str())
    }

    /// The date written around the month name at `index`: "May 3, 2023", "3rd of May",
    /// "May 2023", "May".
    fn written(&self, index: usize) -> Option<Written> {
        let month = month_of(self.words[index])?;
        let day_after = day_of(self.at(index + 1));
        let day_before = index
            .checked_sub(1)
            .and_then(|before| day_of(self.words[before]))
            .or_else(|| {
                (self.previous(index) == Some("of"))
                    .then(|| index.checked_sub(2).and_then(|before| day_of(self.words[before])))
                    .flatten()
            });
        let year_at = if day_after.is_some() { index + 2 } else { index + 1 };
        let year = year_of(self.at(year_at));
        Some(Written {
            month,
            day: day_after.or(day_before),
            year,
            next: year_at + usize::from(year.is_some()),
        })
    }

    /// A time the question names by the calendar: a date, a month, a range of dates, a
    /// year, a season.
    fn named(&self) -> Option<When> {
        for index in 0..self.words.len() {
            if let Some(written) = self.written(index) {
                // "between August 11 and August 15, 2023": one period, the year of the last.
                let joined = matches!(
                    self.lower.get(written.next).map(String::as_str),
                    Some("and" | "to" | "until")
                ) && matches!(self.previous(index), Some("between" | "from"));
                if joined
                    && let Some(last) = self.written(written.next + 1)
                    && let (Some(year), Some(first_day), Some(last_day)) =
                        (written.year.or(last.year), written.day, last.day)
                {
                    let from = NaiveDate::from_ymd_opt(year, written.month, first_day)?;
                    let to = NaiveDate::from_ymd_opt(last.year.unwrap_or(year), last.month, last_day)?;
                    if from <= to {
                        return Some(When::Between(midnight(from), midnight(to) + Duration::days(1)));
                    }
                }
                match (written.day, written.year) {
                    (Some(day), Some(year)) => return day_in(year, written.month, day),
                    (Some(day), None) => {
                        return Some(When::Recurring {
                            month: written.month,
                            day: Some(day),
                        });
                    }
                    (None, Some(year)) => return months_from(month_start(year, written.month)?, 1),
                    // A month alone may be a verb or a name ("May I", "June said",
                    // "Jan's car"): a time only after "in", "during" and the like.
                    (None, None)
                        if self
                            .previous(index)
                            .is_some_and(|word| BEFORE_A_MONTH.contains(&word)) =>
                    {
                        return Some(When::Recurring {
                            month: written.month,
                            day: None,
                        });
                    }
                    (None, None) => {}
                }
            }
            // "in 2023".
            if let Some(year) = year_of(self.words[index])
                && matches!(self.previous(index), Some("in" | "during" | "of" | "since"))
            {
                return months_from(month_start(year, 1)?, 12);
            }
            // "summer 2021", "during the summer", "in the fall".
            if let Some(&(_, first, last)) = SEASONS.iter().find(|(name, ..)| *name == self.lower[index]) {
                if let Some(year) = year_of(self.at(index + 1)) {
                    return season_of(year, first, last);
                }
                // "in the summer", "during summer", "this winter"; "the spring" alone may
                // be water, "the fall" a tumble.
                let the = self.previous(index) == Some("the");
                let lead = if the {
                    index.checked_sub(2)
                } else {
                    index.checked_sub(1)
                };
                if matches!(
                    lead.map(|at| self.lower[at].as_str()),
                    Some("in" | "during" | "over" | "through" | "this")
                ) {
                    return Some(When::Season { first, last });
                }
            }
        }
        None
    }

    /// A time the question counts back from `now`: "yesterday", "last week", "last
    /// May", "last summer", "three days ago".
    fn counted_back(&self, now: DateTime<Utc>) -> Option<When> {
        let today = now.date_naive();
        for index in 0..self.words.len() {
            match self.lower[index].as_str() {
                "yesterday" => return Some(day(today - Duration::days(1))),
                "today" | "tonight" => return Some(day(today)),
                "last" | "this" | "past" => {
                    let last = self.lower[index] != "this";
                    let back = |days: i64| midnight(today) - Duration::days(days);
                    let next = self.lower.get(index + 1).map(String::as_str).unwrap_or("");
                    let period = match next {
                        "week" if last => When::Between(back(7), midnight(today)),
                        "week" => When::Between(back(i64::from(today.weekday().num_days_from_monday())), now),
                        "weekend" => {
                            let since_saturday = (i64::from(today.weekday().num_days_from_monday()) + 2) % 7;
                            let saturday = back(if since_saturday == 0 { 7 } else { since_saturday });
                            When::Between(saturday, saturday + Duration::days(2))
                        }
                        "month" if last => {
                            let this_month = month_start(today.year(), today.month())?;
                            When::Between(this_month.checked_sub_months(Months::new(1))?, this_month)
                        }
                        "month" => When::Between(month_start(today.year(), today.month())?, now),
                        "year" if last => {
                            When::Between(month_start(today.year() - 1, 1)?, month_start(today.year(), 1)?)
                        }
                        "year" => When::Between(month_start(today.year(), 1)?, now),
                        _ if last => {
                            if let Some(month) = month_of(self.at(index + 1)) {
                                let year = if month < today.month() {
                                    today.year()
                                } else {
                                    today.year() - 1
                                };
                                return months_from(month_start(year, month)?, 1);
                            }
                            // "last summer": the latest whole one before today.
                            let Some(&(_, first, last_month)) =
                                SEASONS.iter().find(|(name, ..)| *name == next)
                            else {
                                continue;
                            };
                            let mut year = today.year();
                            loop {
                                let season = season_of(year, first, last_month)?;
                                if let When::Between(_, end) = season
                                    && end <= midnight(today)
                                {
                                    return Some(season);
                                }
                                year -= 1;
                            }
                        }
                        _ => continue,
                    };
                    return Some(period);
                }
                "ago" => {
                    let count = index
                        .checked_sub(2)
                        .and_then(|before| count_of(self.words[before]));
                    let unit = self
                        .previous(index)
                        .map(|word| word.trim_end_matches('s').to_owned());
                    let (Some(count), Some(unit)) = (count, unit) else {
                        continue;
                    };
                    // The day, week, month or year that many back, with the unit's width.
                    let period = match unit.as_str() {
                        "day" => day(today - Duration::days(i64::from(count))),
                        "week" => {
                            let from =
                                midnight(today) - Duration::weeks(i64::from(count)) - Duration::days(3);
                            When::Between(from, from + Duration::days(7))
                        }
                        "month" => {
                            let from = month_start(today.year(), today.month())?
                                .checked_sub_months(Months::new(count))?;
                            months_from(from, 1)?
                        }
                        "year" => {
                            let year = today.year() - i32::try_from(count).ok()?;
                            months_from(month_start(year, 1)?, 12)?
                        }
                        _ => continue,
                    };
                    return Some(period);
                }
                _ => {}
            }
        }
        None
    }
}

/// The season of `year` from month `first` to month `last`: a winter runs from the
/// December of `year` into the next year.
fn season_of(year: i32, first: u32, last: u32) -> Option<When> {
    let from = month_start(year, first)?;
    let to_year = if last < first { year + 1 } else { year };
    let to = month_start(to_year, last)?.checked_add_months(Months::new(1))?;
    Some(When::Between(from, to))
}

fn day_in(year: i32, month: u32, day_of_month: u32) -> Option<When> {
    NaiveDate::from_ymd_opt(year, month, day_of_month).map(day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        // A Wednesday.
        Utc.with_ymd_and_hms(2026, 12, 9, 15, 0, 0)
            .single()
            .expect("a time")
    }

    fn date(year: i32, month: u32, day: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(year, month, day, 0, 0, 0)
            .single()
            .expect("a date")
    }

    #[test]
    fn dates_with_their_year_are_their_day_or_month() {
        let asked = |question: &str| asked(question, now());
        assert_eq!(
            asked("Who did Maria have dinner with on May 3, 2023?"),
            Some(When::Between(date(2023, 5, 3), date(2023, 5, 4)))
        );
        assert_eq!(
            asked("What did Gina find for her store on 1 February, 2023?"),
            Some(When::Between(date(2023, 2, 1), date(2023, 2, 2)))
        );
        assert_eq!(
            asked("What was the pet John said goodbye to on 3rd of June 2023?"),
            Some(When::Between(date(2023, 6, 3), date(2023, 6, 4)))
        );
        assert_eq!(
            asked("What setback did Melanie face in October 2023?"),
            Some(When::Between(date(2023, 10, 1), date(2023, 11, 1)))
        );
        assert_eq!(
            asked("How many times has Melanie gone to the beach in 2023?"),
            Some(When::Between(date(2023, 1, 1), date(2024, 1, 1)))
        );
        assert_eq!(
            asked("What did I say on Dec. 24th, 2025?"),
            Some(When::Between(date(2025, 12, 24), date(2025, 12, 25)))
        );
    }

    #[test]
    fn a_month_without_its_year_is_that_month_of_any_year() {
        let june = asked("When did Melanie go camping in June?", now()).expect("a time");
        assert_eq!(june, When::Recurring { month: 6, day: None });
        assert!(june.holds(date(2023, 6, 30)) && june.holds(date(2019, 6, 1)));
        assert!(!june.holds(date(2023, 7, 1)));
        assert_eq!(
            asked("What did I do on July 4?", now()),
            Some(When::Recurring {
                month: 7,
                day: Some(4)
            })
        );
    }

    #[test]
    fn times_counted_back_from_now() {
        let asked = |question: &str| asked(question, now());
        assert_eq!(
            asked("What did I cook yesterday?"),
            Some(When::Between(date(2026, 12, 8), date(2026, 12, 9)))
        );
        assert_eq!(
            asked("Where did I go last month?"),
            Some(When::Between(date(2026, 11, 1), date(2026, 12, 1)))
        );
        assert_eq!(
            asked("What did I read last year?"),
            Some(When::Between(date(2025, 1, 1), date(2026, 1, 1)))
        );
        assert_eq!(
            asked("Which film did I see last weekend?"),
            Some(When::Between(date(2026, 12, 5), date(2026, 12, 7)))
        );
        assert_eq!(
            asked("What did I buy three days ago?"),
            Some(When::Between(date(2026, 12, 6), date(2026, 12, 7)))
        );
        assert_eq!(
            asked("Where was I two years ago?"),
            Some(When::Between(date(2024, 1, 1), date(2025, 1, 1)))
        );
        // "last May" is the latest May before this month; in December, this year's.
        assert_eq!(
            asked("What did we plan last May?"),
            Some(When::Between(date(2026, 5, 1), date(2026, 6, 1)))
        );
        assert_eq!(
            asked("What did we plan last December?"),
            Some(When::Between(date(2025, 12, 1), date(2026, 1, 1)))
        );
    }

    #[test]
    fn ranges_seasons_and_times_counted_back_from_a_date() {
        let asked = |question: &str| asked(question, now());
        assert_eq!(
            asked("Where was John between August 11 and August 15 2023?"),
            Some(When::Between(date(2023, 8, 11), date(2023, 8, 16)))
        );
        assert_eq!(
            asked("What did Maria take part in last weekend before April 10, 2023?"),
            Some(When::Between(date(2023, 4, 8), date(2023, 4, 10))),
            "the weekend before that Monday"
        );
        assert_eq!(
            asked("What state did Joanna visit in summer 2021?"),
            Some(When::Between(date(2021, 6, 1), date(2021, 9, 1)))
        );
        let summer = asked("When did Caroline go to a pride parade during the summer?").expect("a season");
        assert_eq!(summer, When::Season { first: 6, last: 8 });
        assert!(summer.holds(date(2023, 7, 2)) && !summer.holds(date(2023, 9, 1)));
        let winter = asked("Where did we ski in the winter?").expect("a season");
        assert!(
            winter.holds(date(2023, 12, 20))
                && winter.holds(date(2024, 2, 1))
                && !winter.holds(date(2024, 3, 1))
        );
        assert_eq!(
            asked("What did John and Max enjoy together last summer?"),
            Some(When::Between(date(2026, 6, 1), date(2026, 9, 1)))
        );
        assert_eq!(
            asked("Where did we go last winter?"),
            Some(When::Between(date(2025, 12, 1), date(2026, 3, 1))),
            "the latest whole winter"
        );
        assert_eq!(asked("What are Caroline's plans for the summer?"), None);
        assert_eq!(asked("Did the water come from the spring?"), None);
    }

    #[test]
    fn words_that_are_not_a_time_name_none() {
        let asked = |question: &str| asked(question, now());
        assert_eq!(asked("What does my sister do for a living?"), None);
        assert_eq!(
            asked("may I ask what my plans are?"),
            None,
            "lower-case may is a verb"
        );
        assert_eq!(asked("May I know where Caroline moved from?"), None);
        assert_eq!(asked("Will the march go ahead?"), None);
        assert_eq!(asked("What did June say about the trip?"), None, "a name");
        assert_eq!(asked("Where does Jan keep her bike?"), None, "a name");
        assert_eq!(asked("What did the last guest bring?"), None);
        assert_eq!(asked("How many books did I read in 12 weeks?"), None);
    }
}
