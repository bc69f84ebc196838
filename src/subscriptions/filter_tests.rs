use serde_json::json;

use super::*;

fn parse(v: Value) -> Result<Filter, FilterError> {
    Filter::parse(&v)
}

fn matches(filter: Value, body: &str) -> bool {
    parse(filter).unwrap().matches(body.as_bytes())
}

/// The shapes of SPEC section 13 and the issue's TOML example read, and read back from the
/// form they are kept and shown in.
#[test]
fn the_documented_shapes_read_and_round_trip() {
    let toml_text = r#"filter = { all = [ { path = "/data/object/currency", eq = "usd" },
                                 { path = "/data/object/amount", gte = 1000 } ] }"#;
    let table: toml::Table = toml::from_str(toml_text).unwrap();
    let value = serde_json::to_value(&table["filter"]).unwrap();
    let filter = parse(value.clone()).unwrap();
    assert_eq!(filter.to_json(), value);
    for v in [
        json!({"path": "/data/object/currency", "eq": "usd"}),
        json!({"any": [{"path": "/a", "in": ["x", 1, true]}, {"not": {"path": "/b", "exists": true}}]}),
        json!({"path": "/a", "gte": 10, "lt": 20}),
        json!({"path": "/a~1b/c~0d", "prefix": "ev_"}),
    ] {
        assert_eq!(parse(v.clone()).unwrap().to_json(), v);
    }
}

/// A filter that cannot compile is refused naming where, the pointer and the operator.
#[test]
fn a_bad_filter_names_the_path_and_the_operator() {
    let cases = [
        (
            json!({"path": "/amount", "gte": {"a": 1}}),
            "`/amount` `gte`: takes a number or a string, not an object",
        ),
        (
            json!({"path": "/amount", "between": [1, 2]}),
            "`/amount`: unknown operator `between`",
        ),
        (
            json!({"path": "amount", "eq": 1}),
            "`path` must be a JSON pointer",
        ),
        (
            json!({"path": "/a//b", "eq": 1}),
            "`path` `/a//b`: an empty segment",
        ),
        (
            json!({"path": "/items/0", "eq": 1}),
            "looks like an array position",
        ),
        (
            json!({"path": "/a\"b", "eq": 1}),
            "a quote or a control character",
        ),
        (
            json!({"all": [{"path": "/a", "eq": 1}, {"path": "/b", "in": []}]}),
            "all[1]: `/b` `in`: takes a non-empty list",
        ),
        (
            json!({"any": [{"not": {"path": "/c", "exists": "yes"}}]}),
            "any[0].not: `/c` `exists`: takes true or false, not a string",
        ),
        (
            json!({"path": "/a", "eq": null}),
            "`/a` `eq`: takes a string, a number or a boolean, not null",
        ),
        (
            json!({"path": "/a", "eq": "x\u{0}y"}),
            "not a string with U+0000",
        ),
        (
            json!({"path": "/a", "in": ["x", [1]]}),
            "`/a` `in`: takes a list of strings, numbers or booleans only, not a list",
        ),
        (json!({"path": "/a"}), "`/a`: a condition needs an operator"),
        (json!({"all": []}), "`all` takes a non-empty list"),
        (
            json!({"all": [{"path": "/a", "eq": 1}], "path": "/b"}),
            "`all` stands alone",
        ),
        (json!({"eq": 1}), "a condition needs `path`"),
        (json!("currency = usd"), "a filter is an object"),
        (
            json!({"path": "/a", "prefix": ""}),
            "`/a` `prefix`: takes a non-empty string",
        ),
        (
            json!({"path": "/a", "lt": true}),
            "`/a` `lt`: takes a number or a string, not a boolean",
        ),
    ];
    for (value, expected) in cases {
        let error = parse(value.clone()).unwrap_err().to_string();
        assert!(error.contains(expected), "{value}: {error}");
    }
    let deep = (0..12).fold(json!({"path": "/a", "eq": 1}), |f, _| json!({"not": f}));
    assert!(
        parse(deep)
            .unwrap_err()
            .to_string()
            .contains("nested deeper")
    );
    let many: Vec<Value> = (0..300).map(|i| json!(i)).collect();
    assert!(
        parse(json!({"path": "/a", "in": many}))
            .unwrap_err()
            .to_string()
            .contains("at most")
    );
}

/// The rules of the module's doc, in Rust (the stores are held to the same by the corpus).
#[test]
fn numbers_strings_missing_fields_and_bodies_that_are_not_json() {
    let amount = |op: &str, v: Value| json!({"path": "/amount", op: v});
    assert!(matches(amount("eq", json!(1000)), r#"{"amount": 1000.0}"#));
    assert!(matches(amount("eq", json!(1000.0)), r#"{"amount": 1000}"#));
    assert!(matches(amount("eq", json!(1000)), r#"{"amount": 1e3}"#));
    assert!(!matches(amount("eq", json!(1000)), r#"{"amount": "1000"}"#));
    assert!(!matches(amount("eq", json!("1000")), r#"{"amount": 1000}"#));
    assert!(!matches(
        amount("gte", json!(1000)),
        r#"{"amount": "2000"}"#
    ));
    assert!(matches(amount("gte", json!(999.5)), r#"{"amount": 1000}"#));
    assert!(matches(amount("lt", json!(1000)), r#"{"amount": 999.999}"#));
    assert!(!matches(amount("eq", json!(1)), r#"{"amount": true}"#));
    assert!(matches(amount("ne", json!("usd")), r#"{"amount": 5}"#));
    assert!(!matches(amount("ne", json!(5)), r#"{}"#));
    assert!(!matches(amount("nin", json!([5])), r#"{}"#));
    assert!(matches(json!({"not": amount("eq", json!(5))}), r#"{}"#));
    assert!(!matches(json!({"not": amount("eq", json!(5))}), "amount=5"));
    assert!(matches(amount("exists", json!(false)), r#"{"other": 1}"#));
    assert!(matches(
        amount("exists", json!(true)),
        r#"{"amount": null}"#
    ));
    assert!(!matches(amount("exists", json!(false)), "not json"));
    assert!(!matches(
        json!({"path": "/a/b", "exists": true}),
        r#"{"a": [{"b": 1}]}"#
    ));
    assert!(!matches(
        json!({"path": "/a/b", "exists": true}),
        r#"{"a": "b"}"#
    ));
    assert!(matches(
        json!({"path": "/id", "prefix": "ev_"}),
        r#"{"id": "ev_1"}"#
    ));
    assert!(matches(
        json!({"path": "/id", "gt": "b"}),
        r#"{"id": "ba"}"#
    ));
    assert!(matches(json!({"path": "/id", "lt": "é"}), r#"{"id": "z"}"#));
    // Exactly, as SQLite compares an integer with a real: no rounding to a double.
    assert!(!matches(
        amount("eq", json!(9007199254740992.0)),
        r#"{"amount": 9007199254740993}"#
    ));
    assert!(matches(
        amount("gt", json!(9007199254740992.0)),
        r#"{"amount": 9007199254740993}"#
    ));
}
