//! The time an API server did not answer: the spans in which the servers a release uses were
//! away or starting, as the controller's clients saw them (`crate::cluster::Health`), passed in
//! with the observations. They are not counted against `spec.timeout` nor the readiness
//! timeouts: after a control-plane restart the cluster's own controllers need a while before
//! anything becomes ready again, and that is no fault of the release. Pure: the spans are
//! timestamps handed in, and `now` is an argument.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Spans of time, sorted and not overlapping. A span may end after `now`: a server that
/// answers again counts as starting for a while after (`crate::cluster::health::STARTING_FOR`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outages {
    spans: Vec<(Time, Time)>,
}

fn length(from: &Time, to: &Time) -> Duration {
    Duration::try_from(to.0.duration_since(from.0)).unwrap_or(Duration::ZERO)
}

impl Outages {
    /// The spans given, in any order, overlapping or not (an empty or reversed span is left
    /// out).
    pub fn new(spans: impl IntoIterator<Item = (Time, Time)>) -> Outages {
        let mut spans: Vec<(Time, Time)> = spans.into_iter().filter(|(a, b)| a.0 < b.0).collect();
        spans.sort_by_key(|(a, _)| a.0);
        let mut merged: Vec<(Time, Time)> = Vec::with_capacity(spans.len());
        for (from, to) in spans {
            match merged.last_mut() {
                Some((_, end)) if from.0 <= end.0 => {
                    if to.0 > end.0 {
                        *end = to;
                    }
                }
                _ => merged.push((from, to)),
            }
        }
        Outages { spans: merged }
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// How much of the time from `since` to `now` was an outage: what a timeout does not count.
    pub fn during(&self, since: &Time, now: &Time) -> Duration {
        self.spans
            .iter()
            .filter(|(from, to)| to.0 > since.0 && from.0 < now.0)
            .map(|(from, to)| {
                let from = if from.0 > since.0 { from } else { since };
                let to = if to.0 < now.0 { to } else { now };
                length(from, to)
            })
            .sum()
    }

    /// The whole length of the spans that end after `since`, the parts after `now` included:
    /// what a status message tells (it does not change at every look while a server is
    /// starting, only when a new span is seen).
    pub fn since(&self, since: &Time) -> Duration {
        self.spans
            .iter()
            .filter(|(_, to)| to.0 > since.0)
            .map(|(from, to)| length(if from.0 > since.0 { from } else { since }, to))
            .sum()
    }

    /// How long from `since` to `now`, the outages left out; None when `since` is not set.
    pub fn waited(&self, since: Option<&Time>, now: &Time) -> Option<Duration> {
        let since = since?;
        Some(length(since, now).saturating_sub(self.during(since, now)))
    }
}

/// What a status message adds when an operation that started at `since` was paused: `; 40s
/// while the API server did not answer were not counted against spec.timeout and the readiness
/// timeouts`. Empty when nothing was paused.
pub fn told(outages: &Outages, since: Option<&Time>) -> String {
    let Some(since) = since else {
        return String::new();
    };
    let paused = outages.since(since);
    if paused < Duration::from_secs(1) {
        return String::new();
    }
    format!(
        " ({} while the API server did not answer or was starting not counted against spec.timeout and the readiness timeouts)",
        crate::readiness::format_duration(Duration::from_secs(paused.as_secs()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + second).unwrap())
    }

    #[test]
    fn spans_merge_and_only_their_part_within_the_window_counts() {
        let outages = Outages::new([(at(50), at(60)), (at(10), at(30)), (at(25), at(40))]);
        assert_eq!(outages.spans, [(at(10), at(40)), (at(50), at(60))]);
        assert_eq!(outages.during(&at(0), &at(100)), Duration::from_secs(40));
        assert_eq!(outages.during(&at(20), &at(55)), Duration::from_secs(25));
        assert_eq!(outages.during(&at(41), &at(49)), Duration::ZERO);
        assert_eq!(
            outages.waited(Some(&at(0)), &at(100)),
            Some(Duration::from_secs(60))
        );
        assert_eq!(outages.waited(None, &at(100)), None);
        // A span that ends after now counts up to now for a timeout, whole for a message.
        let starting = Outages::new([(at(90), at(110))]);
        assert_eq!(starting.during(&at(0), &at(100)), Duration::from_secs(10));
        assert_eq!(starting.since(&at(0)), Duration::from_secs(20));
        assert_eq!(starting.since(&at(95)), Duration::from_secs(15));
        assert!(told(&starting, Some(&at(0))).starts_with(" (20s while the API server"));
        assert_eq!(told(&Outages::default(), Some(&at(0))), "");
        assert!(Outages::new([(at(5), at(5)), (at(9), at(1))]).is_empty());
    }
}
