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
    let compiled = compile(code).unwrap();
    let input = jaq_json::read::parse_single(body.as_bytes()).unwrap();
    let lut = jaq_core::Ctx::<jaq_core::data::JustLut<jaq_json::Val>>::new(
        &compiled.lut,
        jaq_core::Vars::new([]),
    );
    let mut outputs = compiled.id.run((lut, input)).map(jaq_core::unwrap_valr);
    outputs.next().unwrap().unwrap().to_string()
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
