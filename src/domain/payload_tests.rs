use super::*;

/// The direct reading gives what reading a whole `Value` gave, numbers written alike, and
/// refuses what that refused.
#[test]
fn a_scalar_reads_as_it_would_through_a_value() {
    for text in [
        "\"evt_1\"",
        "\"a\\u00e9\\n\"",
        "\"\"",
        "0",
        "-0",
        "42",
        "-9223372036854775808",
        "18446744073709551615",
        "12345678901234567890123",
        "1.5",
        "-0.0",
        "1e20",
        "1E-7",
        "2.5e+300",
        "null",
        "true",
        "false",
        "[]",
        "[1, \"x\", {\"y\": [null]}]",
        "{}",
        "{\"a\": 1}",
        "\"\\ud800\"",
        "[\"\\udfff\"]",
        "{\"k\": 1e999}",
        "01",
        "[1,]",
    ] {
        let direct = serde_json::from_str::<Scalar>(text).map_err(|e| e.to_string());
        let through_value = serde_json::from_str::<Value>(text)
            .map(|v| Scalar::of(&v))
            .map_err(|e| e.to_string());
        assert_eq!(
            direct.is_ok(),
            through_value.is_ok(),
            "{text}: {direct:?} {through_value:?}"
        );
        if let (Ok(a), Ok(b)) = (direct, through_value) {
            assert_eq!(a, b, "{text}");
        }
    }
}

#[test]
fn peek_reads_ids_and_type_and_checks_the_rest_is_json() {
    let p = peek(br#"{"id":"evt_1","type":"a.b","data":{"x":[1,2]}}"#, None).unwrap();
    assert_eq!(
        (p.id(), p.into_event_type()),
        (Some("evt_1".into()), Some("a.b".into()))
    );
    let p = peek(br#"{"event_id":42,"type":7}"#, Some("application/json")).unwrap();
    assert_eq!(
        (p.event_id(), p.into_event_type()),
        (Some("42".into()), None)
    );
    for (body, what) in [
        (&b" [1, 2, 3]"[..], "an array"),
        (b"\"evt\"", "a string"),
        (b"42", "a number"),
        (b"null", "null"),
        (b"true", "a boolean"),
    ] {
        assert_eq!(peek(body, None).unwrap_err(), PayloadError::NotObject(what));
    }
    let form = b"payload=%5B1%5D";
    assert_eq!(
        peek(form, Some("application/x-www-form-urlencoded")).unwrap_err(),
        PayloadError::NotObject("an array")
    );
    assert!(matches!(
        peek(b"{\"id\": ", None),
        Err(PayloadError::NotJson(_))
    ));
    assert!(matches!(
        peek(b"not json", None),
        Err(PayloadError::NotJson(_))
    ));
    let form = b"payload=%7B%22type%22%3A%22push%22%7D";
    let p = peek(form, Some("application/x-www-form-urlencoded")).unwrap();
    assert_eq!(p.into_event_type(), Some("push".into()));
    assert!(matches!(
        peek(b"--x", Some("multipart/form-data; boundary=x")),
        Err(PayloadError::UnsupportedContentType(_))
    ));
}

/// Media types compare ignoring case, their parameters dropped.
#[test]
fn media_types_are_read_whatever_their_case() {
    let form = Some("Application/X-WWW-Form-URLEncoded; charset=utf-8");
    assert!(is_form(form) && !is_json(form));
    let p = peek(b"payload=%7B%22type%22%3A%22push%22%7D", form).unwrap();
    assert_eq!(p.into_event_type(), Some("push".into()));
    assert!(!is_json(Some(" MULTIPART/Mixed; boundary=x")));
    assert!(is_json(Some("Application/JSON")) && is_json(None) && is_json(Some("multi")));
    assert_eq!(
        peek(b"--x", Some("Multipart/Form-Data; boundary=x")).unwrap_err(),
        PayloadError::UnsupportedContentType("multipart/form-data".into())
    );
}

/// What serde_json refuses as a document, peek refuses wherever it sits, in the fields it
/// reads or those it passes over (fuzz: `{" i": "\ud83d^u$e00"}` was accepted).
#[test]
fn a_skipped_field_is_checked_as_a_document_is() {
    let deep = format!("{{\"x\":{}{}}}", "[".repeat(200), "]".repeat(200));
    for body in [
        r#"{" i": "\ud83d^u$e00"}"#,
        r#"{"note": "\ud83d"}"#,
        r#"{"n": 1e400}"#,
        r#"{"data": {"a": ["\udc00"]}}"#,
        r#"["\ud83d"]"#,
        deep.as_str(),
    ] {
        assert!(serde_json::from_str::<Value>(body).is_err(), "{body}");
        assert!(
            matches!(peek(body.as_bytes(), None), Err(PayloadError::NotJson(_))),
            "{body}: {:?}",
            peek(body.as_bytes(), None)
        );
    }
    // Surrogate pairs and escapes that are whole are fine, and the last of a repeated
    // key wins, as in a parsed object.
    let p = peek(
        br#"{"e":"\ud83d\ude00","type":"a","type":"b","id":1}"#,
        None,
    )
    .unwrap();
    assert_eq!(
        (p.id(), p.into_event_type()),
        (Some("1".into()), Some("b".into()))
    );
}

/// Invalid UTF-8 inside a string is not JSON, wherever the string is: serde_json skips the
/// fields peek ignores without checking them (fuzz/found/peek-invalid-utf8-in-string).
#[test]
fn invalid_utf8_anywhere_is_not_json() {
    for body in [
        &b"\"t\xffext\""[..],
        b"{\"id\":\"evt_1\",\"note\":\"t\xffext\"}",
        b"{\"id\":\"evt_1\",\"t\xffext\":1}",
        b"{\"id\":\"evt_1\",\"data\":[\"\xc3\"]}",
        b"[\"\xed\xa0\x80\"]",
    ] {
        assert!(serde_json::from_slice::<Value>(body).is_err());
        match peek(body, Some("application/json")) {
            Err(PayloadError::NotJson(message)) => assert!(message.contains("UTF-8")),
            other => panic!("{body:?}: {other:?}"),
        }
    }
}
