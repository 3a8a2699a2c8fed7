//! The corpus of bad charts in tests/plan-corpus: each is rendered by the real helm and linted
//! by the `sequenced` binary, and the output must hold the expected messages.

use sequenced_testkit as support;

use std::path::Path;
use std::process::Command;

fn lint(chart: &Path) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_sequenced"))
        .arg("lint")
        .arg(chart)
        .env("SEQUENCED_HELM", support::helm())
        .output()
        .expect("run sequenced");
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.code().unwrap_or(-1), text)
}

#[test]
fn every_bad_chart_gets_its_message() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/plan-corpus");
    let mut cases: Vec<_> = std::fs::read_dir(&corpus)
        .expect("read the corpus")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(cases.len() >= 12, "the corpus is missing: {cases:?}");
    let mut failures = Vec::new();
    for case in &cases {
        let expected = std::fs::read_to_string(case.join("expected")).expect("expected file");
        let mut lines = expected.lines();
        let exit: i32 = lines
            .next()
            .and_then(|l| l.strip_prefix("exit "))
            .and_then(|n| n.parse().ok())
            .expect("first line: exit N");
        let (code, output) = lint(case);
        let name = case.file_name().unwrap_or_default().to_string_lossy();
        if code != exit {
            failures.push(format!("{name}: exit {code}, expected {exit}\n{output}"));
        }
        for line in lines.filter(|l| !l.is_empty()) {
            if !output.contains(line) {
                failures.push(format!("{name}: missing {line:?} in\n{output}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
