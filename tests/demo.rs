//! scripts/demo.sh as someone without a cluster runs it, without a terminal (as in CI): forced
//! into its embedded mode (`SEQUENCED_DEMO_CLUSTER=embedded`) with the `sequenced` of this build
//! (`SEQUENCED_DEMO_BIN`), a shorter pace, and no network (`CARGO_NET_OFFLINE`: the script
//! builds its tools, `sequenced-demo`, from what the test build compiled). The assertions are
//! what a user reads in its output, checked against the record of the demo's own watch: the
//! steps ran, shop's layers became ready in order, the failed hook's log was shown, the rollback
//! brought revision 1 back, the uninstall deleted app before database and queue, the timings
//! were printed, and nothing the demo started is left running.

use sequenced_testkit as support;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Runs the demo; its exit status and what it printed on stdout and stderr.
fn run_demo(dir: &Path) -> (std::process::ExitStatus, String, String) {
    let mut command = Command::new(support::charts::repo().join("scripts/demo.sh"));
    // What cargo set for this test (CARGO_MANIFEST_DIR, ...) would make the script's cargo
    // build everything again: some build scripts watch those variables.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_") && key != "CARGO_HOME" && key != "CARGO_TARGET_DIR" {
            command.env_remove(key.as_ref());
        }
    }
    let mut child = command
        .env("SEQUENCED_DEMO_CLUSTER", "embedded")
        .env("SEQUENCED_DEMO_BIN", env!("CARGO_BIN_EXE_sequenced"))
        .env("SEQUENCED_DEMO_DIR", dir)
        .env("SEQUENCED_DEMO_PACE", "0.3")
        .env("SEQUENCED_DEMO_TIMEOUT", "120")
        .env("SEQUENCED_HELM", support::helm())
        .env("CARGO_NET_OFFLINE", "true")
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run scripts/demo.sh");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    // Generous: the script may have to build its tools first, on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the demo") {
            break status;
        }
        if Instant::now() > deadline {
            // SIGTERM: the script's trap stops what it started.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            let status = child.wait().expect("wait for the demo");
            panic!(
                "the demo did not finish within 10 minutes ({status}); it printed:\n{}\n{}",
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    (
        status,
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )
}

/// The part of `text` from the line starting with `from` to the next step heading.
fn section<'a>(text: &'a str, from: &str) -> &'a str {
    let start = text
        .find(&format!("\n==== {from}"))
        .unwrap_or_else(|| panic!("no step {from:?} in:\n{text}"));
    let rest = &text[start + 1..];
    let end = rest[1..].find("\n==== ").map_or(rest.len(), |i| i + 2);
    &rest[..end]
}

/// The lines of the demo's watch record (watch.log) after the mark `label`, up to the next mark.
fn watched(dir: &Path, label: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("watch.log")).expect("the demo's watch.log");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let start = lines
        .iter()
        .position(|l| l["mark"] == label)
        .unwrap_or_else(|| panic!("no mark {label:?} in watch.log"));
    lines[start + 1..]
        .iter()
        .take_while(|l| l.get("mark").is_none())
        .cloned()
        .collect()
}

/// When the watch first saw `event` of `kind/name` in `lines`.
fn first(lines: &[Value], event: &str, kind: &str, name: &str) -> f64 {
    lines
        .iter()
        .find(|l| l["event"] == event && l["kind"] == kind && l["name"] == name)
        .and_then(|l| l["at"].as_f64())
        .unwrap_or_else(|| panic!("the watch never saw {kind}/{name} {event}: {lines:#?}"))
}

/// The processes whose environment has `SEQUENCED_DEMO_DIR=dir`: everything the demo started.
fn demo_processes(dir: &Path) -> Vec<String> {
    let needle = format!("SEQUENCED_DEMO_DIR={}", dir.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
        }
    }
    found
}

#[test]
fn the_demo_deploys_shop_to_the_embedded_server_in_order_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (status, out, err) = run_demo(dir.path());
    assert!(
        status.success(),
        "the demo failed ({status}):\n{out}\n{err}"
    );

    // Every step ran, in this order.
    let steps = [
        "The plan",
        "Install shop",
        "Upgrade shop",
        "Install migrate",
        "Upgrade migrate",
        "Roll migrate back",
        "Uninstall shop",
        "Timings",
        "Cleaning up",
    ];
    let positions: Vec<usize> = steps
        .iter()
        .map(|s| {
            out.find(&format!("\n==== {s}"))
                .unwrap_or_else(|| panic!("no step {s:?} in:\n{out}"))
        })
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{out}");
    assert!(
        out.contains("Deploying to the embedded API server, http://127.0.0.1:"),
        "{out}"
    );

    // The install: shop Ready at revision 1, and the app layer created only once the database
    // and queue layers were ready, as the demo's watch saw it.
    let install = section(&out, "Install shop");
    assert!(install.contains("PHASE        Ready"), "{install}");
    assert!(install.contains("REVISION     1"), "{install}");
    for layer in ["database", "queue", "app"] {
        assert!(
            install
                .lines()
                .any(|l| l.contains(&format!("── {layer}")) && l.ends_with("Ready")),
            "{layer} is not Ready in:\n{install}"
        );
    }
    let watch = watched(dir.path(), "install shop");
    let app_created = first(&watch, "created", "Deployment", "my-app")
        .min(first(&watch, "created", "Service", "my-app"));
    for (kind, name) in [
        ("Deployment", "db"),
        ("Service", "db-service"),
        ("Deployment", "queue-processor"),
        ("ConfigMap", "queue-config"),
    ] {
        assert!(
            first(&watch, "ready", kind, name) <= app_created,
            "app was created before {kind}/{name} was ready: {watch:#?}"
        );
    }

    // The upgrade: revision 2, in the same order.
    let upgrade = section(&out, "Upgrade shop");
    assert!(upgrade.contains("REVISION     2"), "{upgrade}");
    assert!(upgrade.contains("PHASE        Ready"), "{upgrade}");
    let watch = watched(dir.path(), "upgrade shop");
    let app_changed = first(&watch, "changed", "Deployment", "my-app");
    assert!(first(&watch, "ready", "Deployment", "db") <= app_changed);
    assert!(first(&watch, "ready", "Deployment", "queue-processor") <= app_changed);

    // The failed hook: its stage, the end of its Pod's log in the status and in the event.
    let error = "ERROR: column email of relation users already exists";
    let failed = section(&out, "Upgrade migrate");
    assert!(failed.contains("PHASE        Failed"), "{failed}");
    assert!(failed.contains("(pre-upgrade)"), "{failed}");
    assert!(
        failed.contains("last 2 log lines of pod migrate-migrate-"),
        "{failed}"
    );
    let (status, event) = failed
        .split_once("The HookFailed event of migrate:")
        .unwrap_or_else(|| panic!("no HookFailed event shown:\n{failed}"));
    assert!(status.contains(error), "{status}");
    assert!(
        event.contains("HookFailed: pre-upgrade hook Job/migrate-migrate"),
        "{event}"
    );
    assert!(event.contains(error), "{event}");

    // The rollback brought revision 1 back, as revision 3.
    let rollback = section(&out, "Roll migrate back");
    assert!(
        rollback.contains("migrate: Ready at revision 3: rolled back to revision 1"),
        "{rollback}"
    );

    // The uninstall: app's objects gone first, then queue's and database's.
    let uninstall = section(&out, "Uninstall shop");
    let gone: Vec<&str> = uninstall
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("gone +"))
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(gone.first(), Some(&"app"), "{uninstall}");
    let mut rest = gone[1..].to_vec();
    rest.sort_unstable();
    assert_eq!(rest, ["database", "queue"], "{uninstall}");
    let deleted_app = uninstall
        .find("LayerDeleted: Layer app of chart shop is deleted")
        .unwrap_or_else(|| panic!("{uninstall}"));
    for layer in ["database", "queue"] {
        let deleting = uninstall
            .find(&format!(
                "LayerDeleting: Deleting layer {layer} of chart shop"
            ))
            .unwrap_or_else(|| panic!("{uninstall}"));
        assert!(deleted_app < deleting, "{uninstall}");
    }

    // The timings it measured: the hand-off to app, at the install and at the upgrade.
    let timings = section(&out, "Timings");
    for revision in ["shop revision 1 (install)", "shop revision 2 (upgrade)"] {
        let (_, after) = timings
            .split_once(revision)
            .unwrap_or_else(|| panic!("no timings of {revision}:\n{timings}"));
        let app = after
            .lines()
            .find(|l| l.trim_start().starts_with("app "))
            .unwrap_or_else(|| panic!("{timings}"));
        assert!(app.contains("ms after"), "{app}");
    }

    // Nothing left: the namespace deleted, every process it started stopped.
    let cleanup = section(&out, "Cleaning up");
    assert!(
        cleanup.contains("namespace sequenced-demo-") && cleanup.contains(" deleted"),
        "{cleanup}"
    );
    assert!(cleanup.contains("operator stopped"), "{cleanup}");
    assert!(cleanup.contains("embedded API server stopped"), "{cleanup}");
    assert_eq!(demo_processes(dir.path()), Vec::<String>::new());
}
