//! Plain-text tables for human output: left-aligned columns separated by two spaces.

use serde_json::Value;

/// Renders `rows` under `headers`, each column as wide as its widest cell.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.iter().map(|h| h.to_uppercase()).collect());
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

/// A JSON value as a table cell: strings bare, null as `-`, `{"$oid"}` and `{"$date"}` unwrapped.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Object(o) if o.len() == 1 && (o.contains_key("$oid") || o.contains_key("$date")) => {
            o.values().next().map(cell).unwrap_or_default()
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let t = render(
            &["a", "bb"],
            &[vec!["xxx".into(), "y".into()], vec!["z".into(), "w".into()]],
        );
        assert_eq!(t, "A    BB\nxxx  y\nz    w\n");
        assert_eq!(cell(&serde_json::json!({"$oid": "ab"})), "ab");
        assert_eq!(cell(&Value::Null), "-");
    }
}
