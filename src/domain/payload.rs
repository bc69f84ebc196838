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
#[path = "payload_tests.rs"]
mod tests;
