//! PTX text to tokens: words, punctuation, string literals and `@@DWARF` lines, each with its
//! byte span and line number. Comments (`//` to the end of the line, `/* ... */`) are
//! whitespace; a character that no PTX token starts with is an error naming its line.
//!
//! The parser (`parse.rs`) reads statements from the tokens, and hands an instruction's source
//! text (from its first token to its last, comments blanked) to the decoder, so nothing in the
//! text can fall between two statements unseen.

use crate::PtxError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directive (`.entry`), opcode (`ld.global.v4.f32`), identifier (`%r1`, `$L__BB0_2`,
    /// `__cudart_i2opi_f`) or number (`0f3F800000`, `42`, `1.5e-3`, `9.5`): letters, digits and
    /// `_ $ % .`, and `::` inside a word (`shared::cta`, `L2::cache_hint`).
    Word,
    /// One of `, ; { } [ ] ( ) @ ! = + - < > | : * / ~ & ^ ?`.
    Punct(u8),
    /// A string literal with its quotes (`.file 1 "a.cu"`, `.pragma "nounroll"`).
    Str,
    /// An `@@DWARF ...` line (old nvcc's debug information), to the end of the line.
    Dwarf,
}

#[derive(Debug, Clone, Copy)]
pub struct Token {
    pub kind: Kind,
    pub start: usize,
    pub end: usize,
    /// 1-based line of the token's first character.
    pub line: u32,
}

/// The tokens of `src`, and `src` with every comment blanked (spaces, newlines kept), from
/// which a statement's text is cut.
#[derive(Debug)]
pub struct Lexed {
    pub tokens: Vec<Token>,
    pub text: String,
}

impl Lexed {
    pub fn text(&self, t: &Token) -> &str {
        &self.text[t.start..t.end]
    }

    /// The source from token `a` to token `b` (inclusive), comments blanked.
    pub fn span(&self, a: &Token, b: &Token) -> &str {
        &self.text[a.start..b.end.max(a.start)]
    }

    /// The whole source line `line` (1-based), trimmed, for error messages.
    pub fn line(&self, line: u32) -> &str {
        self.text
            .lines()
            .nth(line.saturating_sub(1) as usize)
            .unwrap_or("")
            .trim()
    }
}

fn word_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'%' | b'.')
}

pub fn lex(src: &str) -> Result<Lexed, PtxError> {
    let b = src.as_bytes();
    let mut text = b.to_vec();
    let mut tokens = Vec::new();
    let mut i = 0;
    let mut line = 1u32;
    let err = |line: u32, what: String| PtxError::Syntax(format!("line {line}: {what}"));
    while i < b.len() {
        let c = b[i];
        let start = i;
        match c {
            b'\n' => {
                line += 1;
                i += 1;
            }
            _ if c.is_ascii_whitespace() => i += 1,
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    text[i] = b' ';
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let open = line;
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    if b[i] == b'\n' {
                        line += 1;
                    }
                    i += 1;
                }
                if i + 1 >= b.len() {
                    return Err(err(open, "unterminated /* comment".into()));
                }
                i += 2;
                for t in &mut text[start..i] {
                    if *t != b'\n' {
                        *t = b' ';
                    }
                }
            }
            b'"' => {
                i += 1;
                loop {
                    match b.get(i) {
                        None | Some(b'\n') => {
                            return Err(err(line, "unterminated string literal".into()))
                        }
                        Some(b'\\') => i += 2,
                        Some(b'"') => {
                            i += 1;
                            break;
                        }
                        Some(_) => i += 1,
                    }
                }
                tokens.push(Token {
                    kind: Kind::Str,
                    start,
                    end: i,
                    line,
                });
            }
            b'@' if b.get(i + 1) == Some(&b'@') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                let word = &src[start..i];
                if !word.starts_with("@@DWARF") {
                    return Err(err(line, format!("unknown directive `{}`", word.trim())));
                }
                tokens.push(Token {
                    kind: Kind::Dwarf,
                    start,
                    end: i,
                    line,
                });
            }
            _ if word_char(c) => {
                let digit = c.is_ascii_digit();
                while i < b.len() {
                    let d = b[i];
                    if word_char(d) {
                        i += 1;
                    } else if d == b':' && b.get(i + 1) == Some(&b':') {
                        i += 2;
                    } else if digit
                        && matches!(d, b'+' | b'-')
                        && matches!(b[i - 1], b'e' | b'E')
                        && !src[start..i].starts_with("0x")
                        && !src[start..i].starts_with("0X")
                        && b.get(i + 1).is_some_and(u8::is_ascii_digit)
                    {
                        // The exponent of a decimal float: `1.5e-3`.
                        i += 1;
                    } else {
                        break;
                    }
                }
                tokens.push(Token {
                    kind: Kind::Word,
                    start,
                    end: i,
                    line,
                });
            }
            b',' | b';' | b'{' | b'}' | b'[' | b']' | b'(' | b')' | b'@' | b'!' | b'=' | b'+'
            | b'-' | b'<' | b'>' | b'|' | b':' | b'*' | b'/' | b'~' | b'&' | b'^' | b'?' => {
                i += 1;
                tokens.push(Token {
                    kind: Kind::Punct(c),
                    start,
                    end: i,
                    line,
                });
            }
            _ => {
                let ch = src[start..].chars().next().unwrap_or('?');
                let l = src.lines().nth(line as usize - 1).unwrap_or("").trim();
                return Err(err(
                    line,
                    format!("unexpected character `{}` in `{l}`", ch.escape_default()),
                ));
            }
        }
    }
    // Every byte of a comment became a space (a multi-byte character's too), and characters
    // outside comments and strings are ASCII, so the blanked text is still UTF-8.
    let text = String::from_utf8(text).map_err(|_| err(line, "invalid UTF-8".into()))?;
    Ok(Lexed { tokens, text })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(src: &str) -> Vec<String> {
        let l = lex(src).unwrap();
        l.tokens.iter().map(|t| l.text(t).to_string()).collect()
    }

    #[test]
    fn words_numbers_and_punctuation() {
        assert_eq!(
            words("ld.global.L2::cache_hint.v4.f32 {%f1, %f2}, [%rd1+-4];"),
            [
                "ld.global.L2::cache_hint.v4.f32",
                "{",
                "%f1",
                ",",
                "%f2",
                "}",
                ",",
                "[",
                "%rd1",
                "+",
                "-",
                "4",
                "]",
                ";"
            ]
        );
        assert_eq!(
            words("x = 1.5e-3, 0x1e-2"),
            ["x", "=", "1.5e-3", ",", "0x1e", "-", "2"]
        );
        assert_eq!(words("$L__BB0_2:"), ["$L__BB0_2", ":"]);
    }

    #[test]
    fn comments_and_strings() {
        let l = lex("a // b ; c\n/* d ; \n e */ f \"g // ; h\" /**/").unwrap();
        let w: Vec<_> = l.tokens.iter().map(|t| l.text(t)).collect();
        assert_eq!(w, ["a", "f", "\"g // ; h\""]);
        assert_eq!(l.tokens[1].line, 3);
        assert!(lex("/* open").unwrap_err().to_string().contains("line 1"));
        assert!(lex("\n\"open").unwrap_err().to_string().contains("line 2"));
        let e = lex("add.s32 %r1, %r2, %r3;\n# define X").unwrap_err();
        assert!(
            e.to_string().contains("line 2") && e.to_string().contains('#'),
            "{e}"
        );
    }
}
