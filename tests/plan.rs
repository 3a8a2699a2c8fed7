//! The planner, case by case for every dialect: named layers (seed 000 and HIP-0025 spellings),
//! werf weights and external dependencies (seed 003), KOTS phases (seed 002), subcharts, hooks,
//! CRDs, uninstall order, and the errors each names. Pure: no helm, no cluster.

use sequenced_testkit as support;

use sequenced::chart::ChartTree;
use sequenced::plan::{self, Grouping, Plan, PlanError, Problem, Severity, Wait};
use support::{chart_tree, object, rendered};
use tempfile::TempDir;

/// Documents of chart shop: `(file, yaml)`.
type Documents<'a> = Vec<(&'a str, String)>;

const SHOP: &str = "apiVersion: v2\nname: shop\nversion: 0.1.0\n";

fn shop() -> (TempDir, ChartTree) {
    let dir = TempDir::new().expect("temp dir");
    let tree = chart_tree(dir.path(), &[("shop", SHOP)], &[]);
    (dir, tree)
}

/// Plans documents of chart shop: `(file, yaml)`.
fn plan_shop(documents: &[(&str, String)]) -> Result<Plan, PlanError> {
    let (_dir, tree) = shop();
    let sources: Vec<(String, String)> = documents
        .iter()
        .map(|(file, yaml)| (format!("shop/{file}"), yaml.clone()))
        .collect();
    let docs: Vec<(&str, String)> = sources
        .iter()
        .map(|(s, y)| (s.as_str(), y.clone()))
        .collect();
    plan::plan(&tree, rendered(&tree, &docs))
}

fn ok(result: Result<Plan, PlanError>) -> Plan {
    result.unwrap_or_else(|e| panic!("plan failed:\n{e}"))
}

fn err(result: Result<Plan, PlanError>) -> PlanError {
    match result {
        Ok(plan) => panic!("planned, expected an error: {plan:#?}"),
        Err(e) => e,
    }
}

/// The layers as `(level, "chart name", [Kind/name...])`.
fn layers(plan: &Plan) -> Vec<(usize, String, Vec<String>)> {
    plan.layers
        .iter()
        .map(|l| {
            (
                l.level,
                format!("{} {}", l.chart, l.name),
                l.resources
                    .iter()
                    .map(|&r| plan.resources[r].id())
                    .collect(),
            )
        })
        .collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn layer<'a>(plan: &'a Plan, name: &str) -> &'a sequenced::plan::Layer {
    plan.layers
        .iter()
        .find(|l| format!("{} {}", l.chart, l.name) == name)
        .unwrap_or_else(|| panic!("no layer {name}"))
}

fn index(plan: &Plan, name: &str) -> usize {
    plan.layers
        .iter()
        .position(|l| format!("{} {}", l.chart, l.name) == name)
        .unwrap_or_else(|| panic!("no layer {name}"))
}

// ---------------------------------------------------------------------------------------------
// Named layers (seed 000, HIP-0025)

#[test]
fn seed_layers_example_database_and_queue_then_app() {
    // The seed's three resources, with the dependency written as the seed writes it: one list
    // element holding a comma. (The seed's queue also names "another-layer", which no resource
    // declares; that is an error, tested below.)
    let plan = ok(plan_shop(&[
        (
            "templates/db.yaml",
            object("Service", "db-service", &[("helm.sh/layer", "database")]),
        ),
        (
            "templates/app.yaml",
            object(
                "Deployment",
                "my-app",
                &[
                    ("helm.sh/layer", "app"),
                    ("helm.sh/depends-on/layers", r#"["database, queue"]"#),
                ],
            ),
        ),
        (
            "templates/queue.yaml",
            object(
                "Deployment",
                "queue-processor",
                &[("helm.sh/layer", "queue")],
            ),
        ),
    ]));
    assert_eq!(
        layers(&plan),
        vec![
            (1, "shop database".into(), strings(&["Service/db-service"])),
            (
                1,
                "shop queue".into(),
                strings(&["Deployment/queue-processor"])
            ),
            (2, "shop app".into(), strings(&["Deployment/my-app"])),
        ]
    );
    let app = index(&plan, "shop app");
    let deps: Vec<usize> = plan.layers[app]
        .depends_on
        .iter()
        .map(|d| d.layer)
        .collect();
    assert_eq!(
        deps,
        vec![index(&plan, "shop database"), index(&plan, "shop queue")]
    );
    assert!(
        plan.layers[app]
            .depends_on
            .iter()
            .all(|d| d.wait == Wait::Ready)
    );
    // Everything in both first layers must be ready before app starts.
    let ready: Vec<String> = plan
        .must_be_ready(app)
        .into_iter()
        .map(|r| plan.resources[r].id())
        .collect();
    assert_eq!(
        ready,
        strings(&["Service/db-service", "Deployment/queue-processor"])
    );
    // Uninstall is the reverse: app first.
    let uninstall: Vec<String> = plan.uninstall.iter().map(|s| s.name.clone()).collect();
    assert_eq!(uninstall[0], "app");
    assert_eq!(plan.uninstall[1].after, vec![0]);
    assert_eq!(plan.uninstall[2].after, vec![0]);
}

#[test]
fn every_spelling_of_a_layer_dependency_means_the_same() {
    let spellings: [(&str, &str); 7] = [
        ("helm.sh/depends-on/layers", "database,queue"),
        ("helm.sh/depends-on/layers", " database , queue "),
        ("helm.sh/depends-on/layers", r#"["database", "queue"]"#),
        ("helm.sh/depends-on/layers", r#"["database, queue"]"#),
        ("helm.sh/depends-on/layers", "[database, queue]"),
        (
            "helm.sh/depends-on/resource-groups",
            r#"["database","queue"]"#,
        ),
        ("helm.sh/depends-on/resource-groups", "queue, database"),
    ];
    for (key, value) in spellings {
        for layer_key in ["helm.sh/layer", "helm.sh/resource-group"] {
            let plan = ok(plan_shop(&[
                (
                    "templates/a.yaml",
                    object("ConfigMap", "db", &[(layer_key, "database")]),
                ),
                (
                    "templates/b.yaml",
                    object("ConfigMap", "q", &[("helm.sh/resource-group", "queue")]),
                ),
                (
                    "templates/c.yaml",
                    object(
                        "ConfigMap",
                        "app",
                        &[("helm.sh/layer", "app"), (key, value)],
                    ),
                ),
            ]));
            let app = layer(&plan, "shop app");
            assert_eq!(app.level, 2, "{key}: {value}");
            assert_eq!(app.depends_on.len(), 2, "{key}: {value}");
        }
    }
}

#[test]
fn both_dependency_keys_on_one_resource_are_merged() {
    let plan = ok(plan_shop(&[
        (
            "templates/a.yaml",
            object("ConfigMap", "a", &[("helm.sh/layer", "a")]),
        ),
        (
            "templates/b.yaml",
            object("ConfigMap", "b", &[("helm.sh/resource-group", "b")]),
        ),
        (
            "templates/c.yaml",
            object(
                "ConfigMap",
                "c",
                &[
                    ("helm.sh/layer", "c"),
                    ("helm.sh/depends-on/layers", "a"),
                    ("helm.sh/depends-on/resource-groups", "b"),
                ],
            ),
        ),
    ]));
    assert_eq!(layer(&plan, "shop c").depends_on.len(), 2);
}

#[test]
fn resources_without_annotations_go_after_every_layer_of_their_chart() {
    let plan = ok(plan_shop(&[
        ("templates/plain.yaml", object("ConfigMap", "plain", &[])),
        (
            "templates/a.yaml",
            object("ConfigMap", "a", &[("helm.sh/layer", "first")]),
        ),
        (
            "templates/b.yaml",
            object(
                "ConfigMap",
                "b",
                &[
                    ("helm.sh/layer", "second"),
                    ("helm.sh/depends-on/layers", "first"),
                ],
            ),
        ),
        (
            "templates/c.yaml",
            object("ConfigMap", "c", &[("helm.sh/layer", "lonely")]),
        ),
    ]));
    assert_eq!(
        layers(&plan),
        vec![
            (1, "shop first".into(), strings(&["ConfigMap/a"])),
            (1, "shop lonely".into(), strings(&["ConfigMap/c"])),
            (2, "shop second".into(), strings(&["ConfigMap/b"])),
            (3, "shop (default)".into(), strings(&["ConfigMap/plain"])),
        ]
    );
    let default = layer(&plan, "shop (default)");
    assert_eq!(default.grouping, Grouping::Default);
    // It waits for the layers nothing else waits for; "first" comes in through "second".
    let deps: Vec<&str> = default
        .depends_on
        .iter()
        .map(|d| plan.layers[d.layer].name.as_str())
        .collect();
    assert_eq!(deps, vec!["lonely", "second"]);
    let waited: Vec<String> = plan
        .must_be_applied(index(&plan, "shop (default)"))
        .into_iter()
        .map(|l| plan.layers[l].name.clone())
        .collect();
    assert_eq!(waited, strings(&["lonely", "second"]));
}

#[test]
fn a_dependency_without_a_layer_is_a_warning_and_goes_last() {
    let plan = ok(plan_shop(&[
        (
            "templates/a.yaml",
            object("ConfigMap", "a", &[("helm.sh/layer", "first")]),
        ),
        (
            "templates/b.yaml",
            object("ConfigMap", "b", &[("helm.sh/depends-on/layers", "first")]),
        ),
    ]));
    assert_eq!(
        layers(&plan)[1],
        (2, "shop (default)".into(), strings(&["ConfigMap/b"]))
    );
    assert_eq!(plan.warnings.len(), 1);
    assert!(
        plan.warnings[0].message.contains(
            "chart shop, templates/b.yaml ConfigMap/b has helm.sh/depends-on/layers but no helm.sh/layer"
        ),
        "{}",
        plan.warnings[0]
    );
}

#[test]
fn kind_order_inside_a_layer() {
    let plan = ok(plan_shop(&[
        ("templates/a.yaml", object("Widget", "w", &[])),
        ("templates/b.yaml", object("Deployment", "d", &[])),
        ("templates/c.yaml", object("Service", "s", &[])),
        ("templates/d.yaml", object("ConfigMap", "c2", &[])),
        ("templates/e.yaml", object("Namespace", "n", &[])),
        ("templates/f.yaml", object("ConfigMap", "c1", &[])),
        ("templates/g.yaml", object("Gadget", "g", &[])),
    ]));
    assert_eq!(
        layers(&plan),
        vec![(
            1,
            "shop (default)".into(),
            strings(&[
                "Namespace/n",
                "ConfigMap/c2",
                "ConfigMap/c1",
                "Service/s",
                "Deployment/d",
                "Gadget/g",
                "Widget/w"
            ])
        )]
    );
    // Uninstall uses Helm's uninstall order: Service before Deployment, Namespace last.
    let names: Vec<String> = plan.uninstall[0]
        .resources
        .iter()
        .map(|&r| plan.resources[r].id())
        .collect();
    assert_eq!(
        names,
        strings(&[
            "Service/s",
            "Deployment/d",
            "ConfigMap/c1",
            "ConfigMap/c2",
            "Namespace/n",
            // Unlisted kinds come last, alphabetically, as Helm sorts them.
            "Gadget/g",
            "Widget/w"
        ])
    );
}

#[test]
fn invalid_annotation_keys_are_read_then_stripped() {
    let plan = ok(plan_shop(&[
        (
            "templates/a.yaml",
            object("ConfigMap", "a", &[("helm.sh/layer", "first")]),
        ),
        (
            "templates/b.yaml",
            object(
                "ConfigMap",
                "b",
                &[
                    ("helm.sh/layer", "second"),
                    ("helm.sh/depends-on/layers", "first"),
                    ("helm.sh/depends-on/resource-groups", "first"),
                    ("example.com/keep", "yes"),
                ],
            ),
        ),
        (
            "templates/c.yaml",
            object(
                "ConfigMap",
                "c",
                &[
                    ("helm.sh/depends-on/layers", "first"),
                    ("helm.sh/layer", "third"),
                ],
            ),
        ),
    ]));
    assert_eq!(layer(&plan, "shop second").level, 2);
    let b = plan.resources.iter().find(|r| r.name == "b").expect("b");
    assert_eq!(
        b.object["metadata"]["annotations"],
        serde_json::json!({"helm.sh/layer": "second", "example.com/keep": "yes"})
    );
}

#[test]
fn other_invalid_annotation_keys_are_errors() {
    let e = err(plan_shop(&[(
        "templates/a.yaml",
        object("ConfigMap", "a", &[("example.com/a/b", "x")]),
    )]));
    assert_eq!(e.errors.len(), 1);
    assert_eq!(e.errors[0].problem, Problem::InvalidAnnotationKey);
    assert!(
        e.to_string().contains(
            "annotation key \"example.com/a/b\" of chart shop, templates/a.yaml ConfigMap/a is not a valid Kubernetes annotation key"
        ),
        "{e}"
    );
}

#[test]
fn errors_of_named_layers() {
    let cases: Vec<(Documents, Problem, &str)> = vec![
        (
            vec![
                (
                    "templates/app.yaml",
                    object(
                        "Deployment",
                        "my-app",
                        &[
                            ("helm.sh/layer", "app"),
                            ("helm.sh/depends-on/layers", "queue"),
                        ],
                    ),
                ),
                (
                    "templates/queue.yaml",
                    object(
                        "Deployment",
                        "queue-processor",
                        &[
                            ("helm.sh/layer", "queue"),
                            ("helm.sh/depends-on/layers", "app"),
                        ],
                    ),
                ),
            ],
            Problem::Cycle,
            "layer cycle in chart shop: app -> queue -> app (templates/app.yaml Deployment/my-app: app depends on queue; templates/queue.yaml Deployment/queue-processor: queue depends on app)",
        ),
        (
            vec![(
                "templates/a.yaml",
                object(
                    "ConfigMap",
                    "a",
                    &[("helm.sh/layer", "a"), ("helm.sh/depends-on/layers", "a")],
                ),
            )],
            Problem::Cycle,
            "layer cycle in chart shop: a -> a",
        ),
        (
            vec![(
                "templates/queue.yaml",
                object(
                    "Deployment",
                    "queue-processor",
                    &[
                        ("helm.sh/layer", "queue"),
                        ("helm.sh/depends-on/layers", r#"["another-layer"]"#),
                    ],
                ),
            )],
            Problem::UnknownLayer,
            "unknown layer \"another-layer\" in chart shop: templates/queue.yaml Deployment/queue-processor has helm.sh/depends-on/layers \"another-layer\", but no resource of chart shop is in that layer (its layers: queue)",
        ),
        (
            vec![(
                "templates/a.yaml",
                object(
                    "ConfigMap",
                    "a",
                    &[("helm.sh/layer", "a"), ("helm.sh/depends-on/layers", "[a,")],
                ),
            )],
            Problem::BadAnnotation,
            "malformed helm.sh/depends-on/layers in chart shop, templates/a.yaml ConfigMap/a: \"[a,\": it is not a valid list",
        ),
        (
            vec![(
                "templates/a.yaml",
                object("ConfigMap", "a", &[("helm.sh/layer", "my layer")]),
            )],
            Problem::BadAnnotation,
            "malformed helm.sh/layer in chart shop, templates/a.yaml ConfigMap/a: \"my layer\": a layer name is",
        ),
        (
            vec![(
                "templates/a.yaml",
                object(
                    "ConfigMap",
                    "a",
                    &[("helm.sh/layer", "a"), ("helm.sh/resource-group", "b")],
                ),
            )],
            Problem::BadAnnotation,
            "it names layer \"b\" but helm.sh/layer names \"a\"; a resource is in one layer",
        ),
        (
            vec![
                ("templates/a.yaml", object("ConfigMap", "same", &[])),
                ("templates/b.yaml", object("ConfigMap", "same", &[])),
            ],
            Problem::DuplicateResource,
            "ConfigMap/same is rendered twice: by chart shop, templates/a.yaml and by chart shop, templates/b.yaml ConfigMap/same",
        ),
    ];
    for (documents, problem, expected) in cases {
        let e = err(plan_shop(&documents));
        assert_eq!(e.errors[0].problem, problem, "{e}");
        assert!(
            e.to_string().contains(expected),
            "expected {expected:?} in:\n{e}"
        );
        assert_eq!(e.errors[0].chart, "shop");
        assert!(e.errors[0].file.is_some() || problem == Problem::Cycle);
    }
}

#[test]
fn every_error_is_reported_at_once() {
    let e = err(plan_shop(&[
        (
            "templates/a.yaml",
            object(
                "ConfigMap",
                "a",
                &[
                    ("helm.sh/layer", "a"),
                    ("helm.sh/depends-on/layers", "nope"),
                ],
            ),
        ),
        (
            "templates/b.yaml",
            object(
                "ConfigMap",
                "b",
                &[("helm.sh/layer", "b"), ("helm.sh/depends-on/layers", "[b,")],
            ),
        ),
        (
            "templates/c.yaml",
            object(
                "ConfigMap",
                "c",
                &[("helm.sh/layer", "c"), ("helm.sh/depends-on/layers", "c")],
            ),
        ),
    ]));
    let problems: Vec<Problem> = e.errors.iter().map(|d| d.problem).collect();
    assert_eq!(
        problems,
        vec![
            Problem::BadAnnotation,
            Problem::UnknownLayer,
            Problem::Cycle
        ],
        "{e}"
    );
    assert_eq!(e.category(), "bad_annotation");
}

// ---------------------------------------------------------------------------------------------
// werf (seed 003)

#[test]
fn werf_weight_groups_in_ascending_order_each_ready_before_the_next() {
    // The seed's example: database (-1), then database-migrations (0, no weight), then app1 and
    // app2 (1) in parallel.
    let plan = ok(plan_shop(&[
        (
            "templates/example.yaml",
            object("StatefulSet", "database", &[("werf.io/weight", "-1")]),
        ),
        (
            "templates/example.yaml",
            object("Job", "database-migrations", &[]),
        ),
        (
            "templates/example.yaml",
            object("Deployment", "app1", &[("werf.io/weight", "1")]),
        ),
        (
            "templates/example.yaml",
            object("Deployment", "app2", &[("werf.io/weight", "1")]),
        ),
    ]));
    assert_eq!(
        layers(&plan),
        vec![
            (
                1,
                "shop weight -1".into(),
                strings(&["StatefulSet/database"])
            ),
            (
                2,
                "shop weight 0".into(),
                strings(&["Job/database-migrations"])
            ),
            (
                3,
                "shop weight 1".into(),
                strings(&["Deployment/app1", "Deployment/app2"])
            ),
        ]
    );
    assert_eq!(layer(&plan, "shop weight 1").grouping, Grouping::Weight(1));
    for l in &plan.layers[1..] {
        assert_eq!(l.depends_on.len(), 1);
        assert_eq!(l.depends_on[0].wait, Wait::Ready);
    }
    assert_eq!(plan.uninstall[0].name, "weight 1");
    assert_eq!(plan.uninstall[2].name, "weight -1");
}

#[test]
fn werf_external_dependencies_hold_their_layer() {
    let plan = ok(plan_shop(&[(
        "templates/example.yaml",
        object(
            "Deployment",
            "myapp",
            &[
                (
                    "secret.external-dependency.werf.io/resource",
                    "secret/my-dynamic-vault-secret",
                ),
                (
                    "secret.external-dependency.werf.io/namespace",
                    "my-namespace",
                ),
                (
                    "database.external-dependency.werf.io/resource",
                    "statefulset.apps/my-database",
                ),
            ],
        ),
    )]));
    let external = &plan.layers[0].external;
    assert_eq!(external.len(), 2);
    let secret = external.iter().find(|e| e.id == "secret").expect("secret");
    assert_eq!(
        (
            secret.kind.as_str(),
            secret.group.as_deref(),
            secret.name.as_str(),
            secret.namespace.as_deref()
        ),
        (
            "secret",
            None,
            "my-dynamic-vault-secret",
            Some("my-namespace")
        )
    );
    assert_eq!(secret.declared_by, "Deployment/myapp");
    let database = external.iter().find(|e| e.id == "database").expect("db");
    assert_eq!(database.group.as_deref(), Some("apps"));
    assert_eq!(database.namespace, None);
}

#[test]
fn errors_of_werf_annotations() {
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![("werf.io/weight", "heavy")],
            "malformed werf.io/weight in chart shop, templates/a.yaml Deployment/a: \"heavy\": \"heavy\" is not an integer",
        ),
        (vec![("werf.io/weight", "1.5")], "\"1.5\" is not an integer"),
        (
            vec![("db.external-dependency.werf.io/resource", "statefulset")],
            "malformed db.external-dependency.werf.io/resource in chart shop, templates/a.yaml Deployment/a: \"statefulset\": \"statefulset\" is not KIND[.GROUP]/NAME",
        ),
    ];
    for (annotations, expected) in cases {
        let e = err(plan_shop(&[(
            "templates/a.yaml",
            object("Deployment", "a", &annotations),
        )]));
        assert_eq!(e.errors[0].problem, Problem::BadAnnotation);
        assert!(e.to_string().contains(expected), "{expected:?} in:\n{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// KOTS (seed 002)

#[test]
fn kots_phases_are_applied_in_order_and_only_marked_resources_are_waited_for() {
    let plan = ok(plan_shop(&[
        (
            "templates/crd.yaml",
            object(
                "Widget",
                "setup",
                &[
                    ("kots.io/creation-phase", "-1"),
                    ("kots.io/deletion-phase", "1"),
                ],
            ),
        ),
        (
            "templates/db.yaml",
            object(
                "StatefulSet",
                "postgresql",
                &[("kots.io/wait-for-ready", "true")],
            ),
        ),
        (
            "templates/cm.yaml",
            object(
                "ConfigMap",
                "settings",
                &[("kots.io/wait-for-ready", "false")],
            ),
        ),
        (
            "templates/res.yaml",
            object(
                "Widget",
                "my-resource",
                &[(
                    "kots.io/wait-for-properties",
                    ".status.tasks.extract=true,.status.tasks.load=true",
                )],
            ),
        ),
        (
            "templates/app.yaml",
            object("Deployment", "app", &[("kots.io/creation-phase", "1")]),
        ),
    ]));
    assert_eq!(
        layers(&plan),
        vec![
            (1, "shop phase -1".into(), strings(&["Widget/setup"])),
            (
                2,
                "shop phase 0".into(),
                strings(&[
                    "ConfigMap/settings",
                    "StatefulSet/postgresql",
                    "Widget/my-resource"
                ])
            ),
            (3, "shop phase 1".into(), strings(&["Deployment/app"])),
        ]
    );
    let app = index(&plan, "shop phase 1");
    assert_eq!(plan.layers[app].depends_on[0].wait, Wait::Gates);
    let ready: Vec<String> = plan
        .must_be_ready(app)
        .into_iter()
        .map(|r| plan.resources[r].id())
        .collect();
    assert_eq!(
        ready,
        strings(&["StatefulSet/postgresql", "Widget/my-resource"])
    );
    // Nothing of phase -1 is marked: phase 0 waits only until it is applied.
    assert!(plan.must_be_ready(index(&plan, "shop phase 0")).is_empty());
    assert_eq!(
        plan.must_be_applied(index(&plan, "shop phase 0")),
        [index(&plan, "shop phase -1")].into()
    );

    // Uninstall by deletion phase, lowest first: everything else (0), then setup (1).
    let steps: Vec<(String, Vec<String>)> = plan
        .uninstall
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                s.resources
                    .iter()
                    .map(|&r| plan.resources[r].id())
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        vec![
            (
                "deletion phase 0".into(),
                strings(&[
                    "Deployment/app",
                    "StatefulSet/postgresql",
                    "ConfigMap/settings",
                    "Widget/my-resource"
                ])
            ),
            ("deletion phase 1".into(), strings(&["Widget/setup"])),
        ]
    );
    assert_eq!(plan.uninstall[1].after, vec![0]);
}

#[test]
fn errors_of_kots_annotations() {
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![("kots.io/creation-phase", "first")],
            "malformed kots.io/creation-phase in chart shop, templates/a.yaml Deployment/a: \"first\"",
        ),
        (
            vec![("kots.io/creation-phase", "10000")],
            "a phase is from -9999 to 9999",
        ),
        (
            vec![("kots.io/deletion-phase", "x")],
            "malformed kots.io/deletion-phase",
        ),
        (
            vec![("kots.io/wait-for-ready", "maybe")],
            "annotation kots.io/wait-for-ready: \"maybe\" is not a boolean (write \"true\" or \"false\"), in chart shop, templates/a.yaml Deployment/a",
        ),
        (
            vec![("helm.sh/readiness-success", "[\"succeeded=>1\"]")],
            "annotation helm.sh/readiness-success: ",
        ),
        (
            vec![("helm.sh/readiness-timeout", "soon")],
            "annotation helm.sh/readiness-timeout: ",
        ),
    ];
    for (annotations, expected) in cases {
        let e = err(plan_shop(&[(
            "templates/a.yaml",
            object("Deployment", "a", &annotations),
        )]));
        assert!(e.to_string().contains(expected), "{expected:?} in:\n{e}");
    }
}

#[test]
fn dialects_cannot_be_mixed_in_one_chart() {
    let cases = [
        (
            ("helm.sh/layer", "app"),
            ("werf.io/weight", "1"),
            "chart shop mixes sequencing dialects: templates/a.yaml ConfigMap/a has helm.sh/layer: app but templates/b.yaml ConfigMap/b has werf.io/weight: \"1\"",
        ),
        (
            ("werf.io/weight", "1"),
            ("kots.io/creation-phase", "2"),
            "templates/a.yaml ConfigMap/a has werf.io/weight: \"1\" but templates/b.yaml ConfigMap/b has kots.io/creation-phase: \"2\"",
        ),
        (
            ("helm.sh/depends-on/resource-groups", "x"),
            ("kots.io/creation-phase", "2"),
            "templates/a.yaml ConfigMap/a has helm.sh/depends-on/resource-groups but templates/b.yaml ConfigMap/b has kots.io/creation-phase",
        ),
    ];
    for (a, b, expected) in cases {
        let e = err(plan_shop(&[
            ("templates/a.yaml", object("ConfigMap", "a", &[a])),
            ("templates/b.yaml", object("ConfigMap", "b", &[b])),
        ]));
        assert_eq!(e.errors[0].problem, Problem::MixedDialects);
        assert!(e.to_string().contains(expected), "{expected:?} in:\n{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Subcharts

const FOO: &str = r#"apiVersion: v2
name: foo
version: 0.1.0
annotations:
  helm.sh/depends-on/subcharts: '["bar", "rabbitmq"]'
dependencies:
  - name: nginx
    version: "0.1.0"
  - name: rabbitmq
    version: "0.1.0"
  - name: bar
    version: "0.1.0"
    depends-on: ["nginx", "rabbitmq"]
    condition: bar.enabled
"#;

/// The subcharts of FOO when Helm renders all of them.
const FOO_RENDERED: &[&str] = &["foo/nginx", "foo/rabbitmq", "foo/bar"];

/// FOO's tree when Helm rendered documents for the chart paths `rendered`.
fn foo_tree(dir: &TempDir, root: &str, rendered: &[&str]) -> ChartTree {
    chart_tree(
        dir.path(),
        &[
            ("foo", root),
            (
                "foo/charts/nginx",
                "apiVersion: v2\nname: nginx\nversion: 0.1.0\n",
            ),
            (
                "foo/charts/rabbitmq",
                "apiVersion: v2\nname: rabbitmq\nversion: 0.1.0\n",
            ),
            (
                "foo/charts/bar",
                "apiVersion: v2\nname: bar\nversion: 0.1.0\n",
            ),
        ],
        rendered,
    )
}

fn foo_documents(tree: &ChartTree) -> sequenced::render::Rendered {
    let docs: Vec<(&str, String)> = tree
        .charts()
        .iter()
        .map(|c| {
            let source = match c.path.split_once('/') {
                Some((_, sub)) => format!("foo/charts/{sub}/templates/x.yaml"),
                None => "foo/templates/x.yaml".to_string(),
            };
            (
                Box::leak(source.into_boxed_str()) as &str,
                object("Deployment", &c.name, &[]),
            )
        })
        .collect();
    rendered(tree, &docs)
}

#[test]
fn seed_subchart_example_nginx_and_rabbitmq_then_bar_then_foo() {
    let dir = TempDir::new().expect("temp dir");
    let tree = foo_tree(&dir, FOO, FOO_RENDERED);
    let plan = ok(plan::plan(&tree, foo_documents(&tree)));
    assert_eq!(
        layers(&plan),
        vec![
            (
                1,
                "foo/nginx (default)".into(),
                strings(&["Deployment/nginx"])
            ),
            (
                1,
                "foo/rabbitmq (default)".into(),
                strings(&["Deployment/rabbitmq"])
            ),
            (2, "foo/bar (default)".into(), strings(&["Deployment/bar"])),
            (3, "foo (default)".into(), strings(&["Deployment/foo"])),
        ]
    );
    assert_eq!(
        layer(&plan, "foo/bar (default)").after_charts,
        strings(&["foo/nginx", "foo/rabbitmq"])
    );
    assert_eq!(
        layer(&plan, "foo (default)").after_charts,
        strings(&["foo/bar", "foo/rabbitmq"])
    );
    let bar = plan
        .charts
        .iter()
        .find(|c| c.path == "foo/bar")
        .expect("bar");
    assert_eq!(bar.after, strings(&["foo/nginx", "foo/rabbitmq"]));
    let root = &plan.charts[0];
    assert_eq!(root.own_after, strings(&["foo/bar", "foo/rabbitmq"]));
    // foo's own resources wait for everything of bar and rabbitmq.
    let ready: Vec<String> = plan
        .must_be_ready(index(&plan, "foo (default)"))
        .into_iter()
        .map(|r| plan.resources[r].id())
        .collect();
    assert_eq!(ready, strings(&["Deployment/rabbitmq", "Deployment/bar"]));
    // Uninstall: foo first, then bar, then nginx and rabbitmq.
    let order: Vec<&str> = plan.uninstall.iter().map(|s| s.chart.as_str()).collect();
    assert_eq!(order[0], "foo");
    assert_eq!(order[1], "foo/bar");
}

#[test]
fn a_disabled_subchart_leaves_the_graph_with_its_edges() {
    let dir = TempDir::new().expect("temp dir");
    // bar disabled (bar.enabled=false): Helm renders nothing of it.
    let tree = foo_tree(&dir, FOO, &["foo/nginx", "foo/rabbitmq"]);
    let plan = ok(plan::plan(&tree, foo_documents(&tree)));
    assert_eq!(
        layers(&plan),
        vec![
            (
                1,
                "foo/nginx (default)".into(),
                strings(&["Deployment/nginx"])
            ),
            (
                1,
                "foo/rabbitmq (default)".into(),
                strings(&["Deployment/rabbitmq"])
            ),
            (2, "foo (default)".into(), strings(&["Deployment/foo"])),
        ]
    );
    assert_eq!(plan.charts[0].disabled, strings(&["bar"]));
    assert_eq!(plan.charts[0].own_after, strings(&["foo/rabbitmq"]));
}

#[test]
fn subcharts_are_named_by_alias_or_by_tag() {
    let root = r#"apiVersion: v2
name: foo
version: 0.1.0
annotations:
  helm.sh/depends-on/subcharts: backend
dependencies:
  - name: nginx
    version: "0.1.0"
    alias: web
    depends-on: [queues]
  - name: rabbitmq
    version: "0.1.0"
    tags: [queues, backend]
  - name: bar
    version: "0.1.0"
    tags: [backend]
    depends-on: ["web"]
"#;
    let dir = TempDir::new().expect("temp dir");
    let tree = foo_tree(&dir, root, &["foo/web", "foo/rabbitmq", "foo/bar"]);
    let plan = ok(plan::plan(&tree, foo_documents(&tree)));
    assert_eq!(
        layers(&plan),
        vec![
            (
                1,
                "foo/rabbitmq (default)".into(),
                strings(&["Deployment/rabbitmq"])
            ),
            (2, "foo/web (default)".into(), strings(&["Deployment/web"])),
            (3, "foo/bar (default)".into(), strings(&["Deployment/bar"])),
            (4, "foo (default)".into(), strings(&["Deployment/foo"])),
        ]
    );
    assert_eq!(
        plan.charts[0].own_after,
        strings(&["foo/bar", "foo/rabbitmq"])
    );
}

#[test]
fn layers_inside_a_subchart_are_its_own_and_wait_for_its_subtree_order() {
    // bar waits for nginx; bar has two layers of its own; its second layer starts after its
    // first, and its first after all of nginx.
    let root = r#"apiVersion: v2
name: foo
version: 0.1.0
dependencies:
  - name: nginx
    version: "0.1.0"
  - name: bar
    version: "0.1.0"
    depends-on: [nginx]
"#;
    let dir = TempDir::new().expect("temp dir");
    let tree = chart_tree(
        dir.path(),
        &[
            ("foo", root),
            (
                "foo/charts/nginx",
                "apiVersion: v2\nname: nginx\nversion: 0.1.0\n",
            ),
            (
                "foo/charts/bar",
                "apiVersion: v2\nname: bar\nversion: 0.1.0\n",
            ),
        ],
        &["foo/nginx", "foo/bar"],
    );
    let docs = vec![
        (
            "foo/charts/nginx/templates/a.yaml",
            object("Deployment", "nginx", &[("helm.sh/layer", "app")]),
        ),
        (
            "foo/charts/bar/templates/a.yaml",
            object("ConfigMap", "bar-config", &[("helm.sh/layer", "config")]),
        ),
        (
            "foo/charts/bar/templates/b.yaml",
            object(
                "Deployment",
                "bar",
                &[
                    ("helm.sh/layer", "app"),
                    ("helm.sh/depends-on/layers", "config"),
                ],
            ),
        ),
        ("foo/templates/a.yaml", object("ConfigMap", "foo", &[])),
    ];
    let plan = ok(plan::plan(&tree, rendered(&tree, &docs)));
    assert_eq!(
        layers(&plan),
        vec![
            (1, "foo (default)".into(), strings(&["ConfigMap/foo"])),
            (1, "foo/nginx app".into(), strings(&["Deployment/nginx"])),
            (
                2,
                "foo/bar config".into(),
                strings(&["ConfigMap/bar-config"])
            ),
            (3, "foo/bar app".into(), strings(&["Deployment/bar"])),
        ]
    );
    assert_eq!(
        layer(&plan, "foo/bar config").after_charts,
        strings(&["foo/nginx"])
    );
    assert!(layer(&plan, "foo/bar app").after_charts.is_empty());
}

#[test]
fn errors_of_subcharts() {
    let cases = [
        (
            r#"apiVersion: v2
name: foo
version: 0.1.0
dependencies:
  - name: nginx
    version: "0.1.0"
    depends-on: [bar]
  - name: rabbitmq
    version: "0.1.0"
  - name: bar
    version: "0.1.0"
    depends-on: [nginx]
"#,
            Problem::Cycle,
            "subchart cycle in chart foo: bar -> nginx -> bar (",
        ),
        (
            r#"apiVersion: v2
name: foo
version: 0.1.0
dependencies:
  - name: nginx
    version: "0.1.0"
    depends-on: [nginx]
  - name: rabbitmq
    version: "0.1.0"
  - name: bar
    version: "0.1.0"
"#,
            Problem::Cycle,
            "subchart cycle in chart foo: nginx -> nginx",
        ),
        (
            r#"apiVersion: v2
name: foo
version: 0.1.0
dependencies:
  - name: nginx
    version: "0.1.0"
    depends-on: [redis]
  - name: rabbitmq
    version: "0.1.0"
  - name: bar
    version: "0.1.0"
"#,
            Problem::UnknownSubchart,
            "unknown subchart \"redis\" in chart foo (",
        ),
        (
            r#"apiVersion: v2
name: foo
version: 0.1.0
annotations:
  helm.sh/depends-on/subcharts: '["bar", "postgres"]'
dependencies:
  - name: nginx
    version: "0.1.0"
  - name: rabbitmq
    version: "0.1.0"
  - name: bar
    version: "0.1.0"
"#,
            Problem::UnknownSubchart,
            "helm.sh/depends-on/subcharts names it, but chart foo has no dependency or tag of that name (its dependencies and tags: bar, nginx, rabbitmq)",
        ),
        (
            r#"apiVersion: v2
name: foo
version: 0.1.0
annotations:
  helm.sh/depends-on/subcharts: '["bar",'
dependencies:
  - name: nginx
    version: "0.1.0"
  - name: rabbitmq
    version: "0.1.0"
  - name: bar
    version: "0.1.0"
"#,
            Problem::BadAnnotation,
            "malformed helm.sh/depends-on/subcharts in chart foo (",
        ),
    ];
    for (root, problem, expected) in cases {
        let dir = TempDir::new().expect("temp dir");
        let tree = foo_tree(&dir, root, FOO_RENDERED);
        let e = err(plan::plan(&tree, foo_documents(&tree)));
        assert_eq!(e.errors[0].problem, problem, "{e}");
        assert!(e.to_string().contains(expected), "{expected:?} in:\n{e}");
        // The message names the Chart.yaml file.
        assert!(
            e.errors[0]
                .file
                .as_deref()
                .is_some_and(|f| f.ends_with("foo/Chart.yaml")),
            "{:?}",
            e.errors[0]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Hooks and CRDs

#[test]
fn hooks_run_one_at_a_time_by_weight_and_ignore_sequencing_annotations() {
    let plan = ok(plan_shop(&[
        (
            "templates/third.yaml",
            object(
                "Job",
                "third",
                &[
                    ("helm.sh/hook", "pre-install"),
                    ("helm.sh/hook-weight", "1"),
                ],
            ),
        ),
        (
            "templates/second.yaml",
            object(
                "Job",
                "second",
                &[
                    ("helm.sh/hook", "pre-install,pre-upgrade"),
                    ("helm.sh/layer", "migrations"),
                    ("helm.sh/depends-on/layers", "db"),
                ],
            ),
        ),
        (
            "templates/first.yaml",
            object(
                "Job",
                "first",
                &[
                    ("helm.sh/hook", "pre-install"),
                    ("helm.sh/hook-weight", "-1"),
                    ("helm.sh/hook-delete-policy", "hook-succeeded,hook-failed"),
                ],
            ),
        ),
        (
            "templates/cm.yaml",
            object(
                "ConfigMap",
                "before",
                &[
                    ("helm.sh/hook", "pre-install"),
                    ("helm.sh/hook-weight", "1"),
                ],
            ),
        ),
        (
            "templates/test.yaml",
            object(
                "Pod",
                "test",
                &[("helm.sh/hook", "test"), ("helm.sh/hook-weight", "heavy")],
            ),
        ),
        ("templates/main.yaml", object("ConfigMap", "main", &[])),
    ]));
    let order: Vec<String> = plan
        .hooks_at("pre-install")
        .map(|h| h.resource.id())
        .collect();
    assert_eq!(
        order,
        strings(&["Job/first", "Job/second", "ConfigMap/before", "Job/third"])
    );
    assert_eq!(
        plan.hooks[0].delete_policies,
        strings(&["hook-succeeded", "hook-failed"])
    );
    assert_eq!(
        plan.hooks[1].delete_policies,
        strings(&["before-hook-creation"])
    );
    let test = plan
        .hooks
        .iter()
        .find(|h| h.resource.name == "test")
        .expect("test");
    assert!(test.is_test());
    assert_eq!(test.weight, 0);
    // Hooks are not in the layers.
    assert_eq!(
        layers(&plan),
        vec![(1, "shop (default)".into(), strings(&["ConfigMap/main"]))]
    );
    // The ignored layer annotations are warned about, and stripped where invalid.
    let warnings: Vec<String> = plan.warnings.iter().map(|w| w.message.clone()).collect();
    assert!(
        warnings.iter().any(|w| w.contains(
            "helm.sh/layer, helm.sh/depends-on/layers on hook chart shop, templates/second.yaml Job/second are ignored"
        )),
        "{warnings:#?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("helm.sh/hook-weight of chart shop, templates/test.yaml Pod/test is \"heavy\", not an integer; Helm uses 0")),
        "{warnings:#?}"
    );
    let second = &plan.hooks[1].resource.object["metadata"]["annotations"];
    assert!(second.get("helm.sh/depends-on/layers").is_none());
    assert!(
        plan.warnings
            .iter()
            .all(|w| w.severity == Severity::Warning)
    );
}

#[test]
fn crds_are_their_own_stage() {
    let plan = ok(plan_shop(&[
        (
            "crds/widgets.yaml",
            object(
                "CustomResourceDefinition",
                "widgets.example.com",
                &[("helm.sh/layer", "ignored-here")],
            ),
        ),
        (
            "templates/widget.yaml",
            object("Widget", "w", &[("helm.sh/layer", "app")]),
        ),
    ]));
    assert_eq!(plan.crds.len(), 1);
    assert_eq!(plan.crds[0].template, "crds/widgets.yaml");
    assert_eq!(
        layers(&plan),
        vec![(1, "shop app".into(), strings(&["Widget/w"]))]
    );
}

#[test]
fn a_plan_is_plain_data() {
    let plan = ok(plan_shop(&[
        (
            "templates/a.yaml",
            object(
                "ConfigMap",
                "a",
                &[
                    ("kots.io/creation-phase", "1"),
                    ("kots.io/wait-for-ready", "true"),
                ],
            ),
        ),
        ("templates/b.yaml", object("ConfigMap", "b", &[])),
    ]));
    let json = serde_json::to_string(&plan).expect("serialize");
    let back: Plan = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back, plan);
    assert!(json.contains("\"gate\":true"), "{json}");
}
