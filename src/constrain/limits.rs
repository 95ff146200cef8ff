//! Limits on a constraint, checked before it is compiled (compiling is what costs: a 50,000-way
//! `guided_choice` or a regular expression of nested counted repetitions takes seconds and
//! gigabytes): its source size, the number of choices, and the size a regular expression's
//! counted repetitions expand to. Each refusal is a reason for a 400 naming the field.

/// The largest constraint source (a regular expression, a grammar, a serialized JSON schema, or
/// all the choices together), in bytes.
pub const MAX_CONSTRAINT_BYTES: usize = 64 << 10;

/// The most `guided_choice` alternatives.
pub const MAX_CHOICES: usize = 1024;

/// The largest size a regular expression may expand to, counting each counted repetition
/// `x{m,n}` as `n` copies of `x` (see [`regex_expansion`]).
pub const MAX_REGEX_EXPANSION: u64 = 16_384;

/// Refuses a source of `len` bytes over [`MAX_CONSTRAINT_BYTES`].
pub fn check_size(what: &str, len: usize) -> Result<(), String> {
    if len > MAX_CONSTRAINT_BYTES {
        return Err(format!(
            "{what} is {len} bytes; constraints are limited to {MAX_CONSTRAINT_BYTES} bytes"
        ));
    }
    Ok(())
}

/// Refuses more than [`MAX_CHOICES`] choices, or choices over [`MAX_CONSTRAINT_BYTES`] in all.
pub fn check_choices(choices: &[String]) -> Result<(), String> {
    if choices.len() > MAX_CHOICES {
        return Err(format!(
            "guided_choice has {} choices; at most {MAX_CHOICES} are allowed",
            choices.len()
        ));
    }
    check_size("guided_choice", choices.iter().map(String::len).sum())
}

/// Refuses a regular expression over [`MAX_CONSTRAINT_BYTES`] or whose expansion exceeds
/// [`MAX_REGEX_EXPANSION`].
pub fn check_regex(regex: &str) -> Result<(), String> {
    check_size("the regular expression", regex.len())?;
    let expansion = regex_expansion(regex);
    if expansion > MAX_REGEX_EXPANSION {
        return Err(format!(
            "the regular expression's counted repetitions expand to about {expansion} elements; \
             at most {MAX_REGEX_EXPANSION} are allowed"
        ));
    }
    Ok(())
}

/// An upper estimate of the size of `regex` with its counted repetitions written out: a
/// literal, class or escape counts 1, a sequence the sum of its parts, an alternation the sum
/// of its branches, and `x{m,n}` (or `x{m,}`, `x{m}`) `max(n, m, 1)` times `x` (`*`, `+`, `?`
/// count once). Saturates instead of overflowing. Malformed syntax is left to the compiler.
pub fn regex_expansion(regex: &str) -> u64 {
    let chars: Vec<char> = regex.chars().collect();
    let mut at = 0;
    let mut total = 0u64;
    // A stray `)` ends an alternation early: go on after it.
    while at < chars.len() {
        total = total.saturating_add(alternation(&chars, &mut at));
        at += 1;
    }
    total
}

fn alternation(chars: &[char], at: &mut usize) -> u64 {
    let mut total = sequence(chars, at);
    while chars.get(*at) == Some(&'|') {
        *at += 1;
        total = total.saturating_add(sequence(chars, at));
    }
    total
}

fn sequence(chars: &[char], at: &mut usize) -> u64 {
    let mut total = 0u64;
    while let Some(&c) = chars.get(*at) {
        let atom = match c {
            ')' | '|' => break,
            '(' => {
                *at += 1;
                if chars.get(*at) == Some(&'?') {
                    // A group's flags or name: `(?:`, `(?i)`, `(?P<name>`, `(?<name>`.
                    while let Some(&c) = chars.get(*at) {
                        if c == ':' || c == ')' || c == '>' {
                            break;
                        }
                        *at += 1;
                    }
                    if chars.get(*at) == Some(&')') {
                        *at += 1;
                        continue;
                    }
                    *at += 1;
                }
                let inner = alternation(chars, at);
                *at += 1; // the `)`
                inner
            }
            '[' => {
                skip_class(chars, at);
                1
            }
            '\\' => {
                *at += 1;
                if matches!(chars.get(*at), Some('p' | 'P' | 'x' | 'u'))
                    && chars.get(*at + 1) == Some(&'{')
                {
                    while chars.get(*at).is_some_and(|&c| c != '}') {
                        *at += 1;
                    }
                }
                *at += 1;
                1
            }
            _ => {
                *at += 1;
                1
            }
        };
        let times = quantifier(chars, at);
        total = total.saturating_add(atom.saturating_mul(times));
    }
    total
}

/// Skips a character class `[...]` (nested classes and escapes included).
fn skip_class(chars: &[char], at: &mut usize) {
    *at += 1;
    if chars.get(*at) == Some(&'^') {
        *at += 1;
    }
    if chars.get(*at) == Some(&']') {
        *at += 1;
    }
    while let Some(&c) = chars.get(*at) {
        *at += 1;
        match c {
            '\\' => *at += 1,
            '[' => skip_class_inner(chars, at),
            ']' => return,
            _ => {}
        }
    }
}

fn skip_class_inner(chars: &[char], at: &mut usize) {
    // `[:alpha:]` or a nested class: up to its own `]`.
    while let Some(&c) = chars.get(*at) {
        *at += 1;
        match c {
            '\\' => *at += 1,
            ']' => return,
            _ => {}
        }
    }
}

/// The repetition count of the quantifier at `at`, if any (1 without one).
fn quantifier(chars: &[char], at: &mut usize) -> u64 {
    let times = match chars.get(*at) {
        Some('*' | '+' | '?') => {
            *at += 1;
            1
        }
        Some('{') => match counted(chars, *at + 1) {
            Some((times, end)) => {
                *at = end;
                times
            }
            None => return 1,
        },
        _ => return 1,
    };
    // Lazy or possessive suffix.
    if matches!(chars.get(*at), Some('?' | '+')) {
        *at += 1;
    }
    times
}

/// `m}`, `m,}`, `m,n}` or `,n}` from `from`: the count `max(n, m, 1)` and the index after the `}`.
fn counted(chars: &[char], from: usize) -> Option<(u64, usize)> {
    let mut at = from;
    let number = |at: &mut usize| {
        let start = *at;
        while chars.get(*at).is_some_and(char::is_ascii_digit) {
            *at += 1;
        }
        (start != *at).then(|| {
            chars[start..*at]
                .iter()
                .collect::<String>()
                .parse::<u64>()
                .unwrap_or(u64::MAX)
        })
    };
    let low = number(&mut at);
    let mut high = None;
    if chars.get(at) == Some(&',') {
        at += 1;
        high = number(&mut at);
    }
    let (low, high) = match (low, high) {
        (None, None) => return None,
        (low, high) => (low.unwrap_or(0), high),
    };
    (chars.get(at) == Some(&'}')).then(|| (high.unwrap_or(low).max(low).max(1), at + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_repetitions_multiply_through_nesting() {
        assert_eq!(regex_expansion("abc"), 3);
        assert_eq!(regex_expansion("a{5}"), 5);
        assert_eq!(regex_expansion("(ab){0,10}"), 20);
        assert_eq!(regex_expansion("[a-z]{3,}x*"), 4);
        assert_eq!(regex_expansion(r"\d{3}-\d{4}"), 8);
        assert_eq!(regex_expansion("(?:a|bc){2}"), 6);
        assert_eq!(regex_expansion(r"[\]{}]{4}"), 4);
        assert_eq!(regex_expansion("([a-z]{0,200}[0-9]{0,200}){0,200}"), 80_000);
        assert_eq!(
            regex_expansion("(((a{1000000}){1000000}){1000000}){1000000}"),
            u64::MAX
        );
        assert_eq!(regex_expansion("a{,3}"), 3);
        assert_eq!(regex_expansion("a{x}"), 4, "not a quantifier: literal text");
    }

    #[test]
    fn the_issue_47_bombs_are_refused_and_ordinary_constraints_pass() {
        assert!(check_regex("([a-z]{0,200}[0-9]{0,200}){0,200}").is_err());
        assert!(check_regex(r"\d{4}-\d{2}-\d{2}").is_ok());
        assert!(check_regex(r"(\w+ ){1,20}\w+\.").is_ok());
        let many: Vec<String> = (0..50_000).map(|i| format!("choice-{i}")).collect();
        assert!(check_choices(&many).unwrap_err().contains("50000 choices"));
        let few: Vec<String> = (0..10).map(|i| format!("choice-{i}")).collect();
        assert!(check_choices(&few).is_ok());
        assert!(check_size("guided_grammar", MAX_CONSTRAINT_BYTES + 1).is_err());
    }
}
