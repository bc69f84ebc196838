use super::program::{Ran, compile, run};
use super::{MAX_PROGRAM_BYTES, Transform};

fn ran(code: &str, body: &str) -> Ran {
    run(&compile(code).unwrap(), body.as_bytes(), 1024)
}

#[test]
fn one_output_is_delivered_none_is_filtered_several_or_an_error_fail() {
    assert_eq!(
        ran("{id: .id, n: (.n + 1)}", r#"{"id":"a","n":1}"#),
        Ran::One(br#"{"id":"a","n":2}"#.to_vec())
    );
    assert_eq!(ran("select(.n > 5)", r#"{"n":1}"#), Ran::Nothing);
    let Ran::Failed(several) = ran(".[]", "[1,2]") else {
        panic!()
    };
    assert!(several.contains("more than one output"), "{several}");
    let Ran::Failed(error) = ran(".a + 1", r#"{"a":"x"}"#) else {
        panic!()
    };
    assert!(error.starts_with("the program failed: "), "{error}");
    let Ran::Failed(not_json) = ran(".", "a=1") else {
        panic!()
    };
    assert!(not_json.contains("the body is not JSON"), "{not_json}");
    let Ran::Failed(big) = ran("[range(1000)]", "null") else {
        panic!()
    };
    assert!(big.contains("over the budget of 1024"), "{big}");
    let Ran::Failed(nan) = ran("nan", "null") else {
        panic!()
    };
    assert!(nan.contains("not JSON"), "{nan}");
}

#[test]
fn a_program_that_does_not_compile_is_refused_with_where() {
    for (code, words) in [
        (".a |", "expected term, found the end at 1:5"),
        ("{a: .b", "expected closing brace at 1:7"),
        (
            "nosuchfunction(1)",
            "undefined filter `nosuchfunction` at 1:1",
        ),
        (".x | $nope", "undefined variable `$nope` at 1:6"),
        ("import \"lib\" as l; .", "cannot import"),
        ("  ", "an empty program"),
    ] {
        let err = Transform::parse(code).unwrap_err();
        assert!(err.contains(words), "{code}: {err}");
    }
    let long = format!(".a{}", " ".repeat(MAX_PROGRAM_BYTES));
    assert!(
        Transform::parse(&long)
            .unwrap_err()
            .contains("over the limit of 16384")
    );
}

#[test]
fn the_deepest_program_within_the_limit_is_checked_without_overflowing() {
    for open in ["[", "(", "{a:"] {
        let depth = MAX_PROGRAM_BYTES / open.len() - 1;
        let code = open.repeat(depth);
        assert!(Transform::parse(&code).is_err());
    }
    let nested = format!("{}.{}", "[".repeat(5000), "]".repeat(5000));
    assert!(Transform::parse(&nested).is_ok());
}

/// The first output of `code` on `body` as jaq's `Display` prints it (the slow way, which the
/// jq corpus test goes by).
fn displayed(code: &str, body: &str) -> String {
    compile(code).unwrap().displayed(body.as_bytes())
}

/// The output is written by hand where it is plainly JSON: the same bytes as `Display`, escapes
/// and numbers included.
#[test]
fn outputs_are_written_as_jaqs_display_writes_them() {
    let controls: String = (0u8..0x20).chain([0x7f]).map(char::from).collect();
    let escaped = serde_json::to_string(&format!("{controls}\"\\ é 😀 \u{2028}")).unwrap();
    for (code, body) in [
        (".", escaped.clone()),
        (
            ".",
            format!(r#"{{"k\"\\": [{escaped}, 1], "": {{}}, "e": []}}"#),
        ),
        (
            ".",
            "[0, -1, 9223372036854775807, 123456789012345678901234567890, 1.5, 12.50, -0.0]".into(),
        ),
        (
            ".",
            r#"[1e300, 2E-7, 1.0e2, true, false, null, {"a": {"b": [[], [{}]]}}]"#.into(),
        ),
        (
            r#"[.a * 1.5, 1 / 3, .a / 0.1, 1e300 * 10, "\(.)", (.s | ascii_downcase)]"#,
            format!(r#"{{"a": 7, "s": {escaped}}}"#),
        ),
        ("{b: (.a + 0.25), c: -.a}", r#"{"a": 0.5}"#.into()),
    ] {
        let display = displayed(code, &body);
        assert_eq!(
            ran(code, &body),
            Ran::One(display.into_bytes()),
            "{code} on {body}"
        );
    }
}

/// However deep, as `Display` writes it.
#[test]
fn deep_outputs_are_written_whole() {
    let deep = "reduce range(1000) as $x (1; [.])";
    assert_eq!(
        run(&compile(deep).unwrap(), b"null", 4096),
        Ran::One(displayed(deep, "null").into_bytes())
    );
}

/// A program that only builds JSON out of the body's fields runs without jaq's interpreter
/// (`template`): the outcome is jaq's, byte for byte, on every body, including those where the
/// template gives up and jaq runs it (a field of a string, an interpolated number).
#[test]
fn templates_give_what_jaq_gives() {
    let programs = [
        r#"{order: .data.order_id, customer: .data.customer_id, points: .data.points, type, label: "order \(.data.order_id)"}"#,
        ".",
        ".data",
        ".data.points",
        r#"."a b".c"#,
        r#".["data"]["order_id"]"#,
        r#"{"k\"ey": .a, "é\u00e9\n": {n: {m: .a.b}}, "": []}"#,
        r#"[.a, .data.order_id, "x", {}, [], "\(.a)-\(.data.customer_id)\t\u263A"]"#,
        r#""just text""#,
        r#""\(.)""#,
        "{a}",
        "{}",
        "[]",
    ];
    let bodies = [
        r#"{"type": "order.completed", "data": {"order_id": "ord-1", "customer_id": "c\"1", "points": 12.50}}"#,
        r#"{"type": null, "data": {"order_id": 7, "points": 123456789012345678901234567890}}"#,
        r#"{"data": "a string", "a": "x"}"#,
        r#"{"data": [1, 2], "a": {"b": 1e300}}"#,
        r#"{"data": null, "a": "\u0000\u001f\u007f é 😀"}"#,
        r#"{"a": 1, "a": "second", "a b": {"c": [true, false, null]}}"#,
        r#"{"data": {"order_id": "\ud800"}}"#,
        "null",
        "[]",
        "3",
        r#""text""#,
    ];
    for code in programs {
        let fast = compile(code).unwrap();
        assert!(fast.has_template(), "{code} is a template");
        let slow = compile(code).unwrap().jaq_only();
        for body in bodies {
            assert_eq!(
                run(&fast, body.as_bytes(), 1024),
                run(&slow, body.as_bytes(), 1024),
                "{code} on {body}"
            );
        }
    }
    let template = compile(programs[0]).unwrap();
    assert_eq!(
        run(&template, bodies[0].as_bytes(), 60),
        run(
            &compile(programs[0]).unwrap().jaq_only(),
            bodies[0].as_bytes(),
            60
        )
    );
    assert!(
        matches!(run(&template, bodies[0].as_bytes(), 60), Ran::Failed(m) if m.contains("over the budget of 60"))
    );
}

/// What could give no output, several, or other than the field as written, is jaq's to run.
#[test]
fn programs_that_do_more_than_pick_fields_are_not_templates() {
    for code in [
        ".a?",
        ".[0]",
        ".[]",
        "{a: 1}",
        "{(.k): .v}",
        "{a: .x, a: .y}",
        ". as $x | {$x}",
        "{a: (.x, .y)}",
        r#"@base64 "\(.a)""#,
        r#""\(.a + 1)""#,
        "def f: .; {a: f}",
        ".a | .b",
        "null",
        "[.a, .b?]",
    ] {
        assert!(!compile(code).unwrap().has_template(), "{code}");
    }
}
