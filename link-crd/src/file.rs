//! Standalone configuration: a YAML file of links in exactly the CRD's spec shape.
//!
//! ```yaml
//! links:
//!   - name: east
//!     spec:
//!       remote: {kubeconfigPath: /etc/floodgate/east.kubeconfig}
//! ```
//!
//! Loading applies the defaults, refuses unknown fields, and validates every link; each problem is
//! reported with its field path and the line it stands on.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

use crate::spec::LinkSpec;
use crate::validate::{FieldError, is_dns_label, validate};

/// The file: a list of named links.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LinksFile {
    /// The links Floodgate runs.
    pub links: Vec<NamedLink>,
}

/// One link of a file: the name it is served under (`/links/<name>/`) and its spec.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NamedLink {
    /// A DNS-1123 label, unique in the file.
    pub name: String,
    /// The same spec a `Link` resource has.
    pub spec: LinkSpec,
}

/// A problem with its place in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocatedError {
    /// 1-based line of the field, or of its nearest ancestor written in the file.
    pub line: Option<usize>,
    /// What and where in the spec.
    pub error: FieldError,
}

impl fmt::Display for LocatedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.error),
            None => write!(f, "{}", self.error),
        }
    }
}

/// Why a links file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not YAML, a wrong type, a missing required field or an unknown field. serde_yaml's message
    /// names the field path, line and column.
    #[error("{0}")]
    Parse(#[from] serde_yaml::Error),
    /// Well-formed, but some values are not acceptable.
    #[error("{} problem(s):\n{}", .0.len(), DisplayList(.0))]
    Invalid(Vec<LocatedError>),
}

struct DisplayList<'a>(&'a [LocatedError]);

impl fmt::Display for DisplayList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in self.0 {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

impl LinksFile {
    /// Parses, applies defaults and validates `src`.
    pub fn from_yaml(src: &str) -> Result<Self, ConfigError> {
        let file: LinksFile = serde_yaml::from_str(src)?;
        let mut problems = Vec::new();
        let mut seen = HashSet::new();
        for (i, link) in file.links.iter().enumerate() {
            if !is_dns_label(&link.name) {
                problems.push(FieldError {
                    path: format!("links[{i}].name"),
                    message: format!(
                        "{:?} is not a DNS-1123 label (lowercase letters, digits and '-', at most 63)",
                        link.name
                    ),
                });
            } else if !seen.insert(link.name.as_str()) {
                problems.push(FieldError {
                    path: format!("links[{i}].name"),
                    message: format!("{:?} is used by an earlier link", link.name),
                });
            }
            if let Err(errs) = validate(&link.spec, &format!("links[{i}].spec")) {
                problems.extend(errs.0);
            }
        }
        if problems.is_empty() {
            return Ok(file);
        }
        let lines = LineIndex::of(src);
        Err(ConfigError::Invalid(
            problems
                .into_iter()
                .map(|error| LocatedError {
                    line: lines.find(&error.path),
                    error,
                })
                .collect(),
        ))
    }

    /// The file with every default written out.
    pub fn to_yaml(&self) -> Result<String, serde_yaml::Error> {
        serde_yaml::to_string(self)
    }
}

/// The line of every mapping key in a YAML document, by field path (`links[0].spec.caps`).
#[derive(Debug, Default)]
struct LineIndex {
    lines: BTreeMap<String, usize>,
}

impl LineIndex {
    fn of(src: &str) -> Self {
        let mut walker = Walker::default();
        // A document serde_yaml accepted parses here too; if it does not, we just know fewer lines.
        let _ = Parser::new_from_str(src).load(&mut walker, false);
        Self {
            lines: walker.lines,
        }
    }

    /// The line of `path`, or of its nearest ancestor present in the file.
    fn find(&self, path: &str) -> Option<usize> {
        let mut p = path;
        loop {
            if let Some(line) = self.lines.get(p) {
                return Some(*line);
            }
            p = &p[..p.rfind(['.', '['])?];
        }
    }
}

#[derive(Debug)]
enum Frame {
    Mapping { path: String, key: Option<String> },
    Sequence { path: String, index: usize },
}

#[derive(Debug, Default)]
struct Walker {
    stack: Vec<Frame>,
    lines: BTreeMap<String, usize>,
}

impl Walker {
    /// The path of the node that starts now, as a child of the top frame.
    fn child_path(&self) -> String {
        match self.stack.last() {
            Some(Frame::Mapping { path, key: Some(k) }) if path.is_empty() => k.clone(),
            Some(Frame::Mapping { path, key: Some(k) }) => format!("{path}.{k}"),
            Some(Frame::Sequence { path, index }) => format!("{path}[{index}]"),
            _ => String::new(),
        }
    }

    /// A value node finished: the parent moves on to its next key or item.
    fn value_done(&mut self) {
        match self.stack.last_mut() {
            Some(Frame::Mapping { key, .. }) => *key = None,
            Some(Frame::Sequence { index, .. }) => *index += 1,
            None => {}
        }
    }
}

impl MarkedEventReceiver for Walker {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::MappingStart(..) => {
                let path = self.child_path();
                self.stack.push(Frame::Mapping { path, key: None });
            }
            Event::SequenceStart(..) => {
                let path = self.child_path();
                self.stack.push(Frame::Sequence { path, index: 0 });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
                self.value_done();
            }
            Event::Scalar(value, ..) => {
                if let Some(Frame::Mapping {
                    key: key @ None, ..
                }) = self.stack.last_mut()
                {
                    *key = Some(value);
                    let path = self.child_path();
                    self.lines.entry(path).or_insert(mark.line());
                } else {
                    self.value_done();
                }
            }
            Event::Alias(..) => self.value_done(),
            _ => {}
        }
    }
}
