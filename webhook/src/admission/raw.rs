//! Reading an AdmissionReview without building a tree of it: the envelope and the parts of
//! the objects the rules read are kept as borrowed slices of the body ([`RawValue`]) until
//! they are decoded into typed values, and every part is counted before it is decoded.
//!
//! A JSON tree costs far more than its text: a `serde_json::Value` of `{"name":"E1","value":"x"}`
//! takes some 700 bytes for 26 of text, so a dense 4 MiB body grew the process by 170 MiB.
//! Here the bytes that are never judged (`managedFields`, `status` but for its version) are
//! skipped without allocating, and what is decoded holds at most [`MAX_VALUES`] JSON values.

use std::cell::Cell;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// Most JSON values (objects, arrays, strings, numbers, booleans, nulls; keys not counted)
/// that one decoded part may hold: the request envelope without its objects, an object's
/// `metadata` without `managedFields`, an object's `spec`. A spec of 50 members' worth of
/// settings has a few hundred; the bound keeps the typed copy of a part under about 4 MiB.
pub const MAX_VALUES: usize = 10_000;

/// The top level of an AdmissionReview: its type and its request, unread.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Envelope<'a> {
    pub api_version: String,
    pub kind: String,
    #[serde(borrow, default)]
    pub request: Option<&'a RawValue>,
}

/// The top-level fields of an object the rules read, unread.
#[derive(Deserialize)]
pub(crate) struct ObjectParts<'a> {
    #[serde(borrow, default)]
    pub metadata: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub spec: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub status: Option<&'a RawValue>,
}

/// A part holds more JSON values than [`MAX_VALUES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{part} holds more than {limit} JSON values")]
pub struct TooManyValues {
    /// Which part: `request`, `metadata`, `spec`.
    pub part: &'static str,
    /// The limit.
    pub limit: usize,
}

/// The JSON type of a raw value, from its first character.
pub(crate) fn kind_of(raw: &RawValue) -> de::Unexpected<'static> {
    match raw.get().trim_start().as_bytes().first() {
        Some(b'{') => de::Unexpected::Map,
        Some(b'[') => de::Unexpected::Seq,
        Some(b'"') => de::Unexpected::Other("a string"),
        Some(b't') => de::Unexpected::Bool(true),
        Some(b'f') => de::Unexpected::Bool(false),
        Some(b'n') => de::Unexpected::Unit,
        _ => de::Unexpected::Other("a number"),
    }
}

/// Whether the raw value is a JSON object.
pub(crate) fn is_object(raw: &RawValue) -> bool {
    matches!(kind_of(raw), de::Unexpected::Map)
}

/// Checks that `raw` holds at most `limit` JSON values, without allocating, skipping the
/// values of the object keys in `skip` at its top level. `raw` is valid JSON (serde_json
/// checked it when it cut the slice).
pub(crate) fn check_values(
    raw: &RawValue,
    skip: &[&str],
    part: &'static str,
    limit: usize,
) -> Result<(), TooManyValues> {
    measure(raw, skip, part, limit).map(|_| ())
}

/// [`check_values`] that also answers the length in bytes of the longest string (keys not
/// counted) outside the skipped keys, in the same pass.
pub(crate) fn measure(
    raw: &RawValue,
    skip: &[&str],
    part: &'static str,
    limit: usize,
) -> Result<usize, TooManyValues> {
    let left = Cell::new(limit);
    let longest = Cell::new(0);
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let counted = Counter {
        left: &left,
        longest: &longest,
        skip,
        top: true,
    }
    .deserialize(&mut de);
    match counted {
        Ok(()) => Ok(longest.get()),
        // Valid JSON fails only when the budget runs out (or nesting passes serde_json's
        // limit of 128, which the typed decoding reports with its path).
        Err(_) if left.get() == 0 => Err(TooManyValues { part, limit }),
        Err(_) => Ok(longest.get()),
    }
}

/// JSON values in `body` (keys not counted), counting at most `cap`: what the decoded copies of
/// a review may cost is proportional to it. Counting allocates nothing; a body that is not
/// JSON counts what was read before the error.
pub fn count_values(body: &[u8], cap: usize) -> usize {
    let left = Cell::new(cap);
    let mut de = serde_json::Deserializer::from_slice(body);
    let _ = Counter {
        left: &left,
        longest: &Cell::new(0),
        skip: &[],
        top: false,
    }
    .deserialize(&mut de);
    cap - left.get()
}

struct Counter<'b> {
    left: &'b Cell<usize>,
    longest: &'b Cell<usize>,
    skip: &'b [&'b str],
    top: bool,
}

impl Counter<'_> {
    fn tick<E: de::Error>(&self) -> Result<(), E> {
        match self.left.get() {
            0 => Err(E::custom("too many JSON values")),
            n => {
                self.left.set(n - 1);
                Ok(())
            }
        }
    }

    fn child(&self) -> Counter<'_> {
        Counter {
            left: self.left,
            longest: self.longest,
            skip: &[],
            top: false,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Counter<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

/// A key, kept only to compare with the skipped ones.
struct Key(bool);

struct KeyVisitor<'b>(&'b [&'b str]);

impl<'de> DeserializeSeed<'de> for KeyVisitor<'_> {
    type Value = Key;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyVisitor<'_> {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(Key(self.0.contains(&v)))
    }
}

impl<'de> Visitor<'de> for Counter<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.tick()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.tick()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.tick()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.tick()
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.longest.set(self.longest.get().max(v.len()));
        self.tick()
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.tick()
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.tick()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.tick()?;
        while seq.next_element_seed(self.child())?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.tick()?;
        let skip = if self.top { self.skip } else { &[] };
        while let Some(Key(skipped)) = map.next_key_seed(KeyVisitor(skip))? {
            if skipped {
                map.next_value::<IgnoredAny>()?;
            } else {
                map.next_value_seed(self.child())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_string()).expect("valid JSON")
    }

    #[test]
    fn values_are_counted_to_the_limit() {
        // An object, two keys' values: 3 values.
        let r = raw(r#"{"a": 1, "b": [true, null, "x"]}"#);
        assert_eq!(check_values(&r, &[], "spec", 6), Ok(()));
        assert_eq!(
            check_values(&r, &[], "spec", 5),
            Err(TooManyValues {
                part: "spec",
                limit: 5
            })
        );
        // Skipped keys are not counted, at the top level only.
        assert_eq!(check_values(&r, &["b"], "spec", 2), Ok(()));
        let nested = raw(r#"{"x": {"b": [1, 2, 3]}}"#);
        assert!(check_values(&nested, &["b"], "spec", 4).is_err());
    }

    #[test]
    fn a_dense_array_is_refused_without_reading_all_of_it() {
        let text = format!("[{}1]", "{\"n\":\"v\"},".repeat(100_000));
        let r = raw(&text);
        let e = check_values(&r, &[], "spec", MAX_VALUES).expect_err("too many");
        assert_eq!(e.to_string(), "spec holds more than 10000 JSON values");
    }

    #[test]
    fn a_body_is_counted_up_to_the_cap() {
        assert_eq!(count_values(br#"{"a": [1, 2, {"b": null}]}"#, 100), 6);
        assert_eq!(count_values(br#"[1, 2, 3, 4, 5]"#, 3), 3);
        assert_eq!(count_values(b"{nope", 100), 1);
    }

    #[test]
    fn the_longest_string_is_measured_outside_skipped_keys() {
        let r = raw(r#"{"a": "xyz", "object": "0123456789", "b": {"object": "12345"}}"#);
        assert_eq!(measure(&r, &["object"], "request", 100), Ok(5));
        assert_eq!(measure(&r, &[], "request", 100), Ok(10));
    }

    #[test]
    fn kinds_come_from_the_first_character() {
        assert!(is_object(&raw(r#" {"a":1}"#)));
        for text in ["[]", "\"s\"", "1", "true", "null"] {
            assert!(!is_object(&raw(text)), "{text}");
        }
    }
}
