//! `[telemetry]`: OpenTelemetry traces (SPEC section 15), off unless an endpoint is set.

use serde::Deserialize;

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySettings {
    /// Where spans are exported over OTLP/HTTP (protobuf), e.g.
    /// `http://127.0.0.1:4318/v1/traces`; the path is used as given. Empty: no spans are made.
    pub otlp_endpoint: String,
    /// The share of new traces sampled (0.0 to 1.0). A provider's `traceparent` decides for
    /// its own trace: sampled there, sampled here.
    pub sample_ratio: f64,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        TelemetrySettings {
            otlp_endpoint: String::new(),
            sample_ratio: 1.0,
        }
    }
}

impl TelemetrySettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(invalid(
                "telemetry.sample_ratio",
                "must be between 0.0 and 1.0",
            ));
        }
        let endpoint = self.otlp_endpoint.trim();
        if !endpoint.is_empty()
            && !endpoint.starts_with("http://")
            && !endpoint.starts_with("https://")
        {
            return Err(invalid(
                "telemetry.otlp_endpoint",
                "must be an http:// or https:// URL (the collector's OTLP/HTTP traces path, \
                 usually ending in /v1/traces), or empty to make no spans",
            ));
        }
        Ok(())
    }
}
