//! Checks `sequenced::yaml::parse` against the real helm binary: every input below is rendered
//! by helm through `fromYaml` (which decodes with `sigs.k8s.io/yaml.Unmarshal`, as Helm does for
//! values, `Chart.yaml` and manifests) and `toJson`, and must mean the same to us. A values file
//! read with `-f` is checked the same way.
//!
//! Helm's numbers are all float64 by the time `toJson` writes them, so numbers are compared as
//! f64. Where helm reports an error, `parse` must fail too.

use sequenced_testkit as support;

use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

/// YAML inputs; each one's meaning is asked of helm (`fromYaml`) and of `sequenced::yaml::parse`.
const INPUTS: &[&str] = &[
    "a: yes\nb: \"yes\"\nc: on\nd: 0755\ne: 1_000\nf: 0x1F\ng: 2001-12-14\nh: ~\ni: 1e3\nk: y\nl: 0b101\nm: +12\nn: 12.50\no: 123456789012345678901\np: -0o17\n",
    "a: y\nb: Y\nc: yes\nd: Yes\ne: YES\nf: true\ng: True\nh: TRUE\ni: on\nj: On\nk: ON\n",
    "a: n\nb: N\nc: no\nd: No\ne: NO\nf: false\ng: False\nh: FALSE\ni: off\nj: Off\nk: OFF\n",
    "a: yEs\nb: oN\nc: nO\nd: tRUE\ne: \"no\"\nf: 'off'\n",
    "a:\nb: ~\nc: null\nd: Null\ne: NULL\nf: nULL\ng: \"~\"\nh: ''\n",
    "a: 0\nb: -0\nc: +7\nd: -12\ne: 1_000_000\nf: 1__0\ng: 1_\nh: _1\n",
    "a: 0x1F\nb: 0X1f\nc: 0o17\nd: 0O17\ne: -0o17\nf: 0b101\ng: 0B11\nh: -0b101\ni: 0755\nj: 00\nk: 0x\nl: 0b2\n",
    "a: 0b-101\nb: 0b+101\nc: -0b-101\n",
    "a: 08\nb: 09.5\n",
    "a: 9223372036854775807\nb: 9223372036854775808\nc: -9223372036854775808\nd: -9223372036854775809\ne: 18446744073709551615\nf: 18446744073709551616\ng: 0xFFFFFFFFFFFFFFFFFF\n",
    "a: 1.5\nb: -1.5\nc: +.5\nd: .5\ne: 5.\nf: 1e3\ng: 1E-3\nh: 1.5e+3\ni: 6.02e23\nj: -0.0\nk: 12.50\n",
    "a: .5_5\nb: ._5\nc: 1e400\nd: -1e400\ne: 1e-400\nf: 1.5.5\ng: 1e\nh: .\n",
    "a: 1:20\nb: 1,000\nc: 0x1G\nd: 12abc\ne: '12'\nf: \"0x1F\"\ng: 1 2\n",
    "a: 1\nb: .inf\n",
    "b: -.Inf\n",
    "b: [1, .NaN]\n",
    "a: '.inf'\nb: \".nan\"\nc: .iNf\nd: +.inf1\n",
    "a: .nan\na: 1\n",
    "a: 2001-12-14\nb: 2001-12-14T21:59:43.10-05:00\nc: 2001-12-14 21:59:43.10\nd: 2001-13-14\n",
    "a: \"true\"\nb: '1'\nc: |\n  1\nd: >-\n  yes\n",
    "a: \"\\x41\\u263A\\U0001F600\\t\\\\\\\"\\0\\e\\N\\_\\L\\P\"\n",
    "a: \"it\\'s\"\nb: \"\\'\\'\"\nc: it\\'s\n",
    "a: \"x\\/y\"\n",
    "a: 'it''s'\nb: \"multi\n  line\"\nc: plain\n  folded\n\n  para\n",
    "a: |\n  x\n\nb: |-\n  x\n\nc: |+\n  x\n\nd: >\n  one\n  two\n\n  three\ne: |2\n    x\n",
    "a: >\n  x\n  z",
    "a: |\n",
    "a: !!str 12\nb: !!int \"12\"\nc: !!float 1\nd: !!float '2.5'\ne: !!bool \"yes\"\nf: !!null ''\ng: !!str\nh: !!timestamp 2001-12-14\ni: !<tag:yaml.org,2002:int> \"3\"\n",
    "a: ! 12\nb: !foo 13\nc: !!map 14\nd: !!str {e: 1}\n",
    "a: !!binary aGVsbG8=\nb: !!binary |\n  aGVs\n  bG8=\n",
    "a: !!binary 4oI=\nb: !!binary gA==\n",
    "a: !!binary aGVsbG8\n",
    "a: !!int 1.5\n",
    "a: !!int\n",
    "a: !!float 18446744073709551615\n",
    "a: !!timestamp 2001-12-14t21:59:43.10-05:00\nb: !!timestamp 2001-12-14  21:59:43\nc: !!timestamp 2000-02-29\nd: !!timestamp 2001-12-14T1:2:3,5Z\n",
    "a: !!timestamp 2001-02-29\n",
    "a: !!timestamp foo\n",
    "yes: a\nno: b\n1: c\n0x10: d\n-1: e\n2.5: f\n1e20: g\n123456789.0: h\n0.00001: i\n1000000.0: j\n123456.0: k\n-0.0: l\n.inf: m\n-.inf: n\n.nan: o\n~x: p\n",
    "a: 1\n~: 2\n",
    "? \n: 1\n",
    "18446744073709551615: 1\n",
    "[1, 2]: a\n",
    "? {a: 1}\n: b\n",
    "a: {~: 1}\na: 2\n",
    "a: 1\nb: 2\na: 3\n",
    "true: c\nyes: d\nTrue: e\n0x1: f\n1: g\n",
    "a: &x {b: [1, 2]}\nc: *x\nd: &y 3\ne: [*y, *y]\n&k key: v\nref: *k\n",
    "a: &x 1\nb: &x 2\nc: *x\n",
    "b: &b {a: 1, c: 3}\nx:\n  a: 2\n  <<: *b\n  c: 4\n",
    "b1: &b1 {a: 1}\nb2: &b2 {a: 2, z: 2}\nx:\n  <<: [*b1, *b2]\n  w: 0\n",
    "x:\n  <<: {a: 1}\n  !!merge <<: {b: 2}\n  ! <<: {c: 3}\nz:\n  \"<<\": {a: 1}\n",
    "b: &b [1]\nx:\n  <<: *b\n",
    "a: &a [1, *a]\n",
    "a: *nope\n",
    "- &x:\n    b: 1\n",
    "a: &x. 1\n",
    "a: 1\n---\nb: [\n",
    "\u{feff}a: 1\n",
    "a: 1\nb: x\u{1}y\n",
    "a:\tb\nc:\t-1\n",
    "args: [\n  \"a\",\n  \"b\"\n]\nmap: {\nk: v\n}\n",
    "a:\n  b: \"x\ny\"\n  c: 'p\n\tq'\n",
    "a: \"x\"# note\n",
    "s: [a, 'b', \"c\", 1, 1.5, true, ~, ]\nm: {a: 1, b, c: }\np: [a: 1, b]\n",
    "a: b: c\n",
    // go-yaml's base64 (`\r` and `\n` ignored, spaces not, non-zero unused bits allowed).
    "a: !!binary \"aGVs\\rbG9=\"\nb: !!binary \"YR==\\n\"\nc: !!binary \"\"\n",
    "a: !!binary aGVs\n  bG8=\n",
    // `\'` is an escape in double-quoted scalars only.
    "a: 'x\\'\nb: \"y\\'z\"\nc: |\n  it\\'s\n# don\\'t\n",
    "a: \"x\\\\'\"\nb: \"\\\\\\'\"\n",
    "a: [\"it\\'s\", .inf]\n",
    // Where libyaml 0.2.5 and go-yaml v2 part ways and this module follows go-yaml.
    "%YAML 1.2\n---\na: 1\n",
    "%YAML 1.1\n%YAML 1.1\n---\na: 1\n",
    "a: [b?c]\n",
    "a: {b: c?d}\n",
    "a: [b\n  ?c]\n",
    // libyaml's own syntax: line breaks, tabs, flow and block corner cases, directives.
    "a: b\u{85}c: d\u{2028}e: f\r\ng: h\ri: j\n",
    "a:\n\tb: 1\n",
    "- a\n-\tb\n",
    "? a\n:\tb\n",
    "a: |\n\tx\n",
    "a: \"b\n\tc\"\n",
    "a: [\n\tb]\n",
    "a: [b:c, d]\n",
    "a: {-}\n",
    "a:\n|\n x\n",
    "key: \"\\\n  x\"\n",
    "a: 1\n%YAML 1.1\n---\nb: 2\n",
    "%TAG !e! tag:example.com,2000:\n---\na: !e!foo b\n",
    "a: 1\n...\nb\n",
    "a: &x\n  b: 1\nc: *x\n",
    "a: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n",
    "replicaCount: 1\nimage:\n  repository: nginx\n  pullPolicy: IfNotPresent\n  tag: \"\"\nserviceAccount:\n  create: true\n  annotations: {}\n  name: \"\"\npodAnnotations: {}\nsecurityContext: {}\nservice:\n  type: ClusterIP\n  port: 80\ningress:\n  enabled: false\n  className: \"\"\n  hosts:\n    - host: chart-example.local\n      paths:\n        - path: /\n          pathType: ImplementationSpecific\n  tls: []\nresources: {}\nautoscaling:\n  enabled: false\n  minReplicas: 1\n  maxReplicas: 100\n  targetCPUUtilizationPercentage: 80\nnodeSelector: {}\ntolerations: []\naffinity: {}\n",
    "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  labels: {app: web, tier: \"1\"}\nspec:\n  replicas: 3\n  template:\n    spec:\n      containers:\n        - name: web\n          image: \"nginx:1.25\"\n          args: [\"--port\", \"8080\", --verbose]\n          env:\n            - {name: DEBUG, value: \"no\"}\n            - name: MODE\n              value: off\n          ports:\n            - containerPort: 8080\n              protocol: TCP\n",
    "apiVersion: v1\nkind: ConfigMap\ndata:\n  script.sh: |\n    #!/bin/sh\n    echo \"hello: world\"\n  folded: >-\n    a long\n    line\n  octal: 0644\n  version: 1.10\n",
    "defaults: &defaults\n  adapter: postgres\n  host: localhost\ndevelopment:\n  database: dev\n  <<: *defaults\ntest:\n  <<: *defaults\n  database: test\n  host: 127.0.0.1\n",
    "apiVersion: v2\nname: mychart\ndescription: \"A Helm chart for Kubernetes\"\ntype: application\nversion: 0.1.0\nappVersion: \"1.16.0\"\ndependencies:\n  - name: redis\n    version: ~17.0.0\n    repository: https://charts.bitnami.com/bitnami\n    condition: redis.enabled\nkeywords: [web, nginx]\n",
    "args: [\n  \"--flag\",\n  \"value\"\n]\nselector: {\nmatchLabels: {app: x}\n}\n",
];

/// A chart whose single template writes, for every file under `cases/`, what `fromYaml` makes of
/// it, as base64 of `toJson` (so any text survives the trip through the rendered YAML).
fn write_chart(dir: &Path, inputs: &[&str]) {
    std::fs::create_dir_all(dir.join("templates")).unwrap();
    std::fs::create_dir_all(dir.join("cases")).unwrap();
    std::fs::write(
        dir.join("Chart.yaml"),
        "apiVersion: v2\nname: oracle\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("templates/cases.yaml"),
        concat!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cases\ndata:\n",
            "{{- range $path, $_ := .Files.Glob \"cases/*\" }}\n",
            "  {{ base $path }}: {{ $.Files.Get $path | fromYaml | toJson | b64enc | quote }}\n",
            "{{- end }}\n",
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: values\ndata:\n",
            "  values: {{ toJson .Values | b64enc | quote }}\n",
        ),
    )
    .unwrap();
    for (index, input) in inputs.iter().enumerate() {
        std::fs::write(dir.join(format!("cases/case{index:04}")), input).unwrap();
    }
}

/// Runs `helm template` and returns every `key: "base64"` line of its output, decoded.
fn render(chart: &Path, values: &Path) -> Vec<(String, Value)> {
    let helm = support::helm();
    let output = Command::new(&helm)
        .args(["template", "oracle"])
        .arg(chart)
        .arg("-f")
        .arg(values)
        .output()
        .unwrap_or_else(|e| panic!("cannot run helm at {}: {e}", helm.display()));
    assert!(
        output.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    stdout
        .lines()
        .filter_map(|line| {
            let (key, value) = line.trim().split_once(": \"")?;
            let encoded = value.strip_suffix('"')?;
            let json = String::from_utf8(STANDARD.decode(encoded).unwrap()).unwrap();
            Some((key.to_owned(), serde_json::from_str(&json).unwrap()))
        })
        .collect()
}

/// Whether two values agree, numbers compared as the f64s Go holds after `sigs.k8s.io/yaml`.
/// serde_json (without its `float_roundtrip` feature) may read helm's printed floats one unit in
/// the last place off, so floats need only agree that closely.
fn agree(ours: &Value, helm: &Value) -> bool {
    match (ours, helm) {
        (Value::Number(a), Value::Number(b)) => match (a.as_f64(), b.as_f64()) {
            (Some(a), Some(b)) => {
                a == b || (a - b).abs() <= 2.0 * f64::EPSILON * a.abs().max(b.abs())
            }
            _ => false,
        },
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| agree(a, b))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| agree(v, w)))
        }
        _ => ours == helm,
    }
}

fn is_helm_error(value: &Value) -> bool {
    value
        .as_object()
        .is_some_and(|map| map.len() == 1 && map.contains_key("Error"))
}

#[test]
fn parse_agrees_with_helm() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("chart");
    write_chart(&chart, INPUTS);
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, VALUES_FILE).unwrap();

    let rendered = render(&chart, &values);
    let mut failures = Vec::new();
    let mut compared = 0;
    for (key, helm) in &rendered {
        let (input, ours) = if key == "values" {
            (VALUES_FILE, sequenced::yaml::parse(VALUES_FILE))
        } else {
            let index: usize = key.trim_start_matches("case").parse().unwrap();
            (INPUTS[index], sequenced::yaml::parse(INPUTS[index]))
        };
        compared += 1;
        let agree = match &ours {
            Ok(value) => !is_helm_error(helm) && agree(value, helm),
            Err(_) => is_helm_error(helm),
        };
        if !agree {
            failures.push(format!("input {input:?}\n  helm: {helm}\n  ours: {ours:?}"));
        }
    }
    assert_eq!(
        compared,
        INPUTS.len() + 1,
        "helm rendered {compared} results"
    );
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The values file of the brief: Helm reads it with `-f`; the key `n` becomes `"false"`.
const VALUES_FILE: &str = "a: yes\nb: \"yes\"\nc: on\nd: 0755\ne: 1_000\nf: 0x1F\ng: 2001-12-14\n\
h: ~\ni: 1e3\nk: y\nl: 0b101\nm: +12\nn: 12.50\no: 123456789012345678901\np: -0o17\n";
