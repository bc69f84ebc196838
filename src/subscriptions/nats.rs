//! A `nats` subscription's settings (SPEC section 13): the broker's URL and the subject
//! template, checked the same way at start and in the API (the subject an event is published
//! to is [`super::template::fill`]'s).

use super::settings::FieldError;

/// A creds file is a JWT of a few hundred bytes and a seed, with their banners.
const MAX_CREDS_FILE_BYTES: u64 = 64 * 1024;

fn invalid(field: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        message: message.into(),
    }
}

/// A `nats` subscription's `url`, `subject` and `stream`, checked: its subject and stream.
pub fn destination(
    url: &str,
    subject: Option<&str>,
    stream: Option<&str>,
) -> Result<(Option<String>, Option<String>), FieldError> {
    check_url(url)?;
    let subject =
        subject.ok_or_else(|| invalid("subject", "a `nats` subscription needs the subject"))?;
    check_subject(subject)?;
    if let Some(stream) = stream {
        check_stream(stream)?;
    }
    Ok((Some(subject.to_string()), stream.map(str::to_string)))
}

/// `nats://` or `tls://`, with a host; credentials (`user:password@`, or a token as the user)
/// may be in it. Never echoed: it may hold them.
pub fn check_url(url: &str) -> Result<(), FieldError> {
    match reqwest::Url::parse(url) {
        Ok(u)
            if matches!(u.scheme(), "nats" | "tls")
                && u.host_str().is_some_and(|h| !h.is_empty()) =>
        {
            Ok(())
        }
        _ => Err(invalid(
            "url",
            "must be a nats:// or tls:// URL with a host (credentials as user:password@ or \
             token@)",
        )),
    }
}

/// A subject template: dot-separated tokens, none empty, no wildcard (`*`, `>`), no space,
/// and no `{…}` but `{source}` and `{type}`.
pub fn check_subject(template: &str) -> Result<(), FieldError> {
    let filled = super::template::skeleton(template);
    let bad = filled.is_empty()
        || filled.len() > 255
        || filled.split('.').any(|token| {
            token.is_empty()
                || token.chars().any(|c| {
                    c.is_whitespace() || c.is_control() || matches!(c, '*' | '>' | '{' | '}')
                })
        });
    if bad {
        return Err(invalid(
            "subject",
            format!(
                "`{template}` is not a subject to publish to: dot-separated tokens, none \
                 empty, without spaces or wildcards (`*`, `>`), at most 255 characters; \
                 `{{source}}` and `{{type}}` are the only placeholders"
            ),
        ));
    }
    Ok(())
}

/// A `creds_file` holds a user JWT and its nkey seed, as `nsc generate creds` writes them, on
/// the disk of the node that reads it. Read as the client reads it at connect; the broker
/// checks the JWT's signatures and expiry there (an attempt it refuses names the cause).
pub fn check_creds_file(file: &str) -> Result<(), FieldError> {
    let bytes = super::target::read_file("creds_file", file, MAX_CREDS_FILE_BYTES)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| invalid("creds_file", format!("`{file}` is not a text file")))?;
    // Its messages name what is missing, never the JWT or the seed.
    async_nats::ConnectOptions::with_credentials(&text).map_err(|e| {
        invalid(
            "creds_file",
            format!("`{file}` is not a creds file (a user JWT and an nkey seed): {e}"),
        )
    })?;
    Ok(())
}

/// A stream name as JetStream takes it: no space, `.`, `*`, `>`, path separator.
pub fn check_stream(stream: &str) -> Result<(), FieldError> {
    if stream.is_empty()
        || stream.len() > 255
        || stream
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || ".*>/\\".contains(c))
    {
        return Err(invalid(
            "stream",
            "a JetStream stream name: not empty, without spaces, `.`, `*`, `>`, `/` or `\\`",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_and_urls_are_checked() {
        for good in ["webhooks.{source}.{type}", "a", "x-{type}_y"] {
            assert!(check_subject(good).is_ok(), "{good}");
        }
        for bad in ["", "a..b", ".a", "a.*", "a.>", "a b", "{nope}", "a.{source"] {
            assert_eq!(check_subject(bad).unwrap_err().field, "subject", "{bad}");
        }
        assert!(check_url("nats://127.0.0.1:4222").is_ok());
        assert!(check_url("tls://user:pw@nats.internal").is_ok());
        for bad in ["http://x", "nats://", "127.0.0.1:4222"] {
            assert_eq!(check_url(bad).unwrap_err().field, "url", "{bad}");
        }
        assert!(check_stream("WEBHOOKS").is_ok());
        assert!(check_stream("a.b").is_err());
    }
}
