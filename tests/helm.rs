//! Running helm: every call has a deadline, after which helm and what it started are killed and
//! the error says which command timed out; values reach helm as files only their owner can read,
//! removed after use. A shell script stands in for helm.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sequenced::chart::source::{ChartCache, ChartReference, SourceError};
use sequenced::helm::{Helm, HelmError, Timeouts};
use sequenced::pipeline::{self, ChartSource, RenderRequest, ValuesFile};
use sequenced::render::RenderError;
use tempfile::TempDir;

fn block_on<T>(work: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(work)
}

/// An executable shell script `dir/helm` with this body.
fn fake_helm(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("helm");
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).expect("write the script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// A helm that never finishes: it writes its process id and that of a child it starts.
fn hanging_helm(dir: &Path) -> PathBuf {
    let d = dir.display();
    fake_helm(
        dir,
        &format!("echo $$ > {d}/helm.pid\nsleep 60 &\necho $! > {d}/child.pid\nwait\n"),
    )
}

/// Whether the process is still running (a zombie waiting for its parent is not).
fn running(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
    }
}

/// Waits until neither the fake helm nor its child runs; panics after 5 s.
fn assert_gone(dir: &Path) {
    let pids: Vec<String> = ["helm.pid", "child.pid"]
        .iter()
        .map(|f| {
            std::fs::read_to_string(dir.join(f))
                .unwrap_or_else(|e| panic!("{f}: {e}"))
                .trim()
                .to_string()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| running(p)) {
        assert!(Instant::now() < deadline, "still running: {pids:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn short(template: u64, pull: u64) -> Timeouts {
    Timeouts {
        template: Duration::from_secs(template),
        pull: Duration::from_secs(pull),
        ..Timeouts::default()
    }
}

#[test]
fn a_hung_helm_is_killed_at_its_deadline_with_what_it_started() {
    let dir = TempDir::new().unwrap();
    let helm = Helm::at(hanging_helm(dir.path()));
    let started = Instant::now();
    let err = block_on(helm.run("helm template", &[], Duration::from_secs(1))).unwrap_err();
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(matches!(err, HelmError::TimedOut { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "helm template timed out after 1s and was stopped"
    );
    assert!(err.is_transient());
    assert_eq!(err.category(), "helm_timeout");
    assert_gone(dir.path());
}

#[test]
fn a_helm_no_one_waits_for_any_more_is_killed() {
    let dir = TempDir::new().unwrap();
    let helm = Helm::at(hanging_helm(dir.path()));
    let abandoned = block_on(async {
        tokio::time::timeout(
            Duration::from_secs(1),
            helm.run("helm pull", &[], Duration::from_secs(60)),
        )
        .await
    });
    assert!(abandoned.is_err(), "the call should still be running");
    assert_gone(dir.path());
}

#[test]
fn the_default_timeouts_can_be_changed() {
    let defaults = Helm::at("helm").timeouts();
    assert_eq!(defaults.template, Duration::from_secs(120));
    assert_eq!(defaults.pull, Duration::from_secs(300));
    let helm = Helm::at("helm").with_timeouts(short(1, 2));
    assert_eq!(helm.timeouts().template, Duration::from_secs(1));
    assert_eq!(helm.timeouts().pull, Duration::from_secs(2));
}

/// A chart directory `dir/app` with one template.
fn app_chart(dir: &Path) -> PathBuf {
    let root = dir.join("app");
    std::fs::create_dir_all(root.join("templates")).unwrap();
    std::fs::write(
        root.join("Chart.yaml"),
        "apiVersion: v2\nname: app\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        root.join("templates/cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
    )
    .unwrap();
    root
}

fn render(
    helm: &Helm,
    chart: &Path,
    values: Vec<ValuesFile>,
) -> Result<pipeline::Rendered, pipeline::Error> {
    block_on(async {
        let cache = TempDir::new().unwrap();
        let source = ChartSource::Reference(ChartReference::Path(chart.to_path_buf()));
        let resolved =
            pipeline::resolve(helm, &ChartCache::new(cache.path()), &source, None).await?;
        let request = RenderRequest {
            release_name: "r".into(),
            namespace: "default".into(),
            values,
            ..Default::default()
        };
        pipeline::render(helm, &resolved, &request).await
    })
}

#[test]
fn a_render_or_a_pull_that_times_out_is_transient_and_names_the_command() {
    let dir = TempDir::new().unwrap();
    let chart = app_chart(dir.path());
    let helm = Helm::at(hanging_helm(dir.path())).with_timeouts(short(1, 1));
    let err = render(&helm, &chart, Vec::new()).unwrap_err();
    assert!(
        matches!(
            err,
            pipeline::Error::Render(RenderError::Helm {
                source: HelmError::TimedOut { .. },
                ..
            })
        ),
        "{err:?}"
    );
    assert!(err.is_transient(), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "rendering chart {}: helm template timed out after 1s and was stopped",
            chart.display()
        )
    );
    assert_gone(dir.path());

    let cache = TempDir::new().unwrap();
    let source = ChartSource::Reference(ChartReference::Repository {
        url: "http://127.0.0.1:9/charts".into(),
        name: "demo".into(),
        version: Some("^1.0".into()),
    });
    let err = block_on(pipeline::resolve(
        &helm,
        &ChartCache::new(cache.path()),
        &source,
        None,
    ))
    .unwrap_err();
    assert!(
        matches!(
            err,
            pipeline::Error::Source(SourceError::Pull {
                source: HelmError::TimedOut { .. },
                ..
            })
        ),
        "{err:?}"
    );
    assert!(err.is_transient(), "{err}");
    assert_eq!(
        err.to_string(),
        "chart repository http://127.0.0.1:9/charts: helm pull demo --version ^1.0 timed out after 1s and was stopped"
    );
    assert_gone(dir.path());
}

#[test]
fn values_reach_helm_in_order_as_owner_only_files_removed_after_use() {
    let dir = TempDir::new().unwrap();
    let chart = app_chart(dir.path());
    let record = dir.path().join("record");
    // Records each values file's mode and text, then prints what helm template would.
    let helm = Helm::at(fake_helm(
        dir.path(),
        &format!(
            "while [ $# -gt 0 ]; do\n  if [ \"$1\" = --values ]; then\n    \
             echo \"$2 $(stat -c %a \"$2\") $(cat \"$2\")\" >> {record}\n  fi\n  shift\ndone\n\
             printf -- '---\\n# Source: app/templates/cm.yaml\\napiVersion: v1\\nkind: ConfigMap\\nmetadata:\\n  name: x\\n'\n",
            record = record.display()
        ),
    ));
    let values = vec![
        ValuesFile {
            origin: "spec.valuesFrom[0]".into(),
            text: "a: 1".into(),
        },
        ValuesFile {
            origin: "spec.values".into(),
            text: "{\"a\":2}".into(),
        },
    ];
    let rendered = render(&helm, &chart, values).expect("render");
    assert_eq!(rendered.documents.resources.len(), 1);
    let recorded = std::fs::read_to_string(&record).expect("helm saw values files");
    let lines: Vec<Vec<&str>> = recorded
        .lines()
        .map(|l| l.splitn(3, ' ').collect())
        .collect();
    assert_eq!(lines.len(), 2, "{recorded}");
    assert_eq!((lines[0][1], lines[0][2]), ("600", "a: 1"));
    assert_eq!((lines[1][1], lines[1][2]), ("600", "{\"a\":2}"));
    for line in &lines {
        assert!(!Path::new(line[0]).exists(), "{} was left behind", line[0]);
    }
}

#[test]
fn a_values_text_helm_cannot_use_is_named_by_its_origin() {
    let dir = TempDir::new().unwrap();
    let chart = app_chart(dir.path());
    // Helm is never run.
    let helm = Helm::at(dir.path().join("no-helm-needed"));
    let origin = "spec.valuesFrom[1] (ConfigMap apps/shop key values.yaml)";
    for (text, expected) in [
        ("image: {tag: [\n", "invalid YAML at line"),
        (
            "a: 1\n---\n- b\n",
            "document 2 is a list, but values must be a mapping of keys to values",
        ),
    ] {
        let err = render(
            &helm,
            &chart,
            vec![ValuesFile {
                origin: origin.into(),
                text: text.into(),
            }],
        )
        .unwrap_err();
        let message = err.to_string();
        assert!(message.starts_with(&format!("{origin}: ")), "{message}");
        assert!(message.contains(expected), "{message}");
        assert!(!err.is_transient());
        assert_eq!(err.reason(), sequenced::api::Reason::InvalidSpec);
    }
}
