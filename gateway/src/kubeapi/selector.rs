//! Label and field selectors in their query-string syntax.
//!
//! Label selectors parse into kube-core's [`Selector`] (whose matcher we reuse): `k=v`, `k==v`,
//! `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, comma-separated, with optional spaces. The
//! set-based `>`/`<` operators are refused with a clear 400 rather than misread. Field selectors
//! support `metadata.name` and `metadata.namespace` with `=`, `==` and `!=`, as the API server
//! does for every resource; any other field is a 400 naming it.

use std::collections::{BTreeMap, BTreeSet};

use kube::core::{Expression, Selector, SelectorExt};

use super::status::StatusError;

/// A parsed `labelSelector`.
#[derive(Clone, Debug, Default)]
pub struct LabelFilter(Option<Selector>);

impl LabelFilter {
    /// True when it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Parses the query-string form; empty selects everything.
    pub fn parse(s: &str) -> Result<Self, StatusError> {
        if s.trim().is_empty() {
            return Ok(Self(None));
        }
        let mut exprs = Vec::new();
        let mut lex = Lexer::new(s);
        loop {
            exprs.push(requirement(&mut lex).map_err(|why| {
                StatusError::bad_request(format!(
                    "unable to parse requirement: {why} in labelSelector {s:?}"
                ))
            })?);
            match lex.next() {
                None => break,
                Some(Tok::Comma) => continue,
                Some(t) => {
                    return Err(StatusError::bad_request(format!(
                        "unable to parse requirement: expected ',' but found {t:?} in labelSelector {s:?}"
                    )));
                }
            }
        }
        Ok(Self(Some(exprs.into_iter().collect())))
    }

    /// True when `labels` satisfy the selector.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        match &self.0 {
            None => true,
            Some(sel) => match labels {
                Some(l) => sel.matches(l),
                None => sel.matches(&BTreeMap::new()),
            },
        }
    }

    /// True when it selects everything.
    pub fn is_everything(&self) -> bool {
        self.0.as_ref().is_none_or(Selector::selects_all)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Word(String),
    Eq,
    DoubleEq,
    NotEq,
    Bang,
    Open,
    Close,
    Comma,
    Gt,
    Lt,
}

struct Lexer<'a> {
    rest: &'a str,
    peeked: Option<Option<Tok>>,
}

impl<'a> Lexer<'a> {
    fn new(s: &'a str) -> Self {
        Self {
            rest: s,
            peeked: None,
        }
    }

    fn peek(&mut self) -> Option<&Tok> {
        if self.peeked.is_none() {
            self.peeked = Some(self.lex());
        }
        self.peeked.as_ref().and_then(Option::as_ref)
    }

    fn next(&mut self) -> Option<Tok> {
        match self.peeked.take() {
            Some(t) => t,
            None => self.lex(),
        }
    }

    fn lex(&mut self) -> Option<Tok> {
        self.rest = self.rest.trim_start();
        let mut chars = self.rest.chars();
        let c = chars.next()?;
        let two = self.rest.get(..2);
        let (tok, len) = match (c, two) {
            (_, Some("==")) => (Tok::DoubleEq, 2),
            (_, Some("!=")) => (Tok::NotEq, 2),
            ('=', _) => (Tok::Eq, 1),
            ('!', _) => (Tok::Bang, 1),
            ('(', _) => (Tok::Open, 1),
            (')', _) => (Tok::Close, 1),
            (',', _) => (Tok::Comma, 1),
            ('>', _) => (Tok::Gt, 1),
            ('<', _) => (Tok::Lt, 1),
            _ => {
                let end = self
                    .rest
                    .find(|c: char| c.is_whitespace() || "=!(),<>".contains(c))
                    .unwrap_or(self.rest.len());
                (Tok::Word(self.rest[..end].to_owned()), end)
            }
        };
        self.rest = &self.rest[len..];
        Some(tok)
    }
}

fn requirement(lex: &mut Lexer<'_>) -> Result<Expression, String> {
    let key = match lex.next() {
        Some(Tok::Bang) => match lex.next() {
            Some(Tok::Word(k)) => return Ok(Expression::DoesNotExist(checked_key(k)?)),
            other => return Err(format!("expected a key after '!', found {other:?}")),
        },
        Some(Tok::Word(k)) => checked_key(k)?,
        other => return Err(format!("expected a key, found {other:?}")),
    };
    match lex.peek() {
        None | Some(Tok::Comma) => Ok(Expression::Exists(key)),
        Some(Tok::Eq | Tok::DoubleEq) => {
            lex.next();
            Ok(Expression::Equal(key, value(lex)?))
        }
        Some(Tok::NotEq) => {
            lex.next();
            Ok(Expression::NotEqual(key, value(lex)?))
        }
        Some(Tok::Gt | Tok::Lt) => {
            Err("the operators > and < are not supported by Floodgate".into())
        }
        Some(Tok::Word(w)) if w == "in" || w == "notin" => {
            let notin = w == "notin";
            lex.next();
            let values = set(lex)?;
            Ok(if notin {
                Expression::NotIn(key, values)
            } else {
                Expression::In(key, values)
            })
        }
        Some(t) => Err(format!("unexpected {t:?} after key {key:?}")),
    }
}

/// A value after `=`/`!=`: a word, or nothing (`k=` selects an empty value).
fn value(lex: &mut Lexer<'_>) -> Result<String, String> {
    match lex.peek() {
        Some(Tok::Word(_)) => match lex.next() {
            Some(Tok::Word(v)) => checked_value(v),
            _ => Err("expected a value".into()),
        },
        None | Some(Tok::Comma) => Ok(String::new()),
        Some(t) => Err(format!("expected a value, found {t:?}")),
    }
}

fn set(lex: &mut Lexer<'_>) -> Result<BTreeSet<String>, String> {
    if lex.next() != Some(Tok::Open) {
        return Err("expected '(' after in/notin".into());
    }
    let mut values = BTreeSet::new();
    loop {
        match lex.next() {
            Some(Tok::Word(v)) => {
                values.insert(checked_value(v)?);
            }
            Some(Tok::Close) if values.is_empty() => return Err("empty value set".into()),
            other => return Err(format!("expected a value in the set, found {other:?}")),
        }
        match lex.next() {
            Some(Tok::Comma) => continue,
            Some(Tok::Close) => return Ok(values),
            other => return Err(format!("expected ',' or ')', found {other:?}")),
        }
    }
}

fn checked_key(k: String) -> Result<String, String> {
    floodgate_link_crd::validate::check_label_key(&k)
        .map_err(|why| format!("invalid label key {k:?}: {why}"))?;
    Ok(k)
}

fn checked_value(v: String) -> Result<String, String> {
    floodgate_link_crd::validate::check_label_value(&v)
        .map_err(|why| format!("invalid label value {v:?}: {why}"))?;
    Ok(v)
}

/// A parsed `fieldSelector`: conditions on `metadata.name` and `metadata.namespace`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldFilter(Vec<(Field, bool, String)>);

/// The fields every resource supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// `metadata.name`.
    Name,
    /// `metadata.namespace`.
    Namespace,
}

impl FieldFilter {
    /// True when it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Parses `metadata.name=x,metadata.namespace!=y`.
    pub fn parse(s: &str) -> Result<Self, StatusError> {
        let mut out = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(StatusError::bad_request(format!(
                    "invalid field selector {term:?}: expected field=value, field==value or field!=value"
                )));
            };
            let field = match field.trim() {
                "metadata.name" => Field::Name,
                "metadata.namespace" => Field::Namespace,
                other => {
                    return Err(StatusError::bad_request(format!(
                        "field label not supported: {other} (Floodgate supports metadata.name and metadata.namespace)"
                    )));
                }
            };
            out.push((field, eq, value.trim().to_owned()));
        }
        Ok(Self(out))
    }

    /// True when an object with this namespace and name satisfies every condition.
    pub fn matches(&self, namespace: &str, name: &str) -> bool {
        self.0.iter().all(|(field, eq, value)| {
            let actual = match field {
                Field::Name => name,
                Field::Namespace => namespace,
            };
            (actual == value) == *eq
        })
    }

    /// The one name asked for with `metadata.name=x`, if any (lets a watch of one object skip
    /// the rest).
    pub fn exact_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(f, eq, _)| *f == Field::Name && *eq)
            .map(|(_, _, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn sel(s: &str) -> LabelFilter {
        LabelFilter::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn the_full_label_syntax() {
        let l = labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("mirror.linkerd.io/exported", "true"),
        ]);
        for yes in [
            "app=web",
            "app==web",
            "app!=db",
            "tier in (front,back)",
            "tier notin (db)",
            "app",
            "!legacy",
            "app=web, tier in ( front ) ,!legacy",
            "mirror.linkerd.io/exported=true",
            "",
        ] {
            assert!(sel(yes).matches(Some(&l)), "{yes:?} should match");
        }
        for no in [
            "app=db",
            "app!=web",
            "tier in (back)",
            "tier notin (front)",
            "legacy",
            "!app",
            "app=web,tier=back",
        ] {
            assert!(!sel(no).matches(Some(&l)), "{no:?} should not match");
        }
        assert!(
            sel("missing!=x").matches(None),
            "!= matches objects without the label"
        );
    }

    #[test]
    fn malformed_label_selectors_are_400() {
        for bad in [
            "app=",
            "=web",
            "app in web",
            "app in ()",
            "app in (a",
            "a b",
            "app=web,",
            "!",
            "a>1",
            "Bad Key=1",
            "app=(x)",
        ] {
            if bad == "app=" {
                assert!(LabelFilter::parse(bad).is_ok(), "an empty value is legal");
                continue;
            }
            let err = LabelFilter::parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} must fail"));
            assert_eq!(err.code().as_u16(), 400, "{bad:?}");
        }
    }

    #[test]
    fn field_selectors_on_name_and_namespace_only() {
        let f =
            FieldFilter::parse("metadata.name=a,metadata.namespace!=kube-system").expect("valid");
        assert!(f.matches("default", "a"));
        assert!(!f.matches("kube-system", "a"));
        assert!(!f.matches("default", "b"));
        assert_eq!(f.exact_name(), Some("a"));
        let err = FieldFilter::parse("spec.nodeName=n1").expect_err("unsupported");
        assert_eq!(err.code().as_u16(), 400);
        assert!(err.message.contains("spec.nodeName"), "{}", err.message);
        assert!(FieldFilter::parse("metadata.name").is_err());
    }
}
