//! Helm hooks on the in-process test API server (DESIGN.md "Stages" 2 and 5): pre/post install,
//! upgrade and delete hooks in order, weights, delete policies, a failing Job, a hook Pod,
//! multi-event hook objects, `disableHooks`, and a takeover in the middle of a hook stage. The
//! testkit plays kube-controller-manager's Job controller and the kubelet, writing Job and Pod
//! statuses in the shape recorded from a real cluster (tests/apiserver-recordings).

use sequenced_testkit as support;

use std::future::Future;
use std::time::{Duration, Instant};

use kube::api::{DeleteParams, Patch, PatchParams};
use sequenced::api::v1alpha1::{LayerPhase, ReleasePhase};
use serde_json::{Value, json};
use support::charts::{chart, condition, config_map, deployment, is_ready, is_stalled, release};
use support::operator::{Operator, is_write};
use tempfile::TempDir;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(150), test)
        .await
        .expect("the scenario did not finish in time");
}

/// A Job hook template: `annotations` are lines under `metadata.annotations` (the first
/// indented by the caller's text), `labels` likewise under `metadata.labels`.
fn job(name: &str, annotations: &str, labels: &str) -> String {
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\n  labels:\n    app: {name}\n    {labels}\n  annotations:\n    {annotations}\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: main\n          image: busybox:1.36\n          command: [\"sh\", \"-c\", \"true\"]\n"
    )
}

/// [`job`] whose Pod runs as ServiceAccount `account` (ServiceAccount admission refuses the
/// Pod while it does not exist, and the Job never starts).
fn job_as(name: &str, annotations: &str, account: &str) -> String {
    job(name, annotations, "").replace(
        "      restartPolicy: Never\n",
        &format!("      restartPolicy: Never\n      serviceAccountName: {account}\n"),
    )
}

fn path(dir: &TempDir, name: &str) -> std::path::PathBuf {
    dir.path().join(name)
}

/// The names of the release's `status.layers`, in order.
fn stages(sr: &sequenced::api::SequencedRelease) -> Vec<String> {
    sr.status
        .as_ref()
        .map(|s| s.layers.iter().map(|l| l.name.clone()).collect())
        .unwrap_or_default()
}

/// The (verb, name) of every write of `kind` in namespace default, in order.
fn writes_of(op: &Operator, kind: &str) -> Vec<(String, String)> {
    op.writes(kind)
        .into_iter()
        .map(|(verb, at)| (verb, at.trim_start_matches("default/").to_string()))
        .collect()
}

/// When the first successful request of `verb` on `kind` `name` arrived.
fn first(op: &Operator, verb: &str, kind: &str, name: &str) -> Option<Instant> {
    op.server
        .requests()
        .iter()
        .find(|r| {
            is_write(r)
                && r.verb == verb
                && r.kind.as_deref() == Some(kind)
                && r.name.as_deref() == Some(name)
                && r.status < 300
        })
        .map(|r| r.at)
}

fn uid(object: &Value) -> String {
    object["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_install_job_completes_before_the_first_layer_and_post_install_follows_the_last() {
    within(async {
        let op = Operator::start(4).await;
        let dir = chart(
            "shop",
            &[
                ("templates/migrate.yaml", &job("migrate", "helm.sh/hook: pre-install", "")),
                ("templates/config.yaml", &config_map("config", "helm.sh/layer: config")),
                (
                    "templates/app.yaml",
                    &deployment("app", "helm.sh/layer: app\n    helm.sh/depends-on/layers: config"),
                ),
                ("templates/notify.yaml", &job("notify", "helm.sh/hook: post-install", "")),
            ],
        );
        op.create("default", release("shop", &path(&dir, "shop"), json!({}))).await;
        let migrate = op.wait_object("batch/v1", "Job", "default", "migrate").await;
        let annotations = &migrate["metadata"]["annotations"];
        assert_eq!(annotations["sequenced.dev/owner"], "default/shop");
        assert!(
            annotations["sequenced.dev/hook-run"].as_str().unwrap().ends_with("/1/pre-install"),
            "{annotations}"
        );
        // While the Job runs, nothing of the layers is applied; the status names the hook.
        assert!(op.job_running("default", "migrate"));
        let sr = op
            .wait_release("default", "shop", "the running hook named", |sr| {
                support::charts::message(sr).contains("waiting for Job migrate: running")
            })
            .await;
        assert_eq!(stages(&sr), ["(pre-install)", "config", "app", "(post-install)"]);
        assert_eq!(
            support::charts::message(&sr),
            "pre-install hooks: hook 1 of 1: waiting for Job migrate: running: 0 of 1 completions succeeded (1 active)"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "config").is_none());

        let done = Instant::now();
        assert!(op.job_succeeded("default", "migrate"));
        op.wait_object("v1", "ConfigMap", "default", "config").await;
        assert!(first(&op, "apply", "ConfigMap", "config").unwrap() > done);
        op.wait_object("apps/v1", "Deployment", "default", "app").await;
        // The post-install hook waits for the last layer.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(op.server.object("batch/v1", "Job", Some("default"), "notify").is_none());
        let ready = Instant::now();
        assert!(op.deployment_ready("default", "app"));
        op.wait_object("batch/v1", "Job", "default", "notify").await;
        assert!(first(&op, "apply", "Job", "notify").unwrap() > ready);
        assert!(op.job_succeeded("default", "notify"));
        let sr = op.wait_release("default", "shop", "Ready", is_ready).await;
        let status = sr.status.as_ref().unwrap();
        assert!(status.layers.iter().all(|l| l.phase == LayerPhase::Ready), "{status:?}");
        assert_eq!(status.layers[0].ready, 1);
        let note = op.wait_event("default", "shop", "HookSucceeded").await;
        assert!(note.contains("Job/migrate (chart shop, templates/migrate.yaml)"), "{note}");
        op.wait_event("default", "shop", "HookStarted").await;

        // Uninstall: the layers go, the hook objects stay (no delete policy removes them).
        op.releases("default").delete("shop", &DeleteParams::default()).await.unwrap();
        op.server
            .wait_until(Duration::from_secs(30), |s| {
                s.object("v1", "ConfigMap", Some("default"), "config").is_none()
                    && s.object("apps/v1", "Deployment", Some("default"), "app").is_none()
            })
            .await;
        op.wait_deleted("default", "shop").await;
        assert!(op.server.object("batch/v1", "Job", Some("default"), "migrate").is_some());
        assert!(op.server.object("batch/v1", "Job", Some("default"), "notify").is_some());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_delete_policies_and_multi_event_hooks_and_an_upgrade_runs_them_again() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op.job_controller(Duration::from_millis(100));
        let both = "helm.sh/hook: pre-install,pre-upgrade";
        let dir = chart(
            "shop",
            &[
                (
                    "templates/second.yaml",
                    &job(
                        "second",
                        &format!("{both}\n    helm.sh/hook-weight: \"1\"\n    helm.sh/hook-delete-policy: hook-succeeded"),
                        "",
                    ),
                ),
                (
                    "templates/first.yaml",
                    &job("first", &format!("{both}\n    helm.sh/hook-weight: \"-1\""), ""),
                ),
                (
                    "templates/account.yaml",
                    "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: hook-sa\n  annotations:\n    helm.sh/hook: pre-install,post-install\n    helm.sh/hook-weight: \"-5\"\n",
                ),
                ("templates/config.yaml", &config_map("config", "helm.sh/layer: config\n    revision: \"{{ .Values.revision | default 1 }}\"")),
            ],
        );
        op.create("default", release("shop", &path(&dir, "shop"), json!({}))).await;
        let sr = op.wait_release("default", "shop", "Ready", is_ready).await;
        assert_eq!(stages(&sr), ["(pre-install)", "config", "(post-install)"]);
        // One at a time by weight: the ServiceAccount, first, second; the layer after them.
        let at = |kind, name| first(&op, "apply", kind, name).unwrap();
        assert!(at("ServiceAccount", "hook-sa") < at("Job", "first"));
        assert!(at("Job", "first") < at("Job", "second"));
        assert!(at("Job", "second") < at("ConfigMap", "config"));
        // hook-succeeded removed `second`; `first` (before-hook-creation only) stays.
        assert!(op.server.object("batch/v1", "Job", Some("default"), "second").is_none());
        let first_job = op.server.object("batch/v1", "Job", Some("default"), "first").unwrap();
        // The ServiceAccount is a hook of two events: created for each, the first one deleted
        // before the second is created (before-hook-creation).
        assert_eq!(
            writes_of(&op, "ServiceAccount"),
            [
                ("apply".to_string(), "hook-sa".to_string()),
                ("delete".to_string(), "hook-sa".to_string()),
                ("apply".to_string(), "hook-sa".to_string()),
            ]
        );

        // An upgrade runs the pre-upgrade hooks: `first` is deleted and created again.
        let patch = json!({"spec": {"values": {"revision": 2}}});
        op.releases("default")
            .patch("shop", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let sr = op
            .wait_release("default", "shop", "revision 2 Ready", |sr| {
                is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(2)
            })
            .await;
        assert_eq!(stages(&sr), ["(pre-upgrade)", "config"]);
        let again = op.server.object("batch/v1", "Job", Some("default"), "first").unwrap();
        assert_ne!(uid(&again), uid(&first_job), "first was created again");
        assert!(again["metadata"]["annotations"]["sequenced.dev/hook-run"]
            .as_str()
            .unwrap()
            .ends_with("/2/pre-upgrade"));
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_hook_job_fails_the_release_naming_it_and_nothing_is_applied() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op.job_controller(Duration::from_millis(100));
        let dir = chart(
            "broken",
            &[
                (
                    "templates/job.yaml",
                    &job(
                        "x-admission-create",
                        "helm.sh/hook: pre-install\n    helm.sh/hook-delete-policy: hook-failed",
                        "sequenced.test/outcome: fail",
                    ),
                ),
                ("templates/config.yaml", &config_map("config", "helm.sh/layer: config")),
            ],
        );
        op.create("default", release("broken", &path(&dir, "broken"), json!({}))).await;
        let sr = op.wait_release("default", "broken", "Stalled", is_stalled).await;
        let (_, reason, text) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "HookFailed");
        assert_eq!(
            text,
            "pre-install hook Job/x-admission-create (chart broken, templates/job.yaml) failed: Job x-admission-create: failed (BackoffLimitExceeded: Job has reached the specified backoff limit)"
        );
        let status = sr.status.as_ref().unwrap();
        assert_eq!(status.phase, Some(ReleasePhase::Failed));
        assert_eq!(status.layers[0].phase, LayerPhase::Failed);
        assert_eq!(status.layers[1].phase, LayerPhase::Pending);
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "config").is_none());
        op.wait_event("default", "broken", "HookFailed").await;
        // hook-failed: the failed Job is deleted.
        op.server
            .wait_until(Duration::from_secs(10), |s| {
                s.object("batch/v1", "Job", Some("default"), "x-admission-create").is_none()
            })
            .await;
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_pod_must_succeed_and_disable_hooks_skips_every_hook() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op.job_controller(Duration::from_millis(100));
        let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: check\n  annotations:\n    helm.sh/hook: pre-install\nspec:\n  restartPolicy: Never\n  containers:\n    - name: check\n      image: busybox:1.36\n";
        let dir = chart(
            "podded",
            &[
                ("templates/pod.yaml", pod),
                ("templates/config.yaml", &config_map("config", "helm.sh/layer: config")),
            ],
        );
        op.create("default", release("podded", &path(&dir, "podded"), json!({}))).await;
        let sr = op.wait_release("default", "podded", "Ready", is_ready).await;
        assert_eq!(stages(&sr), ["(pre-install)", "config"]);
        let check = op.server.object("v1", "Pod", Some("default"), "check").unwrap();
        assert_eq!(check["status"]["phase"], "Succeeded");
        assert!(first(&op, "apply", "Pod", "check").unwrap() < first(&op, "apply", "ConfigMap", "config").unwrap());

        op.namespace("quiet").await;
        op.create(
            "quiet",
            release("podded", &path(&dir, "podded"), json!({"disableHooks": true})),
        )
        .await;
        let sr = op.wait_release("quiet", "podded", "Ready", is_ready).await;
        assert_eq!(stages(&sr), ["config"]);
        assert!(op.server.object("v1", "Pod", Some("quiet"), "check").is_none());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_runs_pre_delete_hooks_then_the_layers_then_post_delete_hooks() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op.job_controller(Duration::from_millis(100));
        let dir = chart(
            "shop",
            &[
                (
                    "templates/backup.yaml",
                    &job("backup", "helm.sh/hook: pre-delete", ""),
                ),
                (
                    "templates/cleanup.yaml",
                    &job("cleanup", "helm.sh/hook: post-delete", ""),
                ),
                (
                    "templates/config.yaml",
                    &config_map("config", "helm.sh/layer: config"),
                ),
            ],
        );
        op.create("default", release("shop", &path(&dir, "shop"), json!({})))
            .await;
        let sr = op.wait_release("default", "shop", "Ready", is_ready).await;
        assert_eq!(stages(&sr), ["config"], "no delete hook runs on install");
        assert!(
            op.server
                .object("batch/v1", "Job", Some("default"), "backup")
                .is_none()
        );

        op.releases("default")
            .delete("shop", &DeleteParams::default())
            .await
            .unwrap();
        op.wait_deleted("default", "shop").await;
        let backup = first(&op, "apply", "Job", "backup").expect("backup ran");
        let deleted = first(&op, "delete", "ConfigMap", "config").expect("config deleted");
        let cleanup = first(&op, "apply", "Job", "cleanup").expect("cleanup ran");
        assert!(backup < deleted && deleted < cleanup);
        // The hooks stay, as Helm leaves them.
        assert!(
            op.server
                .object("batch/v1", "Job", Some("default"), "backup")
                .is_some()
        );
        assert!(
            op.server
                .object("batch/v1", "Job", Some("default"), "cleanup")
                .is_some()
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_in_a_hook_stage_is_taken_over_without_creating_the_hook_again() {
    within(async {
        let op = Operator::without_controller().await;
        let dir = chart(
            "shop",
            &[
                (
                    "templates/migrate.yaml",
                    &job("migrate", "helm.sh/hook: pre-install", ""),
                ),
                (
                    "templates/config.yaml",
                    &config_map("config", "helm.sh/layer: config"),
                ),
            ],
        );
        let a = op.spawn("controller-a", 4);
        op.create(
            "default",
            release("shop", &path(&dir, "shop"), json!({"timeout": "3s"})),
        )
        .await;
        op.wait_object("batch/v1", "Job", "default", "migrate")
            .await;
        op.wait_release("default", "shop", "the hook waited on", |sr| {
            sr.status.as_ref().is_some_and(|s| {
                s.layers
                    .first()
                    .is_some_and(|l| l.phase == LayerPhase::Waiting)
            })
        })
        .await;
        // Killed while the hook runs; the Job succeeds while no controller is alive.
        a.kill().await;
        assert!(op.job_succeeded("default", "migrate"));
        let b = op.spawn("controller-b", 4);
        op.wait_event("default", "shop", "LockTakenOver").await;
        let sr = op.wait_release("default", "shop", "Ready", is_ready).await;
        assert_eq!(sr.status.as_ref().unwrap().revision, Some(1));
        // The Job was created once, by controller-a.
        let applies: Vec<_> = op
            .server
            .requests()
            .into_iter()
            .filter(|r| r.verb == "apply" && r.kind.as_deref() == Some("Job"))
            .collect();
        assert_eq!(applies.len(), 1, "the hook was created again");
        assert!(
            op.server
                .object("v1", "ConfigMap", Some("default"), "config")
                .is_some()
        );
        b.stop().await;
    })
    .await;
}

/// The hooks of a monitoring stack's admission webhook, as popular charts write them: RBAC
/// hooks (cluster-scoped and namespaced) before a certificate Job at pre-install, a patch Job
/// at post-install, all `before-hook-creation,hook-succeeded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_webhook_hooks_with_cluster_scoped_rbac_install_like_helm_install_wait() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op.job_controller(Duration::from_millis(50));
        let policy = "helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded";
        let rbac_hook = |kind: &str, weight: &str, rest: &str| {
            let api = if kind.contains("Role") { "rbac.authorization.k8s.io/v1" } else { "v1" };
            format!(
                "apiVersion: {api}\nkind: {kind}\nmetadata:\n  name: x-admission\n  annotations:\n    helm.sh/hook: pre-install,pre-upgrade,post-install,post-upgrade\n    helm.sh/hook-weight: \"{weight}\"\n    {policy}\n{rest}"
            )
        };
        let binding = |role: &str| {
            format!("roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: {role}\n  name: x-admission\nsubjects:\n  - kind: ServiceAccount\n    name: x-admission\n    namespace: default\n")
        };
        let rules = "rules:\n  - apiGroups: [\"\"]\n    resources: [\"secrets\"]\n    verbs: [\"get\", \"create\"]\n";
        let webhook = "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata:\n  name: x-admission\nwebhooks:\n  - name: x.example.com\n    admissionReviewVersions: [\"v1\"]\n    sideEffects: None\n    clientConfig:\n      service:\n        name: x-operator\n        namespace: default\n";
        let dir = chart(
            "stack",
            &[
                ("templates/admission/sa.yaml", &rbac_hook("ServiceAccount", "-5", "")),
                ("templates/admission/clusterrole.yaml", &rbac_hook("ClusterRole", "-5", rules)),
                (
                    "templates/admission/clusterrolebinding.yaml",
                    &rbac_hook("ClusterRoleBinding", "-5", &binding("ClusterRole")),
                ),
                ("templates/admission/role.yaml", &rbac_hook("Role", "-5", rules)),
                ("templates/admission/rolebinding.yaml", &rbac_hook("RoleBinding", "-5", &binding("Role"))),
                (
                    "templates/admission/create.yaml",
                    &job_as("x-admission-create", &format!("helm.sh/hook: pre-install,pre-upgrade\n    {policy}"), "x-admission"),
                ),
                (
                    "templates/admission/patch.yaml",
                    &job_as("x-admission-patch", &format!("helm.sh/hook: post-install,post-upgrade\n    {policy}"), "x-admission"),
                ),
                ("templates/webhook.yaml", webhook),
                ("templates/operator.yaml", &deployment("x-operator", "app: x")),
            ],
        );
        let _kubelet = op.kubelet();
        op.create("default", release("stack", &path(&dir, "stack"), json!({}))).await;
        let sr = op.wait_release("default", "stack", "Ready", is_ready).await;
        let status = sr.status.as_ref().unwrap();
        assert_eq!(stages(&sr), ["(pre-install)", "(default)", "(post-install)"]);
        assert_eq!(status.layers[0].ready, 6);
        assert_eq!(status.layers[2].ready, 6);
        // The certificate Job ran after its RBAC, before the webhook; the patch Job after it.
        let at = |kind, name| first(&op, "apply", kind, name).unwrap();
        assert!(at("ClusterRoleBinding", "x-admission") < at("Job", "x-admission-create"));
        assert!(at("Job", "x-admission-create") < at("ValidatingWebhookConfiguration", "x-admission"));
        assert!(at("ValidatingWebhookConfiguration", "x-admission") < at("Job", "x-admission-patch"));
        // hook-succeeded removed every hook object; the release's own objects stay.
        for (api, kind, namespace) in [
            ("batch/v1", "Job", Some("default")),
            ("rbac.authorization.k8s.io/v1", "ClusterRole", None),
            ("rbac.authorization.k8s.io/v1", "RoleBinding", Some("default")),
            ("v1", "ServiceAccount", Some("default")),
        ] {
            let name = if kind == "Job" { "x-admission-create" } else { "x-admission" };
            assert!(op.server.object(api, kind, namespace, name).is_none(), "{kind} {name} left");
        }
        assert!(op
            .server
            .object("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", None, "x-admission")
            .is_some());
        // The Jobs' Pods ran as the hook ServiceAccount: none was refused for want of it (the
        // account outlived the Jobs, as with Helm).
        let refused = op
            .server
            .requests()
            .into_iter()
            .filter(|r| r.verb == "create" && r.kind.as_deref() == Some("Pod") && r.status == 403)
            .count();
        assert_eq!(refused, 0);
        // Deleted after the stage's last hook, in reverse order: the Job first, the account last.
        let deletes: Vec<String> = op
            .server
            .requests()
            .into_iter()
            .filter(|r| r.verb == "delete" && r.status < 300)
            .take(6)
            .map(|r| format!("{}/{}", r.kind.unwrap_or_default(), r.name.unwrap_or_default()))
            .collect();
        assert_eq!(
            deletes,
            [
                "Job/x-admission-create",
                "RoleBinding/x-admission",
                "Role/x-admission",
                "ClusterRoleBinding/x-admission",
                "ClusterRole/x-admission",
                "ServiceAccount/x-admission"
            ]
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_hook_job_tells_the_last_lines_of_its_pods_log() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op.job_controller(Duration::from_millis(50));
        let log: String = (1..=30).map(|i| format!("applying migration {i}\n")).collect::<String>()
            + "ERROR: column \"email\" of relation \"users\" already exists\n";
        // What the migration's container prints, as the kubelet keeps it (the Job's template
        // annotation is the test's way to say it).
        let template_log = format!(
            "  template:\n    metadata:\n      annotations:\n        {}: {}\n    spec:\n",
            support::workloads::LOG_ANNOTATION,
            serde_json::to_string(&log).unwrap()
        );
        let migrate = job("migrate", "helm.sh/hook: pre-install", "sequenced.test/outcome: fail")
            .replace("  template:\n    spec:\n", &template_log);
        let dir = chart(
            "shop",
            &[
                ("templates/migrate.yaml", migrate.as_str()),
                ("templates/config.yaml", &config_map("config", "helm.sh/layer: config")),
            ],
        );
        op.create("default", release("shop", &path(&dir, "shop"), json!({}))).await;
        let sr = op.wait_release("default", "shop", "Stalled", is_stalled).await;
        let (_, reason, text) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "HookFailed");
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("pre-install hook Job/migrate (chart shop, templates/migrate.yaml) failed: Job migrate: failed (BackoffLimitExceeded: Job has reached the specified backoff limit)")
        );
        let head = lines.next().unwrap();
        assert!(head.starts_with("last 20 log lines of pod migrate-"), "{head}");
        assert!(head.ends_with(" (container main):"), "{head}");
        let tail: Vec<&str> = lines.collect();
        assert_eq!(tail.len(), 20, "{text}");
        assert_eq!(tail[0], "applying migration 12");
        assert_eq!(tail[19], "ERROR: column \"email\" of relation \"users\" already exists");
        let note = op.wait_event("default", "shop", "HookFailed").await;
        assert!(note.len() <= 1024, "{}", note.len());
        assert!(note.ends_with("ERROR: column \"email\" of relation \"users\" already exists"), "{note}");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_that_takes_over_before_the_clean_up_deletes_each_hook_once() {
    within(async {
        let op = Operator::without_controller().await;
        let policy = "helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded";
        let account = format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: runner\n  annotations:\n    helm.sh/hook: pre-install\n    helm.sh/hook-weight: \"-1\"\n    {policy}\n"
        );
        let dir = chart(
            "shop",
            &[
                ("templates/account.yaml", account.as_str()),
                (
                    "templates/migrate.yaml",
                    &job_as("migrate", &format!("helm.sh/hook: pre-install\n    {policy}"), "runner"),
                ),
                ("templates/config.yaml", &config_map("config", "helm.sh/layer: config")),
            ],
        );
        let a = op.spawn("controller-a", 4);
        op.create("default", release("shop", &path(&dir, "shop"), json!({"timeout": "3s"})))
            .await;
        op.wait_object("batch/v1", "Job", "default", "migrate").await;
        // Killed while the stage's last hook runs; it succeeds while no controller is alive.
        a.kill().await;
        assert!(op.job_succeeded("default", "migrate"));
        let b = op.spawn("controller-b", 4);
        op.wait_event("default", "shop", "LockTakenOver").await;
        op.wait_release("default", "shop", "Ready", is_ready).await;
        // The new holder did the clean-up, once: each hook deleted once, the Job before its
        // account, and neither created again.
        let writes: Vec<String> = op
            .server
            .requests()
            .into_iter()
            .filter(|r| {
                is_write(r)
                    && r.status < 300
                    && matches!(r.kind.as_deref(), Some("Job" | "ServiceAccount"))
                    && r.name.as_deref() != Some("default")
            })
            .map(|r| format!("{} {}/{}", r.verb, r.kind.unwrap_or_default(), r.name.unwrap_or_default()))
            .collect();
        assert_eq!(
            writes,
            ["apply ServiceAccount/runner", "apply Job/migrate", "delete Job/migrate", "delete ServiceAccount/runner"]
        );
        b.stop().await;
    })
    .await;
}
