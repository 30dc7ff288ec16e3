//! Reading config text the way Disbatch 4 reads its config file: JSON with `#` (and `//`,
//! `/* */`) comments and trailing commas, as Perl's relaxed JSON parser accepts them.

use serde_json::Value;

use super::ConfigError;

/// Parses `text` as relaxed JSON: comments and trailing commas are blanked out first
/// (keeping every line and column where it was, so syntax errors point at the file's own
/// text), then the rest must be plain JSON. `file` names the text in errors.
pub fn parse_relaxed(text: &str, file: &str) -> Result<Value, ConfigError> {
    let mut plain = text.to_owned();
    if json_strip_comments::strip(&mut plain).is_err() {
        let line = text.lines().count().max(1);
        let column = text.lines().last().map_or(0, |l| l.chars().count()) + 1;
        return Err(ConfigError::Syntax {
            file: file.to_owned(),
            line,
            column,
            message: "the file ends inside a comment or a string".into(),
        });
    }
    serde_json::from_str(&plain).map_err(|e| ConfigError::Syntax {
        file: file.to_owned(),
        line: e.line(),
        column: e.column(),
        message: e.to_string().split(" at line").next().unwrap_or_default().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_trailing_commas_are_accepted() {
        let text = "# Disbatch config\n{\n  \"mongohost\": \"mongodb://h#1/\", # the server\n  \"plugins\": [\"A\", \"B\",],\n  // c style\n  \"gfs\": \"auto\", /* block */\n}\n";
        let v = parse_relaxed(text, "c.json").unwrap();
        assert_eq!(v["mongohost"], "mongodb://h#1/", "a # inside a string is kept");
        assert_eq!(v["plugins"], serde_json::json!(["A", "B"]));
        assert_eq!(v["gfs"], "auto");
    }

    #[test]
    fn errors_point_at_the_line_of_the_original_text() {
        let text = "# comment\n{\n  \"a\": 1, # fine\n  \"b\": nope\n}\n";
        match parse_relaxed(text, "c.json") {
            Err(ConfigError::Syntax { line, file, .. }) => {
                assert_eq!(line, 4);
                assert_eq!(file, "c.json");
            }
            other => panic!("{other:?}"),
        }
        match parse_relaxed("{\"a\": 1 /* open", "c.json") {
            Err(ConfigError::Syntax { line, .. }) => assert_eq!(line, 1),
            other => panic!("{other:?}"),
        }
    }
}
