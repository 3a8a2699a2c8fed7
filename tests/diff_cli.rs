//! `sequenced diff` as a user runs it: the built binary with a kubeconfig for the test API
//! server, against a release the real controller deployed (and then stopped, so that every
//! request the server records after it is the command's). Each test checks that the command
//! wrote nothing: no create, update, patch or delete but server-side apply dry runs.

use sequenced_testkit as support;

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};
use support::apiserver::TestApiServer;
use support::charts::{chart, is_ready, release};
use support::operator::Operator;
use tempfile::TempDir;

async fn within<F: std::future::Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(120), test)
        .await
        .expect("the test did not finish in time");
}

const DB: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: db\n  annotations:\n    helm.sh/layer: database\ndata:\n  size: \"{{ .Values.size }}\"\n";
const CREDS: &str = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\n  annotations:\n    helm.sh/layer: database\nstringData:\n  password: \"{{ .Values.password }}\"\n";
const QUEUE: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: queue\n  annotations:\n    helm.sh/layer: queue\ndata:\n  a: b\n";
const APP: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n  annotations:\n    helm.sh/layer: app\n    helm.sh/depends-on/layers: \"{{ .Values.appAfter }}\"\ndata:\n  a: b\n";
const OLD: &str = "{{- if .Values.old }}\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: old\n  annotations:\n    helm.sh/layer: app\ndata:\n  a: b\n{{- end }}\n";
const HOOKS: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: migrate\n  annotations:\n    helm.sh/hook: pre-install,pre-upgrade,pre-rollback\n    helm.sh/hook-weight: \"1\"\ndata:\n  a: b\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: prepare\n  annotations:\n    helm.sh/hook: pre-install,pre-upgrade\n    helm.sh/hook-weight: \"-5\"\ndata:\n  a: b\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: announce\n  annotations:\n    helm.sh/hook: post-install,post-upgrade\ndata:\n  a: b\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: smoke\n  annotations:\n    helm.sh/hook: test\ndata:\n  a: b\n";
const VALUES: &str = "size: \"1\"\npassword: s3cret-one\nappAfter: database\nold: false\n";

/// The chart `web`: layers database (a ConfigMap and a Secret), queue, and app after what
/// `appAfter` says; `old` adds a ConfigMap to app; hooks before and after, and a test hook.
fn web_chart() -> TempDir {
    chart(
        "web",
        &[
            ("values.yaml", VALUES),
            ("templates/db.yaml", DB),
            ("templates/creds.yaml", CREDS),
            ("templates/queue.yaml", QUEUE),
            ("templates/app.yaml", APP),
            ("templates/old.yaml", OLD),
            ("templates/hooks.yaml", HOOKS),
        ],
    )
}

/// A test API server, the chart, a kubeconfig whose context namespace is `default`.
struct Setup {
    op: Operator,
    chart: TempDir,
    home: TempDir,
    kubeconfig: PathBuf,
}

impl Setup {
    async fn start() -> Setup {
        let op = Operator::start(2).await;
        let home = TempDir::new().expect("temp dir");
        let kubeconfig = support::kubeconfig(&home, &op.server.url(), "default");
        Setup {
            op,
            chart: web_chart(),
            home,
            kubeconfig,
        }
    }

    fn server(&self) -> &TestApiServer {
        &self.op.server
    }

    /// The release `web` of the chart with `values`, as JSON.
    fn release(&self, values: Value) -> Value {
        let mut sr = release(
            "web",
            &self.chart.path().join("web"),
            json!({"values": values}),
        );
        sr["metadata"]["namespace"] = json!("default");
        sr
    }

    /// A manifest file of the release with `values`.
    fn manifest(&self, values: Value) -> PathBuf {
        let path = self.home.path().join("release.yaml");
        std::fs::write(&path, self.release(values).to_string()).expect("write the manifest");
        path
    }

    /// Deploys release `web` with `values` and waits until revision `revision` is Ready.
    async fn deploy(&self, values: Value, revision: i64) {
        let api = self.op.releases("default");
        if api.get_opt("web").await.unwrap().is_none() {
            self.op.create("default", self.release(values)).await;
        } else {
            self.op.patch_spec("web", json!({"values": values})).await;
        }
        self.op
            .wait_release("default", "web", "Ready at the revision", |sr| {
                is_ready(sr) && sr.status.as_ref().and_then(|s| s.revision) == Some(revision)
            })
            .await;
    }

    /// Stops the controller: from now on every request is the command's.
    async fn stop_controller(&mut self) {
        self.op.take_controller().stop().await;
        self.server().clear_requests();
    }

    async fn diff(&self, args: &[&str]) -> Output {
        let child = tokio::process::Command::from(support::sequenced_command(
            env!("CARGO_BIN_EXE_sequenced"),
            &self.kubeconfig,
        ))
        .current_dir(self.home.path())
        .arg("diff")
        .args(args)
        .kill_on_drop(true)
        .spawn()
        .expect("run sequenced");
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("sequenced did not exit in time")
            .expect("wait for sequenced");
        self.assert_read_only();
        out
    }

    /// Nothing but reads and server-side apply dry runs reached the server.
    fn assert_read_only(&self) {
        for r in self.server().requests() {
            let dry_run_apply = r.method == "PATCH"
                && r.content_type.as_deref() == Some("application/apply-patch+yaml")
                && r.query.split('&').any(|p| p == "dryRun=All");
            assert!(
                r.method == "GET" || dry_run_apply,
                "the command wrote: {} {}?{}",
                r.method,
                r.path,
                r.query
            );
        }
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The lines of `text` that start with a marker (`+ `, `~ `, `- `, `> `) or a stage or layer
/// title, in order: the outline of the output.
fn outline(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| {
            l.starts_with("layer ")
                || l.starts_with('(')
                || ["  + ", "  ~ ", "  - ", "  > ", "  = "]
                    .iter()
                    .any(|m| l.starts_with(m))
        })
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_not_deployed_yet_creates_everything_in_rollout_order() {
    within(async {
        let mut setup = Setup::start().await;
        setup.stop_controller().await;
        let manifest = setup.manifest(json!({}));
        let file = manifest.to_str().unwrap();
        let out = setup.diff(&["-f", file]).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let text = stdout(&out);
        assert_eq!(
            outline(&text),
            [
                "(pre-install) web",
                "  > ConfigMap default/prepare (weight -5)",
                "  > ConfigMap default/migrate (weight 1)",
                "layer web database",
                "  + Secret default/creds",
                "  + ConfigMap default/db",
                "layer web queue",
                "  + ConfigMap default/queue",
                "layer web app",
                "  + ConfigMap default/app",
                "(post-install) web",
                "  > ConfigMap default/announce (weight 0)",
            ],
            "{text}"
        );
        assert!(
            text.starts_with("SequencedRelease default/web: install\n"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "\n4 to create, 0 to change, 0 to delete, 0 unchanged, 3 hooks to run.\n"
            ),
            "{text}"
        );
        // What would be created is what the operator applies: the chart's object with the
        // ownership labels and annotations; a Secret's values are not shown.
        assert!(text.contains("      +  name: db\n"), "{text}");
        assert!(text.contains("      +  size: '1'\n"), "{text}");
        assert!(
            text.contains("      +    app.kubernetes.io/managed-by: sequenced\n"),
            "{text}"
        );
        assert!(
            text.contains("      +  password: (sensitive value, added)\n"),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "{text}");

        // --exit-code: 2, as something would change.
        let out = setup.diff(&["-f", file, "--exit-code"]).await;
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert_eq!(stdout(&out), text);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_values_show_the_managed_fields_that_change_and_secrets_masked() {
    within(async {
        let mut setup = Setup::start().await;
        setup.deploy(json!({}), 1).await;
        // Another manager's field is not sequenced's business: not shown.
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(setup.server().client(), "default");
        api.patch(
            "db",
            &kube::api::PatchParams::apply("someone-else"),
            &kube::api::Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "db", "labels": {"team": "storage"}},
            })),
        )
        .await
        .unwrap();
        setup.stop_controller().await;

        let out = setup
            .diff(&["web", "--set", "size=2", "--set", "password=s3cret-two"])
            .await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let text = stdout(&out);
        assert_eq!(
            outline(&text),
            [
                "(pre-upgrade) web",
                "  > ConfigMap default/prepare (weight -5)",
                "  > ConfigMap default/migrate (weight 1)",
                "layer web database",
                "  ~ Secret default/creds",
                "  ~ ConfigMap default/db",
                "layer web queue",
                "  = 1 unchanged",
                "layer web app",
                "  = 1 unchanged",
                "(post-upgrade) web",
                "  > ConfigMap default/announce (weight 0)",
            ],
            "{text}"
        );
        assert!(
            text.starts_with("SequencedRelease default/web: upgrade from revision 1\n"),
            "{text}"
        );
        assert!(
            text.contains("      -  size: '1'\n      +  size: '2'\n"),
            "{text}"
        );
        assert!(
            text.contains("      -  password: (sensitive value)\n      +  password: (sensitive value, changed)\n"),
            "{text}"
        );
        // Neither side shows a value: not the live object's base64 `data` (the API server
        // keeps `stringData` as `data`), nor the applied one's.
        use base64::Engine;
        let encoded = |v: &str| base64::engine::general_purpose::STANDARD.encode(v);
        let live_secret: k8s_openapi::api::core::v1::Secret =
            kube::Api::namespaced(setup.server().client(), "default")
                .get("creds")
                .await
                .unwrap();
        let live = live_secret.data.unwrap();
        assert_eq!(live["password"].0, b"s3cret-one");
        for hidden in [
            "s3cret",
            &encoded("s3cret-one"),
            &encoded("s3cret-two"),
            "team",
            "storage",
            "resourceVersion",
            "managedFields",
        ] {
            assert!(!text.contains(hidden), "{hidden} in {text}");
        }

        // The same as JSON: the values stay hidden there too.
        let out = setup
            .diff(&["web", "--set", "password=s3cret-two", "-o", "json"])
            .await;
        let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        for hidden in ["s3cret", &encoded("s3cret-one"), &encoded("s3cret-two")] {
            assert!(!stdout(&out).contains(hidden), "{hidden}");
        }
        let creds = &json["stages"][1]["layers"][0]["objects"][0];
        assert_eq!(creds["kind"], "Secret");
        assert_eq!(creds["action"], "change");
        assert!(
            creds["diff"]
                .as_str()
                .unwrap()
                .contains("+  password: (sensitive value, changed)"),
            "{creds}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_to_change_exits_zero_even_with_exit_code() {
    within(async {
        let mut setup = Setup::start().await;
        setup.deploy(json!({"size": "3"}), 1).await;
        setup.stop_controller().await;
        let manifest = setup.manifest(json!({"size": "3"}));
        for args in [
            vec!["web", "--exit-code"],
            vec!["-f", manifest.to_str().unwrap(), "--exit-code"],
        ] {
            let out = setup.diff(&args).await;
            assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
            assert_eq!(
                stdout(&out),
                "SequencedRelease default/web: upgrade from revision 1\nNo changes.\n",
                "{args:?}"
            );
        }
        // The dry runs were made: one per object of the layers, in each of the two runs.
        let dry_runs = setup
            .server()
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH")
            .count();
        assert_eq!(dry_runs, 8);
        let out = setup.diff(&["web", "-o", "json"]).await;
        let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(json["changes"], false);
        assert_eq!(json["newRevision"], false);
        assert_eq!(
            json["summary"],
            json!({"create": 0, "change": 0, "delete": 0, "unchanged": 4, "hooks": 0})
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_that_render_the_same_objects_still_start_a_revision_and_say_so() {
    within(async {
        let mut setup = Setup::start().await;
        setup.deploy(json!({"size": "3"}), 1).await;
        setup.stop_controller().await;
        // A value no template reads: the objects are the same, but the digest is not.
        let manifest = setup.manifest(json!({"size": "3", "unused": true}));
        let out = setup
            .diff(&["-f", manifest.to_str().unwrap(), "--exit-code"])
            .await;
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let text = stdout(&out);
        assert!(
            text.ends_with(
                "\n0 to create, 0 to change, 0 to delete, 4 unchanged, 3 hooks to run.\n\
                 A new revision would start: spec.values changed; no object would change, but its 3 hooks would run.\n"
            ),
            "{text}"
        );
        let out = setup
            .diff(&["-f", manifest.to_str().unwrap(), "-o", "json"])
            .await;
        let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(json["newRevision"], true);
        assert_eq!(json["changes"], true);
        assert_eq!(json["newRevisionReason"], "spec.values changed");
        // Values given on the command line are a new revision too, said so.
        let out = setup.diff(&["web", "--set", "size=9"]).await;
        assert!(
            stdout(&out).ends_with("A new revision would start: values given on the command line.\n"),
            "{}",
            stdout(&out)
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_no_longer_rendered_are_pruned_after_the_layers() {
    within(async {
        let mut setup = Setup::start().await;
        setup.deploy(json!({"old": true}), 1).await;
        setup.stop_controller().await;
        let manifest = setup.manifest(json!({"old": false}));
        let out = setup
            .diff(&["-f", manifest.to_str().unwrap(), "--exit-code"])
            .await;
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let text = stdout(&out);
        let outline = outline(&text);
        let prune = outline
            .iter()
            .position(|l| l == "(prune) web")
            .expect("a prune stage");
        assert_eq!(outline[prune + 1], "  - ConfigMap default/old", "{text}");
        assert_eq!(outline[prune + 2], "(post-upgrade) web", "{text}");
        assert!(
            outline[..prune].iter().any(|l| l == "layer web app"),
            "{text}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_whose_order_changed_are_listed() {
    within(async {
        let mut setup = Setup::start().await;
        setup.deploy(json!({}), 1).await;
        setup.stop_controller().await;
        let out = setup.diff(&["web", "--set", "appAfter=queue"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let text = stdout(&out);
        assert!(
            text.contains(
                "Layers whose order changed:\n  ~ layer web app: level 2 -> 2, after database -> queue\n"
            ),
            "{text}"
        );
        let out = setup
            .diff(&["web", "--set", "appAfter=queue", "-o", "json"])
            .await;
        let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(
            json["layerOrder"],
            json!([{"chart": "web", "name": "app",
                    "before": {"level": 2, "after": ["database"]},
                    "after": {"level": 2, "after": ["queue"]}}])
        );
        assert_eq!(json["changes"], true);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_preview_applies_the_stored_plan_and_prunes_what_came_after() {
    within(async {
        let mut setup = Setup::start().await;
        setup.deploy(json!({"size": "1"}), 1).await;
        setup.deploy(json!({"size": "2", "old": true}), 2).await;
        setup.stop_controller().await;
        let out = setup.diff(&["web", "--revision", "1", "--exit-code"]).await;
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let text = stdout(&out);
        assert_eq!(
            outline(&text),
            [
                "(pre-rollback) web",
                "  > ConfigMap default/migrate (weight 1)",
                "layer web database",
                "  ~ ConfigMap default/db",
                "  = 1 unchanged",
                "layer web queue",
                "  = 1 unchanged",
                "layer web app",
                "  = 1 unchanged",
                "(prune) web",
                "  - ConfigMap default/old",
            ],
            "{text}"
        );
        assert!(
            text.starts_with(
                "SequencedRelease default/web: rollback from revision 2 back to revision 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("      -  size: '2'\n      +  size: '1'\n"),
            "{text}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_exit_one_and_name_what_is_wrong() {
    within(async {
        let mut setup = Setup::start().await;
        setup.deploy(json!({}), 1).await;
        setup.stop_controller().await;
        let cases: Vec<(Vec<String>, String)> = vec![
            (
                vec!["nowhere".into()],
                "error: SequencedRelease default/nowhere not found".into(),
            ),
            (
                vec!["web".into(), "--revision".into(), "9".into()],
                "error: SequencedRelease default/web: there is no revision 9 to roll back to (the latest is 1)".into(),
            ),
            (
                vec!["web".into(), "--set".into(), "appAfter=nothing".into()],
                "error: SequencedRelease default/web: unknown layer \"nothing\" in chart web: templates/app.yaml ConfigMap/app".into(),
            ),
        ];
        for (args, wanted) in cases {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = setup.diff(&args).await;
            assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
            assert!(out.stdout.is_empty(), "{}", stdout(&out));
            assert!(
                stderr(&out).starts_with(&wanted),
                "{args:?}: {}",
                stderr(&out)
            );
        }
        // A chart path that does not exist, in a manifest.
        let mut sr = setup.release(json!({}));
        sr["spec"]["chart"]["path"] = json!("charts/missing");
        let path = setup.home.path().join("missing.yaml");
        std::fs::write(&path, sr.to_string()).unwrap();
        let out = setup.diff(&["-f", path.to_str().unwrap()]).await;
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("spec.chart.path: chart charts/missing"),
            "{}",
            stderr(&out)
        );
        // A command line diff cannot use: 1 too, never the 2 of "changes".
        let out = setup.diff(&["web", "--revision", "1", "--set", "a=b"]).await;
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let out = setup.diff(&[]).await;
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_example_is_shown_layer_by_layer_in_rollout_order() {
    within(async {
        let mut setup = Setup::start().await;
        setup.stop_controller().await;
        let shop = support::charts::repo().join("examples/shop");
        let mut sr = release("shop", &shop, json!({}));
        sr["metadata"]["namespace"] = json!("default");
        let path = setup.home.path().join("shop.yaml");
        std::fs::write(&path, sr.to_string()).unwrap();
        let out = setup
            .diff(&["-f", path.to_str().unwrap(), "-o", "json", "--exit-code"])
            .await;
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let layers: Vec<(String, Vec<String>)> = json["stages"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["layers"].as_array().unwrap().iter())
            .map(|l| {
                let objects = l["objects"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| {
                        format!(
                            "{} {} {}",
                            o["action"].as_str().unwrap(),
                            o["kind"].as_str().unwrap(),
                            o["name"].as_str().unwrap()
                        )
                    })
                    .collect();
                (l["name"].as_str().unwrap().to_string(), objects)
            })
            .collect();
        let names: Vec<&str> = layers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["database", "queue", "app"], "{layers:?}");
        assert!(
            layers.iter().all(|(_, objects)| !objects.is_empty()
                && objects.iter().all(|o| o.starts_with("create "))),
            "{layers:?}"
        );
        assert_eq!(json["operation"], "install");
    })
    .await;
}
