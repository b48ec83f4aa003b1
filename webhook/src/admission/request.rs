//! The request envelope: an AdmissionReview body read into the typed request, its `object` and
//! `oldObject` kept as slices of the body.
//!
//! Each byte is read by serde at most three times and decoded once: the top level
//! (`apiVersion`, `kind`, the request's text), a count of the request's values without its
//! objects (allocating nothing: the bound on what its typed copy may cost, and its longest
//! string), then the typed request in the same pass that cuts out its objects as [`RawObject`]s,
//! which the `decode` module reads later.

use etcd_shared::EtcdCluster;
use etcd_shared::admission::clipped;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::TypeMeta;
use kube::core::admission::{AdmissionRequest, META_API_VERSION_V1, META_KIND};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::error::ReviewError;
use super::raw::{self, Envelope, MAX_VALUES, is_object};
use super::{MAX_QUOTED, decode};

/// The longest decoder message about the envelope, bytes.
const MAX_ERROR: usize = 700;

/// The request's fields that hold objects, left unread by the envelope's checks.
const OBJECTS: &[&str] = &["object", "oldObject"];

/// An AdmissionRequest whose objects are slices of the body.
pub(super) type Request<'a> = AdmissionRequest<RawObject<'a>>;

/// One of the request's objects, unread: its text as the API server sent it. (The metadata is
/// always empty: it is there because the request type wants a [`Resource`].)
#[derive(Clone, Debug)]
pub(super) struct RawObject<'a> {
    text: &'a RawValue,
    metadata: ObjectMeta,
}

impl<'a> RawObject<'a> {
    /// The object's JSON text.
    pub(super) fn text(&self) -> &'a RawValue {
        self.text
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawObject<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(RawObject {
            text: <&'a RawValue>::deserialize(d)?,
            metadata: ObjectMeta::default(),
        })
    }
}

impl Resource for RawObject<'_> {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        EtcdCluster::kind(&())
    }

    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        EtcdCluster::group(&())
    }

    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        EtcdCluster::version(&())
    }

    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        EtcdCluster::plural(&())
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Reads an `admission.k8s.io/v1` AdmissionReview's request from `body`; a `null` object
/// reads as absent.
pub(super) fn parse(body: &[u8]) -> Result<Request<'_>, ReviewError> {
    // serde reads a struct from an array too: the review must be a JSON object.
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        let e = serde_json::from_slice::<serde::de::IgnoredAny>(body).err();
        return Err(match e {
            Some(e) => ReviewError::NotJson(e),
            None => ReviewError::NotAdmissionReview("expected a JSON object".into()),
        });
    }
    let envelope: Envelope<'_> = match serde_json::from_slice(body) {
        Ok(envelope) => envelope,
        Err(e) if e.is_data() => {
            return Err(ReviewError::NotAdmissionReview(clipped(
                e.to_string(),
                MAX_ERROR,
            )));
        }
        Err(e) => return Err(ReviewError::NotJson(e)),
    };
    if envelope.api_version != META_API_VERSION_V1 || envelope.kind != META_KIND {
        return Err(ReviewError::UnsupportedVersion {
            api_version: clipped(envelope.api_version, MAX_QUOTED),
            kind: clipped(envelope.kind, MAX_QUOTED),
        });
    }
    let Some(raw_request) = envelope.request.filter(|r| r.get() != "null") else {
        return Err(ReviewError::MissingRequest);
    };
    let mut request = decode_request(raw_request)?;
    request.types = TypeMeta {
        api_version: envelope.api_version,
        kind: envelope.kind,
    };
    Ok(request)
}

/// The typed request, counted first. A request with long strings is judged on a copy of the
/// envelope with them cut first, as `decode` does for the objects' parts: serde quotes the
/// whole value of a field of the wrong type in its message, and quoting a 700 KB string takes
/// 100 ms or more (the fuzz run's slowest inputs).
fn decode_request(raw: &RawValue) -> Result<Request<'_>, ReviewError> {
    let failed = |message: String| ReviewError::NotAdmissionReview(clipped(message, MAX_ERROR));
    // A request that is no object is refused by its type alone: serde would quote a string
    // whole (a 700 KB one of U+202E took 85-140 ms, the 1,000,000-input fuzz run).
    if !is_object(raw) {
        let e = <serde_json::Error as serde::de::Error>::invalid_type(
            raw::kind_of(raw),
            &"an AdmissionRequest object",
        );
        return Err(failed(format!("request: {e}")));
    }
    let longest =
        raw::measure(raw, OBJECTS, "request", MAX_VALUES).map_err(ReviewError::TooLarge)?;
    if longest > decode::LONG_STRING {
        let fields: std::collections::BTreeMap<String, &RawValue> =
            serde_json::from_str(raw.get()).map_err(|e| failed(format!("request: {e}")))?;
        let mut envelope = Map::new();
        for (key, value) in fields {
            if !OBJECTS.contains(&key.as_str()) {
                let value: Value = serde_json::from_str(value.get())
                    .map_err(|e| failed(format!("request.{key}: {e}")))?;
                envelope.insert(key, value);
            }
        }
        let mut envelope = Value::Object(envelope);
        decode::shorten(&mut envelope);
        // The copy has no objects: nothing in it is borrowed.
        if Request::deserialize(&envelope).is_err() {
            let message = match serde_path_to_error::deserialize::<_, Request<'_>>(&envelope) {
                Err(e) => format!("request.{e}"),
                Ok(_) => "request: cannot be decoded".to_string(),
            };
            return Err(failed(message));
        }
    }
    // The plain decoder first; on failure, again with the path tracker for the message.
    match serde_json::from_str(raw.get()) {
        Ok(request) => Ok(request),
        Err(plain) => {
            let mut de = serde_json::Deserializer::from_str(raw.get());
            let message = match serde_path_to_error::deserialize::<_, Request<'_>>(&mut de) {
                Err(e) => format!("request.{e}"),
                Ok(_) => plain.to_string(),
            };
            Err(failed(message))
        }
    }
}
