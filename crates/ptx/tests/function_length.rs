//! No function of the crate's source is longer than 150 lines, counted from its `fn` line to
//! its closing brace (issue 30: the parser and the interpreter read as tables and named
//! pieces, not as a few functions of hundreds of lines).

use std::path::Path;

const LIMIT: usize = 150;

/// `src` with comments, strings and character literals blanked (newlines kept), so that no
/// brace or `fn` inside them counts.
fn blank(src: &str) -> Vec<u8> {
    let mut out = src.as_bytes().to_vec();
    let mut i = 0;
    while i < out.len() {
        match literal_end(src, i) {
            Some(end) => {
                let end = end.min(out.len());
                for b in &mut out[i..end] {
                    if *b != b'\n' {
                        *b = b' ';
                    }
                }
                i = end;
            }
            None => i += 1,
        }
    }
    out
}

/// Where the comment, string or character literal at `i` ends, if one starts there (a
/// lifetime is none).
fn literal_end(src: &str, i: usize) -> Option<usize> {
    let s = src.as_bytes();
    let find = |from: usize, end: &[u8]| {
        (from..s.len())
            .find(|&k| s[k..].starts_with(end))
            .map_or(s.len(), |k| k + end.len())
    };
    if s[i..].starts_with(b"//") {
        Some(find(i, b"\n") - 1)
    } else if s[i..].starts_with(b"/*") {
        let mut depth = 0;
        let mut k = i;
        while k < s.len() {
            if s[k..].starts_with(b"/*") {
                depth += 1;
                k += 2;
            } else if s[k..].starts_with(b"*/") {
                depth -= 1;
                k += 2;
                if depth == 0 {
                    break;
                }
            } else {
                k += 1;
            }
        }
        Some(k)
    } else if let Some((j, hashes)) = raw_string(s, i) {
        // Through `"` and as many `#` as it opened with.
        let mut close = vec![b'"'];
        close.resize(1 + hashes, b'#');
        Some(find(j + hashes + 1, &close))
    } else if s[i] == b'"' {
        let mut k = i + 1;
        while k < s.len() && s[k] != b'"' {
            k += if s[k] == b'\\' { 2 } else { 1 };
        }
        Some(k + 1)
    } else if s[i] == b'\'' {
        // `'x'`, `'\n'`, `'\u{..}'`; else a lifetime.
        let len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
        if s.get(i + 1) == Some(&b'\\') {
            Some(find(i + 2, b"'"))
        } else {
            (s.get(i + 1 + len) == Some(&b'\'')).then_some(i + len + 2)
        }
    } else {
        None
    }
}

/// A raw string (`r"`, `r#"`, `br"`, ...) at `i`: where its `#`s start, and how many.
fn raw_string(s: &[u8], i: usize) -> Option<(usize, usize)> {
    let j = i + match s[i..] {
        [b'r', ..] => 1,
        [b'b', b'r', ..] => 2,
        _ => return None,
    };
    if i > 0 && (s[i - 1].is_ascii_alphanumeric() || s[i - 1] == b'_') {
        return None;
    }
    let hashes = s[j..].iter().take_while(|&&b| b == b'#').count();
    (s.get(j + hashes) == Some(&b'"')).then_some((j, hashes))
}

/// Each function of `src` longer than `limit` lines: its name, first line and length.
fn long_functions(src: &str, limit: usize) -> Vec<(String, usize, usize)> {
    let s = blank(src);
    let line = |at: usize| s[..at].iter().filter(|&&b| b == b'\n').count() + 1;
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = s[i..].windows(3).position(|w| w == b"fn ") {
        let at = i + p;
        i = at + 3;
        if at > 0 && ident(s[at - 1]) {
            continue;
        }
        let name: String = s[i..]
            .iter()
            .skip_while(|b| b.is_ascii_whitespace())
            .take_while(|&&b| ident(b))
            .map(|&b| b as char)
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body's `{` (outside the parameters), or `;` for a declaration without one.
        let mut depth = 0i32;
        let mut open = None;
        for (k, &b) in s.iter().enumerate().skip(i) {
            match b {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                b';' if depth == 0 => break,
                b'{' if depth == 0 => {
                    open = Some(k);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = open else { continue };
        let mut depth = 0;
        let mut close = open;
        for (k, &b) in s.iter().enumerate().skip(open) {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = k;
                        break;
                    }
                }
                _ => {}
            }
        }
        let (first, last) = (line(at), line(close));
        if last - first + 1 > limit {
            out.push((name, first, last - first + 1));
        }
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("the source directory") {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_function_is_longer_than_150_lines() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    files.sort();
    assert!(files.len() > 20, "{files:?}");
    let mut long = Vec::new();
    for f in &files {
        let src = std::fs::read_to_string(f).expect("a source file");
        for (name, line, len) in long_functions(&src, LIMIT) {
            long.push(format!("{}:{line} {name}: {len} lines", f.display()));
        }
    }
    assert!(
        long.is_empty(),
        "functions over {LIMIT} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn lengths_are_counted_from_fn_to_its_closing_brace() {
    let src = "fn a() {\n    let s = \"}\";\n    let c = '}';\n    // }\n}\n\
               fn b<'x>(v: &'x [u8]) -> &'x u8 {\n    /* { */\n    &v[0]\n}\n\
               fn c() { let r = r#\"{\"#; }\n";
    let all = long_functions(src, 0);
    let got: Vec<(&str, usize, usize)> = all.iter().map(|(n, l, k)| (n.as_str(), *l, *k)).collect();
    assert_eq!(got, [("a", 1, 5), ("b", 6, 4), ("c", 10, 1)]);
}
