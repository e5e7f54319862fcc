//! Where each field of a scenario file was written. The walk (`spec::parse`) records a site per
//! field it reads; the rules (`spec::validate`) run on the typed `Scenario` and name fields by
//! [`FieldPath`], which these spans turn back into file:line:column. A scenario built in code has
//! no spans ([`Spans::none`]), and its problems carry no position.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::Range;

use toml::de::DeValue;
use toml::Spanned;

/// A field of a scenario, as problems name it. `Copy` and free of allocation: the walk records
/// one per key, tens of thousands for a large scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum FieldPath {
    /// `table.key`, or a top-level key when `table` is empty.
    Top(&'static str, &'static str),
    /// `workload[i].key`; an empty key is the `workload[i]` table itself.
    Workload(usize, &'static str),
    /// `workload[i].ramp.key`.
    Ramp(usize, &'static str),
    /// `workload[i].partition.key`.
    Partition(usize, &'static str),
    /// `workload[i].cpu[j]`.
    Cpu(usize, usize),
    /// `workload[i].serve.key`.
    Serve(usize, &'static str),
    /// `workload[i].serve.batching.key`.
    Batching(usize, &'static str),
    /// `workload[i].serve.batching.preferred[j]`.
    Preferred(usize, usize),
    /// A workload's run length, which no single key holds (`duration_s`, `jobs`, or for an
    /// interferer its ramp): only ever marked unread, never reported.
    Length(usize),
}

impl FieldPath {
    /// The workload the field belongs to, if any.
    fn workload(self) -> Option<usize> {
        match self {
            FieldPath::Top(..) => None,
            FieldPath::Workload(i, _)
            | FieldPath::Ramp(i, _)
            | FieldPath::Partition(i, _)
            | FieldPath::Cpu(i, _)
            | FieldPath::Serve(i, _)
            | FieldPath::Batching(i, _)
            | FieldPath::Preferred(i, _)
            | FieldPath::Length(i) => Some(i),
        }
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FieldPath::Top("", key) => write!(f, "{key}"),
            FieldPath::Top(table, key) => write!(f, "{table}.{key}"),
            FieldPath::Workload(i, "") => write!(f, "workload[{i}]"),
            FieldPath::Workload(i, key) => write!(f, "workload[{i}].{key}"),
            FieldPath::Ramp(i, key) => write!(f, "workload[{i}].ramp.{key}"),
            FieldPath::Partition(i, key) => write!(f, "workload[{i}].partition.{key}"),
            FieldPath::Cpu(i, j) => write!(f, "workload[{i}].cpu[{j}]"),
            FieldPath::Serve(i, key) => write!(f, "workload[{i}].serve.{key}"),
            FieldPath::Batching(i, key) => write!(f, "workload[{i}].serve.batching.{key}"),
            FieldPath::Preferred(i, j) => {
                write!(f, "workload[{i}].serve.batching.preferred[{j}]")
            }
            FieldPath::Length(i) => write!(f, "workload[{i}]"),
        }
    }
}

/// Byte offset → 1-based line and column (in characters) of a text.
pub(super) struct Lines<'a> {
    text: &'a str,
    /// Byte offset of the start of every line, ascending (the first is 0): a position is found
    /// by binary search, so locating a name costs O(log n), not a scan of the text before it
    /// (which made a scenario of many workloads quadratic to validate).
    starts: Vec<usize>,
}

impl<'a> Lines<'a> {
    pub fn new(text: &'a str) -> Lines<'a> {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Lines { text, starts }
    }

    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        // Spans are byte offsets; a span inside a multi-byte char would be a toml bug, but
        // find a char boundary rather than panic on slicing.
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        // The last line start at or before `offset` (there is always one: 0).
        let line_index = self.starts.partition_point(|&s| s <= offset) - 1;
        let line_start = self.starts[line_index];
        let column = self.text[line_start..offset].chars().count() + 1;
        (line_index + 1, column)
    }
}

type Value<'a> = Spanned<DeValue<'a>>;

/// Where one field was written: its key and its value (kept whole, to describe what was found).
struct Site<'a> {
    key: Range<usize>,
    value: &'a Value<'a>,
}

/// The sites of a file's fields, and the fields the walk could not read.
#[derive(Default)]
pub(super) struct Spans<'a> {
    lines: Option<&'a Lines<'a>>,
    sites: HashMap<FieldPath, Site<'a>>,
    /// Fields whose value the walk refused (wrong type, missing, not allowed here): the walk
    /// has reported them and left a placeholder in the `Scenario`, so no rule looks at them.
    unread: HashSet<FieldPath>,
}

impl<'a> Spans<'a> {
    /// No file: a scenario built in code.
    pub fn none() -> Spans<'a> {
        Spans::default()
    }

    pub fn of_file(lines: &'a Lines<'a>) -> Spans<'a> {
        Spans {
            lines: Some(lines),
            ..Spans::default()
        }
    }

    pub fn record(&mut self, path: FieldPath, key: Range<usize>, value: &'a Value<'a>) {
        self.sites.insert(path, Site { key, value });
    }

    pub fn mark_unread(&mut self, path: FieldPath) {
        self.unread.insert(path);
    }

    pub fn unread(&self, path: FieldPath) -> bool {
        !self.unread.is_empty() && self.unread.contains(&path)
    }

    /// Whether the file wrote `path` (a scenario built in code wrote nothing).
    pub fn written(&self, path: FieldPath) -> bool {
        self.sites.contains_key(&path)
    }

    /// What the file wrote for `path` ("integer 0", "string \"x\""), if it wrote it.
    pub fn found(&self, path: FieldPath) -> Option<String> {
        self.sites.get(&path).map(|s| describe(s.value.get_ref()))
    }

    /// The span of the field's value (`key == false`) or key; a field the file does not hold
    /// (a default) falls back to its workload's table, then to the file's start.
    pub fn span(&self, path: FieldPath, key: bool) -> Range<usize> {
        let site = self.sites.get(&path).or_else(|| {
            path.workload()
                .and_then(|i| self.sites.get(&FieldPath::Workload(i, "")))
        });
        match site {
            Some(s) if key => s.key.clone(),
            Some(s) => s.value.span(),
            None => 0..0,
        }
    }

    /// Line and column of a byte offset; `None` without a file.
    pub fn line_col(&self, offset: usize) -> Option<(usize, usize)> {
        self.lines.map(|l| l.line_col(offset))
    }

    /// The line of a field's value, when there is a file and the file holds the field.
    pub fn line_of(&self, path: FieldPath) -> Option<usize> {
        let site = self.sites.get(&path)?;
        self.line_col(site.value.span().start).map(|(line, _)| line)
    }
}

pub(super) fn describe(v: &DeValue<'_>) -> String {
    match v {
        DeValue::String(s) => format!("string {:?}", s.as_ref()),
        DeValue::Integer(i) => format!("integer {}", i.as_str()),
        DeValue::Float(f) => format!("float {}", f.as_str()),
        DeValue::Boolean(b) => format!("boolean {b}"),
        DeValue::Datetime(d) => format!("datetime {d}"),
        DeValue::Array(_) => "an array".to_string(),
        DeValue::Table(_) => "a table".to_string(),
    }
}
