//! The lexer: text to tokens with positions.

use super::ParseError;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    Ident(String),
    Str(String),
    /// A decimal integer, sign included.
    Int(String),
    /// A decimal number with a fraction or an exponent, sign included.
    Float(String),
    /// `0x...`, the digits only.
    Hex(String),
    /// `%123`.
    Ref(u64),
    /// A lone `-` before an identifier (`-inf`).
    Minus,
    /// One of `= ( ) { } [ ] , :`.
    Punct(char),
    Eof,
}

#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub tok: Tok,
    pub line: usize,
    pub col: usize,
    /// Byte range in the source.
    pub start: usize,
    pub end: usize,
}

struct Cursor<'a> {
    src: &'a str,
    pos: usize,
    line: usize,
    col: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn peek2(&self) -> Option<char> {
        let mut it = self.src[self.pos..].chars();
        it.next();
        it.next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn eat_while(&mut self, f: impl Fn(char) -> bool) {
        while self.peek().is_some_and(&f) {
            self.bump();
        }
    }
}

pub(crate) fn err(line: usize, col: usize, message: impl Into<String>) -> ParseError {
    ParseError {
        line,
        col,
        message: message.into(),
    }
}

/// Show a piece of source in a message, shortened.
pub(crate) fn snippet(text: &str) -> String {
    let mut s: String = text.chars().take(40).collect();
    if text.chars().nth(40).is_some() {
        s.push_str("...");
    }
    s
}

pub(crate) fn lex(src: &str) -> Result<Vec<Token>, ParseError> {
    let mut c = Cursor {
        src,
        pos: 0,
        line: 1,
        col: 1,
    };
    let mut out = Vec::new();
    loop {
        c.eat_while(char::is_whitespace);
        let (line, col, start) = (c.line, c.col, c.pos);
        let Some(ch) = c.peek() else {
            out.push(Token {
                tok: Tok::Eof,
                line,
                col,
                start,
                end: start,
            });
            crate::work::add_len(crate::work::Stage::Parse, out.len());
            return Ok(out);
        };
        let tok = match ch {
            '#' => {
                c.eat_while(|x| x != '\n');
                continue;
            }
            '"' => {
                c.bump();
                Tok::Str(lex_string(&mut c, line, col)?)
            }
            '%' => {
                c.bump();
                let ds = c.pos;
                c.eat_while(|x| x.is_ascii_digit());
                let digits = &src[ds..c.pos];
                if digits.is_empty() {
                    let found = c.peek().map_or("end of input".to_string(), |x| format!("`{x}`"));
                    return Err(err(line, col, format!("expected a node id after `%`, found {found}")));
                }
                let n = digits
                    .parse::<u64>()
                    .map_err(|_| err(line, col, format!("node id `%{}` is too large", snippet(digits))))?;
                Tok::Ref(n)
            }
            '0' if matches!(c.peek2(), Some('x' | 'X')) => {
                c.bump();
                c.bump();
                let ds = c.pos;
                c.eat_while(|x| x.is_ascii_hexdigit());
                if ds == c.pos {
                    return Err(err(line, col, "expected hex digits after `0x`"));
                }
                Tok::Hex(src[ds..c.pos].to_string())
            }
            '-' | '+' | '0'..='9' => {
                if ch == '-' || ch == '+' {
                    c.bump();
                    if !c.peek().is_some_and(|x| x.is_ascii_digit()) {
                        if ch == '-' {
                            out.push(Token {
                                tok: Tok::Minus,
                                line,
                                col,
                                start,
                                end: c.pos,
                            });
                            continue;
                        }
                        return Err(err(line, col, "expected a number after `+`"));
                    }
                }
                c.eat_while(|x| x.is_ascii_digit());
                let mut float = false;
                if c.peek() == Some('.') && c.peek2().is_some_and(|x| x.is_ascii_digit()) {
                    float = true;
                    c.bump();
                    c.eat_while(|x| x.is_ascii_digit());
                }
                if matches!(c.peek(), Some('e' | 'E')) {
                    let mut look = c.src[c.pos..].chars().skip(1);
                    let ok = match look.next() {
                        Some('+' | '-') => look.next().is_some_and(|x| x.is_ascii_digit()),
                        Some(x) => x.is_ascii_digit(),
                        None => false,
                    };
                    if ok {
                        float = true;
                        c.bump();
                        if matches!(c.peek(), Some('+' | '-')) {
                            c.bump();
                        }
                        c.eat_while(|x| x.is_ascii_digit());
                    }
                }
                let text = src[start..c.pos].to_string();
                if float {
                    Tok::Float(text)
                } else {
                    Tok::Int(text)
                }
            }
            x if x.is_ascii_alphabetic() || x == '_' => {
                c.eat_while(|x| x.is_ascii_alphanumeric() || x == '_');
                Tok::Ident(src[start..c.pos].to_string())
            }
            '=' | '(' | ')' | '{' | '}' | '[' | ']' | ',' | ':' => {
                c.bump();
                Tok::Punct(ch)
            }
            x => {
                return Err(err(line, col, format!("unexpected character `{}`", x.escape_debug())));
            }
        };
        out.push(Token {
            tok,
            line,
            col,
            start,
            end: c.pos,
        });
    }
}

/// The rest of a string literal after its opening quote at `line:col`.
fn lex_string(c: &mut Cursor<'_>, line: usize, col: usize) -> Result<String, ParseError> {
    let mut s = String::new();
    loop {
        let (el, ec) = (c.line, c.col);
        match c.bump() {
            None | Some('\n') => return Err(err(line, col, "unterminated string")),
            Some('"') => return Ok(s),
            Some('\\') => match c.bump() {
                Some('"') => s.push('"'),
                Some('\\') => s.push('\\'),
                Some('n') => s.push('\n'),
                Some('t') => s.push('\t'),
                Some('r') => s.push('\r'),
                Some('u') => {
                    if c.bump() != Some('{') {
                        return Err(err(el, ec, "expected `{` after `\\u`"));
                    }
                    let ds = c.pos;
                    c.eat_while(|x| x.is_ascii_hexdigit());
                    let digits = &c.src[ds..c.pos];
                    let ch = u32::from_str_radix(digits, 16)
                        .ok()
                        .filter(|_| digits.len() <= 6)
                        .and_then(char::from_u32);
                    match (ch, c.bump()) {
                        (Some(ch), Some('}')) => s.push(ch),
                        _ => return Err(err(el, ec, format!("bad unicode escape `\\u{{{}`", snippet(digits)))),
                    }
                }
                None | Some('\n') => return Err(err(line, col, "unterminated string")),
                Some(x) => return Err(err(el, ec, format!("unknown escape `\\{}`", x.escape_debug()))),
            },
            Some(x) => s.push(x),
        }
    }
}
