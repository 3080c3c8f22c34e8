//! [`Secret`], [`mask_url`] and the lenient string deserializers settings use (the config's
//! own and the agent's, such as an MCP server's): a leaf every module may use.
//!
//! A value that was exactly one `${VAR}` may have been turned into an integer, float or boolean
//! by env substitution (so numeric settings can come from the environment); string settings
//! therefore accept those scalars too and take their text. Empty strings count as absent for
//! every optional string and secret.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, Visitor};

/// A secret value: deserialized from a plain string, printed as `***`, never serialized.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret in clear, for the one place that must send or check it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl<'de> de::Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TextVisitor).map(Self)
    }
}

/// Accepts a string, or a scalar that env substitution typed, as text.
struct TextVisitor;

impl Visitor<'_> for TextVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }
}

/// A required string setting (anything built from a `String`).
pub(crate) fn string<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: From<String>,
{
    deserializer.deserialize_any(TextVisitor).map(T::from)
}

/// A list of ids; numbers are taken as their text (`[12345]` is `["12345"]`), since
/// platform ids often look like numbers.
pub(crate) fn strings<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    struct Text(String);
    impl<'de> serde::Deserialize<'de> for Text {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_any(TextVisitor).map(Text)
        }
    }
    let texts: Vec<Text> = serde::Deserialize::deserialize(deserializer)?;
    Ok(texts.into_iter().map(|Text(text)| text).collect())
}

/// A list of ids (allowlists, admins): a list as [`strings`] reads it, or one string of ids
/// separated by commas, so that a list can come from one environment variable
/// (`admins = "${ANTLER_TELEGRAM_ADMINS:-}"`; empty is no ids).
pub(crate) fn ids<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    struct Ids;
    impl<'de> de::Visitor<'de> for Ids {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of ids, or one string of ids separated by commas")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(v.split(',')
                .map(str::trim)
                .filter(|id| !id.is_empty())
                .map(str::to_owned)
                .collect())
        }

        // One id alone, from a variable holding a number (`ANTLER_TELEGRAM_ADMINS=42`).
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(vec![v.to_string()])
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(vec![v.to_string()])
        }

        fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            strings(de::value::SeqAccessDeserializer::new(seq))
        }
    }
    deserializer.deserialize_any(Ids)
}

/// An optional string setting; empty means absent.
pub(crate) fn opt_string<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    let text = deserializer.deserialize_any(TextVisitor)?;
    Ok((!text.is_empty()).then_some(text))
}

/// An optional secret; empty means absent.
pub(crate) fn opt_secret<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Secret>, D::Error> {
    Ok(opt_string(deserializer)?.map(Secret))
}

/// An optional socket address (`host:port`); empty means absent.
pub(crate) fn opt_socket_addr<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<std::net::SocketAddr>, D::Error> {
    let Some(text) = opt_string(deserializer)? else {
        return Ok(None);
    };
    // The parse error is replaced rather than forwarded so that the text never reaches a
    // message (std's error does not quote it today; this keeps it so).
    text.parse().map(Some).map_err(|_| {
        de::Error::custom("invalid socket address syntax (expected ip:port, e.g. 127.0.0.1:9090)")
    })
}

/// `url` with any password replaced by `***`, for display.
pub(crate) fn mask_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            if parsed.set_password(Some("***")).is_ok() {
                parsed.to_string()
            } else {
                "<url with credentials>".to_owned()
            }
        }
        _ => url.to_owned(),
    }
}
