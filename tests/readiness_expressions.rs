//! The readiness annotations as chart authors write them: both spellings of the expressions,
//! every operator, values of every type, KOTS properties, timeouts, and malformed text (a clear
//! error naming the annotation, never a panic).

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use sequenced::readiness::{self, RuleError, Rules, Verdict, expr};
use serde_json::{Value, json};

fn parse_rules(pairs: &[(&str, &str)]) -> Result<Rules, RuleError> {
    let annotations: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Rules::from_annotations(&annotations)
}

fn success(expression: &str) -> Rules {
    parse_rules(&[(readiness::SUCCESS_ANNOTATION, expression)])
        .unwrap_or_else(|e| panic!("{expression}: {e}"))
}

/// A Job-like object with the given status.
fn object(status: Value) -> Value {
    json!({
        "apiVersion": "example.com/v1",
        "kind": "Task",
        "metadata": {"name": "barz", "generation": 1},
        "status": status,
    })
}

fn verdict(rules: &Rules, status: Value) -> Verdict {
    readiness::check(&object(status), rules, None, Duration::from_secs(300))
}

fn is_ready(expression: &str, status: Value) -> bool {
    verdict(&success(expression), status).is_ready()
}

#[test]
fn both_spellings_and_every_way_of_writing_the_list() {
    let done = json!({"succeeded": 1});
    let running = json!({"active": 1, "succeeded": 0});
    for annotation in [
        // The sequencing proposal (as a string: annotations are strings).
        r#"["succeeded==1"]"#,
        // HIP-0025.
        r#"["{.succeeded} == 1"]"#,
        r#"[ "{ .succeeded } == 1" ]"#,
        // A leading dot, no braces.
        r#"[".succeeded == 1"]"#,
        // YAML flow list, single quotes, no quotes.
        "['succeeded==1']",
        "[succeeded==1]",
        // A bare expression.
        "succeeded==1",
        "  {.succeeded}==1  ",
        // A path from the object root, as Helm's implementation also accepts.
        r#"["{.status.succeeded} == 1"]"#,
        ".status.succeeded==1",
    ] {
        assert!(is_ready(annotation, done.clone()), "{annotation}");
        assert!(!is_ready(annotation, running.clone()), "{annotation}");
    }
}

#[test]
fn every_operator_on_numbers() {
    let status = json!({"n": 2});
    for (expression, expected) in [
        ("n == 2", true),
        ("n == 3", false),
        ("n != 3", true),
        ("n != 2", false),
        ("n < 3", true),
        ("n < 2", false),
        ("n <= 2", true),
        ("n <= 1", false),
        ("n > 1", true),
        ("n > 2", false),
        ("n >= 2", true),
        ("n >= 3", false),
        // Spaces are optional.
        ("n>=2", true),
        ("n<3", true),
        ("n!=2", false),
    ] {
        assert_eq!(
            is_ready(expression, status.clone()),
            expected,
            "{expression}"
        );
    }
}

#[test]
fn integers_and_floats_compare_numerically() {
    for (expression, status, expected) in [
        ("n == 1", json!({"n": 1.0}), true),
        ("n == 1.0", json!({"n": 1}), true),
        ("n > 0.5", json!({"n": 1}), true),
        ("n < 1.5", json!({"n": 2}), false),
        ("n == -2", json!({"n": -2}), true),
        ("n >= 1e3", json!({"n": 1000}), true),
        (
            "n == 9007199254740993",
            json!({"n": 9_007_199_254_740_993_u64}),
            true,
        ),
        (
            "n == 9007199254740993",
            json!({"n": 9_007_199_254_740_992_u64}),
            false,
        ),
        ("n == 18446744073709551615", json!({"n": u64::MAX}), true),
        // A number written as a string in the status still compares as a number.
        ("n >= 2", json!({"n": "3"}), true),
        ("n == 3", json!({"n": "3"}), true),
    ] {
        assert_eq!(
            is_ready(expression, status.clone()),
            expected,
            "{expression} on {status}"
        );
    }
}

#[test]
fn strings_quoted_or_not() {
    let status = json!({"phase": "Running", "message": "all good, really"});
    for (expression, expected) in [
        (r#"phase == "Running""#, true),
        ("phase == 'Running'", true),
        ("phase==Running", true),
        ("{.phase} == Running", true),
        (r#"phase != "Failed""#, true),
        (r#"phase == "running""#, false),
        (r#"message == "all good, really""#, true),
        (r#"["message == \"all good, really\""]"#, true),
        (r#"phase == "Run\"ning""#, false),
    ] {
        assert_eq!(
            is_ready(expression, status.clone()),
            expected,
            "{expression}"
        );
    }
}

#[test]
fn booleans_and_condition_statuses() {
    let status = json!({
        "ready": true,
        "stale": false,
        "conditions": [
            {"type": "Progressing", "status": "True"},
            {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
        ],
    });
    for (expression, expected) in [
        ("ready == true", true),
        ("ready == false", false),
        ("stale != true", true),
        // A boolean literal matches the condition status strings.
        (
            r#"{.conditions[?(@.type=="Progressing")].status} == true"#,
            true,
        ),
        (
            r#"{.conditions[?(@.type=="Available")].status} == true"#,
            false,
        ),
        (
            r#"{.conditions[?(@.type=="Available")].status} == "False""#,
            true,
        ),
        (
            "{.conditions[1].reason} == MinimumReplicasUnavailable",
            true,
        ),
        ("{.conditions[-1].status} == False", true),
        ("{.conditions[0].status} == True", true),
        // "True" is a string; "true" the boolean: both match a boolean true.
        ("ready == True", false),
        ("ready == \"true\"", true),
    ] {
        assert_eq!(
            is_ready(expression, status.clone()),
            expected,
            "{expression}"
        );
    }
}

#[test]
fn type_mixes_never_match_by_accident() {
    let status = json!({"n": 1, "s": "abc", "b": true, "o": {"a": 1}, "l": [1], "z": null});
    for (expression, expected) in [
        ("n == \"1\"", true), // a quoted number matches the number
        ("n == true", false),
        ("s == 1", false),
        ("s > 1", false), // not a number: ordering is false
        ("b == 1", false),
        ("b == \"true\"", true),
        ("o == 1", false),
        ("o != 1", true), // the path exists: != is the negation of ==
        ("l == 1", false),
        // A missing or null path is false whatever the operator.
        ("missing == 1", false),
        ("missing != 1", false),
        ("z != 1", false),
        ("n.deeper == 1", false),
        ("l[5] == 1", false),
    ] {
        assert_eq!(
            is_ready(expression, status.clone()),
            expected,
            "{expression}"
        );
    }
}

#[test]
fn nested_paths_and_quoted_names() {
    let status = json!({"a": {"b": {"c": 3}}, "labels": {"app.kubernetes.io/name": "web"}});
    assert!(is_ready(".a.b.c == 3", status.clone()));
    assert!(is_ready("a.b.c == 3", status.clone()));
    assert!(is_ready("{.a.b.c} >= 3", status.clone()));
    assert!(is_ready("{.a['b'].c} == 3", status.clone()));
    assert!(is_ready(
        r#"{.labels["app.kubernetes.io/name"]} == web"#,
        status
    ));
}

#[test]
fn any_success_expression_is_enough_and_failure_wins() {
    let rules = parse_rules(&[
        (
            readiness::SUCCESS_ANNOTATION,
            r#"["succeeded >= 1", "phase == Done"]"#,
        ),
        (
            readiness::FAILURE_ANNOTATION,
            r#"["failed >= 1", "phase == Error"]"#,
        ),
    ])
    .unwrap();
    assert!(verdict(&rules, json!({"phase": "Done"})).is_ready());
    assert!(verdict(&rules, json!({"succeeded": 2})).is_ready());
    assert_eq!(
        verdict(&rules, json!({"succeeded": 1, "failed": 1})),
        Verdict::Failed(
            "Task barz: failure condition failed >= 1 is true (status.failed is 1)".into()
        )
    );
    assert_eq!(
        verdict(&rules, json!({"phase": "Error", "succeeded": 1})),
        Verdict::Failed(
            "Task barz: failure condition phase == Error is true (status.phase is \"Error\")"
                .into()
        )
    );
    assert_eq!(
        verdict(&rules, json!({"phase": "Pending"})),
        Verdict::InProgress(
            "Task barz: waiting for one of succeeded >= 1 (status.succeeded is missing), \
             phase == Done (status.phase is \"Pending\")"
                .into()
        )
    );
    assert!(rules.is_custom());
}

#[test]
fn custom_expressions_replace_the_built_in_rule() {
    // A Deployment that the built-in rule calls ready, with a success expression that is not.
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "generation": 1,
                     "annotations": {"helm.sh/readiness-success": "[\"{.replicas} == 5\"]"}},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                   "readyReplicas": 1, "availableReplicas": 1,
                   "conditions": [{"type": "Available", "status": "True"}]},
    });
    let rules = Rules::from_object(&deployment).unwrap();
    assert!(rules.is_custom());
    assert_eq!(
        readiness::assess(&deployment, &rules),
        Verdict::InProgress("waiting for {.replicas} == 5 (status.replicas is 1)".into())
    );
    assert!(readiness::assess(&deployment, &Rules::default()).is_ready());
}

#[test]
fn failure_expressions_alone_keep_the_built_in_rule() {
    let rules = parse_rules(&[(readiness::FAILURE_ANNOTATION, "failed > 0")]).unwrap();
    assert!(!rules.is_custom());
    assert!(!rules.is_empty());
    let ready_condition =
        json!({"conditions": [{"type": "Ready", "status": "False", "reason": "Waiting"}]});
    assert_eq!(
        verdict(&rules, ready_condition),
        Verdict::InProgress("Task barz: Ready is False (Waiting)".into())
    );
}

#[test]
fn kots_wait_for_properties_all_must_match() {
    let rules = parse_rules(&[(
        readiness::WAIT_FOR_PROPERTIES_ANNOTATION,
        ".status.tasks.extract=true, .status.tasks.count=3,.status.phase=Done,.metadata.name=barz",
    )])
    .unwrap();
    assert!(rules.is_custom());
    assert!(rules.waits_in_kots_phases());
    assert_eq!(rules.properties().len(), 4);
    let done = json!({"tasks": {"extract": true, "count": 3}, "phase": "Done"});
    assert!(verdict(&rules, done).is_ready());
    let partly = json!({"tasks": {"extract": true, "count": 2}});
    assert_eq!(
        verdict(&rules, partly),
        Verdict::InProgress(
            "Task barz: waiting for .status.tasks.count=3 (status.tasks.count is 2); \
             .status.phase=Done (status.phase is missing)"
                .into()
        )
    );
}

#[test]
fn kots_properties_in_other_spellings() {
    for annotation in [
        "{.status.phase}=Done",
        "status.phase=Done",
        ".status.phase = Done",
        ".status.phase==Done",
        ".status.phase=\"Done\"",
        ".status.phase='Done',",
    ] {
        let rules = parse_rules(&[(readiness::WAIT_FOR_PROPERTIES_ANNOTATION, annotation)])
            .unwrap_or_else(|e| panic!("{annotation}: {e}"));
        assert!(
            verdict(&rules, json!({"phase": "Done"})).is_ready(),
            "{annotation}"
        );
        assert!(
            !verdict(&rules, json!({"phase": "Do"})).is_ready(),
            "{annotation}"
        );
    }
    // A value with spaces needs no quotes (the value runs to the comma).
    let rules = parse_rules(&[(
        readiness::WAIT_FOR_PROPERTIES_ANNOTATION,
        ".status.message=all done",
    )])
    .unwrap();
    assert!(verdict(&rules, json!({"message": "all done"})).is_ready());
}

#[test]
fn kots_wait_for_ready_keeps_the_built_in_rule() {
    for (text, expected) in [
        ("true", Some(true)),
        ("'false'", None),
        ("False", Some(false)),
        ("1", Some(true)),
    ] {
        let parsed = parse_rules(&[(readiness::WAIT_FOR_READY_ANNOTATION, text)]);
        match expected {
            Some(value) => {
                let parsed = parsed.unwrap();
                assert_eq!(parsed.wait_for_ready(), Some(value));
                assert!(!parsed.is_custom());
                assert_eq!(parsed.waits_in_kots_phases(), value);
            }
            None => {
                let error = parsed.unwrap_err();
                assert_eq!(error.category(), "bad_wait_for_ready");
                assert!(
                    error.to_string().contains("kots.io/wait-for-ready"),
                    "{error}"
                );
            }
        }
    }
}

#[test]
fn timeouts_from_the_annotation_or_the_release() {
    let rules = parse_rules(&[
        (readiness::SUCCESS_ANNOTATION, "succeeded == 1"),
        (readiness::TIMEOUT_ANNOTATION, "20s"),
    ])
    .unwrap();
    assert_eq!(rules.timeout(), Some(Duration::from_secs(20)));
    let running = object(json!({"succeeded": 0}));
    let at = |waited: u64, default: u64| {
        readiness::check(
            &running,
            &rules,
            Some(Duration::from_secs(waited)),
            Duration::from_secs(default),
        )
    };
    assert_eq!(
        at(19, 300),
        Verdict::InProgress("Task barz: waiting for succeeded == 1 (status.succeeded is 0)".into())
    );
    assert_eq!(
        at(20, 300),
        Verdict::Failed(
            "readiness timeout after 20s: Task barz: waiting for succeeded == 1 (status.succeeded is 0)"
                .into()
        )
    );
    // The override beats a shorter default, too.
    assert!(matches!(at(19, 5), Verdict::InProgress(_)));
    // Without an override the release's timeout applies.
    let plain = success("succeeded == 1");
    let late = readiness::check(
        &running,
        &plain,
        Some(Duration::from_secs(90)),
        Duration::from_secs(90),
    );
    assert_eq!(
        late,
        Verdict::Failed(
            "readiness timeout after 1m30s: Task barz: waiting for succeeded == 1 (status.succeeded is 0)"
                .into()
        )
    );
    for (text, seconds) in [
        ("500ms", 0.5),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
    ] {
        let rules = parse_rules(&[(readiness::TIMEOUT_ANNOTATION, text)]).unwrap();
        assert_eq!(
            rules.timeout(),
            Some(Duration::from_secs_f64(seconds)),
            "{text}"
        );
        assert!(!rules.is_custom());
    }
}

#[test]
fn malformed_annotations_are_clear_errors_naming_annotation_and_text() {
    let success = readiness::SUCCESS_ANNOTATION;
    let failure = readiness::FAILURE_ANNOTATION;
    let properties = readiness::WAIT_FOR_PROPERTIES_ANNOTATION;
    let timeout = readiness::TIMEOUT_ANNOTATION;
    for (annotation, text, message) in [
        (success, "[a,", "not a valid list of expressions"),
        (
            success,
            r#"["succeeded==1""#,
            "not a valid list of expressions",
        ),
        (success, "succeeded=>1", "unknown operator \"=>\""),
        (
            success,
            "succeeded = 1",
            "unknown operator \"=\" (did you mean ==?)",
        ),
        (success, "succeeded =! 1", "unknown operator \"=!\""),
        (success, "succeeded ~= 1", "unknown operator \"~=\""),
        (success, "succeeded===1", "unknown operator \"===\""),
        (success, "== 1", "expected a path"),
        (success, "{} == 1", "empty path"),
        (success, "{.} == 1", "expected a field name after \".\""),
        (
            success,
            "{.succeeded == 1",
            "expected '}' to close the path",
        ),
        (success, ".a..b == 1", "expected a field name after \".\""),
        (success, "succeeded", "expected an operator"),
        (success, "succeeded 1", "expected an operator"),
        (success, "succeeded ==", "missing value after =="),
        (success, "phase == \"Running", "unterminated string"),
        (success, "phase == 'Running", "unterminated string"),
        (success, "phase == Run\"ning", "stray quote"),
        (
            success,
            "phase == Running now",
            "unexpected \"now\" after the value",
        ),
        (
            success,
            "n < abc",
            "operator < compares numbers, and \"abc\" is not a number",
        ),
        (success, "n >= true", "operator >= compares numbers"),
        (success, "a[*] == 1", "wildcards (*) are not supported"),
        (success, "a.* == 1", "wildcards (*) are not supported"),
        (
            success,
            "a[x] == 1",
            "expected an index, a quoted name or a filter",
        ),
        (success, "a[0 == 1", "expected ']' to close the bracket"),
        (success, "a[99999999999999999999] == 1", "is not an index"),
        (
            success,
            "a[?(@.b == 1] == 1",
            "expected ')' to close the filter",
        ),
        (
            success,
            "a[?(b == 1)] == 1",
            "expected '@' at the start of a filter",
        ),
        (
            success,
            "a[?(@.b)] == 1",
            "expected an operator (== != < <= > >=) after the path @.b",
        ),
        (success, "a[?(@.b ==)] == 1", "missing value after =="),
        (
            success,
            "[1]",
            "list element 1 is 1, not an expression string",
        ),
        (
            success,
            "[{.succeeded} == 1]",
            "write a list of quoted strings",
        ),
        (
            success,
            "[{.succeeded}]",
            "quote expressions that use {.path}",
        ),
        (success, "a == 1,", "empty expression (a stray comma?)"),
        (success, "[\"\"]", "empty expression"),
        (failure, "failed=>1", "unknown operator \"=>\""),
        (
            properties,
            ".status.a",
            "expected = after the path .status.a",
        ),
        (properties, ".status.a!=1", "expected = after the path"),
        (properties, "=x", "expected a path"),
        (properties, ",,", "no properties"),
        (properties, ".status.a=\"x", "unterminated string"),
        (timeout, "20", "has no unit"),
        (timeout, "soon", "expected a number"),
        (timeout, "-5s", "negative"),
        (timeout, "5d", "unknown unit \"d\""),
    ] {
        let error = parse_rules(&[(annotation, text)]).expect_err(text);
        let shown = error.to_string();
        assert!(shown.contains(annotation), "{text}: {shown}");
        assert!(
            shown.contains(message),
            "{text}: expected {message:?} in {shown}"
        );
        // The bad text is quoted.
        let quoted = format!("{:?}", text.trim());
        assert!(
            shown.contains(&quoted) || shown.contains(text.trim()),
            "{text}: {shown}"
        );
        assert!(!error.category().is_empty());
    }
}

#[test]
fn errors_in_a_list_name_the_expression() {
    let error = parse_rules(&[(
        readiness::SUCCESS_ANNOTATION,
        r#"["succeeded==1", "failed=>1"]"#,
    )])
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "annotation helm.sh/readiness-success: \"failed=>1\": unknown operator \"=>\" \
         (use one of == != < <= > >=) (in \"[\\\"succeeded==1\\\", \\\"failed=>1\\\"]\")"
    );
    assert_eq!(error.category(), "bad_readiness_expression");
}

#[test]
fn blank_annotations_mean_no_rule() {
    let rules = parse_rules(&[
        (readiness::SUCCESS_ANNOTATION, " "),
        (readiness::FAILURE_ANNOTATION, "[]"),
    ])
    .unwrap();
    assert!(!rules.is_custom());
    assert!(rules.success_expressions().is_empty() && rules.failure_expressions().is_empty());
}

#[test]
fn non_string_annotations_in_hand_written_objects() {
    let with = |annotations: Value| {
        Rules::from_object(
            &json!({"kind": "Job", "metadata": {"name": "x", "annotations": annotations}}),
        )
    };
    let rules = with(
        json!({"helm.sh/readiness-success": ["succeeded==1", "{.ok} == true"],
                            "kots.io/wait-for-ready": true,
                            "unrelated": {"a": 1}}),
    )
    .unwrap();
    assert_eq!(rules.success_expressions().len(), 2);
    assert_eq!(rules.wait_for_ready(), Some(true));
    let error = with(json!({"helm.sh/readiness-failure": {"failed": 1}})).unwrap_err();
    assert_eq!(
        error.to_string(),
        "annotation helm.sh/readiness-failure: the value is a mapping; annotation values are strings, so quote it"
    );
    assert_eq!(error.category(), "bad_annotation");
}

#[test]
fn parse_duration_matches_the_crd_pattern() {
    // Every duration the CRD accepts parses.
    for text in [
        "0s",
        "30s",
        "5m",
        "1h30m",
        "250ms",
        "1.5h",
        "10m0s",
        "2h45m30.5s",
    ] {
        assert!(readiness::parse_duration(text).is_ok(), "{text}");
    }
}

/// Arbitrary text, weighted towards the characters the grammar cares about.
fn expression_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("{".to_string()),
        Just("}".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just("?(@".to_string()),
        Just(".".to_string()),
        Just(",".to_string()),
        Just("\"".to_string()),
        Just("'".to_string()),
        Just("\\".to_string()),
        Just("==".to_string()),
        Just("=".to_string()),
        Just("!=".to_string()),
        Just("<".to_string()),
        Just(">=".to_string()),
        Just(" ".to_string()),
        Just("-".to_string()),
        Just("*".to_string()),
        Just("succeeded".to_string()),
        Just("status".to_string()),
        Just("true".to_string()),
        Just("1".to_string()),
        Just("1e309".to_string()),
        Just("-9223372036854775808".to_string()),
        "[a-z0-9]{1,3}",
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// Whatever the text, parsing and evaluating never panics, and an error names the annotation.
    #[test]
    fn the_parsers_never_panic(text in expression_text()) {
        let target = json!({
            "metadata": {"name": "x", "generation": 1},
            "status": {"succeeded": 1, "a": [{"b": "c"}, 2, null], "status": {"x": true}},
        });
        for annotation in [
            readiness::SUCCESS_ANNOTATION,
            readiness::FAILURE_ANNOTATION,
            readiness::WAIT_FOR_PROPERTIES_ANNOTATION,
            readiness::TIMEOUT_ANNOTATION,
        ] {
            match parse_rules(&[(annotation, &text)]) {
                Ok(rules) => {
                    let _ = readiness::check(&target, &rules, Some(Duration::from_secs(1)), Duration::from_secs(2));
                }
                Err(error) => {
                    prop_assert!(error.to_string().contains(annotation), "{}", error);
                }
            }
        }
        let _ = expr::Path::parse(&text);
    }

    /// Anything at all, including invalid structure and control characters.
    #[test]
    fn arbitrary_strings_never_panic(text in any::<String>()) {
        let _ = expr::parse_expressions(&text);
        let _ = expr::parse_properties(&text);
        let _ = readiness::parse_duration(&text);
    }

    /// A parsed path prints in a form that parses back to the same path.
    #[test]
    fn paths_print_back_to_themselves(text in expression_text()) {
        if let Ok(path) = expr::Path::parse(&text) {
            let printed = path.to_string();
            let again = expr::Path::parse(&printed);
            prop_assert_eq!(again.as_ref().ok(), Some(&path), "{} printed as {}", text, printed);
        }
    }
}
