//! Readiness verdicts for objects as real API servers write them: one YAML file per case in
//! `tests/readiness/`, each with its expected verdict in header comments:
//!
//! ```yaml
//! # case: what the case shows
//! # expect: InProgress: Deployment web: 1 of 3 replicas available   (or Ready, or Failed: ...)
//! # waited: 30s            optional: how long it has been waited on (default: not timed)
//! # default-timeout: 5m    optional: the release's readinessTimeout (default 5m)
//! # hook: true             optional: judged as a hook, which must complete
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sequenced::readiness::{self, Rules, Verdict, parse_duration};

struct Fixture {
    path: PathBuf,
    expect: String,
    waited: Option<Duration>,
    default_timeout: Duration,
    hook: bool,
    object: serde_json::Value,
}

fn fixtures() -> Vec<Fixture> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/readiness");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/readiness")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    paths.into_iter().map(|path| read_fixture(&path)).collect()
}

fn read_fixture(path: &Path) -> Fixture {
    let text = std::fs::read_to_string(path).expect("read fixture");
    let header = |key: &str| {
        text.lines()
            .take_while(|line| line.starts_with('#'))
            .find_map(|line| line.strip_prefix(&format!("# {key}: ")))
            .map(str::to_string)
    };
    let name = path.display();
    let duration = |key: &str| {
        header(key).map(|text| parse_duration(&text).unwrap_or_else(|e| panic!("{name}: {e}")))
    };
    Fixture {
        expect: header("expect").unwrap_or_else(|| panic!("{name}: no # expect: line")),
        waited: duration("waited"),
        default_timeout: duration("default-timeout").unwrap_or(Duration::from_secs(300)),
        hook: header("hook").is_some_and(|h| h == "true"),
        object: sequenced::yaml::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}")),
        path: path.to_path_buf(),
    }
}

fn verdict_of(fixture: &Fixture) -> Verdict {
    let name = fixture.path.display();
    let mut rules = Rules::from_object(&fixture.object).unwrap_or_else(|e| panic!("{name}: {e}"));
    if fixture.hook {
        rules = rules.require_completion();
    }
    readiness::check(
        &fixture.object,
        &rules,
        fixture.waited,
        fixture.default_timeout,
    )
}

#[test]
fn every_fixture_gets_its_expected_verdict() {
    let fixtures = fixtures();
    assert!(fixtures.len() > 50, "fixtures missing: {}", fixtures.len());
    let mut wrong = Vec::new();
    for fixture in &fixtures {
        let got = verdict_of(fixture).to_string();
        if got != fixture.expect {
            wrong.push(format!(
                "{}\n  expected: {}\n  got:      {got}",
                fixture
                    .path
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy(),
                fixture.expect
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} fixtures disagree:\n{}",
        wrong.len(),
        fixtures.len(),
        wrong.join("\n")
    );
}

#[test]
fn every_kind_with_a_rule_has_ready_in_progress_and_failed_or_waiting_cases() {
    // kind -> the verdicts its fixtures cover.
    let mut covered: std::collections::BTreeMap<String, BTreeSet<&'static str>> =
        Default::default();
    for fixture in fixtures() {
        let kind = fixture.object["kind"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        covered
            .entry(kind)
            .or_default()
            .insert(verdict_of(&fixture).name());
    }
    let both = ["Ready", "InProgress"];
    let all = ["Ready", "InProgress", "Failed"];
    for (kind, needed) in [
        ("Deployment", &all[..]),
        ("StatefulSet", &both[..]),
        ("DaemonSet", &both[..]),
        ("ReplicaSet", &both[..]),
        ("Job", &all[..]),
        ("Pod", &all[..]),
        ("PersistentVolumeClaim", &all[..]),
        ("Service", &both[..]),
        ("CustomResourceDefinition", &all[..]),
        ("PodDisruptionBudget", &both[..]),
        ("Certificate", &both[..]),
        ("HelmRelease", &["InProgress", "Failed"][..]),
        ("ConfigMap", &both[..]),
    ] {
        let got = covered.get(kind).cloned().unwrap_or_default();
        for verdict in needed {
            assert!(
                got.contains(verdict),
                "no {verdict} fixture for {kind} (has {got:?})"
            );
        }
    }
}

#[test]
fn reasons_never_end_in_punctuation_noise_or_hold_rust_debug_output() {
    for fixture in fixtures() {
        if let Some(reason) = verdict_of(&fixture).reason() {
            let name = fixture.path.display();
            assert!(!reason.contains("Some("), "{name}: {reason}");
            assert!(!reason.contains("\\\""), "{name}: {reason}");
            assert!(!reason.contains("()"), "{name}: {reason}");
            assert!(!reason.ends_with(' '), "{name}: {reason}");
        }
    }
}

#[test]
fn the_time_waited_only_matters_for_objects_in_progress() {
    for fixture in fixtures() {
        let rules = Rules::from_object(&fixture.object).expect("rules");
        let now = readiness::check(&fixture.object, &rules, None, Duration::from_secs(1));
        let late = readiness::check(
            &fixture.object,
            &rules,
            Some(Duration::from_secs(3600 * 24)),
            Duration::from_secs(1),
        );
        match now {
            Verdict::InProgress(reason) => assert_eq!(
                late,
                Verdict::Failed(format!(
                    "readiness timeout after {}: {reason}",
                    readiness::format_duration(rules.effective_timeout(Duration::from_secs(1)))
                )),
                "{}",
                fixture.path.display()
            ),
            other => assert_eq!(late, other, "{}", fixture.path.display()),
        }
    }
}

#[test]
fn the_module_reads_no_clock_and_does_no_io() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/readiness");
    for entry in std::fs::read_dir(&dir).expect("src/readiness") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("source");
        for forbidden in [
            "SystemTime",
            "Instant::",
            "chrono",
            "std::fs",
            "std::net",
            "std::process",
            "tokio",
            "kube::",
            "std::env",
        ] {
            assert!(
                !text.contains(forbidden),
                "{} uses {forbidden}: readiness is pure (time comes in as an argument)",
                path.display()
            );
        }
    }
}
