//! The time a question asks about, from the words that say it: "in June", "on May 3,
//! 2023", "in October 2023", "in 2022", "last week", "yesterday", "three days ago".
//!
//! A date with its year, a year, and a time counted back from now are periods
//! ([`When::Between`]); a month or a day without its year is that month or day of any
//! year ([`When::Recurring`]), since the question does not say which. Recall prefers the
//! memories whose event time falls in it (see `cairn_app::Settings::time_boost`); a
//! question that names no time, or only words that are not a time ("may" and "march"
//! in lower case, a month alone outside "in June" and the like, which may be a name),
//! has none.

use chrono::{DateTime, Datelike, Duration, Months, NaiveDate, TimeZone, Utc};

/// The time a question asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// From `.0` (included) to `.1` (excluded).
    Between(DateTime<Utc>, DateTime<Utc>),
    /// A month (1–12), and a day of it when given, of any year.
    Recurring { month: u32, day: Option<u32> },
}

impl When {
    /// Whether `at` falls in it.
    pub fn holds(&self, at: DateTime<Utc>) -> bool {
        match *self {
            When::Between(from, to) => from <= at && at < to,
            When::Recurring { month, day } => at.month() == month && day.is_none_or(|day| at.day() == day),
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
pub fn asked(question: &str, now: DateTime<Utc>) -> Option<When> {
    let words: Vec<&str> = question
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | '?' | '!' | ';' | '(' | ')' | '"'))
        .filter(|word| !word.is_empty())
        .collect();
    let lower: Vec<String> = words.iter().map(|word| word.to_lowercase()).collect();
    let at = |index: usize| words.get(index).copied().unwrap_or("");
    let today = now.date_naive();
    for index in 0..words.len() {
        // "May 3, 2023", "3rd of May", "May 2023", "last May", "in May".
        if let Some(month) = month_of(words[index]) {
            let previous = index.checked_sub(1).map(|before| lower[before].as_str());
            let day_after = day_of(at(index + 1));
            let day_before = index
                .checked_sub(1)
                .and_then(|before| day_of(words[before]))
                .or_else(|| {
                    (previous == Some("of"))
                        .then(|| index.checked_sub(2).and_then(|before| day_of(words[before])))
                        .flatten()
                });
            let year_at = if day_after.is_some() { index + 2 } else { index + 1 };
            if let Some(day) = day_after.or(day_before) {
                return Some(match year_of(at(year_at)) {
                    Some(year) => day_in(year, month, day)?,
                    None => When::Recurring {
                        month,
                        day: Some(day),
                    },
                });
            }
            if let Some(year) = year_of(at(index + 1)) {
                return months_from(month_start(year, month)?, 1);
            }
            if previous == Some("last") {
                let year = if month < today.month() {
                    today.year()
                } else {
                    today.year() - 1
                };
                return months_from(month_start(year, month)?, 1);
            }
            // A month alone may be a verb or a name ("May I", "June said", "Jan's car"):
            // a time only after "in", "during" and the like.
            if previous.is_some_and(|word| BEFORE_A_MONTH.contains(&word)) {
                return Some(When::Recurring { month, day: None });
            }
        }
        // "in 2023".
        if let Some(year) = year_of(words[index])
            && matches!(
                index.checked_sub(1).map(|before| lower[before].as_str()),
                Some("in" | "during" | "of" | "since")
            )
        {
            return months_from(month_start(year, 1)?, 12);
        }
        match lower[index].as_str() {
            "yesterday" => return Some(day(today - Duration::days(1))),
            "today" | "tonight" => return Some(day(today)),
            "last" | "this" | "past" => {
                let last = lower[index] != "this";
                let back = |days: i64| midnight(today) - Duration::days(days);
                let period = match lower.get(index + 1).map(String::as_str) {
                    Some("week") if last => When::Between(back(7), midnight(today)),
                    Some("week") => {
                        When::Between(back(i64::from(today.weekday().num_days_from_monday())), now)
                    }
                    Some("weekend") => {
                        let since_saturday = (i64::from(today.weekday().num_days_from_monday()) + 2) % 7;
                        let saturday = back(if since_saturday == 0 { 7 } else { since_saturday });
                        When::Between(saturday, saturday + Duration::days(2))
                    }
                    Some("month") if last => {
                        let this_month = month_start(today.year(), today.month())?;
                        When::Between(this_month.checked_sub_months(Months::new(1))?, this_month)
                    }
                    Some("month") => When::Between(month_start(today.year(), today.month())?, now),
                    Some("year") if last => {
                        When::Between(month_start(today.year() - 1, 1)?, month_start(today.year(), 1)?)
                    }
                    Some("year") => When::Between(month_start(today.year(), 1)?, now),
                    _ => continue,
                };
                return Some(period);
            }
            "ago" => {
                let count = index.checked_sub(2).and_then(|before| count_of(words[before]));
                let unit = index
                    .checked_sub(1)
                    .map(|before| lower[before].trim_end_matches('s').to_owned());
                let (Some(count), Some(unit)) = (count, unit) else {
                    continue;
                };
                // The day, week, month or year that many back, with the unit's width.
                let period = match unit.as_str() {
                    "day" => day(today - Duration::days(i64::from(count))),
                    "week" => {
                        let from = midnight(today) - Duration::weeks(i64::from(count)) - Duration::days(3);
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
