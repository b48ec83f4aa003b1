//! Input errors: a history that cannot be read, named by file and line.

/// Why an input could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InputError {
    /// A line that does not parse, or that contradicts an earlier one.
    #[error("{file}:{line}: {message}")]
    Line {
        /// The input's name (its path).
        file: String,
        /// The line, from 1.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The input as a whole (unreadable, empty of records).
    #[error("{file}: {message}")]
    File {
        /// The input's name (its path).
        file: String,
        /// What is wrong with it.
        message: String,
    },
}

impl InputError {
    /// An error on line `line` of `file`.
    pub fn line(file: &str, line: usize, message: impl Into<String>) -> InputError {
        InputError::Line {
            file: file.to_string(),
            line,
            message: message.into(),
        }
    }

    /// An error about the whole of `file`.
    pub fn file(file: &str, message: impl Into<String>) -> InputError {
        InputError::File {
            file: file.to_string(),
            message: message.into(),
        }
    }
}

/// The lines of `input` with their numbers (from 1), each checked to be UTF-8, without the
/// line end (`\n` or `\r\n`).
pub fn numbered_lines<'a>(
    file: &'a str,
    input: &'a [u8],
) -> impl Iterator<Item = Result<(usize, &'a str), InputError>> + 'a {
    let mut parts = input.split(|&b| b == b'\n').enumerate().peekable();
    std::iter::from_fn(move || {
        let (i, raw) = parts.next()?;
        // The empty piece after a final newline is not a line.
        if raw.is_empty() && parts.peek().is_none() {
            return None;
        }
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        Some(match std::str::from_utf8(raw) {
            Ok(text) => Ok((i + 1, text)),
            Err(e) => Err(InputError::line(
                file,
                i + 1,
                format!("not UTF-8 text (byte {})", e.valid_up_to() + 1),
            )),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_numbered_and_checked() {
        let got: Vec<_> = numbered_lines("f", b"a\r\n\nb\n").collect();
        assert_eq!(got, vec![Ok((1, "a")), Ok((2, "")), Ok((3, "b"))]);
        let got: Vec<_> = numbered_lines("f", b"a\n\xff\n").collect();
        assert_eq!(
            got[1].as_ref().map_err(|e| e.to_string()),
            Err("f:2: not UTF-8 text (byte 1)".to_string())
        );
        assert_eq!(numbered_lines("f", b"").count(), 0);
        assert_eq!(numbered_lines("f", b"x").count(), 1);
    }
}
