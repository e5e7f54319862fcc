//! `parameters`: a request's, a response's, an input's or an output's map of name to value
//! (KServe v2: a string, a number or a boolean), with typed accessors for the parameters isolane
//! reads and writes.

use crate::ProtocolError;
use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;

/// The most parameters one `parameters` object may hold (see [`crate::MAX_TENSORS`]).
pub const MAX_PARAMETERS: usize = 64;

/// The request's own deadline, in milliseconds after it arrives (positive integer).
pub const DEADLINE_MS: &str = "deadline_ms";
/// Triton's sequence batcher's parameters: a request's correlation ID and whether it starts or
/// ends its sequence.
pub const SEQUENCE: [&str; 3] = ["sequence_id", "sequence_start", "sequence_end"];
/// In a response: `true` when the request completed after its deadline.
pub const LATE: &str = "late";
/// In an input or a response output: the byte count of its binary data after the JSON header.
pub const BINARY_DATA_SIZE: &str = "binary_data_size";
/// In a requested output: `true` to have it returned as binary data.
pub const BINARY_DATA: &str = "binary_data";
/// In a request: `true` to have every output not asked for otherwise returned as binary data.
pub const BINARY_DATA_OUTPUT: &str = "binary_data_output";

/// One parameter value. JSON numbers that are integers are `Int`; others `Double` (the
/// protocol's `$number`; tritonclient's custom parameters may be floats).
#[derive(Debug, Clone, PartialEq)]
pub enum Parameter {
    Bool(bool),
    Int(i64),
    Double(f64),
    String(String),
}

impl Parameter {
    fn kind(&self) -> &'static str {
        match self {
            Parameter::Bool(_) => "a boolean",
            Parameter::Int(_) => "an integer",
            Parameter::Double(_) => "a number with a fraction",
            Parameter::String(_) => "a string",
        }
    }
}

impl Serialize for Parameter {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Parameter::Bool(b) => s.serialize_bool(*b),
            Parameter::Int(i) => s.serialize_i64(*i),
            Parameter::Double(x) if x.is_finite() => s.serialize_f64(*x),
            // serde_json would write `null`, which no reader takes back as a number.
            Parameter::Double(x) => Err(serde::ser::Error::custom(format!(
                "parameter value {x} is not finite; JSON cannot carry it"
            ))),
            Parameter::String(v) => s.serialize_str(v),
        }
    }
}

impl<'de> Deserialize<'de> for Parameter {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Parameter;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a parameter value: a string, a number or a boolean")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Parameter, E> {
                Ok(Parameter::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Parameter, E> {
                Ok(Parameter::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Parameter, E> {
                i64::try_from(v)
                    .map(Parameter::Int)
                    .map_err(|_| E::custom(format!("parameter value {v} is past the int64 range")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Parameter, E> {
                Ok(Parameter::Double(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Parameter, E> {
                Ok(Parameter::String(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Parameter, E> {
                Ok(Parameter::String(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// A `parameters` object. A name given twice is refused (JSON readers disagree on which one
/// wins).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parameters(BTreeMap<String, Parameter>);

impl Parameters {
    pub fn new() -> Self {
        Parameters::default()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn get(&self, name: &str) -> Option<&Parameter> {
        self.0.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub fn insert(&mut self, name: impl Into<String>, value: Parameter) -> Option<Parameter> {
        self.0.insert(name.into(), value)
    }

    pub fn remove(&mut self, name: &str) -> Option<Parameter> {
        self.0.remove(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Parameter)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The boolean parameter `name`, if given; another type is refused, naming `scope`.
    pub fn bool(&self, name: &str, scope: &str) -> Result<Option<bool>, ProtocolError> {
        match self.0.get(name) {
            None => Ok(None),
            Some(Parameter::Bool(b)) => Ok(Some(*b)),
            Some(p) => Err(param_error(
                scope,
                name,
                format!("is {}; it is a boolean (true or false)", p.kind()),
            )),
        }
    }

    /// The integer parameter `name`, if given; another type is refused, naming `scope`.
    pub fn int(&self, name: &str, scope: &str) -> Result<Option<i64>, ProtocolError> {
        match self.0.get(name) {
            None => Ok(None),
            Some(Parameter::Int(i)) => Ok(Some(*i)),
            Some(p) => Err(param_error(
                scope,
                name,
                format!("is {}; it is an integer", p.kind()),
            )),
        }
    }

    /// A request's `deadline_ms`: a positive number of milliseconds (a fraction allowed: a
    /// critical model's deadline may be 1.5 ms), or none. Past int64's range it is refused,
    /// as an integer there would be. A string holding a decimal number is read as that number:
    /// perf_analyzer's `--request-parameter` and Triton's C++ clients send only strings,
    /// integers and booleans, so a fractional deadline reaches the server from them only as
    /// `deadline_ms:1.5:string`.
    pub fn deadline_ms(&self) -> Result<Option<f64>, ProtocolError> {
        let ms = match self.0.get(DEADLINE_MS) {
            None => return Ok(None),
            Some(Parameter::Int(i)) => *i as f64,
            Some(Parameter::Double(x)) if x.is_finite() => *x,
            Some(Parameter::String(s)) => match decimal(s) {
                Some(x) => x,
                None => {
                    let shown: String = s.chars().take(40).collect();
                    return Err(param_error(
                        "the request",
                        DEADLINE_MS,
                        format!(
                            "is the string {shown:?}, which is not a decimal number; a deadline \
                             is a positive number of milliseconds (e.g. 20 or 1.5, as a number \
                             or a string)"
                        ),
                    ));
                }
            },
            // gRPC's double_param carries NaN and infinities, which JSON cannot.
            Some(Parameter::Double(x)) => {
                return Err(param_error(
                    "the request",
                    DEADLINE_MS,
                    format!(
                        "is {x}; a deadline is a positive, finite number of milliseconds, at \
                         most {}",
                        i64::MAX
                    ),
                ))
            }
            Some(p) => {
                return Err(param_error(
                    "the request",
                    DEADLINE_MS,
                    format!("is {}; it is a number of milliseconds", p.kind()),
                ))
            }
        };
        if ms > 0.0 && ms <= i64::MAX as f64 {
            return Ok(Some(ms));
        }
        // Past 1e15 in scientific notation: 1e300 written out is three hundred digits.
        let shown = if ms.abs() < 1e15 {
            ms.to_string()
        } else {
            format!("{ms:e}")
        };
        Err(param_error(
            "the request",
            DEADLINE_MS,
            format!(
                "is {shown}; a deadline is a positive number of milliseconds, at most {}",
                i64::MAX
            ),
        ))
    }

    /// Refuses a request that says it belongs to a sequence: no model isolane serves is a
    /// sequence model (none has Triton's `sequence_batching`), so the request would run as if
    /// alone and a stateful client would get answers it did not mean. A zero or empty
    /// `sequence_id` and a `false` flag mean "no sequence", as tritonclient's defaults do.
    pub fn refuse_sequence(&self) -> Result<(), ProtocolError> {
        for name in SEQUENCE {
            let none = match self.0.get(name) {
                None => true,
                Some(Parameter::Int(0)) | Some(Parameter::Bool(false)) => true,
                Some(Parameter::String(s)) => s.is_empty(),
                Some(_) => false,
            };
            if !none {
                return Err(param_error(
                    "the request",
                    name,
                    "is given, but no model isolane serves is a sequence model (none has \
                     sequence batching); send the request without sequence_id, \
                     sequence_start and sequence_end"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// Sets a request's `deadline_ms` (a value past int64 is kept at int64's largest).
    pub fn set_deadline_ms(&mut self, ms: u64) {
        let ms = i64::try_from(ms).unwrap_or(i64::MAX);
        self.insert(DEADLINE_MS, Parameter::Int(ms));
    }

    /// A response's `late`: whether the request completed after its deadline (absent: false).
    pub fn late(&self) -> Result<bool, ProtocolError> {
        Ok(self.bool(LATE, "the response")?.unwrap_or(false))
    }

    /// Marks a response as completed late (`late = true`), or removes the mark.
    pub fn set_late(&mut self, late: bool) {
        if late {
            self.insert(LATE, Parameter::Bool(true));
        } else {
            self.remove(LATE);
        }
    }
}

/// A decimal number written as text (`20`, `1.5`, `2e1`), surrounding spaces allowed; not
/// Rust's other spellings (`inf`, `NaN`, `infinity`), which no deadline is.
fn decimal(s: &str) -> Option<f64> {
    let t = s.trim();
    let digits = t.trim_start_matches(['+', '-']);
    if !digits.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return None;
    }
    t.parse::<f64>().ok().filter(|x| x.is_finite())
}

pub(crate) fn param_error(scope: &str, name: &str, message: String) -> ProtocolError {
    ProtocolError::Parameter {
        scope: scope.to_owned(),
        name: name.to_owned(),
        message,
    }
}

impl Serialize for Parameters {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for Parameters {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Parameters;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a parameters object: names to strings, numbers or booleans")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Parameters, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(name) = map.next_key::<String>()? {
                    let value = map.next_value::<Parameter>()?;
                    if out.len() == MAX_PARAMETERS {
                        return Err(de::Error::custom(format!(
                            "a parameters object holds at most {MAX_PARAMETERS} parameters"
                        )));
                    }
                    if out.contains_key(&name) {
                        return Err(de::Error::custom(format!(
                            "parameter `{name}` is given more than once"
                        )));
                    }
                    out.insert(name, value);
                }
                Ok(Parameters(out))
            }
        }
        d.deserialize_map(V)
    }
}
