//! The config's `[[subscriptions]]`, validated through [`crate::subscriptions::validate`] (the
//! one check of the config, the API and the CLI), each mistake named by its key. Here, above
//! `subscriptions`, so that the subscriptions read none of the config: it hands them the values
//! they need (`[consumers]`' defaults, `downstream.mode`).

use super::{ConfigError, Settings};
use crate::signature::Secret;
use crate::subscriptions::{FieldError, Subscription, implicit_with, valid_name, validate};

fn in_config(i: usize, e: FieldError) -> ConfigError {
    ConfigError::Invalid {
        key: format!("subscriptions[{i}].{}", e.field),
        message: e.message,
    }
}

/// The three subscriptions of a config that names none (SPEC section 13).
pub fn implicit_subscriptions(settings: &Settings) -> Vec<Subscription> {
    implicit_with(&settings.consumers, settings.downstream.mode)
}

/// The config's subscriptions, validated, or the implicit three when it names none.
pub fn subscriptions_of(settings: &Settings) -> Result<Vec<Subscription>, ConfigError> {
    if settings.subscriptions.is_empty() {
        return Ok(implicit_subscriptions(settings));
    }
    let mut seen = std::collections::HashSet::new();
    settings
        .subscriptions
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if valid_name(&s.name) && !seen.insert(s.name.as_str()) {
                return Err(in_config(
                    i,
                    FieldError {
                        field: "name".into(),
                        message: format!("subscription `{}` is defined twice", s.name),
                    },
                ));
            }
            validate(s, &settings.consumers, settings.downstream.mode).map_err(|e| in_config(i, e))
        })
        .collect()
}

/// Refuse a `pull` subscription's token that is also the admin token, a submission token or
/// another subscription's: each token opens its own routes and no others. Run once every
/// token is known (generated ones included).
pub fn check_tokens(subs: &[Subscription], settings: &Settings) -> Result<(), ConfigError> {
    let mut seen: Vec<&str> = std::iter::once(&settings.admin_token)
        .chain(&settings.submission_tokens)
        .chain(&settings.listen_tokens)
        .map(Secret::expose)
        .collect();
    for sub in subs {
        if let Some(token) = &sub.token {
            if seen.contains(&token.expose()) {
                return Err(ConfigError::Invalid {
                    key: format!("subscriptions.{}.token", sub.name),
                    message: "is also the admin token, a submission or listen token or \
                              another subscription's token: give each its own"
                        .into(),
                });
            }
            seen.push(token.expose());
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "subscriptions_tests.rs"]
mod tests;
