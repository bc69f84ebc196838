//! The JSON view of a stored body.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("body is not JSON: {0}")]
    NotJson(String),
    #[error("form body has no `payload` field")]
    NoPayloadField,
    #[error("unsupported content type {0}: send JSON")]
    UnsupportedContentType(String),
    /// Valid JSON of another kind (SPEC section 3: an array or a scalar is refused).
    #[error("body is JSON but {0}, not an object: a webhook body must be a JSON object")]
    NotObject(&'static str),
}

/// What a JSON document is, from its first byte, for [`PayloadError::NotObject`].
fn kind(json: &[u8]) -> &'static str {
    match json.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// The media type as sent (parameters dropped); compared ignoring case, without a lower-cased
/// copy: ingest reads it for every delivery.
fn media_type(content_type: Option<&str>) -> &str {
    content_type
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
}

fn is_multipart(media: &str) -> bool {
    media
        .as_bytes()
        .get(..MULTIPART.len())
        .is_some_and(|m| m.eq_ignore_ascii_case(MULTIPART.as_bytes()))
}

const FORM: &str = "application/x-www-form-urlencoded";
const MULTIPART: &str = "multipart/";

pub fn is_form(content_type: Option<&str>) -> bool {
    media_type(content_type).eq_ignore_ascii_case(FORM)
}

/// Whether [`payload_json`] reads this body as it is (neither a form nor multipart).
pub fn is_json(content_type: Option<&str>) -> bool {
    let media = media_type(content_type);
    !is_multipart(media) && !media.eq_ignore_ascii_case(FORM)
}

/// Parse a body as JSON. A form-encoded body (GitHub's other delivery format) carries its JSON
/// in the `payload` field; multipart is refused. Other types are tried as JSON, since providers
/// label JSON in many ways (`text/plain`, vendor `+json` types).
pub fn payload_json(raw: &[u8], content_type: Option<&str>) -> Result<Value, PayloadError> {
    let media = media_type(content_type);
    if is_multipart(media) {
        return Err(PayloadError::UnsupportedContentType(
            media.to_ascii_lowercase(),
        ));
    }
    if is_form(content_type) {
        let json = form_urlencoded::parse(raw)
            .find(|(k, _)| k == "payload")
            .map(|(_, v)| v.into_owned())
            .ok_or(PayloadError::NoPayloadField)?;
        return serde_json::from_str(&json).map_err(|e| PayloadError::NotJson(e.to_string()));
    }
    serde_json::from_slice(raw).map_err(|e| PayloadError::NotJson(e.to_string()))
}

/// The few top-level fields ingest needs (`id`, `event_id`, `type`), read without building the
/// whole document: everything else is passed over, though checked as strictly as serde_json
/// reads a document ([`Checked`]). A repeated key keeps its last value, as in a parsed object.
#[derive(Debug, Default)]
pub struct Peek {
    pub id: Option<Scalar>,
    pub event_id: Option<Scalar>,
    pub event_type: Option<Scalar>,
}

impl<'de> serde::Deserialize<'de> for Peek {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Peek;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Peek, A::Error> {
                let mut peek = Peek::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        "id" => peek.id = Some(map.next_value()?),
                        "event_id" => peek.event_id = Some(map.next_value()?),
                        "type" => peek.event_type = Some(map.next_value()?),
                        _ => map.next_value::<Checked>().map(|_| ())?,
                    }
                }
                Ok(peek)
            }
        }
        d.deserialize_map(Fields)
    }
}

/// A JSON value read and dropped, checked as building a [`Value`] checks it: its strings are
/// decoded (a lone surrogate escape is refused), its numbers read, its depth bounded. serde's
/// `IgnoredAny` only skips: serde_json passes over escapes in a skipped string unchecked, so a
/// body it would refuse as a document could be stored (found by the `peek` fuzz target).
struct Checked;

impl<'de> serde::Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> serde::de::Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

/// A string or a number; anything else in these fields is ignored.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar(pub Option<String>);

impl Scalar {
    fn of(value: &Value) -> Scalar {
        Scalar(match value {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
    }
}

/// Read straight from the document, without building a [`Value`] first: a string is copied
/// once, a number is written as `Value` would write it, and anything else is checked as
/// [`Checked`] checks it and gives no scalar.
impl<'de> serde::Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl ScalarVisitor {
    fn number(n: serde_json::Number) -> Scalar {
        Scalar(Some(n.to_string()))
    }
}

impl<'de> serde::de::Visitor<'de> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Scalar, E> {
        Ok(Scalar(None))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Scalar, E> {
        Ok(Self::number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Scalar, E> {
        Ok(Self::number(n.into()))
    }

    fn visit_f64<E>(self, n: f64) -> Result<Scalar, E> {
        // JSON has no NaN or infinity, so serde_json never hands one over.
        Ok(Scalar(
            serde_json::Number::from_f64(n).map(|n| n.to_string()),
        ))
    }

    fn visit_str<E>(self, s: &str) -> Result<Scalar, E> {
        Ok(Scalar(Some(s.to_owned())))
    }

    fn visit_string<E>(self, s: String) -> Result<Scalar, E> {
        Ok(Scalar(Some(s)))
    }

    fn visit_unit<E>(self) -> Result<Scalar, E> {
        Ok(Scalar(None))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Scalar, A::Error> {
        serde::de::Visitor::visit_seq(CheckedVisitor, seq).map(|_| Scalar(None))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Scalar, A::Error> {
        serde::de::Visitor::visit_map(CheckedVisitor, map).map(|_| Scalar(None))
    }
}

impl Peek {
    pub fn id(&self) -> Option<String> {
        self.id.as_ref().and_then(|s| s.0.clone())
    }

    pub fn event_id(&self) -> Option<String> {
        self.event_id.as_ref().and_then(|s| s.0.clone())
    }

    /// Types are names: a number there is not a type. Taken, not copied: the type is the
    /// last thing ingest reads of a peek.
    pub fn into_event_type(self) -> Option<String> {
        self.event_type
            .and_then(|s| s.0)
            .filter(|t| t.parse::<f64>().is_err())
    }
}

/// Check that the body is JSON (or a form carrying JSON) and read its id and type fields.
pub fn peek(raw: &[u8], content_type: Option<&str>) -> Result<Peek, PayloadError> {
    let media = media_type(content_type);
    if is_multipart(media) {
        return Err(PayloadError::UnsupportedContentType(
            media.to_ascii_lowercase(),
        ));
    }
    if is_form(content_type) {
        let json = payload_json(raw, content_type)?;
        if !json.is_object() {
            let text = json.to_string();
            return Err(PayloadError::NotObject(kind(text.as_bytes())));
        }
        return Ok(serde_json::from_value(json).unwrap_or_default());
    }
    // JSON is UTF-8. Checked first and whole, because serde_json does not check the strings it
    // skips: a field peek ignores could otherwise hold bytes no later reader can parse.
    let text =
        std::str::from_utf8(raw).map_err(|e| PayloadError::NotJson(format!("not UTF-8: {e}")))?;
    // Only an object has fields. (A derived struct would also read an array positionally.)
    let is_object = raw.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if is_object {
        match serde_json::from_str::<Peek>(text) {
            Ok(p) => Ok(p),
            // Valid JSON the fast path refuses (a repeated key): read it whole, the last value
            // of a key winning, rather than refuse an authentic delivery.
            Err(e) if e.is_data() => {
                let value: Value =
                    serde_json::from_str(text).map_err(|e| PayloadError::NotJson(e.to_string()))?;
                let scalar = |name: &str| value.get(name).map(Scalar::of);
                Ok(Peek {
                    id: scalar("id"),
                    event_id: scalar("event_id"),
                    event_type: scalar("type"),
                })
            }
            Err(e) => Err(PayloadError::NotJson(e.to_string())),
        }
    } else {
        serde_json::from_str::<Checked>(text).map_err(|e| PayloadError::NotJson(e.to_string()))?;
        Err(PayloadError::NotObject(kind(raw)))
    }
}

#[cfg(test)]
mod tests {
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
}
