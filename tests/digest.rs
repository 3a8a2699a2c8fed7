//! Golden digests (see `src/digest.rs`): what starts a new revision must not move when the
//! operator is upgraded. Each case pins the digest of one spec's inputs under the scheme that
//! writes it now (v2) and, where v1 expresses it, under v1, which operators before the digest
//! was versioned wrote. A change that moves one of them starts a revision of every release that
//! has those inputs: it needs a new scheme, not a new pinned value.

use std::collections::BTreeMap;

use sequenced::api::CommonMetadata;
use sequenced::digest::{Asked, Digests, ValuesInput};

const REPOSITORY: &str = "repository https://charts.example.com shop 1.2.3";

fn asked<'a>(chart: &'a str, values: Vec<ValuesInput<'a>>) -> Asked<'a> {
    Asked {
        chart,
        values,
        release_name: "shop",
        namespace: "apps",
        common_metadata: None,
    }
}

fn check(name: &str, asked: &Asked, v2: &str, v1: Option<&str>) {
    let digests = Digests::of(asked);
    assert_eq!(digests.current, v2, "{name}: the v2 digest moved");
    assert_eq!(digests.v1.as_deref(), v1, "{name}: the v1 digest moved");
}

#[test]
fn the_digests_of_the_fixture_specs_do_not_move() {
    let common = CommonMetadata {
        labels: BTreeMap::from([("team".to_string(), "platform".to_string())]),
        annotations: BTreeMap::from([("example.com/owner".to_string(), "shop".to_string())]),
    };
    let cases: Vec<(&str, Asked, &str, Option<&str>)> = vec![
        (
            "no values",
            asked(REPOSITORY, vec![]),
            "v2:sha256:8cab2ccfc4df7201dc97074ab1e83655e0a699164f2c309d683e97d2daee6cbb",
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
            "v2:sha256:546b0dea39b5e79be2aaad49f160db924ee2344325ed54e46a514eed709e3ee8",
            Some("sha256:da0a10436af80bbd50b82707996f399392a7f7727402b23d52183c80c8292ff5"),
        ),
        (
            "an OCI chart",
            asked(
                "oci oci://registry.example.com/charts/shop 2.0.0",
                vec![ValuesInput::File("a: 1")],
            ),
            "v2:sha256:2ba839650aa4a089669f37c27f0153ec89ef5adbea5d0d3341f2da314805816e",
            Some("sha256:c9b9cbcfcb1a26a3efbdf32aad0f887cad99fb34e7c41d00b8215012337c7cfe"),
        ),
        (
            "a local chart",
            asked(
                "path sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
                vec![ValuesInput::File("a: 1")],
            ),
            "v2:sha256:bc2b45a8ce984f4fffa4d6a5a159e4448f3d15e9d98b5084815182f25c0c8385",
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
            "v2:sha256:4fe619e92c414cd33c6800fb0f865833198e6e049d8ee37f2e5450728c06c82a",
            None,
        ),
        (
            "common metadata",
            Asked {
                common_metadata: Some(&common),
                ..asked(REPOSITORY, vec![ValuesInput::File("a: 1")])
            },
            "v2:sha256:e698a32eaf6824cf3de3805ec4063a7f6e8d55bfd78d73135f6207fb893199cb",
            None,
        ),
    ];
    for (name, asked, v2, v1) in &cases {
        check(name, asked, v2, *v1);
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
