//! Messages and message events as JavaScript extensions write them.
//!
//! Extensions written for the original TypeScript Goondan build messages by
//! hand and emit them with `ctx.emitMessageEvent(...)`. After JSON encoding
//! in the JS host they differ from our [`Message`] in a few ways, all
//! accepted here:
//!
//! - `createdAt` is a `Date` (encoded as an ISO-8601 string such as
//!   `"2026-11-23T08:39:02.123Z"`), a number of milliseconds, or missing
//!   (now);
//! - `id` may be missing (a new ordered id), `metadata` missing or `null`
//!   (empty), `source` missing (the emitting extension);
//! - `data.content` may be the AI SDK's array of parts: `text` parts (joined
//!   with `"\n"`) for every role, `tool-call` parts (`input`, or the older
//!   `args`) in assistant messages;
//! - a tool message may come in the AI SDK's shape,
//!   `{role: "tool", content: [{type: "tool-result", toolCallId, toolName, output}]}`,
//!   where `output` is `{type: "json" | "text" | "content", value}`,
//!   `{type: "error-text" | "error-json", value}` or a plain value (the AI
//!   SDK 4 spelling `result` with `isError` is read too).
//!
//! Our own serialized [`Message`] is read back unchanged. Anything else is
//! refused with a [`JsMessageError`] that names the field (`message.data.role`)
//! and what was expected, so an extension author can fix the emitting code.

use std::fmt;

use crate::conversation::MessageEvent;
use crate::message::now_millis;
use crate::{JsonObject, JsonValue, Message, MessageData, MessageSource, ToolCall, ToolError, ToolResult, ids};

/// Why a message or message event from JavaScript was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsMessageError {
    /// A required field is absent.
    #[error("{field} is missing; expected {expected}")]
    Missing {
        /// The field, e.g. `message.data.role`.
        field: String,
        /// What it should hold.
        expected: String,
    },
    /// A field holds something it may not.
    #[error("{field} must be {expected}; got {got}")]
    Invalid {
        /// The field, e.g. `message.data.role`.
        field: String,
        /// What it should hold.
        expected: String,
        /// What it holds: the JSON of a scalar (`"bot"`, `42`), or `an array` / `an object`.
        got: String,
    },
}

/// The most characters of a refused value quoted in an error.
const MAX_QUOTED_CHARS: usize = 80;

/// Reads a message written by a JavaScript extension (see the module docs
/// for the shapes accepted). `fallback_extension` becomes the source of a
/// message that has none: `{type: "extension", extensionName}`.
pub fn message_from_js(value: &JsonValue, fallback_extension: &str) -> Result<Message, JsMessageError> {
    parse_message(value, &Field::Root("message"), fallback_extension)
}

/// Reads a message event written by a JavaScript extension: `{type:
/// "append", message}`, `{type: "replace", targetId, message}`, `{type:
/// "remove", targetId}` or `{type: "truncate"}`, with messages read by
/// [`message_from_js`].
pub fn message_event_from_js(value: &JsonValue, fallback_extension: &str) -> Result<MessageEvent, JsMessageError> {
    let path = Field::Root("event");
    let event = object(value, &path)?;
    let kind = string(required(event, &path, "type", EVENT_TYPES)?, &path.key("type"), EVENT_TYPES)?;
    let message = |event: &JsonObject| {
        let path = path.key("message");
        parse_message(required(event, &Field::Root("event"), "message", "a message object")?, &path, fallback_extension)
    };
    let target_id = |event: &JsonObject| {
        let field = path.key("targetId");
        let value = required(event, &path, "targetId", "the id of a message (a non-empty string)")?;
        non_empty_string(value, &field, "the id of a message (a non-empty string)").map(str::to_owned)
    };
    match kind {
        "append" => Ok(MessageEvent::Append { message: message(event)? }),
        "replace" => Ok(MessageEvent::Replace { target_id: target_id(event)?, message: message(event)? }),
        "remove" => Ok(MessageEvent::Remove { target_id: target_id(event)? }),
        "truncate" => Ok(MessageEvent::Truncate),
        _ => Err(invalid(&path.key("type"), EVENT_TYPES, value_of(event, "type"))),
    }
}

const EVENT_TYPES: &str = "one of append, replace, remove, truncate";
const ROLES: &str = "one of system, user, assistant, tool";
const SOURCE_TYPES: &str = "one of user, assistant, tool, system, extension";
const CREATED_AT: &str = "milliseconds since the Unix epoch or an ISO-8601 date such as 2026-11-23T08:39:02.123Z";

/// Milliseconds since the Unix epoch as JavaScript's `Date.toJSON` writes
/// them (`2026-11-24T05:04:05.123Z`); the inverse of [`parse_rfc3339_millis`].
pub fn format_rfc3339_millis(millis: u64) -> String {
    let (year, month, day, rest) = civil_from_millis(millis);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        millis % 1000
    )
}

/// [`format_rfc3339_millis`] as a `Display` that writes the date without
/// allocating (serializers write it with `collect_str`): the runtime-event
/// export stamps every record with one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rfc3339Millis(pub u64);

impl fmt::Display for Rfc3339Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (year, month, day, rest) = civil_from_millis(self.0);
        let Ok(year) = u64::try_from(year) else { return f.write_str(&format_rfc3339_millis(self.0)) };
        if year > 9999 {
            return f.write_str(&format_rfc3339_millis(self.0));
        }
        let mut text = *b"0000-00-00T00:00:00.000Z";
        let mut put = |at: usize, width: usize, mut value: u64| {
            for index in (at..at + width).rev() {
                text[index] = b'0' + (value % 10) as u8;
                value /= 10;
            }
        };
        let rest = u64::try_from(rest).unwrap_or(0);
        put(0, 4, year);
        put(5, 2, u64::try_from(month).unwrap_or(0));
        put(8, 2, u64::try_from(day).unwrap_or(0));
        put(11, 2, rest / 3600);
        put(14, 2, rest % 3600 / 60);
        put(17, 2, rest % 60);
        put(20, 3, self.0 % 1000);
        f.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
    }
}

impl serde::Serialize for Rfc3339Millis {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The civil date (proleptic Gregorian year, month, day) of `millis` since
/// the Unix epoch, and the seconds into that day.
fn civil_from_millis(millis: u64) -> (i64, i64, i64, i64) {
    let total_seconds = i64::try_from(millis / 1000).unwrap_or(i64::MAX);
    let days = total_seconds / 86_400;
    let rest = total_seconds % 86_400;
    // Civil from days (Hinnant), the inverse of days_from_civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, rest)
}

/// Parses an RFC 3339 / ISO-8601 date-time, `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`
/// (what JavaScript's `Date.toJSON` writes), into milliseconds since the Unix
/// epoch. Digits of the fraction beyond milliseconds are dropped; `t`, `z`
/// and a space for `T` are accepted as RFC 3339 allows. `None` for anything
/// else, for impossible dates (`2026-02-30`) and for times before 1970.
pub fn parse_rfc3339_millis(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<u32> {
        let slice = bytes.get(range)?;
        slice.iter().try_fold(0u32, |sum, &b| b.is_ascii_digit().then(|| sum * 10 + u32::from(b - b'0')))
    };
    let at = |index: usize, expected: &[u8]| bytes.get(index).is_some_and(|b| expected.contains(b));
    if !(at(4, b"-") && at(7, b"-") && at(10, b"Tt ") && at(13, b":") && at(16, b":")) {
        return None;
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut index = 19;
    let mut millis = 0u32;
    if at(index, b".") {
        index += 1;
        let start = index;
        while bytes.get(index).is_some_and(u8::is_ascii_digit) {
            index += 1;
        }
        if index == start {
            return None;
        }
        // The first three digits, padded: ".1" is 100 ms, ".123456" is 123 ms.
        for position in 0..3 {
            let digit = if start + position < index { digits(start + position..start + position + 1)? } else { 0 };
            millis = millis * 10 + digit;
        }
    }
    let offset_minutes: i64 = match bytes.get(index) {
        Some(b'Z' | b'z') if index + 1 == bytes.len() => 0,
        Some(&sign @ (b'+' | b'-')) if index + 6 == bytes.len() && at(index + 3, b":") => {
            let (hours, minutes) = (digits(index + 1..index + 3)?, digits(index + 4..index + 6)?);
            if hours > 23 || minutes > 59 {
                return None;
            }
            let offset = i64::from(hours * 60 + minutes);
            if sign == b'-' { -offset } else { offset }
        }
        _ => return None,
    };
    let days = days_from_civil(i64::from(year), month, day);
    let seconds = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second) - offset_minutes * 60;
    let total = seconds.checked_mul(1000)?.checked_add(i64::from(millis))?;
    u64::try_from(total).ok()
}

fn is_leap_year(year: u32) -> bool {
    (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400)
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given date of the proleptic Gregorian
/// calendar (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month = i64::from(month);
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// A field's path, built without allocating until an error names it.
#[derive(Debug, Clone, Copy)]
enum Field<'a> {
    Root(&'static str),
    Key(&'a Field<'a>, &'static str),
    Index(&'a Field<'a>, usize),
}

impl<'a> Field<'a> {
    fn key(&'a self, key: &'static str) -> Field<'a> {
        Field::Key(self, key)
    }

    fn index(&'a self, index: usize) -> Field<'a> {
        Field::Index(self, index)
    }
}

impl fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Root(name) => f.write_str(name),
            Self::Key(parent, key) => write!(f, "{parent}.{key}"),
            Self::Index(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

/// How an error quotes a refused value.
fn describe(value: Option<&JsonValue>) -> String {
    match value {
        None => "nothing".to_owned(),
        Some(JsonValue::Array(_)) => "an array".to_owned(),
        Some(JsonValue::Object(_)) => "an object".to_owned(),
        Some(scalar) => {
            let text = scalar.to_string();
            match text.char_indices().nth(MAX_QUOTED_CHARS) {
                Some((cut, _)) => format!("{}...", &text[..cut]),
                None => text,
            }
        }
    }
}

fn invalid(field: &Field<'_>, expected: &str, got: Option<&JsonValue>) -> JsMessageError {
    JsMessageError::Invalid { field: field.to_string(), expected: expected.to_owned(), got: describe(got) }
}

fn value_of<'v>(object: &'v JsonObject, key: &str) -> Option<&'v JsonValue> {
    object.get(key)
}

/// The value of `key`, treating `null` as absent (JSON encoding turns
/// `undefined` fields into missing ones, but code also writes `null`).
fn optional<'v>(object: &'v JsonObject, key: &str) -> Option<&'v JsonValue> {
    object.get(key).filter(|value| !value.is_null())
}

fn required<'v>(
    object: &'v JsonObject,
    parent: &Field<'_>,
    key: &'static str,
    expected: &str,
) -> Result<&'v JsonValue, JsMessageError> {
    object
        .get(key)
        .ok_or_else(|| JsMessageError::Missing { field: parent.key(key).to_string(), expected: expected.to_owned() })
}

fn object<'v>(value: &'v JsonValue, field: &Field<'_>) -> Result<&'v JsonObject, JsMessageError> {
    value.as_object().ok_or_else(|| invalid(field, "an object", Some(value)))
}

fn string<'v>(value: &'v JsonValue, field: &Field<'_>, expected: &str) -> Result<&'v str, JsMessageError> {
    value.as_str().ok_or_else(|| invalid(field, expected, Some(value)))
}

fn non_empty_string<'v>(value: &'v JsonValue, field: &Field<'_>, expected: &str) -> Result<&'v str, JsMessageError> {
    match value.as_str() {
        Some(text) if !text.is_empty() => Ok(text),
        _ => Err(invalid(field, expected, Some(value))),
    }
}

/// A required string field.
fn string_field(object: &JsonObject, parent: &Field<'_>, key: &'static str) -> Result<String, JsMessageError> {
    string(required(object, parent, key, "a string")?, &parent.key(key), "a string").map(str::to_owned)
}

fn parse_message(value: &JsonValue, path: &Field<'_>, fallback_extension: &str) -> Result<Message, JsMessageError> {
    let message = object(value, path)?;
    let id = match optional(message, "id") {
        None => ids::new_ordered_id(),
        Some(id) => non_empty_string(id, &path.key("id"), "a non-empty string")?.to_owned(),
    };
    let data_path = path.key("data");
    let data = parse_data(required(message, path, "data", "an object with a role")?, &data_path)?;
    let metadata = match optional(message, "metadata") {
        None => JsonObject::new(),
        Some(metadata) => object(metadata, &path.key("metadata"))?.clone(),
    };
    let created_at = match optional(message, "createdAt") {
        None => now_millis(),
        Some(created_at) => parse_created_at(created_at, &path.key("createdAt"))?,
    };
    let source = match optional(message, "source") {
        None => MessageSource::Extension { extension_name: fallback_extension.to_owned() },
        Some(source) => parse_source(source, &path.key("source"), fallback_extension)?,
    };
    Ok(Message { id, data, metadata, created_at, source })
}

fn parse_created_at(value: &JsonValue, field: &Field<'_>) -> Result<u64, JsMessageError> {
    let millis = match value {
        JsonValue::Number(number) => number.as_u64().or_else(|| {
            // Date.now() arithmetic can leave a fraction; a float here is
            // still milliseconds, cut to whole ones.
            number
                .as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0 && *f < 18_446_744_073_709_551_616.0)
                .map(|f| f as u64)
        }),
        JsonValue::String(text) => parse_rfc3339_millis(text),
        _ => None,
    };
    millis.ok_or_else(|| invalid(field, CREATED_AT, Some(value)))
}

fn parse_source(
    value: &JsonValue,
    path: &Field<'_>,
    fallback_extension: &str,
) -> Result<MessageSource, JsMessageError> {
    let source = object(value, path)?;
    let kind = string(required(source, path, "type", SOURCE_TYPES)?, &path.key("type"), SOURCE_TYPES)?;
    match kind {
        "user" => Ok(MessageSource::User),
        "system" => Ok(MessageSource::System),
        "assistant" => Ok(MessageSource::Assistant { step_id: string_field(source, path, "stepId")? }),
        "tool" => Ok(MessageSource::Tool {
            tool_call_id: string_field(source, path, "toolCallId")?,
            tool_name: string_field(source, path, "toolName")?,
        }),
        "extension" => {
            let extension_name = match optional(source, "extensionName") {
                None => fallback_extension.to_owned(),
                Some(name) => string(name, &path.key("extensionName"), "a string")?.to_owned(),
            };
            Ok(MessageSource::Extension { extension_name })
        }
        _ => Err(invalid(&path.key("type"), SOURCE_TYPES, value_of(source, "type"))),
    }
}

fn parse_data(value: &JsonValue, path: &Field<'_>) -> Result<MessageData, JsMessageError> {
    let data = object(value, path)?;
    let role = string(required(data, path, "role", ROLES)?, &path.key("role"), ROLES)?;
    match role {
        "system" => Ok(MessageData::System { content: text_content(data, path, "system")? }),
        "user" => Ok(MessageData::User { content: text_content(data, path, "user")? }),
        "assistant" => parse_assistant(data, path),
        "tool" => parse_tool(data, path),
        _ => Err(invalid(&path.key("role"), ROLES, value_of(data, "role"))),
    }
}

/// The content of a system or user message: a string, or text parts joined with newlines.
fn text_content(data: &JsonObject, path: &Field<'_>, role: &str) -> Result<String, JsMessageError> {
    let expected = "a string or an array of text parts";
    let field = path.key("content");
    match required(data, path, "content", expected)? {
        JsonValue::String(text) => Ok(text.clone()),
        JsonValue::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (index, part) in parts.iter().enumerate() {
                let part_path = field.index(index);
                let part = object(part, &part_path)?;
                let kind = optional(part, "type");
                if kind.and_then(JsonValue::as_str) != Some("text") {
                    return Err(invalid(
                        &part_path.key("type"),
                        &format!("\"text\" in a {role} message"),
                        kind.or_else(|| value_of(part, "type")),
                    ));
                }
                texts.push(string_field(part, &part_path, "text")?);
            }
            Ok(texts.join("\n"))
        }
        other => Err(invalid(&field, expected, Some(other))),
    }
}

fn parse_assistant(data: &JsonObject, path: &Field<'_>) -> Result<MessageData, JsMessageError> {
    let mut tool_calls = Vec::new();
    // Our own shape: `toolCalls: [{id, name, args}]`.
    if let Some(calls) = optional(data, "toolCalls") {
        let field = path.key("toolCalls");
        let JsonValue::Array(calls) = calls else {
            return Err(invalid(&field, "an array of tool calls {id, name, args}", Some(calls)));
        };
        for (index, call) in calls.iter().enumerate() {
            let call_path = field.index(index);
            let call = object(call, &call_path)?;
            let id = string_field(call, &call_path, "id")?;
            let name = string_field(call, &call_path, "name")?;
            let args = call_args(call, &call_path, "args")?;
            tool_calls.push(ToolCall::new(id, name, args));
        }
    }
    let field = path.key("content");
    let content = match optional(data, "content") {
        None => None,
        Some(JsonValue::String(text)) => Some(text.clone()),
        Some(JsonValue::Array(parts)) => {
            let mut texts = Vec::new();
            for (index, part) in parts.iter().enumerate() {
                let part_path = field.index(index);
                let part = object(part, &part_path)?;
                match optional(part, "type").and_then(JsonValue::as_str) {
                    Some("text") => texts.push(string_field(part, &part_path, "text")?),
                    Some("tool-call") => {
                        let id = string_field(part, &part_path, "toolCallId")?;
                        let name = string_field(part, &part_path, "toolName")?;
                        // AI SDK 5 calls the arguments `input`; older code `args`.
                        let key = if optional(part, "input").is_some() { "input" } else { "args" };
                        tool_calls.push(ToolCall::new(id, name, call_args(part, &part_path, key)?));
                    }
                    _ => {
                        return Err(invalid(
                            &part_path.key("type"),
                            "\"text\" or \"tool-call\" in an assistant message",
                            value_of(part, "type"),
                        ));
                    }
                }
            }
            (!texts.is_empty()).then(|| texts.join("\n"))
        }
        Some(other) => {
            return Err(invalid(&field, "a string, null or an array of text and tool-call parts", Some(other)));
        }
    };
    Ok(MessageData::Assistant { content, tool_calls })
}

/// A call's arguments: an object, or nothing (no arguments).
fn call_args(call: &JsonObject, path: &Field<'_>, key: &'static str) -> Result<JsonObject, JsMessageError> {
    match optional(call, key) {
        None => Ok(JsonObject::new()),
        Some(JsonValue::Object(args)) => Ok(args.clone()),
        Some(other) => Err(invalid(&path.key(key), "an object of arguments", Some(other))),
    }
}

fn parse_tool(data: &JsonObject, path: &Field<'_>) -> Result<MessageData, JsMessageError> {
    // The AI SDK's shape: one tool-result part in `content`.
    if let Some(content) = optional(data, "content") {
        let field = path.key("content");
        let expected = "an array holding one tool-result part {type: \"tool-result\", toolCallId, toolName, output}";
        let part = match content {
            JsonValue::Array(parts) if parts.len() == 1 => &parts[0],
            JsonValue::Array(parts) => {
                return Err(JsMessageError::Invalid {
                    field: field.to_string(),
                    expected: expected.to_owned(),
                    got: format!("{} parts", parts.len()),
                });
            }
            other => return Err(invalid(&field, expected, Some(other))),
        };
        let part_path = field.index(0);
        let part = object(part, &part_path)?;
        if optional(part, "type").and_then(JsonValue::as_str) != Some("tool-result") {
            return Err(invalid(&part_path.key("type"), "\"tool-result\" in a tool message", value_of(part, "type")));
        }
        return Ok(MessageData::Tool {
            tool_call_id: string_field(part, &part_path, "toolCallId")?,
            tool_name: string_field(part, &part_path, "toolName")?,
            result: Box::new(tool_output(part, &part_path)?),
        });
    }
    // Our own shape.
    let tool_call_id = string_field(data, path, "toolCallId")?;
    let tool_name = string_field(data, path, "toolName")?;
    let expected = "a tool result {status: \"ok\" | \"error\" | \"pending\", output?, handle?, error?}";
    let result = required(data, path, "result", expected)?;
    let result = serde_json::from_value::<ToolResult>(result.clone()).map_err(|error| JsMessageError::Invalid {
        field: path.key("result").to_string(),
        expected: expected.to_owned(),
        got: format!("{} ({error})", describe(Some(result))),
    })?;
    Ok(MessageData::Tool { tool_call_id, tool_name, result: Box::new(result) })
}

/// The result of a tool-result part: `output` as the AI SDK 5 types it, or
/// a plain value; or the AI SDK 4 `result` with `isError`.
fn tool_output(part: &JsonObject, path: &Field<'_>) -> Result<ToolResult, JsMessageError> {
    let failure = |value: Option<&JsonValue>| {
        let message = match value {
            Some(JsonValue::String(text)) => text.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        ToolResult::error(ToolError { message, ..ToolError::default() })
    };
    if let Some(output) = optional(part, "output") {
        let typed = output.as_object().and_then(|o| Some((o.get("type")?.as_str()?, o.get("value"))));
        return Ok(match typed {
            Some(("json" | "text" | "content", value)) => ToolResult::ok(value.cloned().unwrap_or(JsonValue::Null)),
            Some(("error-text" | "error-json", value)) => failure(value),
            // Any other value is the output itself.
            _ => ToolResult::ok(output.clone()),
        });
    }
    if let Some(result) = part.get("result") {
        let is_error = part.get("isError").and_then(JsonValue::as_bool).unwrap_or(false);
        return Ok(if is_error { failure(Some(result)) } else { ToolResult::ok(result.clone()) });
    }
    Err(JsMessageError::Missing {
        field: path.key("output").to_string(),
        expected: "the tool's output (a value, or {type: \"json\" | \"text\", value})".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ToolStatus;
    use proptest::prelude::*;
    use serde_json::json;

    fn parse(value: JsonValue) -> Message {
        message_from_js(&value, "fallback-ext").unwrap_or_else(|e| panic!("{value}: {e}"))
    }

    fn refusal(value: JsonValue) -> String {
        match message_from_js(&value, "fallback-ext") {
            Ok(message) => panic!("accepted {value}: {message:?}"),
            Err(error) => error.to_string(),
        }
    }

    fn event_refusal(value: JsonValue) -> String {
        match message_event_from_js(&value, "fallback-ext") {
            Ok(event) => panic!("accepted {value}: {event:?}"),
            Err(error) => error.to_string(),
        }
    }

    fn args(value: JsonValue) -> JsonObject {
        value.as_object().cloned().unwrap_or_else(|| panic!("not an object: {value}"))
    }

    #[test]
    fn the_original_idle_monitor_message_is_read() {
        let message = parse(json!({
            "id": "msg-1",
            "data": {"role": "system", "content": "[idle]"},
            "metadata": {"x.y": true},
            "createdAt": "2026-11-23T08:39:02.123Z",
            "source": {"type": "extension", "extensionName": "idle-monitor"},
        }));
        assert_eq!(message.id, "msg-1");
        assert_eq!(message.data, MessageData::System { content: "[idle]".into() });
        assert_eq!(message.metadata, args(json!({"x.y": true})));
        assert_eq!(message.created_at, 1_795_423_142_123);
        assert_eq!(message.source, MessageSource::Extension { extension_name: "idle-monitor".into() });
    }

    #[test]
    fn missing_fields_get_defaults() {
        let before = now_millis();
        let message = parse(json!({"data": {"role": "user", "content": "hi"}, "metadata": null}));
        let after = now_millis();
        assert!(!message.id.is_empty());
        assert!(message.metadata.is_empty());
        assert!((before..=after).contains(&message.created_at));
        assert_eq!(message.source, MessageSource::Extension { extension_name: "fallback-ext".into() });
        let other = parse(json!({"data": {"role": "user", "content": "hi"}}));
        assert_ne!(message.id, other.id, "each message gets its own id");
        // An extension source without a name is the emitting extension.
        let named = parse(json!({"data": {"role": "user", "content": "hi"}, "source": {"type": "extension"}}));
        assert_eq!(named.source, MessageSource::Extension { extension_name: "fallback-ext".into() });
    }

    #[test]
    fn created_at_may_be_milliseconds() {
        assert_eq!(
            parse(json!({"data": {"role": "user", "content": ""}, "createdAt": 1_700_000_000_000_u64})).created_at,
            1_700_000_000_000
        );
        assert_eq!(
            parse(json!({"data": {"role": "user", "content": ""}, "createdAt": 1_700_000_000_000.7})).created_at,
            1_700_000_000_000
        );
        for bad in [json!(-1), json!("yesterday"), json!(true), json!({})] {
            let message = refusal(json!({"data": {"role": "user", "content": ""}, "createdAt": bad}));
            assert!(
                message.starts_with("message.createdAt must be milliseconds since the Unix epoch or an ISO-8601 date"),
                "{message}"
            );
        }
    }

    #[test]
    fn text_parts_are_joined_with_newlines() {
        for role in ["system", "user"] {
            let message = parse(
                json!({"data": {"role": role, "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}),
            );
            let content = match message.data {
                MessageData::System { content } | MessageData::User { content } => content,
                other => panic!("{other:?}"),
            };
            assert_eq!(content, "a\nb");
        }
        let message = refusal(json!({"data": {"role": "user", "content": [{"type": "image", "image": "..."}]}}));
        assert_eq!(message, "message.data.content[0].type must be \"text\" in a user message; got \"image\"");
        let message = refusal(json!({"data": {"role": "user", "content": [{"type": "text"}]}}));
        assert_eq!(message, "message.data.content[0].text is missing; expected a string");
        let message = refusal(json!({"data": {"role": "system", "content": 5}}));
        assert_eq!(message, "message.data.content must be a string or an array of text parts; got 5");
    }

    #[test]
    fn assistant_parts_become_text_and_tool_calls() {
        let message = parse(json!({"data": {"role": "assistant", "content": [
            {"type": "text", "text": "let me look"},
            {"type": "tool-call", "toolCallId": "c1", "toolName": "bash__exec", "input": {"command": "ls"}},
            {"type": "tool-call", "toolCallId": "c2", "toolName": "file-system__read", "args": {"path": "a"}},
            {"type": "tool-call", "toolCallId": "c3", "toolName": "wait__seconds"},
        ]}}));
        assert_eq!(
            message.data,
            MessageData::Assistant {
                content: Some("let me look".into()),
                tool_calls: vec![
                    ToolCall::new("c1", "bash__exec", args(json!({"command": "ls"}))),
                    ToolCall::new("c2", "file-system__read", args(json!({"path": "a"}))),
                    ToolCall::new("c3", "wait__seconds", JsonObject::new()),
                ],
            }
        );
        let only_calls = parse(json!({"data": {"role": "assistant", "content": [
            {"type": "tool-call", "toolCallId": "c1", "toolName": "t__x", "input": {}}]}}));
        assert!(matches!(only_calls.data, MessageData::Assistant { content: None, .. }));
        let none = parse(json!({"data": {"role": "assistant", "content": null}}));
        assert_eq!(none.data, MessageData::Assistant { content: None, tool_calls: Vec::new() });

        let message = refusal(json!({"data": {"role": "assistant", "content": [{"type": "reasoning", "text": "hm"}]}}));
        assert_eq!(
            message,
            "message.data.content[0].type must be \"text\" or \"tool-call\" in an assistant message; got \"reasoning\""
        );
        let message = refusal(json!({"data": {"role": "assistant", "content": [
            {"type": "tool-call", "toolCallId": "c1", "toolName": "t__x", "input": "{}"}]}}));
        assert_eq!(message, "message.data.content[0].input must be an object of arguments; got \"{}\"");
        let message = refusal(json!({"data": {"role": "assistant", "toolCalls": [{"id": "c1"}]}}));
        assert_eq!(message, "message.data.toolCalls[0].name is missing; expected a string");
    }

    #[test]
    fn ai_sdk_tool_results_are_read() {
        let result = |output: JsonValue| {
            let message = parse(json!({"data": {"role": "tool", "content": [
                {"type": "tool-result", "toolCallId": "c1", "toolName": "t__x", "output": output}]}}));
            match message.data {
                MessageData::Tool { tool_call_id, tool_name, result } => {
                    assert_eq!((tool_call_id.as_str(), tool_name.as_str()), ("c1", "t__x"));
                    *result
                }
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(result(json!({"type": "json", "value": {"a": 1}})), ToolResult::ok(json!({"a": 1})));
        assert_eq!(result(json!({"type": "text", "value": "done"})), ToolResult::ok(json!("done")));
        assert_eq!(result(json!([1, 2])), ToolResult::ok(json!([1, 2])));
        assert_eq!(result(json!({"files": 3})), ToolResult::ok(json!({"files": 3})));
        let failed = result(json!({"type": "error-text", "value": "boom"}));
        assert_eq!(failed.status, ToolStatus::Error);
        assert_eq!(failed.error.map(|e| e.message), Some("boom".to_owned()));

        let v4 = parse(json!({"data": {"role": "tool", "content": [
            {"type": "tool-result", "toolCallId": "c1", "toolName": "t__x", "result": "no such file", "isError": true}]}}));
        assert!(matches!(v4.data, MessageData::Tool { result, .. } if result.is_error()));

        let message = refusal(json!({"data": {"role": "tool", "content": []}}));
        assert!(message.starts_with("message.data.content must be an array holding one tool-result part"), "{message}");
        assert!(message.ends_with("got 0 parts"), "{message}");
        let message = refusal(json!({"data": {"role": "tool", "content": [{"type": "text", "text": "x"}]}}));
        assert_eq!(message, "message.data.content[0].type must be \"tool-result\" in a tool message; got \"text\"");
        let message = refusal(
            json!({"data": {"role": "tool", "content": [{"type": "tool-result", "toolCallId": "c1", "toolName": "t"}]}}),
        );
        assert!(message.starts_with("message.data.content[0].output is missing"), "{message}");
    }

    #[test]
    fn our_tool_messages_are_read_and_checked() {
        let message = parse(
            json!({"data": {"role": "tool", "toolCallId": "c1", "toolName": "t__x", "result": {"status": "ok", "output": 1}}}),
        );
        assert!(matches!(message.data, MessageData::Tool { result, .. } if *result == ToolResult::ok(json!(1))));
        let message = refusal(
            json!({"data": {"role": "tool", "toolCallId": "c1", "toolName": "t__x", "result": {"status": "fine"}}}),
        );
        assert!(message.starts_with("message.data.result must be a tool result"), "{message}");
        let message = refusal(json!({"data": {"role": "tool", "toolName": "t__x", "result": {"status": "ok"}}}));
        assert_eq!(message, "message.data.toolCallId is missing; expected a string");
    }

    #[test]
    fn refusals_name_the_field_and_what_was_expected() {
        assert_eq!(
            refusal(json!({"data": {"role": "bot", "content": "x"}})),
            "message.data.role must be one of system, user, assistant, tool; got \"bot\""
        );
        assert_eq!(
            refusal(json!({"id": "", "data": {"role": "user", "content": "x"}})),
            "message.id must be a non-empty string; got \"\""
        );
        assert_eq!(
            refusal(json!({"id": 7, "data": {"role": "user", "content": "x"}})),
            "message.id must be a non-empty string; got 7"
        );
        assert_eq!(refusal(json!({"id": "m"})), "message.data is missing; expected an object with a role");
        assert_eq!(
            refusal(json!({"data": {"content": "x"}})),
            "message.data.role is missing; expected one of system, user, assistant, tool"
        );
        assert_eq!(refusal(json!("hello")), "message must be an object; got \"hello\"");
        assert_eq!(refusal(json!([])), "message must be an object; got an array");
        assert_eq!(
            refusal(json!({"data": {"role": "user", "content": "x"}, "metadata": []})),
            "message.metadata must be an object; got an array"
        );
        assert_eq!(
            refusal(json!({"data": {"role": "user", "content": "x"}, "source": {"type": "robot"}})),
            "message.source.type must be one of user, assistant, tool, system, extension; got \"robot\""
        );
        assert_eq!(
            refusal(json!({"data": {"role": "user", "content": "x"}, "source": {"type": "assistant"}})),
            "message.source.stepId is missing; expected a string"
        );
        let long = "x".repeat(500);
        let message = refusal(json!({"data": {"role": long, "content": "x"}}));
        assert!(message.len() < 200 && message.ends_with("..."), "{message}");
    }

    #[test]
    fn the_four_events_are_read() {
        let message = json!({"id": "m1", "data": {"role": "user", "content": "x"}});
        let append = message_event_from_js(&json!({"type": "append", "message": message}), "ext");
        assert!(matches!(append, Ok(MessageEvent::Append { message }) if message.id == "m1"));
        let replace = message_event_from_js(&json!({"type": "replace", "targetId": "m0", "message": message}), "ext");
        assert!(
            matches!(replace, Ok(MessageEvent::Replace { target_id, message }) if target_id == "m0" && message.id == "m1")
        );
        let remove = message_event_from_js(&json!({"type": "remove", "targetId": "m0"}), "ext");
        assert_eq!(remove, Ok(MessageEvent::Remove { target_id: "m0".into() }));
        assert_eq!(message_event_from_js(&json!({"type": "truncate"}), "ext"), Ok(MessageEvent::Truncate));
    }

    #[test]
    fn event_refusals_name_the_field() {
        assert_eq!(
            event_refusal(json!({"type": "insert"})),
            "event.type must be one of append, replace, remove, truncate; got \"insert\""
        );
        assert_eq!(
            event_refusal(json!({})),
            "event.type is missing; expected one of append, replace, remove, truncate"
        );
        assert_eq!(event_refusal(json!(null)), "event must be an object; got null");
        assert_eq!(event_refusal(json!({"type": "append"})), "event.message is missing; expected a message object");
        assert_eq!(
            event_refusal(json!({"type": "remove"})),
            "event.targetId is missing; expected the id of a message (a non-empty string)"
        );
        assert_eq!(
            event_refusal(json!({"type": "remove", "targetId": ""})),
            "event.targetId must be the id of a message (a non-empty string); got \"\""
        );
        assert_eq!(
            event_refusal(json!({"type": "replace", "targetId": "m", "message": {"data": {"role": "bot"}}})),
            "event.message.data.role must be one of system, user, assistant, tool; got \"bot\""
        );
    }

    #[test]
    fn dates_parse_as_rfc_3339() {
        assert_eq!(parse_rfc3339_millis("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339_millis("2026-11-23T08:39:02.123Z"), Some(1_795_423_142_123));
        assert_eq!(parse_rfc3339_millis("2026-11-23T08:39:02Z"), Some(1_795_423_142_000));
        assert_eq!(parse_rfc3339_millis("2026-11-23T08:39:02.1Z"), Some(1_795_423_142_100));
        assert_eq!(parse_rfc3339_millis("2026-11-23T08:39:02.123456789Z"), Some(1_795_423_142_123));
        assert_eq!(parse_rfc3339_millis("2026-11-23T17:39:02.123+09:00"), Some(1_795_423_142_123));
        assert_eq!(parse_rfc3339_millis("2026-11-23T03:09:02.123-05:30"), Some(1_795_423_142_123));
        assert_eq!(parse_rfc3339_millis("2026-11-23t08:39:02.123z"), Some(1_795_423_142_123));
        assert_eq!(parse_rfc3339_millis("2026-11-23 08:39:02.123Z"), Some(1_795_423_142_123));
        assert_eq!(parse_rfc3339_millis("2000-02-29T00:00:00Z"), Some(951_782_400_000));
        assert_eq!(parse_rfc3339_millis("2024-12-31T23:59:59.999Z"), Some(1_735_689_599_999));
        for garbage in [
            "yesterday",
            "",
            "2026-11-23",
            "2026-11-23T08:39:02",
            "2026-11-23T08:39:02.Z",
            "2026-11-23T08:39:02.123",
            "2026-11-23T08:39:02.123Zjunk",
            "2026-13-01T00:00:00Z",
            "2026-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-11-23T24:00:00Z",
            "2026-11-23T08:60:00Z",
            "2026-11-23T08:39:60Z",
            "2026-11-23T08:39:02+0900",
            "2026-11-23T08:39:02+24:00",
            "1969-12-31T23:59:59Z",
            "１９７０-01-01T00:00:00Z",
            "+02026-11-23T08:39:02Z",
        ] {
            assert_eq!(parse_rfc3339_millis(garbage), None, "{garbage:?}");
        }
    }

    /// Agrees with a day-by-day count for every day of a few centuries.
    #[test]
    fn days_from_civil_counts_days() {
        let mut days = 0i64;
        for year in 1970..2400 {
            for month in 1..=12 {
                for day in 1..=days_in_month(year, month) {
                    assert_eq!(days_from_civil(i64::from(year), month, day), days, "{year}-{month}-{day}");
                    days += 1;
                }
            }
        }
    }

    fn json_leaf() -> impl Strategy<Value = JsonValue> {
        prop_oneof![
            Just(JsonValue::Null),
            any::<bool>().prop_map(JsonValue::from),
            any::<i64>().prop_map(JsonValue::from),
            "\\PC{0,12}".prop_map(JsonValue::from),
        ]
    }

    fn json_object() -> impl Strategy<Value = JsonObject> {
        proptest::collection::vec(("[a-z.]{0,6}", json_leaf()), 0..4).prop_map(|pairs| pairs.into_iter().collect())
    }

    /// A leaf for a result's `output`: `Some(null)` serializes as `null`,
    /// which serde reads back as no output, in the store as here.
    fn output_leaf() -> impl Strategy<Value = JsonValue> {
        json_leaf().prop_filter("not null", |value| !value.is_null())
    }

    fn tool_result() -> impl Strategy<Value = ToolResult> {
        prop_oneof![
            output_leaf().prop_map(ToolResult::ok),
            ("\\PC{0,20}", proptest::option::of("E_[A-Z]{1,8}"))
                .prop_map(|(message, code)| { ToolResult::error(ToolError { message, code, ..ToolError::default() }) }),
            ("[a-z0-9-]{1,8}", proptest::option::of(output_leaf()))
                .prop_map(|(handle, output)| ToolResult::pending(handle, output)),
        ]
    }

    fn data() -> impl Strategy<Value = MessageData> {
        let call = ("[a-z0-9_-]{0,8}", "[a-z_]{0,12}", json_object())
            .prop_map(|(id, name, args)| ToolCall::new(id, name, args));
        prop_oneof![
            "\\PC{0,20}".prop_map(|content| MessageData::System { content }),
            "\\PC{0,20}".prop_map(|content| MessageData::User { content }),
            (proptest::option::of("\\PC{0,20}"), proptest::collection::vec(call, 0..3))
                .prop_map(|(content, tool_calls)| MessageData::Assistant { content, tool_calls }),
            ("[a-z0-9_-]{0,8}", "[a-z_]{0,12}", tool_result()).prop_map(|(tool_call_id, tool_name, result)| {
                MessageData::Tool { tool_call_id, tool_name, result: Box::new(result) }
            }),
        ]
    }

    fn source() -> impl Strategy<Value = MessageSource> {
        prop_oneof![
            Just(MessageSource::User),
            Just(MessageSource::System),
            "\\PC{0,8}".prop_map(|step_id| MessageSource::Assistant { step_id }),
            ("\\PC{0,8}", "\\PC{0,8}")
                .prop_map(|(tool_call_id, tool_name)| MessageSource::Tool { tool_call_id, tool_name }),
            "\\PC{0,8}".prop_map(|extension_name| MessageSource::Extension { extension_name }),
        ]
    }

    fn message() -> impl Strategy<Value = Message> {
        ("\\PC{1,16}", data(), json_object(), any::<u64>(), source())
            .prop_map(|(id, data, metadata, created_at, source)| Message { id, data, metadata, created_at, source })
    }

    proptest! {
        /// Our own serialized messages (and events) come back unchanged.
        #[test]
        fn our_messages_round_trip(message in message()) {
            let value = serde_json::to_value(&message).unwrap_or_else(|e| panic!("{e}"));
            prop_assert_eq!(message_from_js(&value, "other"), Ok(message.clone()));
            let event = MessageEvent::Replace { target_id: "t".into(), message };
            let value = serde_json::to_value(&event).unwrap_or_else(|e| panic!("{e}"));
            prop_assert_eq!(message_event_from_js(&value, "other"), Ok(event));
        }

        /// Every date-time in range reads back as the milliseconds it was made from.
        #[test]
        fn formatted_dates_parse_back(millis in 0u64..253_402_300_800_000) {
            prop_assert_eq!(parse_rfc3339_millis(&format_rfc3339(millis)), Some(millis));
        }

        /// The allocation-free form writes what the formatter writes, in
        /// range (four-digit years) and beyond it.
        #[test]
        fn the_display_form_is_the_formatted_date(millis in prop_oneof![0u64..253_402_300_800_000, any::<u64>()]) {
            prop_assert_eq!(super::Rfc3339Millis(millis).to_string(), format_rfc3339(millis));
        }

        /// Arbitrary text never panics the parser.
        #[test]
        fn the_date_parser_never_panics(text in "\\PC{0,40}") {
            let _ = parse_rfc3339_millis(&text);
        }
    }

    fn format_rfc3339(millis: u64) -> String {
        super::format_rfc3339_millis(millis)
    }
}
