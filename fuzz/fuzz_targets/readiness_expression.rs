//! Fuzzes the readiness annotation parsers: whatever the text, parsing returns a value or an
//! error, and evaluating what parsed returns a verdict; nothing panics.
#![no_main]

use std::collections::BTreeMap;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use sequenced::readiness::{self, Rules, expr};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let object = serde_json::json!({
        "apiVersion": "example.com/v1",
        "kind": "Task",
        "metadata": {"name": "x", "generation": 2},
        "status": {
            "observedGeneration": 2,
            "succeeded": 1,
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "a": [{"b": [1, 2.5, "3"]}, null, true],
            "status": {"nested": "yes"},
        },
    });
    for annotation in [
        readiness::SUCCESS_ANNOTATION,
        readiness::FAILURE_ANNOTATION,
        readiness::WAIT_FOR_PROPERTIES_ANNOTATION,
        readiness::TIMEOUT_ANNOTATION,
        readiness::WAIT_FOR_READY_ANNOTATION,
    ] {
        let annotations = BTreeMap::from([(annotation.to_string(), text.to_string())]);
        match Rules::from_annotations(&annotations) {
            Ok(rules) => {
                let _ = readiness::check(
                    &object,
                    &rules,
                    Some(Duration::from_secs(3)),
                    Duration::from_secs(2),
                );
            }
            Err(error) => assert!(error.to_string().contains(annotation)),
        }
    }
    if let Ok(path) = expr::Path::parse(text) {
        // What a path prints parses back to the same path.
        assert_eq!(expr::Path::parse(&path.to_string()).ok(), Some(path));
    }
});
