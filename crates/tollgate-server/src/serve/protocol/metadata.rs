//! What an RLS reply carries in `dynamic_metadata`: the quotas a call exceeded (always), and with
//! `--response-dynamic-metadata` what envoy/ratelimit's `RESPONSE_DYNAMIC_METADATA` returns
//! (`src/service/ratelimit.go`, `ratelimitToMetadata`): the `domain`, the request's
//! `descriptors` (each its `entries` as `key=value`, its `limit` override and its `hitsAddend`
//! when set), the request's `hitsAddend` when not 0, and `metadata`, the rule `metadata` of the
//! descriptors that passed, merged in descriptor order (a name already there keeps its value,
//! two mappings under one name merge the same way).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::{ListValue, NullValue, Struct, Value, value::Kind};

use crate::serve::model::Outcome;

/// The part of envoy/ratelimit's dynamic metadata read from the request, taken before the
/// request is decided (and consumed); [`RequestMetadata::finish`] adds the part the outcome
/// decides.
#[derive(Debug)]
pub(crate) struct RequestMetadata(Struct);

impl RequestMetadata {
    /// The `domain`, `descriptors` and `hitsAddend` of a request.
    pub(crate) fn new(domain: &str, descriptors: &[RateLimitDescriptor], hits_addend: u32) -> RequestMetadata {
        let mut fields = std::collections::BTreeMap::new();
        fields.insert("domain".to_string(), string(domain.to_string()));
        fields.insert("descriptors".to_string(), list(descriptors.iter().map(descriptor).collect()));
        if hits_addend != 0 {
            fields.insert("hitsAddend".to_string(), number(f64::from(hits_addend)));
        }
        RequestMetadata(Struct { fields: fields.into_iter().collect() })
    }

    /// The whole struct: this, and the merged `metadata` of the limits whose descriptor passed
    /// (its status in `reply` is `OK`), unlimited ones left out as envoy/ratelimit does.
    pub(crate) fn finish(self, outcome: &Outcome, reply: &RateLimitResponse) -> Struct {
        let RequestMetadata(mut out) = self;
        let mut passed = Struct::default();
        for (i, status) in reply.statuses.iter().enumerate() {
            if status.code != Code::Ok as i32 {
                continue;
            }
            let limits = outcome.statuses.iter().filter(|s| s.descriptor == i).map(|s| outcome.limit(s));
            for metadata in limits.filter(|l| !l.unlimited()).filter_map(|l| l.metadata()) {
                merge(&mut passed, &to_struct(metadata));
            }
        }
        if !passed.fields.is_empty() {
            out.fields.insert("metadata".to_string(), Value { kind: Some(Kind::StructValue(passed)) });
        }
        out
    }
}

/// `quota_exceeded`: the names (or ids) of the quota limits (`mode: quota`) the call exceeded,
/// added to `metadata`; nothing when there are none.
pub(crate) fn quota_exceeded(outcome: &Outcome, metadata: &mut Option<Struct>) {
    let quotas = outcome.quotas_exceeded();
    if quotas.is_empty() {
        return;
    }
    let value = list(quotas.into_iter().map(string).collect());
    metadata.get_or_insert_with(Struct::default).fields.insert("quota_exceeded".to_string(), value);
}

/// One request descriptor as envoy/ratelimit describes it (`descriptorToStruct`).
fn descriptor(d: &RateLimitDescriptor) -> Value {
    let mut fields = std::collections::BTreeMap::new();
    let entries = d.entries.iter().map(|e| string(format!("{}={}", e.key, e.value))).collect();
    fields.insert("entries".to_string(), list(entries));
    if let Some(limit) = &d.limit {
        // envoy/ratelimit writes the message in protobuf's text format.
        let unit = RateLimitUnit::try_from(limit.unit)
            .map_or_else(|_| limit.unit.to_string(), |u| u.as_str_name().to_string());
        fields
            .insert("limit".to_string(), string(format!("requests_per_unit:{} unit:{unit}", limit.requests_per_unit)));
    }
    if let Some(hits) = d.hits_addend {
        fields.insert("hitsAddend".to_string(), number(hits.value as f64));
    }
    Value { kind: Some(Kind::StructValue(Struct { fields: fields.into_iter().collect() })) }
}

/// Adds `from`'s fields to `into`: a name `into` has keeps its value, unless both are mappings,
/// which merge the same way (envoy/ratelimit's `mergeMetadata`).
fn merge(into: &mut Struct, from: &Struct) {
    for (name, value) in &from.fields {
        match (into.fields.get_mut(name), &value.kind) {
            (None, _) => {
                into.fields.insert(name.clone(), value.clone());
            }
            (Some(Value { kind: Some(Kind::StructValue(inner)) }), Some(Kind::StructValue(more))) => merge(inner, more),
            (Some(_), _) => {}
        }
    }
}

fn to_struct(map: &tollgate_policy::Metadata) -> Struct {
    Struct { fields: map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect() }
}

/// A JSON value as protobuf's: numbers are doubles there.
fn to_value(value: &serde_json::Value) -> Value {
    use serde_json::Value as Json;
    let kind = match value {
        Json::Null => Kind::NullValue(NullValue::NullValue as i32),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(items) => Kind::ListValue(ListValue { values: items.iter().map(to_value).collect() }),
        Json::Object(map) => Kind::StructValue(to_struct(map)),
    };
    Value { kind: Some(kind) }
}

fn string(s: String) -> Value {
    Value { kind: Some(Kind::StringValue(s)) }
}

fn number(n: f64) -> Value {
    Value { kind: Some(Kind::NumberValue(n)) }
}

fn list(values: Vec<Value>) -> Value {
    Value { kind: Some(Kind::ListValue(ListValue { values })) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_struct(text: &str) -> Struct {
        match serde_json::from_str(text).unwrap() {
            serde_json::Value::Object(map) => to_struct(&map),
            other => panic!("not a mapping: {other}"),
        }
    }

    #[test]
    fn the_first_value_of_a_name_stays_and_mappings_merge() {
        let mut into = json_struct(r#"{"name": "service_1", "nested": {"a": 1}}"#);
        merge(&mut into, &json_struct(r#"{"name": "service_2", "other": true, "nested": {"a": 2, "b": 3}}"#));
        assert_eq!(into, json_struct(r#"{"name": "service_1", "other": true, "nested": {"a": 1, "b": 3}}"#));
    }
}
