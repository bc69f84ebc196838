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
