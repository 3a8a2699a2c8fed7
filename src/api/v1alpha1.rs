//! `sequenced.dev/v1alpha1`: the SequencedRelease spec and status (DESIGN.md, "The SequencedRelease API").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// CEL rule for a duration string as Go and Helm write them (`30s`, `5m`, `1h30m`, `250ms`).
const DURATION_RULE: &str = r"self.matches('^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$')";
/// What the API server answers when [`DURATION_RULE`] fails.
const DURATION_MESSAGE: &str = "must be a duration such as 30s, 5m or 1h30m (units ms, s, m, h)";
/// CEL rule at the root: the effective Helm release name (`spec.releaseName`, else
/// `metadata.name`) fits Helm's limit of 53 characters, refused at admission rather than failing
/// at render time.
const RELEASE_NAME_RULE: &str =
    "size(has(self.spec.releaseName) ? self.spec.releaseName : self.metadata.name) <= 53";
/// What the API server answers when [`RELEASE_NAME_RULE`] fails.
const RELEASE_NAME_MESSAGE: &str = "has(self.spec.releaseName) ? 'spec.releaseName ' + self.spec.releaseName + ' is longer than the 53 characters Helm allows for a release name' : 'the Helm release name defaults to metadata.name, ' + self.metadata.name + ', which is longer than the 53 characters Helm allows: set a shorter spec.releaseName'";

/// A Helm chart deployed in dependency order: its resources are applied layer by layer, each layer
/// only after the layers it depends on are ready.
// Each printcolumn repeats `type_`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "sequenced.dev",
    version = "v1alpha1",
    kind = "SequencedRelease",
    namespaced,
    shortname = "sqr",
    status = "SequencedReleaseStatus",
    derive = "PartialEq",
    doc = "A Helm chart deployed in dependency order, layer by layer, by the sequenced operator.",
    validation = Rule::new(RELEASE_NAME_RULE).message(kube::core::cel::Message::Expression(RELEASE_NAME_MESSAGE.into())),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether every resource of the release is ready"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].message",
        description = "The Ready condition's message: what is ready, or why not"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "What the operator is doing with the release"
    ),
    printcolumn(
        name = "Layer",
        type_ = "string",
        json_path = ".status.progress",
        description = "Ready layers of the current revision out of all of them"
    ),
    printcolumn(
        name = "Revision",
        type_ = "integer",
        json_path = ".status.revision",
        description = "The release revision"
    ),
    printcolumn(
        name = "Locked Till",
        type_ = "string",
        json_path = ".status.lock.lockedUntil",
        description = "Until when the operation in progress holds the release's lock"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Session",
        type_ = "string",
        json_path = ".status.lock.sessionId",
        description = "The session that holds the lock",
        priority = 1
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.message",
        description = "What the release is doing or waiting for",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
pub struct SequencedReleaseSpec {
    /// Where the chart comes from: exactly one of repository (with name), oci, path,
    /// configMapRef or secretRef.
    pub chart: ChartSource,

    /// The Helm release name. Defaults to metadata.name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 53))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("must be a lowercase DNS label: letters, digits and '-', starting and ending with a letter or digit"))]
    pub release_name: Option<String>,

    /// The namespace the chart's resources go to. Defaults to the namespace of this object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub target_namespace: Option<String>,

    /// Create the target namespace when it does not exist.
    #[serde(default)]
    pub create_namespace: bool,

    /// Values for the chart, as in a values.yaml file. Merged after valuesFrom, so they win.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub values: Option<serde_json::Map<String, serde_json::Value>>,

    /// Values taken from ConfigMaps and Secrets, merged in order before `values`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub values_from: Vec<ValuesReference>,

    /// Labels and annotations stamped on every object the release applies, hooks included
    /// (not the CRDs of `crds/` directories), as Flux's `commonMetadata`: they override the
    /// chart's own, never the ownership labels and annotations sequenced sets. Changing them
    /// starts a new revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub common_metadata: Option<CommonMetadata>,

    /// `ordered` applies the chart layer by layer; `none` applies everything at once, as plain Helm.
    #[serde(default)]
    pub sequencing: Sequencing,

    /// Bound of one operation (install, upgrade, rollback, uninstall), and the TTL of the
    /// release's lock.
    #[serde(default = "default_timeout")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    pub timeout: String,

    /// How long each resource may take to become ready, unless it carries
    /// `helm.sh/readiness-timeout`.
    #[serde(default = "default_timeout")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    pub readiness_timeout: String,

    /// The release is Ready only when every resource is ready, not just those something waits on.
    #[serde(default = "default_true")]
    pub wait: bool,

    /// What to do when an operation fails.
    #[serde(default)]
    pub on_failure: OnFailure,

    /// How many times a failed operation is retried, with exponential backoff.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub retries: i32,

    /// What must be ready before a revision of this release starts, in Flux's spelling:
    /// another SequencedRelease by `name` (and `namespace`), Ready at its current generation;
    /// or any object by `apiVersion`, `kind`, `name` (and `namespace`), ready by the kstatus
    /// rules of its kind, or by `readyExpr`, a CEL expression over the object (`self`, also
    /// `dep`). Watched: a dependency becoming ready starts the release at once. Read as the
    /// release's service account; `--no-cross-namespace-refs` refuses another namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub depends_on: Vec<DependencyReference>,

    /// A ServiceAccount in the release's namespace whose rights the release's objects (and
    /// werf external dependencies) are read, watched, applied and deleted with: the controller
    /// impersonates `system:serviceaccount:<namespace>:<name>`. Unset: the controller's
    /// `--default-service-account`, or else the controller's own identity (never in
    /// multi-tenant mode, where a release without an account is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub service_account_name: Option<String>,

    /// Stop acting on this release until set back to false.
    #[serde(default)]
    pub suspend: bool,

    /// How many revisions to keep in the history; 0 keeps all of them.
    #[serde(default = "default_max_history")]
    #[schemars(range(min = 0))]
    pub max_history: i32,

    /// What uninstalling keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uninstall: Option<UninstallSpec>,

    /// Skip the chart's Helm hooks (`helm.sh/hook`), as Helm's `--no-hooks` and Flux's
    /// `disableHooks`: no hook stage runs on install, upgrade or uninstall.
    #[serde(default)]
    pub disable_hooks: bool,

    /// What an install or upgrade does with the CRDs of the charts' `crds/` directories:
    /// `Skip`, `Create` or `CreateReplace` (see [`CrdPolicy`]; the CRD takes its description).
    /// Unset: `Create` on install, `Skip` on upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crds: Option<CrdPolicy>,

    /// Take over existing objects that no release owns, and go on from the Helm release of the
    /// release name (its next revision, as `helm upgrade`; see the book's "Moving from Helm").
    /// Objects owned by another release are never taken over.
    #[serde(default)]
    pub adopt: bool,

    /// What deleting the SequencedRelease does, with Flux's names: `Delete` (the default)
    /// uninstalls the chart; `Orphan` leaves its objects and its release records as they are and
    /// only lets go of them (finalizer and Lease), handing the release back to Helm: `helm
    /// upgrade` goes on at the next revision and `helm uninstall` removes it all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<DeletionPolicy>,

    /// What happens when the release's objects no longer match what it applied (deleted, or a
    /// field it manages changed by someone else): `enabled` re-applies the affected layers in
    /// order, `warn` reports it (condition `Drifted`), `disabled` does neither. Either the mode
    /// alone (`driftDetection: warn`, as written before) or, in Flux's spelling, an object
    /// `{mode, ignore: [{paths: [...], target: {group, version, kind, name, namespace}}]}`
    /// (`mode` defaults to `enabled`): the fields at `paths`, JSON pointers (RFC 6901) such as
    /// `/spec/replicas` or `/webhooks/0/clientConfig/caBundle` (`""` is the whole object), of
    /// the objects `target` selects (each of its fields an anchored regular expression; every
    /// object of the release without a target) are neither reported as drift nor corrected.
    /// The API server cannot check this field's shape: a value the controller cannot read stalls
    /// the release (reason `InvalidSpec`) naming what is wrong.
    #[serde(default)]
    #[schemars(schema_with = "drift_detection_schema")]
    pub drift_detection: DriftDetectionSpec,

    /// The chart's Helm tests (`helm.sh/hook: test`), run by the operator as Flux runs them:
    /// with `enable`, after every install and upgrade is ready, one at a time in Helm's order;
    /// the release is Ready only when they pass (unless `ignoreFailures`). `sequenced test NAME`
    /// runs them on demand, enabled or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<TestSpec>,

    /// How the release judges the readiness of objects of kinds its chart applies, in
    /// Flux's shape: per `apiVersion` and `kind` (any version of its group), CEL expressions
    /// over the object (`self`, and its top-level fields by name, as Flux has them):
    /// `inProgress`, `failed` and `current`, judged in that order after the generation check;
    /// the first that is true decides, none true is in progress. They replace the built-in
    /// rule of the kind; an object's own readiness annotations replace them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    #[x_kube(validation = Rule::new("self.all(a, self.exists_one(b, b.apiVersion == a.apiVersion && b.kind == a.kind))").message("healthCheckExprs: one entry per apiVersion and kind"))]
    pub health_check_exprs: Vec<HealthCheckExpr>,

    /// How often a Ready release is looked at again even when nothing changed: the chart
    /// source is resolved again (a new version in a range, a changed chart path in the
    /// operator's file system, `valuesFrom` read again), a new revision starts when that changed
    /// the digest, and the release's objects are compared with what it applied
    /// (`spec.driftDetection`: a GET and a server-side apply dry run per object). Not a retry
    /// interval. Changes of the spec, of its `valuesFrom` and chart ConfigMaps and Secrets, and
    /// deletions of its objects are acted on at once.
    #[serde(default = "default_interval")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    pub interval: String,

    /// Post-renderers, in Flux's shape, applied in order to what helm rendered, before it is
    /// planned: kustomize `patches` (strategic merge or JSON 6902, each with an optional
    /// `target`) and `images`, run by a real kustomize (`kubectl kustomize`). Hooks are
    /// post-rendered with the other templates, as Helm 4 and Flux do; the CRDs of `crds/`
    /// directories are not. A patch may add or change sequencing annotations (`helm.sh/layer`),
    /// which the plan then follows. Changing them starts a new revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub post_renderers: Vec<PostRenderer>,

    /// Deploy to a remote cluster (Flux's field): the chart is rendered for that cluster's
    /// version and APIs, and its objects are applied, watched for readiness and drift, and its
    /// Helm release records kept there; this object, its lock (a Lease), its status and its
    /// events stay on this cluster. `serviceAccountName` (or the controller's default service
    /// account) is impersonated on the remote cluster. The kubeconfig must carry its
    /// credentials inline: exec plugins, auth providers and files of the operator's file system
    /// are refused (the release stalls `InvalidKubeConfig`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_config: Option<KubeConfigReference>,
}

/// Where the kubeconfig of a remote cluster is (`spec.kubeConfig`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubeConfigReference {
    /// A Secret in the release's namespace holding the kubeconfig.
    pub secret_ref: KubeConfigSecretRef,
}

/// A Secret key holding a kubeconfig.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubeConfigSecretRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key holding the kubeconfig; without it, `value`, else `value.yaml` (as Flux reads
    /// it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,
}

/// One post-renderer of `spec.postRenderers`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PostRenderer {
    /// A kustomization applied to the rendered chart: its patches, then its image overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kustomize: Option<KustomizePostRenderer>,
}

/// The kustomize post-renderer: `patches` and `images` as in a kustomization.yaml.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KustomizePostRenderer {
    /// Strategic merge patches (a partial object) and JSON 6902 patches (a list of operations),
    /// written inline, each applied to the objects its `target` selects (a strategic merge
    /// patch without a target applies to the object its own apiVersion, kind and name name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 200))]
    pub patches: Vec<KustomizePatch>,
    /// Images whose name, tag or digest is replaced, in every container and init container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 200))]
    pub images: Vec<KustomizeImage>,
}

/// A patch of the kustomize post-renderer.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KustomizePatch {
    /// The patch, inline: YAML of a partial object (strategic merge) or of a list of JSON 6902
    /// operations (`- op: add`, `path`, `value`).
    #[schemars(length(min = 1, max = 262144))]
    pub patch: String,
    /// The objects the patch applies to; each field set must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<PatchTarget>,
}

/// Which objects a patch applies to, as kustomize's selector: `group`, `version`, `kind`,
/// `name` and `namespace` are anchored regular expressions, the selectors are label selector
/// expressions (`app=web,tier!=db`) matched against the labels or the annotations.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PatchTarget {
    /// API group (`apps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// API version (`v1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Kind (`Deployment`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Object name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Object namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// A label selector matched against the objects' labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// A label selector matched against the objects' annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation_selector: Option<String>,
}

/// An image override of the kustomize post-renderer.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KustomizeImage {
    /// The image name to replace, without tag or digest (`nginx`, `ghcr.io/org/app`).
    #[schemars(length(min = 1))]
    pub name: String,
    /// The name it is replaced with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_name: Option<String>,
    /// The tag it is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_tag: Option<String>,
    /// The digest it is given (`sha256:...`); when set, `newTag` is not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

fn default_timeout() -> String {
    "5m".to_string()
}

fn default_interval() -> String {
    "10m".to_string()
}

fn default_true() -> bool {
    true
}

fn default_max_history() -> i32 {
    10
}

/// `spec.driftDetection` is a string or an object. A structural schema can only say that with
/// no `type` and `x-kubernetes-preserve-unknown-fields`, and kube-apiserver compiles no CEL rule
/// on such a node ("Failed to convert to declType for CEL validation rules"), nor can a rule on
/// `spec` see the field: the controller checks it ([`DriftDetectionSpec::Invalid`]) and stalls a
/// release whose value it cannot read, `InvalidSpec` naming what is wrong.
fn drift_detection_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "default": "enabled",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Values for the chart, as in a values.yaml file. Merged after valuesFrom, so they win.",
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// The chart to deploy. Exactly one source: `repository` with `name` (and `version`), `oci`
/// (and `version`), `path`, `configMapRef` or `secretRef`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.repository) ? 1 : 0) + (has(self.oci) ? 1 : 0) + (has(self.path) ? 1 : 0) + (has(self.configMapRef) ? 1 : 0) + (has(self.secretRef) ? 1 : 0) == 1").message("chart needs exactly one source: repository (with name), oci, path, configMapRef or secretRef"))]
#[x_kube(validation = Rule::new("has(self.repository) == has(self.name)").message("chart.name and chart.repository go together: the name of the chart in that repository"))]
#[x_kube(validation = Rule::new("!has(self.version) || has(self.repository) || has(self.oci)").message("chart.version applies only to repository and oci charts"))]
#[x_kube(validation = Rule::new("!has(self.plainHttp) || has(self.oci)").message("chart.plainHttp applies only to oci charts"))]
#[x_kube(validation = Rule::new("!has(self.credentialsSecretRef) || has(self.repository) || has(self.oci)").message("chart.credentialsSecretRef applies only to repository and oci charts"))]
#[x_kube(validation = Rule::new("!has(self.verify) || has(self.repository) || has(self.oci)").message("chart.verify applies only to repository and oci charts"))]
pub struct ChartSource {
    /// URL of a Helm chart repository that serves index.yaml (http:// or https://).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')").message("must be an http:// or https:// URL of a chart repository"))]
    pub repository: Option<String>,

    /// The chart's name in the repository: letters, digits, `.`, `_` and `-`, not starting
    /// with `.` (a name as Helm allows it, never a path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 250),
        regex(pattern = r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
    )]
    pub name: Option<String>,

    /// A version or a semver range as Helm accepts them (`1.2.3`, `^1.2`, `>=1.0 <2.0`).
    /// Without it the newest stable version is used. A version may be pinned by digest,
    /// `1.2.3@sha256:<hex>`: an OCI chart's manifest digest (helm pulls by it), a repository
    /// chart's archive digest (checked once fetched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub version: Option<String>,

    /// An OCI reference: `oci://registry/path/chart` (a registry host with an optional port,
    /// then repository path components as the OCI distribution spec writes them: lowercase
    /// letters and digits joined by `.`, `_`, `__` or dashes), optionally with a `:tag` or
    /// `@sha256:` digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 2048),
        regex(
            pattern = r"^oci://([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
        )
    )]
    #[x_kube(validation = Rule::new("self.startsWith('oci://') && size(self) > 6").message("must be an OCI reference such as oci://registry.example.com/charts/app"))]
    pub oci: Option<String>,

    /// A chart directory or packaged chart (.tgz) in the operator's file system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub path: Option<String>,

    /// A key of a ConfigMap (in binaryData) that holds a packaged chart (.tgz).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<KeyReference>,

    /// A key of a Secret that holds a packaged chart (.tgz).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<KeyReference>,

    /// A Secret in the release's namespace with `username` and `password` for the repository
    /// or registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<LocalReference>,

    /// Talk plain HTTP to the OCI registry (a registry without TLS), like `helm pull --plain-http`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain_http: Option<bool>,

    /// Verify the chart after it is fetched and before anything reads it, in Flux's shape: a
    /// chart that does not verify is Stalled `VerificationFailed` and nothing of it is rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<ChartVerify>,
}

/// `spec.chart.verify`: how the chart is verified.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.secretRef)").message("chart.verify.secretRef is needed: the Secret that holds the public keys"))]
pub struct ChartVerify {
    /// `helm`: the chart's provenance file (`.prov`, made by `helm package --sign`) checked
    /// against the keyring in `secretRef`, as `helm pull --verify --keyring` checks it.
    pub provider: VerifyProvider,
    /// A Secret in the release's namespace holding the public keys: for `helm`, every key of
    /// it whose name ends in `.gpg` (binary) or `.asc` (ASCII-armored) is an OpenPGP keyring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalReference>,
}

/// Who verifies a chart.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum VerifyProvider {
    /// Helm's provenance file against an OpenPGP keyring.
    Helm,
}

/// [`ChartSource::name`]'s pattern: a chart name as Helm allows it, never a path.
pub const CHART_NAME_PATTERN: &str = r"^[A-Za-z0-9_][A-Za-z0-9._-]*$";
/// [`ChartSource::oci`]'s pattern (see its documentation).
pub const OCI_REFERENCE_PATTERN: &str = r"^oci://([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$";

impl ChartSource {
    /// What the CRD's patterns refuse, checked again for objects admitted before them: a chart
    /// name that is a path, an OCI reference that is not one. None when the source is usable.
    pub fn problem(&self) -> Option<String> {
        static NAME: std::sync::LazyLock<regex::Regex> =
            std::sync::LazyLock::new(|| regex::Regex::new(CHART_NAME_PATTERN).expect("pattern"));
        static OCI: std::sync::LazyLock<regex::Regex> =
            std::sync::LazyLock::new(|| regex::Regex::new(OCI_REFERENCE_PATTERN).expect("pattern"));
        if let Some(name) = &self.name
            && (name.len() > 250 || !NAME.is_match(name))
        {
            return Some(format!(
                "spec.chart.name: {name:?} is not a chart name (letters, digits, '.', '_' and \
                 '-', not starting with '.'; never a path)"
            ));
        }
        if let Some(oci) = &self.oci
            && !OCI.is_match(oci)
        {
            return Some(format!(
                "spec.chart.oci: {oci:?} is not an OCI reference such as \
                 oci://registry.example.com/charts/app (repository path components are \
                 lowercase letters and digits joined by '.', '_' or '-'; no '..')"
            ));
        }
        None
    }
}

/// A key of a ConfigMap or Secret in the release's namespace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KeyReference {
    /// Name of the ConfigMap or Secret.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The key that holds the data.
    #[schemars(length(min = 1))]
    pub key: String,
}

/// An object in the release's namespace, by name.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LocalReference {
    /// Name of the object.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// Values from a key of a ConfigMap or Secret in the release's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ValuesReference {
    /// ConfigMap or Secret.
    pub kind: ValuesKind,
    /// Name of the ConfigMap or Secret.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The key that holds the values as YAML.
    #[serde(default = "default_values_key")]
    #[schemars(length(min = 1))]
    pub values_key: String,
    /// A missing object or key is not an error; the reference is skipped.
    #[serde(default)]
    pub optional: bool,
    /// Set the key's value (a string) at this values path instead of merging it as a values
    /// file, with Helm's `--set` rules (`a.b[0].c`, `\.` for a dot in a key); a value in
    /// single or double quotes is set as a string (`--set-string`), as Flux does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 250))]
    #[x_kube(validation = Rule::new(TARGET_PATH_RULE).message(TARGET_PATH_MESSAGE))]
    pub target_path: Option<String>,
}

/// CEL rule for `valuesFrom[].targetPath`: Flux's pattern, a `--set` path of keys, dots,
/// escapes and list indices.
const TARGET_PATH_RULE: &str = r"self.matches('^([a-zA-Z0-9_\\-.\\\\/]|\\[[0-9]{1,5}\\])+$')";
/// What the API server answers when [`TARGET_PATH_RULE`] fails.
const TARGET_PATH_MESSAGE: &str = "must be a values path as Helm's --set takes it, such as a.b[0].c: letters, digits, '_', '-', '.', '/', '\\' and list indices [N]";

/// Labels and annotations for every object of a release (`spec.commonMetadata`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CommonMetadata {
    /// Labels to stamp; `app.kubernetes.io/managed-by` is sequenced's own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("!('app.kubernetes.io/managed-by' in self)").message("app.kubernetes.io/managed-by is the label sequenced owns: it cannot be set by commonMetadata"))]
    pub labels: BTreeMap<String, String>,
    /// Annotations to stamp; keys of `helm.sh/`, `meta.helm.sh/` and `sequenced.dev/` are
    /// refused, as they would change how the chart is sequenced or whose its objects are.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.all(k, !k.startsWith('helm.sh/') && !k.startsWith('meta.helm.sh/') && !k.startsWith('sequenced.dev/'))").message("annotations of helm.sh/, meta.helm.sh/ and sequenced.dev/ change how the chart is sequenced or whose its objects are: commonMetadata cannot set them"))]
    pub annotations: BTreeMap<String, String>,
}

impl CommonMetadata {
    /// Whether it stamps nothing.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

fn default_values_key() -> String {
    "values.yaml".to_string()
}

/// The kind of object `valuesFrom` reads.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValuesKind {
    ConfigMap,
    Secret,
}

/// What deleting a SequencedRelease does to what it deployed (`spec.deletionPolicy`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeletionPolicy {
    /// Uninstall: hooks, objects, records (as `spec.uninstall` says).
    #[default]
    Delete,
    /// Leave the objects and the records to Helm; delete nothing.
    Orphan,
}

/// Whether the chart is applied layer by layer.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Sequencing {
    /// Layer by layer, each layer after the layers it depends on are ready.
    #[default]
    Ordered,
    /// Everything at once, as plain Helm does.
    None,
}

/// What an install or upgrade does with the CRDs of the charts' `crds/` directories, with
/// Flux's names: `Skip` neither creates nor updates them, `Create` creates those that do not
/// exist and never updates one, `CreateReplace` also updates those that changed (server-side
/// apply, before any hook or layer). A CRD is never deleted. Unset: `Create` on install, `Skip`
/// on upgrade, as Helm and Flux do. A rollback never touches CRDs. Read when a revision begins:
/// a revision in progress keeps the policy it began with.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrdPolicy {
    /// Neither create nor update them.
    Skip,
    /// Create those that do not exist; never update one.
    Create,
    /// Create those that do not exist and update those that changed, with server-side apply;
    /// never delete one.
    CreateReplace,
}

/// What happens when an operation fails.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    /// Roll back to the last revision that was Ready.
    Rollback,
    /// Uninstall the release.
    Uninstall,
    /// Leave everything as it is, the release marked Failed.
    #[default]
    Keep,
}

/// `spec.driftDetection`, with the names of Flux's `driftDetection.mode`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DriftDetection {
    /// Drift is corrected: the affected layers are applied again, in order.
    #[default]
    Enabled,
    /// Drift is reported (condition `Drifted`, an event) and left as it is.
    Warn,
    /// Drift is not looked for.
    Disabled,
}

/// `spec.driftDetection` as written: the mode alone (the form of earlier releases, still read and
/// written back as it was) or Flux's object with ignore rules. A value of neither shape is kept
/// as it is, so that the release is told what is wrong instead of going unread.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum DriftDetectionSpec {
    /// `driftDetection: warn`.
    Mode(DriftDetection),
    /// `driftDetection: {mode: warn, ignore: [...]}`.
    Rules(DriftDetectionRules),
    /// Anything else: [`DriftDetectionSpec::problem`] says what is wrong with it.
    Invalid(serde_json::Value),
}

impl Default for DriftDetectionSpec {
    fn default() -> Self {
        DriftDetectionSpec::Mode(DriftDetection::default())
    }
}

impl From<DriftDetection> for DriftDetectionSpec {
    fn from(mode: DriftDetection) -> Self {
        DriftDetectionSpec::Mode(mode)
    }
}

impl DriftDetectionSpec {
    /// The mode: the string, the object's `mode` (`enabled` when unset, today's default, not
    /// Flux's `disabled`), or `enabled` for a value that cannot be read (the release stalls on it).
    pub fn mode(&self) -> DriftDetection {
        match self {
            DriftDetectionSpec::Mode(mode) => *mode,
            DriftDetectionSpec::Rules(rules) => rules.mode.unwrap_or_default(),
            DriftDetectionSpec::Invalid(_) => DriftDetection::default(),
        }
    }

    /// The ignore rules (none in the string form).
    pub fn ignore(&self) -> &[IgnoreRule] {
        match self {
            DriftDetectionSpec::Rules(rules) => &rules.ignore,
            _ => &[],
        }
    }

    /// Why the value cannot be read as either form, naming the field: None when it can.
    /// (Whether its pointers and regular expressions are well formed is checked where they are
    /// used, `rollout::ignore`.)
    pub fn problem(&self) -> Option<String> {
        let DriftDetectionSpec::Invalid(value) = self else {
            return None;
        };
        let why = match value {
            serde_json::Value::String(s) => format!(
                "{} is not one of enabled, warn, disabled",
                serde_json::Value::String(s.clone())
            ),
            serde_json::Value::Object(_) => {
                match serde_json::from_value::<DriftDetectionRules>(value.clone()) {
                    Err(e) => e.to_string(),
                    Ok(_) => "cannot be read".to_string(),
                }
            }
            other => format!("must be a mode (enabled, warn, disabled) or an object, not {other}"),
        };
        Some(format!("spec.driftDetection: {why}"))
    }
}

/// `spec.driftDetection` in Flux's spelling.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DriftDetectionRules {
    /// `enabled` (the default), `warn` or `disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<DriftDetection>,
    /// Fields that are neither reported as drift nor corrected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore: Vec<IgnoreRule>,
}

/// Fields of some objects that drift detection leaves alone.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IgnoreRule {
    /// JSON pointers (RFC 6901): `/spec/replicas`, `/webhooks/0/clientConfig/caBundle`,
    /// `/metadata/annotations/example.com~1stamp` (`~1` is `/`, `~0` is `~`); `""` is the whole
    /// object. A pointer that is not in an object is nothing to ignore.
    pub paths: Vec<String>,
    /// The objects of the release the rule applies to; every one without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<IgnoreTarget>,
}

/// Which objects an ignore rule applies to: each field set is an anchored regular expression
/// (`Deployment`, `.*-webhook`) that must match, as in Flux's `target`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IgnoreTarget {
    /// API group (`apps`, `admissionregistration\.k8s\.io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// API version (`v1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Kind (`Deployment`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Object name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Object namespace (cluster-scoped objects have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `spec.test`: the chart's Helm tests, with Flux's names.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TestSpec {
    /// Run the tests after every install and upgrade that is ready; a failed test fails the
    /// revision (counted against `retries`, then `onFailure`).
    #[serde(default)]
    pub enable: bool,
    /// How long each test may take (as `helm test --timeout`); defaults to `spec.timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    pub timeout: Option<String>,
    /// A failed test is told (condition `TestSuccess` False, `status.tests`, an event) but
    /// does not fail the release: it stays Ready.
    #[serde(default)]
    pub ignore_failures: bool,
    /// Which tests run, by hook name (`metadata.name`), as `helm test --filter`: a filter
    /// without `exclude` selects a test (when there is one, only the selected tests run), one
    /// with `exclude: true` leaves a test out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub filters: Vec<TestFilter>,
}

/// One test filter of `spec.test.filters`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TestFilter {
    /// The test hook's `metadata.name`.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Leave this test out instead of selecting it.
    #[serde(default)]
    pub exclude: bool,
}

impl TestSpec {
    /// Whether the test hook named `name` runs, as `helm test` filters: excluded names never
    /// run; when some name is selected, only selected names run.
    pub fn selects(&self, name: &str) -> bool {
        let excluded = self.filters.iter().any(|f| f.exclude && f.name == name);
        let mut selected = self.filters.iter().filter(|f| !f.exclude).peekable();
        let chosen = selected.peek().is_none() || selected.any(|f| f.name == name);
        !excluded && chosen
    }
}

/// The outcome of one Helm test of the last test run.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TestStatus {
    /// The test hook's `metadata.name`.
    pub name: String,
    /// Its kind (`Pod`, `Job`).
    pub kind: String,
    /// Running, Succeeded or Failed.
    pub phase: TestPhase,
    /// When it was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When it succeeded or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// How long it ran (`12s`), once finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// Why it failed, with the last lines of its pod's log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Where a Helm test is, with the names of Helm's hook phases.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TestPhase {
    #[default]
    Running,
    Succeeded,
    Failed,
}

/// Something a release waits for (`spec.dependsOn`): another SequencedRelease (`name`, and
/// `namespace`), or with `apiVersion` and `kind` any object.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.apiVersion) == has(self.kind)").message("dependsOn: apiVersion and kind go together (an object's type); without both, name is a SequencedRelease"))]
pub struct DependencyReference {
    /// Name of the SequencedRelease, or of the object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Its namespace; defaults to this object's namespace (ignored for a cluster-scoped kind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
    /// The object's apiVersion (`apps/v1`, `example.com/v1`), with `kind`. Unset: a
    /// SequencedRelease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?v[0-9]+((alpha|beta)[0-9]+)?$')").message("must be an apiVersion such as v1, apps/v1 or example.com/v1beta1"))]
    pub api_version: Option<String>,
    /// The object's kind (`Deployment`, `CustomResourceDefinition`), with `apiVersion`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z][A-Za-z0-9]*$')").message("must be a kind such as Deployment"))]
    pub kind: Option<String>,
    /// A CEL expression over the dependency (`self`, also `dep` as in Flux) that is true when
    /// it is ready, replacing the kstatus rules (for a SequencedRelease: its Ready condition at
    /// its generation). Checked when the release is reconciled: one that does not compile
    /// stalls the release (`InvalidSpec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub ready_expr: Option<String>,
}

/// The name `dependsOn` entries had when they could name releases only.
pub type ReleaseReference = DependencyReference;

/// Flux's `healthCheckExprs` entry: how objects of one kind are judged, in CEL.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckExpr {
    /// The apiVersion of the kind (`example.com/v1`); every version of its group matches.
    #[schemars(length(min = 1, max = 253))]
    pub api_version: String,
    /// The kind.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    /// True when the object is ready (kstatus `Current`).
    #[schemars(length(min = 1, max = 4096))]
    pub current: String,
    /// True while the object is still being worked on (checked first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub in_progress: Option<String>,
    /// True when the object failed: the revision fails (checked before `current`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub failed: Option<String>,
}

/// Uninstall options.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UninstallSpec {
    /// Keep the release history after uninstalling.
    #[serde(default)]
    pub keep_history: bool,
}

/// What the operator observed and did.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SequencedReleaseStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// What the operator is doing with the release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ReleasePhase>,
    /// The current release revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// Digest of the chart and values of the last applied revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_digest: Option<String>,
    /// The chart the current revision deployed: its version and digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart: Option<ChartArtifact>,
    /// What the release is doing or waiting for, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Ready layers out of all layers of the current revision, such as `3/5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// Ready, Reconciling and Stalled, with kstatus meanings; Drifted and TestSuccess.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Every layer of the current revision, in deploy order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<LayerStatus>,
    /// The release's lock, mirrored from its Lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<LockStatus>,
    /// Whose rights the release's objects are read, applied and deleted with:
    /// `serviceaccount NAMESPACE:NAME` (impersonated; `spec.serviceAccountName` or the
    /// controller's `--default-service-account`), or `controller` for the controller's own; for
    /// `spec.kubeConfig`, followed by `on the remote cluster SERVER` (`the kubeconfig's user`
    /// when no account is impersonated there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acting_as: Option<String>,
    /// Consecutive failed operations at the current spec; `spec.retries` bounds how many are
    /// tried again. Reset when the spec or the chart changes and when a revision is Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<i32>,
    /// The last revisions, newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,
    /// The `reconcile.sequenced.dev/requestedAt` value last acted on (`sequenced reconcile`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_reconcile_at: Option<String>,
    /// The `rollback.sequenced.dev/requestedAt` value last acted on (`sequenced rollback`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_rollback_at: Option<String>,
    /// The `test.sequenced.dev/requestedAt` value last acted on (`sequenced test`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_test_at: Option<String>,
    /// Why the test run asked for with `lastHandledTestAt` was refused (the release was not
    /// Ready); absent when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_refused: Option<String>,
    /// The Helm tests of the current revision's last test run (`spec.test`, `sequenced test`),
    /// in the order they ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tests: Vec<TestStatus>,
    /// Set while the release runs a revision rolled back to (on request or after a failure): it
    /// stays there until its spec or chart changes, or a reconcile is requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackStatus>,
    /// The last time drift was corrected (`spec.driftDetection: enabled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_drift_correction: Option<DriftCorrection>,
    /// The current revision's objects outside this object's namespace (cluster-scoped ones,
    /// those of another target namespace), in the order an uninstall deletes them. Kept here
    /// because the release records are Secrets in this namespace: when the namespace is
    /// deleted they go first, and the uninstall still removes these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inventory: Vec<InventoryEntry>,
    /// The last failure `spec.onFailure` remediated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<RemediationStatus>,
    /// While the release waits for its `dependsOn` before a revision starts: each dependency,
    /// whether it is ready and why not. Empty once the revision starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<DependencyStatus>,
}

/// One `dependsOn` entry, as the release last saw it while waiting.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DependencyStatus {
    /// `SequencedRelease`, or the object's kind.
    pub kind: String,
    /// The object's apiVersion (none for a SequencedRelease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Its namespace (none for a cluster-scoped object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// Whether it is ready.
    pub ready: bool,
    /// Why not: missing, not ready (its controller's words), its readyExpr false, its kind not
    /// served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The SequencedRelease that owns the object (its `sequenced.dev/owner` annotation),
    /// `namespace/name`: how cycles through objects are found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// A drift correction: when, in which revision, and what had drifted.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DriftCorrection {
    /// When the correction started.
    pub time: Time,
    /// The revision whose objects were corrected.
    pub revision: i64,
    /// What had drifted: `Kind namespace/name` with `deleted` or the fields changed.
    pub objects: Vec<String>,
}

/// An object of the release, by identity, and the uninstall layer it is deleted with.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct InventoryEntry {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// The chart path of its layer.
    pub chart: String,
    /// Its layer: the entries of one layer are deleted together, after those listed before.
    pub layer: String,
}

/// A rollback: the revision that re-applies an earlier one, and the spec it holds back.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RollbackStatus {
    /// The revision that rolls back (a new revision, as `helm rollback` makes).
    pub revision: i64,
    /// The revision whose stored plan it re-applies.
    pub to: i64,
    /// The revision it rolls back from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<i64>,
    /// Asked for with `sequenced rollback` (else a remediation of `spec.onFailure`).
    #[serde(default)]
    pub requested: bool,
    /// The metadata.generation not applied while the rollback holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The chart and values digest not applied while the rollback holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// What `spec.onFailure` did about a failed revision.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RemediationStatus {
    /// The revision that failed.
    pub failed_revision: i64,
    /// What was done.
    pub action: RemediationAction,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// What `spec.onFailure` did.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RemediationAction {
    /// Rolled back to the last revision that was Ready.
    Rollback,
    /// Uninstalled the failed revision's objects.
    Uninstall,
}

fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = <Vec<Condition>>::json_schema(generator);
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    schema.insert(
        "description".into(),
        "Ready, Reconciling and Stalled, with kstatus meanings.".into(),
    );
    schema
}

/// What the operator is doing with a release.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleasePhase {
    Pending,
    Rendering,
    Deploying,
    Ready,
    Failed,
    RollingBack,
    Uninstalling,
    /// The Helm tests of a Ready revision run on request (`sequenced test`).
    Testing,
    /// A revision replaced by a newer one before it finished (history entries only).
    Superseded,
}

/// One layer of one chart of the release.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LayerStatus {
    /// The chart path: `foo`, or `foo/bar` for subchart bar of foo.
    pub chart: String,
    /// The layer's name.
    pub name: String,
    /// Where the layer is.
    pub phase: LayerPhase,
    /// How many resources the layer has.
    pub resources: i32,
    /// How many of them are ready.
    pub ready: i32,
    /// When the layer started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the layer became ready, failed or was deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// What the layer waits for, naming the resource that blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Where a layer is. A hook stage is `CleaningUp` while the hooks its delete policies name are
/// deleted, one at a time, after every hook of the stage succeeded (`hook-succeeded`) or after
/// one failed (`hook-failed`, and the earlier ones with `hook-succeeded`), as Helm does.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LayerPhase {
    #[default]
    Pending,
    Applying,
    Waiting,
    Ready,
    Failed,
    Deleting,
    Deleted,
    CleaningUp,
}

/// The holder of the release's lock.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LockStatus {
    /// The controller that holds the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The session (one operation of one controller process) that holds the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// When the lock expires unless renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locked_until: Option<Time>,
}

/// The chart a revision deployed, as it was fetched.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ChartArtifact {
    /// The chart's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `sha256:<hex>` of the chart archive (`.tgz`), as a repository's `index.yaml` lists it.
    pub digest: String,
    /// For an OCI chart, the manifest digest the registry served (what `@sha256:` pins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci_digest: Option<String>,
    /// What verified it (`spec.chart.verify`); absent when it was not verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<ChartVerified>,
}

/// What verified a chart.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ChartVerified {
    /// `helm` (the provenance file) or `cosign`.
    pub provider: String,
    /// The fingerprint of the key whose signature verified (OpenPGP, upper-case hexadecimal),
    /// or the name of the public key in the Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Who the key names (its first user id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    /// For a keyless signature, the certificate's issuer and subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
}

/// One revision of the release.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    /// The revision number.
    pub revision: i64,
    /// The chart version it deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart_version: Option<String>,
    /// Digest of its chart and values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// `sha256:<hex>` of the chart archive it deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart_digest: Option<String>,
    /// How it ended, or where it is.
    pub phase: ReleasePhase,
    /// When it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Whether it was applied layer by layer.
    pub sequenced: bool,
    /// How it began when that was more than an install or an upgrade: the Helm history it went
    /// on from (`went on from Helm release shop at revision 3 (…)`), a pending record of
    /// Helm's it took over. Kept as long as the entry is; `sequenced status` shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}
