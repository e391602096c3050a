//! Durations written the Kubernetes way (`100ms`, `10s`, `1m30s`), as `metav1.Duration` does.
//!
//! The accepted grammar is the integer subset of Go's `time.ParseDuration`: one or more
//! `<digits><unit>` terms with units `ns`, `us`, `ms`, `s`, `m` and `h`. The CRD schema carries
//! the same grammar as a `pattern`, so the API server and Floodgate agree on what is valid.
//! Values are printed back in the canonical form (`90s` prints as `1m30s`).
//!
//! Why not `kube::core::Duration`: its parser multiplies with `Duration::mul_f64`, which panics
//! on overflow (`99999999999999999999h` would crash whoever loads the config), it accepts
//! negative durations, and it prints `10m` back as `600s`. A config loader must refuse bad input
//! with an error, never a panic, so this type keeps a strict, checked integer parser.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The schema pattern: the same grammar [`KubeDuration::from_str`] accepts.
pub const DURATION_PATTERN: &str = "^([0-9]+(ns|us|ms|s|m|h))+$";

/// Units in the order they are tried when parsing and printing, largest first.
const UNITS: [(&str, Duration); 6] = [
    ("h", Duration::from_secs(3600)),
    ("m", Duration::from_secs(60)),
    ("s", Duration::from_secs(1)),
    ("ms", Duration::from_millis(1)),
    ("us", Duration::from_micros(1)),
    ("ns", Duration::from_nanos(1)),
];

/// A non-negative duration in Kubernetes notation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeDuration(pub Duration);

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: {why} (expected terms like 100ms, 10s, 1m30s; units ns, us, ms, s, m, h)"
)]
pub struct DurationError {
    input: String,
    why: &'static str,
}

impl KubeDuration {
    /// A duration of `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }

    /// A duration of `s` seconds.
    pub const fn from_secs(s: u64) -> Self {
        Self(Duration::from_secs(s))
    }

    /// The standard-library duration.
    pub const fn get(self) -> Duration {
        self.0
    }
}

impl From<KubeDuration> for Duration {
    fn from(d: KubeDuration) -> Self {
        d.0
    }
}

impl FromStr for KubeDuration {
    type Err = DurationError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |why| DurationError {
            input: input.to_owned(),
            why,
        };
        if input.is_empty() {
            return Err(err("empty"));
        }
        let mut total = Duration::ZERO;
        let mut rest = input;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if digits == 0 {
                return Err(err("each term must start with a whole number"));
            }
            let value: u64 = rest[..digits]
                .parse()
                .map_err(|_| err("number too large"))?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit = UNITS
                .iter()
                .find(|(name, _)| *name == &rest[..unit_len])
                .map(|(_, d)| *d)
                .ok_or_else(|| {
                    err(if unit_len == 0 {
                        "missing unit"
                    } else {
                        "unknown unit"
                    })
                })?;
            rest = &rest[unit_len..];
            let term = u32::try_from(value)
                .ok()
                .and_then(|v| unit.checked_mul(v))
                .ok_or_else(|| err("too large"))?;
            total = total.checked_add(term).ok_or_else(|| err("too large"))?;
        }
        Ok(Self(total))
    }
}

impl fmt::Display for KubeDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_zero() {
            return f.write_str("0s");
        }
        let mut left = self.0;
        for (name, unit) in UNITS {
            let n = left.as_nanos() / unit.as_nanos();
            if n > 0 {
                write!(f, "{n}{name}")?;
                left -= unit * u32::try_from(n).map_err(|_| fmt::Error)?;
            }
        }
        Ok(())
    }
}

impl Serialize for KubeDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for KubeDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Cow::<'de, str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for KubeDuration {
    fn schema_name() -> Cow<'static, str> {
        "KubeDuration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Duration {
        s.parse::<KubeDuration>().expect(s).0
    }

    #[test]
    fn parses_kubernetes_notation() {
        assert_eq!(d("100ms"), Duration::from_millis(100));
        assert_eq!(d("10s"), Duration::from_secs(10));
        assert_eq!(d("10m"), Duration::from_secs(600));
        assert_eq!(d("1h"), Duration::from_secs(3600));
        assert_eq!(d("1m30s"), Duration::from_secs(90));
        assert_eq!(d("2s500ms"), Duration::from_millis(2500));
        assert_eq!(d("7us"), Duration::from_micros(7));
        assert_eq!(d("0s"), Duration::ZERO);
    }

    #[test]
    fn refuses_what_go_would_refuse_or_we_do_not_support() {
        for bad in [
            "",
            "10",
            "s",
            "1.5s",
            "10 s",
            "-1s",
            "1d",
            "1min",
            "ms10",
            "99999999999h",
        ] {
            assert!(
                bad.parse::<KubeDuration>().is_err(),
                "{bad:?} must be refused"
            );
        }
    }

    #[test]
    fn prints_canonically_and_round_trips() {
        for (input, canon) in [
            ("90s", "1m30s"),
            ("1000ms", "1s"),
            ("0ms", "0s"),
            ("3h", "3h"),
        ] {
            let parsed: KubeDuration = input.parse().expect(input);
            assert_eq!(parsed.to_string(), canon);
            assert_eq!(canon.parse::<KubeDuration>().expect(canon), parsed);
        }
    }

    proptest::proptest! {
        #[test]
        fn any_duration_round_trips(nanos in 0u64..10_000_000_000_000) {
            let d = KubeDuration(Duration::from_nanos(nanos));
            let printed = d.to_string();
            proptest::prop_assert_eq!(printed.parse::<KubeDuration>().expect("printed form parses"), d);
        }
    }
}
