//! Messages for a terminal: the one wrapping rule every command's notes, errors and the
//! planner's events share, so that they read whole in 80 columns as the tables do.

/// Columns a message printed after `error: ` wraps at, so that it reads whole in an
/// 80-column terminal as the tables do.
pub const ERROR_WIDTH: usize = 80 - "error: ".len();

/// `text` wrapped at `width` columns (characters) on spaces, each paragraph (a line of `text`)
/// on its own and continuation lines indented by two spaces; a word longer than a line (a path)
/// stays whole.
pub fn wrap_message(text: &str, width: usize) -> String {
    let mut out: Vec<String> = Vec::new();
    for paragraph in text.lines() {
        let mut line = String::new();
        for word in paragraph.split(' ').filter(|w| !w.is_empty()) {
            let len = line.chars().count();
            if len > 0 && len + 1 + word.chars().count() > width {
                out.push(std::mem::take(&mut line));
                line.push_str("  ");
            }
            if !line.trim_start().is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        out.push(line);
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_on_spaces_and_keeps_long_words_whole() {
        let text = "one two three four /a/path/longer/than/the/line five";
        let wrapped = wrap_message(text, 14);
        assert_eq!(
            wrapped,
            "one two three\n  four\n  /a/path/longer/than/the/line\n  five"
        );
        assert!(wrap_message("a\nb c", 80).starts_with("a\nb c"));
    }

    #[test]
    fn long_messages_wrap_at_words_with_indented_continuations() {
        let text = "a scenario that asks for cuda: ".repeat(8) + "/a/very/long/path/name.toml";
        let wrapped = wrap_message(&format!("{text}\nsecond paragraph"), ERROR_WIDTH);
        let lines: Vec<&str> = wrapped.lines().collect();
        assert!(lines.len() > 3, "{wrapped}");
        assert!(
            lines.iter().all(|l| l.chars().count() <= ERROR_WIDTH),
            "{wrapped}"
        );
        assert!(
            lines[1].starts_with("  ") && !lines[1].starts_with("   "),
            "{wrapped}"
        );
        assert_eq!(*lines.last().unwrap(), "second paragraph");
        // Nothing is lost: the words are the same.
        let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(words(&wrapped), words(&format!("{text} second paragraph")));
    }
}
