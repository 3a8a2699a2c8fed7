//! `sequenced ready` as a chart author runs it: objects from a file or stdin, one line each,
//! and the exit code 0 (all ready), 1 (some in progress) or 2 (some failed, or bad input).

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn ready(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sequenced"))
        .arg("ready")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sequenced");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("wait for sequenced")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/readiness")
            .join(name),
    )
    .expect("fixture")
}

#[test]
fn stdin_one_object_in_progress_exits_1() {
    let output = ready(
        &["-f", "-"],
        &fixture("deployment-one-of-three-available.yaml"),
    );
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "NAMESPACE  OBJECT          VERDICT     REASON\n\
         shop       Deployment/web  InProgress  1 of 3 replicas available\n"
    );
    assert!(stderr(&output).is_empty(), "{}", stderr(&output));
}

#[test]
fn a_file_of_ready_objects_exits_0() {
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("objects.yaml");
    let text = [
        fixture("deployment-available-recorded.yaml"),
        fixture("job-complete.yaml"),
        fixture("crd-established-recorded.yaml"),
    ]
    .join("---\n");
    std::fs::write(&file, text).unwrap();
    let output = ready(&["--filename", file.to_str().unwrap()], "");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "NAMESPACE  OBJECT                                        VERDICT  REASON\n\
         rec        Deployment/web                                Ready\n\
         shop       Job/migrate                                   Ready\n\
         -          CustomResourceDefinition/gadgets.example.com  Ready\n"
    );
}

#[test]
fn a_list_is_flattened_and_a_failure_exits_2() {
    let list = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: PersistentVolumeClaim
  metadata: {name: data}
  status: {phase: Bound}
- apiVersion: v1
  kind: PersistentVolumeClaim
  metadata: {name: logs}
  status: {phase: Pending}
- apiVersion: v1
  kind: PersistentVolumeClaim
  metadata: {name: old}
  status: {phase: Lost}
"#;
    let output = ready(&["-f", "-"], list);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "OBJECT                      VERDICT     REASON\n\
         PersistentVolumeClaim/data  Ready\n\
         PersistentVolumeClaim/logs  InProgress  phase Pending, not Bound\n\
         PersistentVolumeClaim/old   Failed      phase Lost: its PersistentVolume no longer exists\n"
    );
}

#[test]
fn kubectl_json_lists_are_read() {
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "migrate", "namespace": "shop"},
             "status": {"startTime": "2025-03-01T10:00:00Z", "active": 1}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": "shop"},
             "spec": {"type": "ClusterIP"}},
        ],
        "metadata": {"resourceVersion": ""},
    });
    let output = ready(&["-f", "-"], &serde_json::to_string_pretty(&list).unwrap());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let out = stdout(&output);
    assert!(
        out.contains("shop       Job/migrate  InProgress  running: 0 pods succeeded (1 active)"),
        "{out}"
    );
    assert!(out.contains("shop       Service/db   Ready"), "{out}");
}

#[test]
fn readiness_annotations_are_honoured_and_timeouts_are_not_applied() {
    // Waiting for succeeded==1 with a 1ms timeout: `ready` has not waited, so no timeout.
    let job = r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: barz
  annotations:
    helm.sh/readiness-success: '["succeeded==1"]'
    helm.sh/readiness-failure: '["failed==1"]'
    helm.sh/readiness-timeout: 1ms
status:
  active: 1
"#;
    let output = ready(&["-f", "-"], job);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stdout(&output).contains(
            "Job/barz  InProgress  waiting for succeeded==1 (status.succeeded is missing)"
        ),
        "{}",
        stdout(&output)
    );
    let help = Command::new(env!("CARGO_BIN_EXE_sequenced"))
        .args(["ready", "--help"])
        .output()
        .unwrap();
    assert!(stdout(&help).contains("Timeouts (helm.sh/readiness-timeout) are not applied"));
}

#[test]
fn bad_documents_are_reported_by_index_and_the_rest_still_judged() {
    let text = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
---
apiVersion: v1
metadata: {name: nameless-kind}
---
- just
- a list
---
kind: Job
metadata:
  name: barz
  annotations:
    helm.sh/readiness-success: succeeded=>1
---
kind: List
items:
- kind: Pod
"#;
    let output = ready(&["-f", "-"], text);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        stdout(&output),
        "OBJECT              VERDICT  REASON\nConfigMap/settings  Ready\n"
    );
    assert_eq!(
        stderr(&output),
        "error: document 2: the object has no kind\n\
         error: document 3: a list, not a Kubernetes object\n\
         error: document 4: Job/barz: annotation helm.sh/readiness-success: \"succeeded=>1\": unknown operator \"=>\" (use one of == != < <= > >=)\n\
         error: document 5, List item 1: the Pod has no metadata.name\n"
    );
}

#[test]
fn unreadable_input_is_one_line_and_exits_2() {
    for (args, stdin, message) in [
        (
            vec!["-f", "-"],
            "kind: [unclosed\n",
            "error: stdin: invalid YAML at line",
        ),
        (
            vec!["-f", "-"],
            "",
            "error: stdin: no Kubernetes objects in the input",
        ),
        (
            vec!["-f", "-"],
            "# only a comment\n---\n",
            "error: stdin: no Kubernetes objects",
        ),
        (
            vec!["-f", "does/not/exist.yaml"],
            "",
            "error: cannot read does/not/exist.yaml:",
        ),
    ] {
        let output = ready(&args, stdin);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with(message), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(stdout(&output).is_empty());
    }
}
