//! Conditions and variables: the two expression forms users write, parsed once.
//!
//! - the simple form of Limitador's first format: `req.method == 'POST'`, `!=`, and a bare key as
//!   a variable (`user_id`); the key is looked up in the request's descriptors, first one first;
//! - CEL, as current Limitador writes it: `descriptors[0]['req.method'] == 'POST'`,
//!   `descriptors[0].user_id`. The common shapes (one descriptor entry compared with a string)
//!   are recognised and evaluated without the CEL interpreter, with the same result; anything else
//!   runs through the `cel` crate.
//!
//! A condition that cannot be evaluated for a request (missing key, descriptor index out of range,
//! a CEL error or a non-boolean result) is false: the limit does not apply, as in Limitador.

use std::sync::Arc;

use crate::request::Facts;

/// Why a condition or a variable cannot be used, naming the expression.
///
/// ```
/// use tollgate_policy::{Condition, ExprError};
/// let err = Condition::parse("user == 'a' &&").unwrap_err();
/// assert!(matches!(&err, ExprError::Syntax { expression, .. } if expression == "user == 'a' &&"));
/// assert!(err.to_string().starts_with("cannot parse `user == 'a' &&`: "), "{err}");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExprError {
    /// Nothing but whitespace.
    #[error("empty {what}")]
    Empty {
        /// `"condition"` or `"variable"`.
        what: &'static str,
    },
    /// A CEL expression names a variable other than `descriptors`.
    #[error(
        "unknown variable `{name}` in `{expression}`: CEL expressions can use `descriptors` (e.g. \
         descriptors[0]['{name}']); the simple form is `key == 'value'`"
    )]
    UnknownVariable {
        /// The unknown name.
        name: String,
        /// The expression it is in (trimmed).
        expression: String,
    },
    /// The CEL parser rejected the expression.
    #[error("cannot parse `{expression}`: {reason}")]
    Syntax {
        /// The expression (trimmed).
        expression: String,
        /// The parser's first complaint.
        reason: String,
    },
    /// The CEL parser failed without saying why (it panicked; the panic was contained).
    #[error("cannot parse `{expression}`")]
    Unparsable {
        /// The expression (trimmed).
        expression: String,
    },
}

/// Where a value is read from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Lookup {
    /// Simple form: the first descriptor that has the key.
    Any(String),
    /// `descriptors[i]['key']`.
    At(usize, String),
}

impl Lookup {
    fn find<'f>(&self, facts: &'f Facts<'_>) -> Option<(usize, &'f str)> {
        match self {
            Lookup::Any(key) => facts.descriptors.iter().enumerate().find_map(|(i, d)| d.get(key).map(|v| (i, v))),
            Lookup::At(i, key) => facts.descriptors.get(*i).and_then(|d| d.get(key)).map(|v| (*i, v)),
        }
    }
}

#[derive(Clone, Debug)]
enum Test {
    Compare { lookup: Lookup, value: String, equal: bool },
    Cel(Arc<cel::Program>),
}

/// A parsed condition: every condition of a limit must hold for the limit to apply.
#[derive(Clone, Debug)]
pub struct Condition {
    source: String,
    test: Test,
}

impl Condition {
    /// Parses a condition in either form; the error says what is wrong with it.
    ///
    /// ```
    /// use tollgate_policy::Condition;
    /// assert!(Condition::parse("req.method == 'POST'").is_ok());
    /// assert!(Condition::parse("descriptors[0]['req.method'] != \"GET\"").is_ok());
    /// assert!(Condition::parse("size(descriptors) > 1").is_ok());
    /// assert!(Condition::parse("req.method = 'POST'").is_err());
    /// ```
    pub fn parse(source: &str) -> Result<Condition, ExprError> {
        let text = source.trim();
        if text.is_empty() {
            return Err(ExprError::Empty { what: "condition" });
        }
        let test = match comparison(text) {
            Some((lookup, equal, value)) => Test::Compare { lookup, value, equal },
            None => Test::Cel(Arc::new(compile(text)?)),
        };
        Ok(Condition { source: source.to_string(), test })
    }

    /// The expression as written in the file.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub(crate) fn holds(&self, facts: &Facts<'_>) -> bool {
        match &self.test {
            Test::Compare { lookup, value, equal } => match lookup.find(facts) {
                Some((_, v)) => (v == value) == *equal,
                None => false,
            },
            Test::Cel(program) => matches!(run(program, facts), Some(cel::Value::Bool(true))),
        }
    }

    pub(crate) fn descriptor(&self, facts: &Facts<'_>) -> Option<usize> {
        match &self.test {
            Test::Compare { lookup, .. } => lookup.find(facts).map(|(i, _)| i),
            Test::Cel(_) => None,
        }
    }
}

#[derive(Clone, Debug)]
enum Get {
    Entry(Lookup),
    Cel(Arc<cel::Program>),
}

/// A parsed variable: the limit keeps one counter per distinct value of its variables.
#[derive(Clone, Debug)]
pub struct Variable {
    source: String,
    get: Get,
}

impl Variable {
    /// Parses a variable: a bare descriptor key (`user_id`) or a CEL expression
    /// (`descriptors[0].user_id`).
    ///
    /// ```
    /// use tollgate_policy::Variable;
    /// assert!(Variable::parse("user_id").is_ok());
    /// assert!(Variable::parse("descriptors[0]['user.id']").is_ok());
    /// assert!(Variable::parse("descriptors[0].").is_err());
    /// ```
    pub fn parse(source: &str) -> Result<Variable, ExprError> {
        let text = source.trim();
        if text.is_empty() {
            return Err(ExprError::Empty { what: "variable" });
        }
        let get = if is_key(text) && !text.starts_with("descriptors") {
            Get::Entry(Lookup::Any(text.to_string()))
        } else if let Some((lookup, rest)) = descriptor_entry(text)
            && rest.trim().is_empty()
        {
            Get::Entry(lookup)
        } else {
            Get::Cel(Arc::new(compile(text)?))
        };
        Ok(Variable { source: source.to_string(), get })
    }

    /// The expression as written in the file.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The descriptor entry's key when the variable is one entry (`user_id`,
    /// `descriptors[0].user_id`, `descriptors[0]['user_id']`); `None` for other CEL expressions.
    ///
    /// ```
    /// use tollgate_policy::Variable;
    /// assert_eq!(Variable::parse("descriptors[0]['user.id']")?.descriptor_key(), Some("user.id"));
    /// assert_eq!(Variable::parse("user_id")?.descriptor_key(), Some("user_id"));
    /// assert_eq!(Variable::parse("descriptors[0].a + descriptors[0].b")?.descriptor_key(), None);
    /// # Ok::<(), tollgate_policy::ExprError>(())
    /// ```
    pub fn descriptor_key(&self) -> Option<&str> {
        match &self.get {
            Get::Entry(Lookup::Any(key) | Lookup::At(_, key)) => Some(key),
            Get::Cel(_) => None,
        }
    }

    /// The value for this request and the descriptor it came from (when known); `None` when the
    /// request does not have it (the limit then does not apply).
    pub(crate) fn value(&self, facts: &Facts<'_>) -> Option<(Option<usize>, String)> {
        match &self.get {
            Get::Entry(lookup) => lookup.find(facts).map(|(i, v)| (Some(i), v.to_string())),
            Get::Cel(program) => match run(program, facts)? {
                cel::Value::String(s) => Some((None, s.to_string())),
                cel::Value::Int(i) => Some((None, i.to_string())),
                cel::Value::UInt(u) => Some((None, u.to_string())),
                cel::Value::Float(f) => Some((None, f.to_string())),
                cel::Value::Bool(b) => Some((None, b.to_string())),
                _ => None,
            },
        }
    }
}

fn compile(text: &str) -> Result<cel::Program, ExprError> {
    // The CEL parser is generated code: keep a panic inside it from taking the server down.
    let parsed = std::panic::catch_unwind(|| cel::Program::compile(text));
    match parsed {
        Ok(Ok(program)) => {
            let refs = program.references();
            // Sorted: the references come in hash order, and the message should not vary by run.
            let mut unknown: Vec<&str> = refs.variables().into_iter().filter(|v| *v != "descriptors").collect();
            unknown.sort_unstable();
            if let Some(name) = unknown.first() {
                return Err(ExprError::UnknownVariable { name: (*name).to_owned(), expression: text.to_owned() });
            }
            Ok(program)
        }
        Ok(Err(errors)) => {
            let first = errors.errors.first().map(|e| e.msg.clone()).unwrap_or_else(|| errors.to_string());
            Err(ExprError::Syntax { expression: text.to_owned(), reason: first })
        }
        Err(_) => Err(ExprError::Unparsable { expression: text.to_owned() }),
    }
}

fn run(program: &cel::Program, facts: &Facts<'_>) -> Option<cel::Value> {
    let mut context = cel::Context::default();
    context.add_variable_from_value("descriptors", facts.cel_descriptors().clone());
    program.execute(&context).ok()
}

/// `key == 'v'`, `key != "v"`, `descriptors[0]['key'] == 'v'`, `descriptors[0].key != 'v'`.
fn comparison(text: &str) -> Option<(Lookup, bool, String)> {
    let (lookup, rest) = match descriptor_entry(text) {
        Some(found) => found,
        None => {
            let end = text.find(|c: char| c.is_whitespace() || c == '=' || c == '!').unwrap_or(text.len());
            let key = &text[..end];
            if !is_key(key) || key.starts_with("descriptors") {
                return None;
            }
            (Lookup::Any(key.to_string()), &text[end..])
        }
    };
    let rest = rest.trim_start();
    let (equal, rest) = if let Some(r) = rest.strip_prefix("==") {
        (true, r)
    } else if let Some(r) = rest.strip_prefix("!=") {
        (false, r)
    } else {
        return None;
    };
    let (value, rest) = quoted(rest.trim_start())?;
    rest.trim().is_empty().then_some((lookup, equal, value))
}

/// `descriptors[N]['key']`, `descriptors[N]["key"]` or `descriptors[N].key`, and what follows.
fn descriptor_entry(text: &str) -> Option<(Lookup, &str)> {
    let rest = text.strip_prefix("descriptors")?.trim_start().strip_prefix('[')?;
    let close = rest.find(']')?;
    let index: usize = rest[..close].trim().parse().ok()?;
    let rest = rest[close + 1..].trim_start();
    if let Some(rest) = rest.strip_prefix('[') {
        let (key, rest) = quoted(rest.trim_start())?;
        let rest = rest.trim_start().strip_prefix(']')?;
        Some((Lookup::At(index, key), rest))
    } else {
        let rest = rest.strip_prefix('.')?;
        let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        let key = &rest[..end];
        if key.is_empty() || key.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        Some((Lookup::At(index, key.to_string()), &rest[end..]))
    }
}

/// A string literal in single or double quotes (escapes `\\`, `\'`, `\"`), and what follows it.
fn quoted(text: &str) -> Option<(String, &str)> {
    let quote = text.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let mut value = String::new();
    let mut chars = text[1..].char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((_, e @ ('\\' | '\'' | '"'))) => value.push(e),
                _ => return None,
            },
            c if c == quote => return Some((value, &text[1 + i + 1..])),
            c => value.push(c),
        }
    }
    None
}

/// A descriptor key as the simple form writes it: `req.method`, `user_id`, `x-api-key`.
fn is_key(text: &str) -> bool {
    let mut chars = text.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | ':' | '/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Descriptor;

    fn holds(condition: &str, descriptors: &[Descriptor]) -> bool {
        Condition::parse(condition).unwrap().holds(&Facts::new(descriptors))
    }

    #[test]
    fn fast_paths_agree_with_cel() {
        let post = [Descriptor::from([("req.method", "POST"), ("user", "al'ice")])];
        let cases = [
            "descriptors[0]['req.method'] == 'POST'",
            "descriptors[0]['req.method'] != 'POST'",
            "descriptors[0][\"req.method\"] == \"GET\"",
            "descriptors[0].user == 'al\\'ice'",
            "descriptors[0]['missing'] == 'x'",
            "descriptors[0]['missing'] != 'x'",
            "descriptors[1]['req.method'] == 'POST'",
        ];
        for case in cases {
            let fast = holds(case, &post);
            let program = compile(case).unwrap();
            let slow = matches!(run(&program, &Facts::new(&post)), Some(cel::Value::Bool(true)));
            assert_eq!(fast, slow, "{case}");
            assert!(matches!(Condition::parse(case).unwrap().test, Test::Compare { .. }), "{case} takes the fast path");
        }
    }

    #[test]
    fn simple_form() {
        let post = [Descriptor::from([("req.method", "POST")])];
        assert!(holds("req.method == 'POST'", &post));
        assert!(!holds("req.method != 'POST'", &post));
        assert!(holds("req.method != \"GET\"", &post));
        assert!(!holds("other == 'POST'", &post), "a missing key never holds");
        assert!(!holds("other != 'POST'", &post), "a missing key never holds, even for !=");
    }

    #[test]
    fn general_cel() {
        let two = [Descriptor::from([("a", "1")]), Descriptor::from([("b", "2")])];
        assert!(holds("size(descriptors) == 2", &two));
        assert!(holds("descriptors[1]['b'] == '2' && descriptors[0].a == '1'", &two));
        assert!(!holds("descriptors[0]['a']", &two), "non-boolean result does not hold");
        assert!(Condition::parse("req.method == POST").is_err(), "unquoted value");
        assert!(Condition::parse("descriptors[0]['a'] ==").is_err());
        assert!(Condition::parse("method == 'a' &&").is_err());
    }

    #[test]
    fn variables() {
        let d = [Descriptor::from([("user", "bob"), ("n", "3")])];
        let facts = Facts::new(&d);
        assert_eq!(Variable::parse("user").unwrap().value(&facts), Some((Some(0), "bob".into())));
        assert_eq!(Variable::parse("descriptors[0].user").unwrap().value(&facts), Some((Some(0), "bob".into())));
        assert_eq!(Variable::parse("descriptors[0]['user'] + '!'").unwrap().value(&facts), Some((None, "bob!".into())));
        assert_eq!(Variable::parse("missing").unwrap().value(&facts), None);
        assert_eq!(Variable::parse("descriptors[3].user").unwrap().value(&facts), None);
    }
}
