//! One connection as the shared statements see it, whichever the store: a statement with
//! `?N` parameters bound from [`Value`]s, and its rows read into [`Row`]s of values. The ops
//! half reads a page at a time, so a row is materialised rather than borrowed from the driver.

use std::error::Error;

use bytes::BytesMut;
use postgres::types::{IsNull, ToSql, Type, WrongType};

use crate::store::{StoreError, StoreResult};

/// A value bound to a statement or read from a row, the same for both stores. A boolean is an
/// `Int` (SQLite has none; PostgreSQL's are bound and read as 0 and 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
    /// A list of integers, for the dialect's [`in_list`](super::Dialect::in_list): a JSON
    /// array for SQLite's `json_each`, a `bigint[]` for PostgreSQL's `ANY`.
    Ints(Vec<i64>),
}

impl From<Option<i64>> for Value {
    fn from(v: Option<i64>) -> Value {
        v.map_or(Value::Null, Value::Int)
    }
}

impl From<Option<&str>> for Value {
    fn from(v: Option<&str>) -> Value {
        v.map_or(Value::Null, |s| Value::Text(s.to_string()))
    }
}

/// A connection (a SQLite transaction or connection, a PostgreSQL transaction) running the
/// shared statements. Their SQL numbers its parameters `?1`, `?2`, … (SQLite's own form,
/// rewritten as `$1`, `$2`, … for PostgreSQL).
pub trait Conn {
    /// How this store's SQL differs where the shared statements care.
    type Dialect: super::Dialect;
    fn execute(&mut self, sql: &str, params: &[Value]) -> StoreResult<u64>;
    fn query(&mut self, sql: &str, params: &[Value]) -> StoreResult<Vec<Row>>;
    /// Before a change of the registry: whatever makes two changes of it run one after the
    /// other, each reading what it changes (SQLite: nothing, its write transaction holds the
    /// database's one write lock; PostgreSQL: the sync's locks, see its `lock_registry`).
    fn lock_registry(&mut self) -> StoreResult<()>;
    /// After queuing work (a retry): wake the claimers of other nodes (PostgreSQL's `NOTIFY`;
    /// SQLite's claimers are this process's, woken by its writer).
    fn queued(&mut self) -> StoreResult<()>;

    fn query_opt(&mut self, sql: &str, params: &[Value]) -> StoreResult<Option<Row>> {
        Ok(self.query(sql, params)?.into_iter().next())
    }

    fn query_one(&mut self, sql: &str, params: &[Value]) -> StoreResult<Row> {
        self.query_opt(sql, params)?
            .ok_or_else(|| internal(format!("no row from {sql}")))
    }
}

/// One row, its columns in the statement's order.
#[derive(Debug)]
pub struct Row(Vec<Value>);

impl Row {
    pub fn new(values: Vec<Value>) -> Row {
        Row(values)
    }

    pub fn into_values(self) -> Vec<Value> {
        self.0
    }

    fn at(&self, i: usize) -> StoreResult<&Value> {
        self.0
            .get(i)
            .ok_or_else(|| internal(format!("no column {i} in a row of {}", self.0.len())))
    }

    pub fn opt_int(&self, i: usize) -> StoreResult<Option<i64>> {
        match self.at(i)? {
            Value::Null => Ok(None),
            Value::Int(v) => Ok(Some(*v)),
            other => Err(internal(format!("column {i}: an integer, not {other:?}"))),
        }
    }

    pub fn int(&self, i: usize) -> StoreResult<i64> {
        self.opt_int(i)?
            .ok_or_else(|| internal(format!("column {i}: NULL")))
    }

    pub fn opt_text(&self, i: usize) -> StoreResult<Option<String>> {
        match self.at(i)? {
            Value::Null => Ok(None),
            Value::Text(v) => Ok(Some(v.clone())),
            other => Err(internal(format!("column {i}: text, not {other:?}"))),
        }
    }

    pub fn text(&self, i: usize) -> StoreResult<String> {
        self.opt_text(i)?
            .ok_or_else(|| internal(format!("column {i}: NULL")))
    }

    /// A boolean, stored as an integer by SQLite and read as 0 or 1 from PostgreSQL's.
    pub fn bool(&self, i: usize) -> StoreResult<bool> {
        Ok(self.int(i)? != 0)
    }

    pub fn opt_bytes(&self, i: usize) -> StoreResult<Option<Vec<u8>>> {
        match self.at(i)? {
            Value::Null => Ok(None),
            Value::Bytes(v) => Ok(Some(v.clone())),
            other => Err(internal(format!("column {i}: bytes, not {other:?}"))),
        }
    }

    pub fn bytes(&self, i: usize) -> StoreResult<Vec<u8>> {
        self.opt_bytes(i)?
            .ok_or_else(|| internal(format!("column {i}: NULL")))
    }
}

pub(crate) fn internal(message: String) -> StoreError {
    StoreError::Internal(anyhow::anyhow!(message))
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Int(i) => ValueRef::Integer(*i),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Bytes(b) => ValueRef::Blob(b),
            Value::Ints(list) => return Ok(ToSqlOutput::Owned(json_list(list).into())),
        }))
    }
}

fn json_list(list: &[i64]) -> String {
    let items: Vec<String> = list.iter().map(i64::to_string).collect();
    format!("[{}]", items.join(","))
}

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(i) => match *ty {
                Type::BOOL => (*i != 0).to_sql(ty, out),
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                _ => i.to_sql(ty, out),
            },
            Value::Text(s) => s.to_sql(ty, out),
            Value::Bytes(b) => b.to_sql(ty, out),
            Value::Ints(list) => list.to_sql(ty, out),
        }
    }

    /// Every type one of the variants takes; each variant is checked against the parameter's
    /// type in [`ToSql::to_sql_checked`].
    fn accepts(ty: &Type) -> bool {
        <i64 as ToSql>::accepts(ty)
            || matches!(*ty, Type::BOOL | Type::INT2 | Type::INT4)
            || <String as ToSql>::accepts(ty)
            || <Vec<u8> as ToSql>::accepts(ty)
            || <Vec<i64> as ToSql>::accepts(ty)
    }

    fn to_sql_checked(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        let fits = match self {
            Value::Null => true,
            Value::Int(_) => {
                <i64 as ToSql>::accepts(ty) || matches!(*ty, Type::BOOL | Type::INT2 | Type::INT4)
            }
            Value::Text(_) => <String as ToSql>::accepts(ty),
            Value::Bytes(_) => <Vec<u8> as ToSql>::accepts(ty),
            Value::Ints(_) => <Vec<i64> as ToSql>::accepts(ty),
        };
        if !fits {
            return Err(Box::new(WrongType::new::<Value>(ty.clone())));
        }
        self.to_sql(ty, out)
    }
}

/// The values as the `postgres` driver takes them.
pub fn pg_params(values: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
}

/// `?N` parameters as PostgreSQL's `$N`, outside quoted strings and names.
pub fn numbered_for_postgres(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quote: Option<char> = None;
    for c in sql.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '?' => {
                out.push('$');
                continue;
            }
            None => {}
        }
        out.push(c);
    }
    out
}

/// A PostgreSQL row read into values, by each column's type.
pub fn pg_row(row: &postgres::Row) -> StoreResult<Row> {
    let mut values = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let value = match *column.type_() {
            Type::BOOL => row.try_get::<_, Option<bool>>(i)?.map(i64::from).into(),
            Type::INT2 => row.try_get::<_, Option<i16>>(i)?.map(i64::from).into(),
            Type::INT4 => row.try_get::<_, Option<i32>>(i)?.map(i64::from).into(),
            Type::INT8 => row.try_get::<_, Option<i64>>(i)?.into(),
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => {
                row.try_get::<_, Option<&str>>(i)?.into()
            }
            Type::BYTEA => row
                .try_get::<_, Option<Vec<u8>>>(i)?
                .map_or(Value::Null, Value::Bytes),
            ref other => return Err(internal(format!("column {i}: type {other} not read"))),
        };
        values.push(value);
    }
    Ok(Row(values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_renumbered_outside_quotes_only() {
        assert_eq!(
            numbered_for_postgres("SELECT '?1', \"a?\" FROM t WHERE x = ?1 AND y = ?12"),
            "SELECT '?1', \"a?\" FROM t WHERE x = $1 AND y = $12"
        );
    }
}
