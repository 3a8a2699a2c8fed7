//! What a record Secret's metadata says about a revision, read without decoding the release:
//! its revision and Helm status (the `version` and `status` labels Helm's Secret driver sets,
//! Helm 3's and Helm 4's alike) and who wrote it (sequenced's annotations). This is what both
//! drivers of sequenced (the operator and the command line) gather about every record under a
//! release name before [`crate::rollout::takeover`] decides whose the name is.
//!
//! Also how long a record has stayed unchanged, as this process has seen it: timed on the local
//! monotonic clock from the first sighting of its resourceVersion, exactly as a Lease's expiry is
//! judged (`crate::lock`), so that no clock of another machine (Helm's `last_deployed` was written
//! by the client that ran helm) is ever compared with ours. Pure: the time comes in as an argument.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::HelmStatus;
use crate::api::{DRIVER_ANNOTATION, DRIVER_CLI, DRIVER_HELM, OWNER_ANNOTATION};

/// Who wrote a release record's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// The operator, for a SequencedRelease.
    Operator,
    /// The command line (`sequenced upgrade`), [`DRIVER_CLI`].
    Cli,
    /// Helm (3 or 4: the same format): a record without sequenced's owner annotation, or one
    /// sequenced took over ([`DRIVER_HELM`]).
    Helm,
}

/// One record under a release name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSummary {
    /// The Secret: `sh.helm.release.v1.NAME.vN`.
    pub name: String,
    pub revision: i64,
    pub status: HelmStatus,
    pub writer: Writer,
    /// The release identity (`namespace/name`) that holds the record: its
    /// [`OWNER_ANNOTATION`]. The operator writes its SequencedRelease's, the command line
    /// `namespace/<release name>`; None for a record of Helm's nobody took over.
    pub owner: Option<String>,
    /// The Secret's resourceVersion: a record rewritten (its status changed) has a new one.
    pub resource_version: String,
}

impl RecordSummary {
    /// The summary of the record Secret `name` with these labels, annotations and
    /// resourceVersion; None when it names no revision (neither a `version` label nor a
    /// `.vN` suffix), which no Helm reads either.
    pub fn of(
        name: &str,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
        resource_version: &str,
    ) -> Option<RecordSummary> {
        let revision = labels
            .get("version")
            .and_then(|v| v.parse::<i64>().ok())
            .or_else(|| name.rsplit_once(".v")?.1.parse::<i64>().ok())?;
        let owner = annotations.get(OWNER_ANNOTATION).cloned();
        let writer = match (
            &owner,
            annotations.get(DRIVER_ANNOTATION).map(String::as_str),
        ) {
            (None, _) | (Some(_), Some(DRIVER_HELM)) => Writer::Helm,
            (Some(_), Some(DRIVER_CLI)) => Writer::Cli,
            (Some(_), _) => Writer::Operator,
        };
        Some(RecordSummary {
            name: name.to_string(),
            revision,
            status: labels
                .get("status")
                .map_or(HelmStatus::Unknown, |s| HelmStatus::parse(s)),
            writer,
            owner,
            resource_version: resource_version.to_string(),
        })
    }

    /// Whether `owner` (`namespace/name`) wrote it (not merely took it over from Helm).
    pub fn written_by(&self, owner: &str) -> bool {
        self.writer != Writer::Helm && self.owner.as_deref() == Some(owner)
    }
}

/// When each record was first seen at its resourceVersion, by this process.
#[derive(Debug, Default, Clone)]
pub struct Sightings {
    seen: HashMap<String, (String, Instant)>,
}

impl Sightings {
    /// Notes `record` as seen at `now`; returns how long it has been unchanged since it was
    /// first seen at this resourceVersion (zero the first time, and after every change).
    pub fn saw(&mut self, record: &RecordSummary, now: Instant) -> Duration {
        let entry = self
            .seen
            .entry(record.name.clone())
            .or_insert_with(|| (record.resource_version.clone(), now));
        if entry.0 != record.resource_version {
            *entry = (record.resource_version.clone(), now);
        }
        now.saturating_duration_since(entry.1)
    }

    /// Forgets every record but these (the ones listed last), so that the sightings of a
    /// release stay as many as its records.
    pub fn keep_only<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        let keep: std::collections::HashSet<&str> = names.into_iter().collect();
        self.seen.retain(|name, _| keep.contains(name.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn summaries_read_helms_labels_and_sequenceds_marks() {
        let helm = RecordSummary::of(
            "sh.helm.release.v1.shop.v3",
            &map(&[
                ("owner", "helm"),
                ("status", "pending-upgrade"),
                ("version", "3"),
            ]),
            &BTreeMap::new(),
            "17",
        )
        .unwrap();
        assert_eq!(helm.revision, 3);
        assert_eq!(helm.status, HelmStatus::PendingUpgrade);
        assert_eq!((helm.writer, helm.owner.as_deref()), (Writer::Helm, None));
        let cli = RecordSummary::of(
            "sh.helm.release.v1.shop.v4",
            &map(&[("status", "deployed")]),
            &map(&[
                (OWNER_ANNOTATION, "apps/shop"),
                (DRIVER_ANNOTATION, DRIVER_CLI),
            ]),
            "18",
        )
        .unwrap();
        // Without a version label, the name's suffix numbers it.
        assert_eq!(cli.revision, 4);
        assert!(cli.written_by("apps/shop"));
        assert_eq!(cli.writer, Writer::Cli);
        // Taken over from Helm: held by a release, written by Helm.
        let taken = RecordSummary::of(
            "sh.helm.release.v1.shop.v2",
            &map(&[("version", "2"), ("status", "superseded")]),
            &map(&[
                (OWNER_ANNOTATION, "apps/shop"),
                (DRIVER_ANNOTATION, DRIVER_HELM),
            ]),
            "9",
        )
        .unwrap();
        assert_eq!(taken.writer, Writer::Helm);
        assert_eq!(taken.owner.as_deref(), Some("apps/shop"));
        assert!(!taken.written_by("apps/shop"));
        assert!(RecordSummary::of("garbage", &BTreeMap::new(), &BTreeMap::new(), "1").is_none());
        let odd = RecordSummary::of("x.v1", &map(&[("status", "gone")]), &BTreeMap::new(), "");
        assert_eq!(odd.unwrap().status, HelmStatus::Unknown);
    }

    #[test]
    fn a_record_is_unchanged_from_the_first_sighting_of_its_resource_version() {
        let t0 = Instant::now();
        let mut record = RecordSummary::of(
            "sh.helm.release.v1.shop.v2",
            &map(&[("version", "2"), ("status", "pending-upgrade")]),
            &BTreeMap::new(),
            "5",
        )
        .unwrap();
        let mut sightings = Sightings::default();
        assert_eq!(sightings.saw(&record, t0), Duration::ZERO);
        let later = t0 + Duration::from_secs(90);
        assert_eq!(sightings.saw(&record, later), Duration::from_secs(90));
        record.resource_version = "6".into();
        assert_eq!(sightings.saw(&record, later), Duration::ZERO);
        assert_eq!(
            sightings.saw(&record, later + Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        sightings.keep_only([]);
        assert_eq!(
            sightings.saw(&record, later + Duration::from_secs(9)),
            Duration::ZERO
        );
    }
}
