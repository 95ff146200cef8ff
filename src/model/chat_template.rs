//! Hugging Face chat templates rendered with minijinja, configured like transformers' Jinja
//! environment (`trim_blocks`, `lstrip_blocks`, loop controls) and with the extras real
//! templates call: `raise_exception`, HF's `tojson`, `strftime_now` and Python string, list and
//! dict methods.

use std::fmt::Write as _;

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, State, Value};
use serde_json::Map;

use super::tokenizer_config::{DEFAULT_TEMPLATE, SpecialTokens};

/// The template transformers selects when a request carries tools and the model has one.
const TOOL_USE_TEMPLATE: &str = "tool_use";

/// Context variables the renderer sets itself; extra arguments may not replace them.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// The roles every chat template is taken to know (OpenAI's chat roles).
const STANDARD_ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// Further roles a template knows when its source names them in quotes (`'ipython'`).
const OPTIONAL_ROLES: [&str; 3] = ["developer", "ipython", "function"];

/// Rendering a chat template failed.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// A message's role is not one the template knows.
    #[error(
        "messages[{index}].role `{role}` is not one of the roles this model's chat template knows: {known}"
    )]
    UnknownRole {
        /// The message's index.
        index: usize,
        /// The role as given (escaped, cut to 64 characters).
        role: String,
        /// The known roles, comma-separated.
        known: String,
    },
    /// The template rejected the conversation through `raise_exception`.
    #[error("chat template rejected the request: {0}")]
    Raised(String),
    /// An extra argument tried to replace one the renderer sets.
    #[error("chat template argument `{0}` is reserved")]
    ReservedArgument(String),
    /// The template failed while rendering.
    #[error("chat template failed: {0}")]
    Render(String),
    /// A template does not compile, or none is the default.
    #[error("chat template `{name}` does not compile: {reason}")]
    Compile {
        /// The template's name.
        name: String,
        /// The template engine's message.
        reason: String,
    },
}

/// The message a template passed to `raise_exception`, carried as an error source.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Raised(String);

/// A model's compiled chat template(s) with the special tokens they may reference.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    has_tool_use: bool,
    special: SpecialTokens,
    roles: Vec<&'static str>,
    reads_effort: bool,
}

impl ChatTemplate {
    /// Compiles `templates` (pairs of name and source; one must be called `default`, unless
    /// there is only one).
    pub fn new(
        templates: &[(String, String)],
        special: SpecialTokens,
    ) -> Result<Self, TemplateError> {
        let compile = |name: &str, reason: String| TemplateError::Compile {
            name: name.to_owned(),
            reason,
        };
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| compile(DEFAULT_TEMPLATE, e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);

        let single = templates.len() == 1;
        for (name, source) in templates {
            let name = if single {
                DEFAULT_TEMPLATE
            } else {
                name.as_str()
            };
            env.add_template_owned(name.to_owned(), source.clone())
                .map_err(|e| compile(name, e.to_string()))?;
        }
        if env.get_template(DEFAULT_TEMPLATE).is_err() {
            return Err(compile(
                DEFAULT_TEMPLATE,
                "no template is named `default`".to_owned(),
            ));
        }
        let has_tool_use = !single && env.get_template(TOOL_USE_TEMPLATE).is_ok();
        let mentioned = |role: &str| {
            templates.iter().any(|(_, source)| {
                source.contains(&format!("'{role}'")) || source.contains(&format!("\"{role}\""))
            })
        };
        let roles = STANDARD_ROLES
            .into_iter()
            .chain(OPTIONAL_ROLES.into_iter().filter(|role| mentioned(role)))
            .collect();
        let reads_effort = templates.iter().any(|(_, source)| {
            source.contains("reasoning_effort") || source.contains("enable_thinking")
        });
        Ok(Self {
            env,
            has_tool_use,
            special,
            roles,
            reads_effort,
        })
    }

    /// Whether a template reads `reasoning_effort` or `enable_thinking`: without either, a
    /// request's reasoning effort changes nothing.
    pub fn reads_reasoning_effort(&self) -> bool {
        self.reads_effort
    }

    /// The sources of the template(s), where a model family's tool-call markers show.
    pub fn sources(&self) -> Vec<String> {
        self.env
            .templates()
            .map(|(_, template)| template.source().to_owned())
            .collect()
    }

    /// The roles this template knows: OpenAI's chat roles, and `developer`, `ipython` or
    /// `function` when the template's source names them.
    pub fn roles(&self) -> &[&'static str] {
        &self.roles
    }

    /// Refuses a message whose role the template does not know: a role is pasted into the
    /// prompt by many templates, so an arbitrary one could forge the conversation's structure.
    pub fn check_roles(&self, messages: &[serde_json::Value]) -> Result<(), TemplateError> {
        for (index, message) in messages.iter().enumerate() {
            let role = message.get("role").and_then(|r| r.as_str()).unwrap_or("");
            if !self.roles.contains(&role) {
                return Err(TemplateError::UnknownRole {
                    index,
                    role: role
                        .chars()
                        .take(64)
                        .collect::<String>()
                        .escape_debug()
                        .to_string(),
                    known: self.roles.join(", "),
                });
            }
        }
        Ok(())
    }

    /// Renders a conversation into the prompt text, as transformers' `apply_chat_template(...,
    /// tokenize=False)` does: `messages`, `tools` (none when absent), `add_generation_prompt`,
    /// the special-token strings and every `extra` argument (e.g. `enable_thinking`) are visible
    /// to the template. With tools, a template named `tool_use` is preferred when present.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        extra: &Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        if let Some(reserved) = RESERVED.iter().find(|name| extra.contains_key(**name)) {
            return Err(TemplateError::ReservedArgument((*reserved).to_owned()));
        }
        let mut ctx = Map::new();
        let special = [
            ("bos_token", &self.special.bos_token),
            ("eos_token", &self.special.eos_token),
            ("pad_token", &self.special.pad_token),
            ("unk_token", &self.special.unk_token),
        ];
        for (name, token) in special {
            if let Some(token) = token {
                ctx.insert(name.to_owned(), serde_json::Value::String(token.clone()));
            }
        }
        ctx.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        ctx.insert(
            "messages".to_owned(),
            serde_json::Value::Array(messages.iter().map(with_assistant_content).collect()),
        );
        ctx.insert(
            "tools".to_owned(),
            tools.cloned().unwrap_or(serde_json::Value::Null),
        );
        ctx.insert("documents".to_owned(), serde_json::Value::Null);
        ctx.insert(
            "add_generation_prompt".to_owned(),
            serde_json::Value::Bool(add_generation_prompt),
        );

        let name = if tools.is_some() && self.has_tool_use {
            TOOL_USE_TEMPLATE
        } else {
            DEFAULT_TEMPLATE
        };
        let template = self
            .env
            .get_template(name)
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        template
            .render(Value::from(minijinja::value::Serde(&ctx)))
            .map_err(template_error)
    }
}

/// An assistant message whose `content` is null or absent (OpenAI's form for a message that
/// only carries `tool_calls`) gets an empty content: published templates test or split the
/// content as a string (Qwen3's `'</think>' in message.content`), and an empty string renders
/// as the templates that check for a missing content do.
fn with_assistant_content(message: &serde_json::Value) -> serde_json::Value {
    let mut message = message.clone();
    if let Some(object) = message.as_object_mut()
        && object.get("role").and_then(|r| r.as_str()) == Some("assistant")
        && object.get("content").is_none_or(serde_json::Value::is_null)
    {
        object.insert(
            "content".to_owned(),
            serde_json::Value::String(String::new()),
        );
    }
    message
}

/// Maps a minijinja error to [`TemplateError`], recovering `raise_exception` messages.
fn template_error(err: Error) -> TemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<Raised>() {
            return TemplateError::Raised(raised.0.clone());
        }
        source = e.source();
    }
    TemplateError::Render(err.to_string())
}

/// `raise_exception(message)`: aborts rendering with the template's message.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// `strftime_now(format)`: the current UTC time in a `strftime` format.
fn strftime_now(state: &State, format: String) -> Result<String, Error> {
    let kwargs = Kwargs::from_iter([("format", Value::from(format))]);
    minijinja_contrib::filters::datetimeformat(state, minijinja_contrib::globals::now(), kwargs)
}

/// HF's `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, unescaped for HTML. Object keys come out in sorted order.
fn tojson(
    value: &Value,
    ensure_ascii: Option<bool>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let ensure_ascii = match kwargs.get::<Option<bool>>("ensure_ascii")? {
        Some(flag) => flag,
        None => ensure_ascii.unwrap_or(false),
    };
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        Some(indent) => Some(indent),
        None => indent,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_str(), i64::try_from(v.clone())) {
            (Some(s), _) => Some(s.to_owned()),
            (None, Ok(n)) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ));
            }
        },
    };
    let separators = match kwargs.get::<Option<Vec<String>>>("separators")? {
        None => None,
        Some(pair) => match <[String; 2]>::try_from(pair) {
            Ok([item, key]) => Some((item, key)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair",
                ));
            }
        },
    };
    // Maps keep the client's key order, as Python's dicts do; `sort_keys` sorts them.
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;

    let json = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let (item_sep, key_sep) = separators.unwrap_or_else(|| {
        let item = if indent.is_some() { "," } else { ", " };
        (item.to_owned(), ": ".to_owned())
    });
    let mut writer = PyJsonWriter {
        out: String::new(),
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    writer.value(&json, 0);
    Ok(Value::from(writer.out))
}

/// Writes JSON the way Python's `json.dumps` lays it out.
struct PyJsonWriter {
    out: String,
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl PyJsonWriter {
    /// Writes `value` at nesting `depth`.
    fn value(&mut self, value: &serde_json::Value, depth: usize) {
        match value {
            serde_json::Value::Array(items) if !items.is_empty() => {
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separator(i, depth + 1);
                    self.value(item, depth + 1);
                }
                self.newline(depth);
                self.out.push(']');
            }
            serde_json::Value::Object(map) if !map.is_empty() => {
                self.out.push('{');
                let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                for (i, (key, item)) in entries.into_iter().enumerate() {
                    self.separator(i, depth + 1);
                    self.string(key);
                    self.out.push_str(&self.key_sep);
                    self.value(item, depth + 1);
                }
                self.newline(depth);
                self.out.push('}');
            }
            serde_json::Value::String(s) => self.string(s),
            serde_json::Value::Number(n) => match (n.is_f64(), n.as_f64()) {
                (true, Some(f)) => self.out.push_str(&python_float_repr(f)),
                _ => self.out.push_str(&n.to_string()),
            },
            other => self.out.push_str(&other.to_string()),
        }
    }

    /// Writes the separator before the `index`-th element of a container.
    fn separator(&mut self, index: usize, depth: usize) {
        if index > 0 {
            let sep = self.item_sep.clone();
            self.out.push_str(&sep);
        }
        self.newline(depth);
    }

    /// With indentation, starts a new line at `depth`.
    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }

    /// Writes a string literal, escaping non-ASCII characters when asked.
    fn string(&mut self, s: &str) {
        let quoted = serde_json::Value::String(s.to_owned()).to_string();
        if !self.ensure_ascii {
            self.out.push_str(&quoted);
            return;
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                self.out.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(self.out, "\\u{unit:04x}");
                }
            }
        }
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, positional for exponents in
/// `-4..16` (always with a fractional part), scientific otherwise with a signed, two-digit
/// exponent (`1e-05`, `1.5e+20`).
fn python_float_repr(f: f64) -> String {
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..16).contains(&exponent) {
        let positional = f.to_string();
        if positional.contains('.') {
            positional
        } else {
            positional + ".0"
        }
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(source: &str) -> ChatTemplate {
        let special = SpecialTokens {
            bos_token: Some("<s>".into()),
            eos_token: Some("</s>".into()),
            ..SpecialTokens::default()
        };
        ChatTemplate::new(&[("default".into(), source.into())], special).unwrap()
    }

    fn render(source: &str, value: serde_json::Value) -> Result<String, TemplateError> {
        let messages = vec![value];
        template(source).render(&messages, None, false, &Map::new())
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let msg = json!({"b": [1, 2.5, null, true], "a": "é<&>\"\n"});
        assert_eq!(
            render("{{ messages[0] | tojson }}", msg.clone()).unwrap(),
            r#"{"b": [1, 2.5, null, true], "a": "é<&>\"\n"}"#
        );
        assert_eq!(
            render(
                "{{ messages[0] | tojson(indent=2, sort_keys=true) }}",
                msg.clone()
            )
            .unwrap(),
            "{\n  \"a\": \"é<&>\\\"\\n\",\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ]\n}"
        );
        assert_eq!(
            render(
                "{{ messages[0].a | tojson(ensure_ascii=true) }}",
                msg.clone()
            )
            .unwrap(),
            r#""\u00e9<&>\"\n""#
        );
        assert_eq!(
            render("{{ messages[0] | tojson(separators=[',', ':']) }}", msg).unwrap(),
            r#"{"b":[1,2.5,null,true],"a":"é<&>\"\n"}"#
        );
        assert_eq!(
            render("{{ [] | tojson(indent=4) }}{{ {} | tojson }}", json!({})).unwrap(),
            "[]{}"
        );
    }

    #[test]
    fn floats_print_like_python_repr() {
        let cases = [
            (0.5, "0.5"),
            (3.0, "3.0"),
            (-2.0, "-2.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1.5e300, "1.5e+300"),
            (-2.5e-7, "-2.5e-07"),
        ];
        for (value, expected) in cases {
            assert_eq!(python_float_repr(value), expected, "{value}");
        }
        assert_eq!(
            render("{{ messages[0] | tojson }}", json!({"x": [1, 1.0, 1e-5]})).unwrap(),
            r#"{"x": [1, 1.0, 1e-05]}"#
        );
    }

    #[test]
    fn raise_exception_surfaces_the_message() {
        let err = render("{{ raise_exception('roles must alternate') }}", json!({})).unwrap_err();
        assert!(
            matches!(&err, TemplateError::Raised(m) if m == "roles must alternate"),
            "{err}"
        );
    }

    #[test]
    fn python_methods_and_trim_blocks_work() {
        let out = render(
            "{% for m in messages %}\n  {{ m.content.strip().upper() }}|{{ m.content.startswith(' a') }}\n{% endfor %}",
            json!({"content": " abc "}),
        )
        .unwrap();
        // As in Jinja2: `lstrip_blocks` strips only before block tags, and booleans print
        // Python-style.
        assert_eq!(out, "  ABC|True\n");
    }

    #[test]
    fn strftime_now_formats_the_current_date() {
        let out = render("{{ strftime_now('%Y-%m-%d') }}", json!({})).unwrap();
        let parts: Vec<&str> = out.split('-').collect();
        assert_eq!(parts.len(), 3, "{out}");
        assert!(parts[0].parse::<u32>().is_ok_and(|y| y >= 2024), "{out}");
    }

    #[test]
    fn special_tokens_extra_arguments_and_reserved_names() {
        let t = template(
            "{{ bos_token }}{{ enable_thinking }}{{ add_generation_prompt }}{{ tools is none }}{{ eos_token }}",
        );
        let mut extra = Map::new();
        extra.insert("enable_thinking".into(), json!(false));
        assert_eq!(
            t.render(&[], None, true, &extra).unwrap(),
            "<s>FalseTrueTrue</s>"
        );
        extra.insert("messages".into(), json!([]));
        assert!(matches!(
            t.render(&[], None, true, &extra),
            Err(TemplateError::ReservedArgument(name)) if name == "messages"
        ));
    }

    #[test]
    fn named_templates_select_tool_use_with_tools() {
        let templates = [
            ("default".to_owned(), "plain".to_owned()),
            (
                "tool_use".to_owned(),
                "tools:{{ tools | length }}".to_owned(),
            ),
        ];
        let t = ChatTemplate::new(&templates, SpecialTokens::default()).unwrap();
        let tools = json!([{"type": "function"}]);
        assert_eq!(
            t.render(&[], Some(&tools), false, &Map::new()).unwrap(),
            "tools:1"
        );
        assert_eq!(t.render(&[], None, false, &Map::new()).unwrap(), "plain");
    }

    #[test]
    fn compile_errors_name_the_template() {
        let err = ChatTemplate::new(
            &[("default".into(), "{% if %}".into())],
            SpecialTokens::default(),
        )
        .unwrap_err();
        assert!(
            matches!(&err, TemplateError::Compile { name, .. } if name == "default"),
            "{err}"
        );
        let err = ChatTemplate::new(
            &[("a".into(), "x".into()), ("b".into(), "y".into())],
            SpecialTokens::default(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("no template is named `default`"),
            "{err}"
        );
    }
}
