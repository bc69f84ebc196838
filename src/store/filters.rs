//! A subscription's filter as SQL, for the fan-out statement of either store: the combinators
//! are written once here, each store's [`Dialect`] says how one test reads the body. Every
//! value and key becomes an escaped literal (SQLite's `'…'` with quotes doubled; PostgreSQL's
//! `E'…'` with quotes and backslashes escaped, whatever `standard_conforming_strings` says);
//! the filter's checks (`subscriptions::filter`) refuse U+0000 and the pointer's a quote or a
//! control character, so no value can end a literal early.
//!
//! Each expression is true or false, never NULL (a NULL under `not` would stay NULL where the
//! Rust evaluator says true): a missing field makes a test false, not unknown.

use crate::subscriptions::filter::{Bound, Filter, Scalar, Test};

/// How one store reads a filter's field and compares it.
pub trait Dialect {
    /// The test on the field at `path`.
    fn test(&self, path: &[String], test: &Test) -> String;
    /// `expr` where the body is JSON, false where it is not.
    fn guard(&self, expr: &str) -> String;
}

/// The filter as a condition on the body, false for a body that is not JSON.
pub fn filter_sql(filter: &Filter, dialect: &impl Dialect) -> String {
    dialect.guard(&node(filter, dialect))
}

fn node(filter: &Filter, dialect: &impl Dialect) -> String {
    let join = |list: &[Filter], with: &str| {
        let parts: Vec<String> = list.iter().map(|f| node(f, dialect)).collect();
        format!("({})", parts.join(with))
    };
    match filter {
        Filter::All(list) => join(list, " AND "),
        Filter::Any(list) => join(list, " OR "),
        Filter::Not(inner) => format!("(NOT {})", node(inner, dialect)),
        Filter::Field(c) => {
            let parts: Vec<String> = c.tests.iter().map(|t| dialect.test(&c.path, t)).collect();
            format!("({})", parts.join(" AND "))
        }
    }
}

/// SQLite: the body is text `body` (an expression); `json_type` tells the JSON type of the
/// field (NULL when missing) and `json_extract` its value, as SQL values (SQLite parses the
/// body once per statement and row for all of them).
pub struct Sqlite<'a> {
    pub body: &'a str,
}

impl Sqlite<'_> {
    fn numeric(ty: &str) -> String {
        format!("ifnull({ty}, '') IN ('integer', 'real')")
    }

    /// `value` equals the scalar `s`, typed: never NULL when the field is there.
    fn equals(ty: &str, value: &str, s: &Scalar) -> String {
        match s {
            Scalar::Str(text) => format!("({ty} IS 'text' AND {value} IS {})", quote(text)),
            Scalar::Num(n) => format!("({} AND {value} = {n})", Self::numeric(ty)),
            Scalar::Bool(b) => format!("({ty} IS '{b}')"),
        }
    }

    fn any_of(ty: &str, value: &str, list: &[Scalar]) -> String {
        let parts: Vec<String> = list.iter().map(|s| Self::equals(ty, value, s)).collect();
        format!("({})", parts.join(" OR "))
    }
}

impl Dialect for Sqlite<'_> {
    fn test(&self, path: &[String], test: &Test) -> String {
        let json_path = sqlite_json_path(path);
        let ty = format!("json_type({}, {json_path})", self.body);
        let value = format!("json_extract({}, {json_path})", self.body);
        match test {
            Test::Exists(true) => format!("({ty} IS NOT NULL)"),
            Test::Exists(false) => format!("({ty} IS NULL)"),
            Test::Eq(s) => Self::equals(&ty, &value, s),
            Test::Ne(s) => format!(
                "({ty} IS NOT NULL AND NOT {})",
                Self::equals(&ty, &value, s)
            ),
            Test::In(list) => Self::any_of(&ty, &value, list),
            Test::Nin(list) => format!(
                "({ty} IS NOT NULL AND NOT {})",
                Self::any_of(&ty, &value, list)
            ),
            Test::Cmp(op, Bound::Num(n)) => {
                format!("({} AND {value} {} {n})", Self::numeric(&ty), op.sql())
            }
            Test::Cmp(op, Bound::Str(s)) => {
                format!("({ty} IS 'text' AND {value} {} {})", op.sql(), quote(s))
            }
            Test::Prefix(p) => format!(
                "({ty} IS 'text' AND substr({value}, 1, {}) IS {})",
                p.chars().count(),
                quote(p)
            ),
        }
    }

    fn guard(&self, expr: &str) -> String {
        format!(
            "(CASE WHEN json_valid({}) THEN {expr} ELSE 0 END)",
            self.body
        )
    }
}

/// PostgreSQL: the body is `body`, a `jsonb` expression that is NULL when the stored body is
/// not JSON (`webhook_inbox_json_body`, migration 0013). Fields compare as `jsonb` (numbers by
/// value, types never equal to each other); strings are ordered byte-wise (`COLLATE "C"`, as
/// SQLite and Rust order them), not by the database's collation.
pub struct Postgres<'a> {
    pub body: &'a str,
}

impl Postgres<'_> {
    fn json(s: &Scalar) -> String {
        format!("{}::jsonb", e_quote(&s.to_json().to_string()))
    }

    fn any_of(field: &str, list: &[Scalar]) -> String {
        let items: Vec<String> = list.iter().map(Self::json).collect();
        format!("{field} IN ({})", items.join(", "))
    }
}

impl Dialect for Postgres<'_> {
    fn test(&self, path: &[String], test: &Test) -> String {
        let keys: Vec<String> = path.iter().map(|k| e_quote(k)).collect();
        let path = format!("ARRAY[{}]::text[]", keys.join(", "));
        let field = format!("({} #> {path})", self.body);
        let text = format!("({} #>> {path})", self.body);
        // `coalesce`: a missing field (NULL) makes the test false, not unknown.
        let known = |expr: String| format!("coalesce({expr}, false)");
        match test {
            Test::Exists(true) => format!("({field} IS NOT NULL)"),
            Test::Exists(false) => format!("({field} IS NULL)"),
            Test::Eq(s) => known(format!("{field} = {}", Self::json(s))),
            Test::Ne(s) => known(format!("{field} <> {}", Self::json(s))),
            Test::In(list) => known(Self::any_of(&field, list)),
            Test::Nin(list) => known(format!("NOT {}", Self::any_of(&field, list))),
            Test::Cmp(op, Bound::Num(n)) => known(format!(
                "jsonb_typeof({field}) = 'number' AND {field} {} {}",
                op.sql(),
                e_quote(&n.to_string()) + "::jsonb"
            )),
            Test::Cmp(op, Bound::Str(s)) => known(format!(
                "jsonb_typeof({field}) = 'string' AND {text} COLLATE \"C\" {} {}",
                op.sql(),
                e_quote(s)
            )),
            Test::Prefix(p) => known(format!(
                "jsonb_typeof({field}) = 'string' AND starts_with({text}, {})",
                e_quote(p)
            )),
        }
    }

    fn guard(&self, expr: &str) -> String {
        format!("({} IS NOT NULL AND {expr})", self.body)
    }
}

/// The SQLite JSON path literal of the key `path` (`'$."data"."customer_id"'`), for filters and
/// order keys alike. SQLite reads a quoted label's backslashes as JSON escapes, so each is
/// doubled (a pointer has no quote or control character to escape: `parse_pointer` refuses
/// them).
pub fn sqlite_json_path(path: &[String]) -> String {
    let json_path: String = std::iter::once("$".to_string())
        .chain(
            path.iter()
                .map(|k| format!(".\"{}\"", k.replace('\\', "\\\\"))),
        )
        .collect();
    quote(&json_path)
}

/// An SQLite string literal (no backslash escapes there).
fn quote(text: &str) -> String {
    crate::store::routes::quote(text)
}

/// A PostgreSQL escape-string literal: the same text whatever the server's
/// `standard_conforming_strings`.
pub fn e_quote(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// How many events this node's fan-outs left out of each filtered subscription (its route took
/// them, its filter did not): `webhook_inbox_filtered_out_total`. Counted by the fan-out, by
/// name; a fan-out whose transaction then fails counts them again when retried.
#[derive(Debug, Default)]
pub struct LeftOut(parking_lot::Mutex<std::collections::HashMap<String, u64>>);

impl LeftOut {
    pub fn add(&self, name: &str, n: u64) {
        if n > 0 {
            *self.0.lock().entry(name.to_string()).or_default() += n;
        }
    }

    /// Every subscription's total so far, by name.
    pub fn totals(&self) -> Vec<(String, u64)> {
        let mut totals: Vec<(String, u64)> =
            self.0.lock().iter().map(|(k, v)| (k.clone(), *v)).collect();
        totals.sort();
        totals
    }
}
