//! NaN and the infinities in a message's JSON, read as Triton reads them.
//!
//! Triton's HTTP front end parses with rapidjson's `kParseNanAndInfFlag`, whose number reader
//! (reader.h, `ParseNumber`) takes `NaN`, `Inf` and `Infinity`, each with or without a leading
//! `-`, where a value may stand: `Inf`/`Infinity` are the infinity of their sign, `-NaN` is the
//! same quiet NaN as `NaN` (the sign is dropped), and nothing else (`nan`, `+Inf`, `Infinit`,
//! `NaN1` are errors; rapidjson before its fix of issue 2299 read `NaN.2e2` as 20, which is
//! refused here). Triton then reads FP32 and FP64 data as doubles, so a tensor's JSON `data`
//! may hold them; tritonclient's HTTP client sends them (Python's `json` writes `NaN`,
//! `Infinity`, `-Infinity`).
//!
//! serde_json reads standard JSON only and has no option for them, so [`mark`] rewrites each
//! token into a marker of the same length that serde_json reads as the number 0 followed by
//! whitespace: `0`, a carriage return, a byte saying which value ([`Kind`]), then spaces. A
//! carriage return outside strings is whitespace that a space may replace, so the message's
//! own are made spaces first; strings cannot hold a raw one (serde_json refuses control
//! characters in them). So after marking every carriage return belongs to a marker, and a
//! `data` array's raw text says where its markers are. Its elements are then read as usual
//! (each marker a 0) and the markers' elements overwritten with their values
//! ([`for_each_marked`]). Same length, and no newline added: serde_json's errors keep their
//! line and column, so every other refusal reads as it did.

use std::borrow::Cow;

/// Which value a token names, and the byte after a marker's carriage return that says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Nan,
    Inf,
    NegInf,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Kind::Nan => b' ',
            Kind::Inf => b'\t',
            Kind::NegInf => b'\r',
        }
    }

    fn from_byte(b: u8) -> Option<Kind> {
        match b {
            b' ' => Some(Kind::Nan),
            b'\t' => Some(Kind::Inf),
            b'\r' => Some(Kind::NegInf),
            _ => None,
        }
    }

    /// The value as rapidjson reads it: a double.
    pub(crate) fn value(self) -> f64 {
        match self {
            Kind::Nan => f64::NAN,
            Kind::Inf => f64::INFINITY,
            Kind::NegInf => f64::NEG_INFINITY,
        }
    }

    /// How Triton writes it back.
    pub(crate) fn token(self) -> &'static str {
        match self {
            Kind::Nan => "NaN",
            Kind::Inf => "Infinity",
            Kind::NegInf => "-Infinity",
        }
    }
}

/// A message's JSON text with its NaN and infinity tokens marked.
pub(crate) struct Marked<'a> {
    pub text: Cow<'a, str>,
    /// How many tokens were marked (0: `text` is the message's own).
    pub tokens: usize,
}

/// The token at the start of `s` (`s` starts where a value may: after `[`, `,` or `:`), and its
/// length; None when `s` does not start with one that a delimiter ends.
fn token_at(s: &[u8]) -> Option<(usize, Kind)> {
    let (negative, rest) = match s.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (len, kind) = if rest.starts_with(b"NaN") {
        (3, Kind::Nan)
    } else if rest.starts_with(b"Infinity") {
        (8, Kind::Inf)
    } else if rest.starts_with(b"Inf") && rest.get(3) != Some(&b'i') {
        // rapidjson refuses `Inf` followed by an `i` that does not finish `Infinity`.
        (3, Kind::Inf)
    } else {
        return None;
    };
    let len = len + usize::from(negative);
    // What may follow a value inside an array or an object; anything else (`NaN1`, `Inf.5`)
    // would otherwise run into the marker's 0 and read as another number.
    if !matches!(
        s.get(len),
        None | Some(b' ' | b'\t' | b'\n' | b'\r' | b',' | b']' | b'}')
    ) {
        return None;
    }
    let kind = match kind {
        Kind::Inf if negative => Kind::NegInf,
        k => k,
    };
    Some((len, kind))
}

/// An edit [`mark`] makes: a token at `at` of `len` bytes, or (None) a carriage return.
type Edit = (usize, usize, Option<Kind>);

/// The edits `text` needs, in order; strings are skipped, escapes included.
fn edits(text: &str) -> impl Iterator<Item = Edit> + '_ {
    let b = text.as_bytes();
    let mut i = 0;
    let mut in_string = false;
    let mut escaped = false;
    // The last byte outside strings that was not whitespace: a token stands only where a value
    // may, after `[`, `,` or `:` (not after a number, which it would extend).
    let mut last = 0u8;
    std::iter::from_fn(move || {
        while i < b.len() {
            let c = b[i];
            if in_string {
                if escaped {
                    escaped = false;
                } else if c == b'\\' {
                    escaped = true;
                } else if c == b'"' {
                    in_string = false;
                    last = c;
                }
                i += 1;
                continue;
            }
            match c {
                b'"' => in_string = true,
                b'\r' => {
                    i += 1;
                    return Some((i - 1, 1, None));
                }
                b' ' | b'\t' | b'\n' => {}
                b'N' | b'I' | b'-' if matches!(last, b'[' | b',' | b':') => {
                    if let Some((len, kind)) = token_at(&b[i..]) {
                        let at = i;
                        i += len;
                        last = b'0';
                        return Some((at, len, Some(kind)));
                    }
                    last = c;
                }
                _ => last = c,
            }
            i += 1;
        }
        None
    })
}

/// Marks `text`'s NaN and infinity tokens (the module's comment says how); borrowed as it is
/// when it has none. At most one copy of the text is made.
pub(crate) fn mark(text: &str) -> Marked<'_> {
    let unmarked = Marked {
        text: Cow::Borrowed(text),
        tokens: 0,
    };
    // Every token holds one of these; most messages hold neither, and are not scanned.
    if !text.contains("NaN") && !text.contains("Inf") {
        return unmarked;
    }
    if !edits(text).any(|(_, _, kind)| kind.is_some()) {
        return unmarked;
    }
    let mut out = String::with_capacity(text.len());
    let mut done = 0;
    let mut tokens = 0;
    for (at, len, kind) in edits(text) {
        // Every edit is of ASCII bytes, so each cut is a char boundary.
        out.push_str(&text[done..at]);
        match kind {
            None => out.push(' '),
            Some(kind) => {
                tokens += 1;
                out.push('0');
                out.push('\r');
                out.push(char::from(kind.byte()));
                out.extend(std::iter::repeat_n(' ', len - 3));
            }
        }
        done = at + len;
    }
    out.push_str(&text[done..]);
    Marked {
        text: Cow::Owned(out),
        tokens,
    }
}

/// How many markers a raw JSON value of a marked text holds.
pub(crate) fn count(raw: &str) -> usize {
    raw.as_bytes().windows(2).filter(|w| w == b"0\r").count()
}

/// The first marker's value in a raw JSON value of a marked text.
pub(crate) fn first(raw: &str) -> Option<Kind> {
    let b = raw.as_bytes();
    let at = b.windows(2).position(|w| w == b"0\r")?;
    b.get(at + 2).copied().and_then(Kind::from_byte)
}

/// Calls `f` with the element index and the value of each marker of a `data` array of a marked
/// text whose elements serde_json read as numbers (so its text is brackets, commas, numbers
/// and whitespace only): an element starts at each number byte that follows none.
pub(crate) fn for_each_marked(raw: &str, mut f: impl FnMut(u64, Kind)) {
    let b = raw.as_bytes();
    let mut index = 0u64;
    let mut in_number = false;
    for (i, &c) in b.iter().enumerate() {
        let numeric = matches!(c, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9');
        if numeric && !in_number {
            if c == b'0' && b.get(i + 1) == Some(&b'\r') {
                if let Some(kind) = b.get(i + 2).copied().and_then(Kind::from_byte) {
                    f(index, kind);
                }
            }
            index += 1;
        }
        in_number = numeric;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marked(text: &str) -> (String, usize) {
        let m = mark(text);
        (m.text.into_owned(), m.tokens)
    }

    #[test]
    fn rapidjsons_tokens_are_marked_where_a_value_stands_and_nowhere_else() {
        let text = r#"{"a":[NaN,-NaN, Inf,-Inf,Infinity ,-Infinity],"b":NaN}"#;
        let (m, n) = marked(text);
        assert_eq!(n, 7);
        assert_eq!(m.len(), text.len());
        assert_eq!(
            m,
            "{\"a\":[0\r ,0\r  , 0\r\t,0\r\r ,0\r\t      ,0\r\r      ],\"b\":0\r }"
        );
        // Each reads as standard JSON.
        let v: serde_json::Value = serde_json::from_str(&m).unwrap();
        assert_eq!(v["a"].as_array().unwrap().len(), 6);
        // Not tokens: inside strings (escaped quotes too), other spellings, a token run into
        // something else, one that does not stand where a value may.
        for text in [
            r#"{"NaN":["NaN","a\"NaN","\\",1]}"#,
            r#"[nan,inf,+Inf,Infinit,NaN1,NaN.5,Inf0,Infinityx,- NaN,1NaN,INF]"#,
            "NaN",
            r#"{"a":"Inf"}"#,
        ] {
            let (m, n) = marked(text);
            assert_eq!((m.as_str(), n), (text, 0), "{text}");
        }
        let (m, n) = marked(r#"["\\",NaN]"#);
        assert_eq!((m.as_str(), n), ("[\"\\\\\",0\r ]", 1));
    }

    #[test]
    fn a_messages_own_carriage_returns_become_spaces_only_when_it_is_marked() {
        let (m, n) = marked("{\"a\":\r[1]}");
        assert_eq!((m.as_str(), n), ("{\"a\":\r[1]}", 0));
        let (m, n) = marked("{\"a\":\r[1,Inf]}");
        assert_eq!((m.as_str(), n), ("{\"a\": [1,0\r\t]}", 1));
    }

    #[test]
    fn markers_are_found_by_element_index_in_nested_arrays() {
        let (m, _) = marked("[[1.5e-3, NaN], [-Inf, -2], [0, Infinity, 1E+2]]");
        let mut got = Vec::new();
        for_each_marked(&m, |i, k| got.push((i, k)));
        assert_eq!(got, [(1, Kind::Nan), (2, Kind::NegInf), (5, Kind::Inf)]);
        assert_eq!(count(&m), 3);
        assert_eq!(first(&m), Some(Kind::Nan));
    }
}
