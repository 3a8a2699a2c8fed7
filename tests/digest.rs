//! Golden digests (see `src/digest.rs`): what starts a new revision must not move when the
//! operator is upgraded. Each case pins the digest of one spec's inputs under the scheme that
//! writes it now (v3), under v2, which operators wrote before `spec.postRenderers`, and, where
//! v1 expresses it, under v1, which operators before the digest was versioned wrote. A change
//! that moves one of them starts a revision of every release that has those inputs: it needs a
//! new scheme, not a new pinned value.

use std::collections::BTreeMap;

use sequenced::api::{
    CommonMetadata, KustomizeImage, KustomizePatch, KustomizePostRenderer, PatchTarget,
    PostRenderer,
};
use sequenced::digest::{Asked, Digests, ValuesInput};

const REPOSITORY: &str = "repository https://charts.example.com shop 1.2.3";

fn asked<'a>(chart: &'a str, values: Vec<ValuesInput<'a>>) -> Asked<'a> {
    Asked {
        chart,
        values,
        release_name: "shop",
        namespace: "apps",
        common_metadata: None,
        post_renderers: &[],
    }
}

/// A fixture spec: its name, its inputs, and its v3, v2 and v1 digests.
type Case<'a> = (
    &'a str,
    Asked<'a>,
    &'a str,
    Option<&'a str>,
    Option<&'a str>,
);

fn check(name: &str, asked: &Asked, v3: &str, v2: Option<&str>, v1: Option<&str>) {
    let digests = Digests::of(asked);
    assert_eq!(digests.current, v3, "{name}: the v3 digest moved");
    assert_eq!(digests.v2.as_deref(), v2, "{name}: the v2 digest moved");
    assert_eq!(digests.v1.as_deref(), v1, "{name}: the v1 digest moved");
}

#[test]
fn the_digests_of_the_fixture_specs_do_not_move() {
    let common = CommonMetadata {
        labels: BTreeMap::from([("team".to_string(), "platform".to_string())]),
        annotations: BTreeMap::from([("example.com/owner".to_string(), "shop".to_string())]),
    };
    let renderers = [PostRenderer {
        kustomize: Some(KustomizePostRenderer {
            patches: vec![KustomizePatch {
                patch: "- op: add\n  path: /metadata/annotations/helm.sh~1layer\n  value: app\n"
                    .to_string(),
                target: Some(PatchTarget {
                    kind: Some("Deployment".to_string()),
                    ..Default::default()
                }),
            }],
            images: vec![KustomizeImage {
                name: "nginx".to_string(),
                new_tag: Some("1.27".to_string()),
                ..Default::default()
            }],
        }),
    }];
    let cases: Vec<Case> = vec![
        (
            "no values",
            asked(REPOSITORY, vec![]),
            "v3:sha256:81c807c37e2f635d15ce362a0412dd805b53127e558cd1c9db19128fee9c5f57",
            Some("v2:sha256:8cab2ccfc4df7201dc97074ab1e83655e0a699164f2c309d683e97d2daee6cbb"),
            Some("sha256:6d69eed5d5642cfa95766e607982dd270d768b4b74e446aa1ef7066ee568e14a"),
        ),
        (
            "a values file and inline values",
            asked(
                REPOSITORY,
                vec![
                    ValuesInput::File("# from a ConfigMap\ngreeting: hello\nname: base\n"),
                    ValuesInput::File(r#"{"extra":{"a":[1,"x"],"b":2},"name":"inline"}"#),
                ],
            ),
            "v3:sha256:98a2ac7aa260a9eacbb6df00b273b75b5653ff8f574b50aa920f5f7b7ca61c42",
            Some("v2:sha256:546b0dea39b5e79be2aaad49f160db924ee2344325ed54e46a514eed709e3ee8"),
            Some("sha256:da0a10436af80bbd50b82707996f399392a7f7727402b23d52183c80c8292ff5"),
        ),
        (
            "an OCI chart",
            asked(
                "oci oci://registry.example.com/charts/shop 2.0.0",
                vec![ValuesInput::File("a: 1")],
            ),
            "v3:sha256:09bc75a1c63e8640dd54add2fae054b0f79e37d3998238faaa54ce86a38e9e66",
            Some("v2:sha256:2ba839650aa4a089669f37c27f0153ec89ef5adbea5d0d3341f2da314805816e"),
            Some("sha256:c9b9cbcfcb1a26a3efbdf32aad0f887cad99fb34e7c41d00b8215012337c7cfe"),
        ),
        (
            "a local chart",
            asked(
                "path sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
                vec![ValuesInput::File("a: 1")],
            ),
            "v3:sha256:34ae22de3aabbbeed06948dfbd4baa269d1904faad347a668114faa515503b95",
            Some("v2:sha256:bc2b45a8ce984f4fffa4d6a5a159e4448f3d15e9d98b5084815182f25c0c8385"),
            Some("sha256:5c12d8440cee866aeb64a251cd210c66a4767b838559dfa1d1408f1430635ccd"),
        ),
        (
            "a target path",
            asked(
                REPOSITORY,
                vec![
                    ValuesInput::File("db: {host: base}"),
                    ValuesInput::TargetPath {
                        path: "db.password",
                        value: "s3cr3t",
                    },
                ],
            ),
            "v3:sha256:8c643ac9335bf024765f237ccfb1e1dbf71357656f5bfac9cdd7ebabda59a260",
            Some("v2:sha256:4fe619e92c414cd33c6800fb0f865833198e6e049d8ee37f2e5450728c06c82a"),
            None,
        ),
        (
            "common metadata",
            Asked {
                common_metadata: Some(&common),
                ..asked(REPOSITORY, vec![ValuesInput::File("a: 1")])
            },
            "v3:sha256:49e4e5de77fcbb8e8f7081285d9d4d8ba03332c0f39abfecbf28c5a16ef94b5d",
            Some("v2:sha256:e698a32eaf6824cf3de3805ec4063a7f6e8d55bfd78d73135f6207fb893199cb"),
            None,
        ),
        (
            "post-renderers",
            Asked {
                post_renderers: &renderers,
                ..asked(REPOSITORY, vec![ValuesInput::File("a: 1")])
            },
            "v3:sha256:dbf674db55b83f09471d24d2d3450e2a26e3a912d82bd20520f0102a34c0bce3",
            None,
            None,
        ),
    ];
    for (name, asked, v3, v2, v1) in &cases {
        check(name, asked, v3, *v2, *v1);
    }
}

#[test]
fn values_written_differently_are_the_same_values() {
    let a = Digests::of(&asked(
        REPOSITORY,
        vec![ValuesInput::File("b: [1, 2]\na: {x: \"z\"}\n")],
    ));
    let b = Digests::of(&asked(
        REPOSITORY,
        vec![ValuesInput::File(
            "# reordered, commented, unquoted\na:\n  x: z\nb:\n- 1\n- 2\n",
        )],
    ));
    assert_eq!(a.current, b.current);
    // Under v1 they differed: a status v1 wrote is compared with v1 of the same text only.
    assert_ne!(a.v1, b.v1);
    assert!(!b.matches(a.v1.as_deref().unwrap()));
    // As Helm reads YAML (1.1): an unquoted y is true, not the string "y".
    let quoted = Digests::of(&asked(REPOSITORY, vec![ValuesInput::File("x: \"y\"")]));
    let bare = Digests::of(&asked(REPOSITORY, vec![ValuesInput::File("x: y")]));
    assert_ne!(quoted.current, bare.current);
    assert!(b.matches(&a.current));
}
