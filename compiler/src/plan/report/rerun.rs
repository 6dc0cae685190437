//! The commands a report names, written so that they work when copied: the user's own
//! command line with one option changed ([`CommandLine::with`]), or `graphc fit` with
//! their model, every `--dim` they gave and their budget and precision options
//! ([`Rerun::fit`]). A library caller without a command line gets `MODEL` in place of
//! the model's path.

use std::fmt;

/// The words after `graphc`, as given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandLine {
    words: Vec<String>,
}

impl CommandLine {
    pub fn new(words: impl IntoIterator<Item = impl Into<String>>) -> CommandLine {
        CommandLine {
            words: words.into_iter().map(Into::into).collect(),
        }
    }

    /// The words after `graphc`.
    pub fn words(&self) -> &[String] {
        &self.words
    }

    /// The subcommand (`run`, `plan`, ...), if any.
    pub fn subcommand(&self) -> Option<&str> {
        self.words.first().map(String::as_str)
    }

    /// Whether switch `flag` is given.
    pub fn has(&self, flag: &str) -> bool {
        self.words.iter().any(|w| w == flag)
    }

    /// The same command with option `flag` set to `value` (a `flag value` or
    /// `flag=value` given is replaced, the new one goes last); `None` sets a switch.
    pub fn with(&self, flag: &str, value: Option<&str>) -> CommandLine {
        let mut out = self.without(flag, value.is_some());
        out.words.push(flag.to_string());
        out.words.extend(value.map(str::to_string));
        out
    }

    /// The same command without option `flag` (and the word after it, when
    /// `takes_value`).
    pub fn without(&self, flag: &str, takes_value: bool) -> CommandLine {
        let joined = format!("{flag}=");
        let mut words = Vec::with_capacity(self.words.len());
        let mut it = self.words.iter();
        while let Some(w) = it.next() {
            if w == flag {
                if takes_value {
                    it.next();
                }
            } else if !w.starts_with(&joined) {
                words.push(w.clone());
            }
        }
        CommandLine { words }
    }
}

impl fmt::Display for CommandLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("graphc")?;
        for w in &self.words {
            write!(f, " {}", shell_word(w))?;
        }
        Ok(())
    }
}

/// `w` as a POSIX shell reads it back: as is when every character is safe, else in
/// single quotes.
pub fn shell_word(w: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./=,:@%+".contains(c);
    if !w.is_empty() && w.chars().all(safe) {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

/// What a report needs to name commands: the command that produced the plan, the
/// model, its symbolic dimensions and the options `graphc fit` shares with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rerun {
    /// The user's command (`None` for a library caller: hints then start from
    /// `graphc plan MODEL` with the dimensions).
    pub command: Option<CommandLine>,
    /// The model's path as given (`MODEL` when unknown).
    pub model: String,
    /// The model's symbolic dimensions, with the value given where known.
    pub dims: Vec<(String, Option<usize>)>,
    /// `--budget`, `--precision`, `--weights`, `--f32-outputs` as given (words), which
    /// `graphc fit` takes too.
    pub fit_options: Vec<String>,
}

impl Default for Rerun {
    fn default() -> Rerun {
        Rerun {
            command: None,
            model: "MODEL".into(),
            dims: Vec::new(),
            fit_options: Vec::new(),
        }
    }
}

impl Rerun {
    /// A library caller's: no command line, these symbolic dimensions (values unknown).
    pub fn dims(names: &[String]) -> Rerun {
        Rerun {
            dims: names.iter().map(|n| (n.clone(), None)).collect(),
            ..Rerun::default()
        }
    }

    /// The names of the symbolic dimensions.
    pub fn dim_names(&self) -> impl Iterator<Item = &str> {
        self.dims.iter().map(|(n, _)| n.as_str())
    }

    /// The command with option `flag` set to `value`: the user's, or `graphc plan` of
    /// the model with its dimensions and options.
    pub fn with(&self, flag: &str, value: &str) -> String {
        let base = match &self.command {
            Some(c) => c.clone(),
            None => {
                let mut words = vec!["plan".to_string(), self.model.clone()];
                words.extend(self.dim_words(None));
                words.extend(self.fit_options.iter().cloned());
                CommandLine::new(words)
            }
        };
        base.with(flag, Some(value)).to_string()
    }

    /// `graphc fit` searching `dim` with the other dimensions fixed where given, the
    /// model and the fit options (`option` set on top); `budget` (a `--budget` word)
    /// when none is given.
    pub fn fit(&self, dim: &str, budget: &str, option: Option<(&str, &str)>) -> String {
        let mut words = vec!["fit".to_string(), self.model.clone()];
        if self.dim_names().all(|n| n != dim) {
            words.extend(["--dim".to_string(), dim.to_string()]);
        }
        words.extend(self.dim_words(Some(dim)));
        words.extend(self.fit_options.iter().cloned());
        let line = CommandLine::new(words);
        let line = if line.has("--budget") || line.words().iter().any(|w| w.starts_with("--budget=")) {
            line
        } else {
            line.with("--budget", Some(budget))
        };
        match option {
            Some((flag, value)) => line.with(flag, Some(value)).to_string(),
            None => line.to_string(),
        }
    }

    /// `--dim NAME=N` for every dimension (`NAME` alone for `searched`, `NAME=N`
    /// spelled out when the value is unknown).
    fn dim_words(&self, searched: Option<&str>) -> Vec<String> {
        let mut out = Vec::new();
        for (name, value) in &self.dims {
            out.push("--dim".to_string());
            out.push(match value {
                _ if Some(name.as_str()) == searched => name.clone(),
                Some(v) => format!("{name}={v}"),
                None => format!("{name}=N"),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_set_replaced_and_removed() {
        let c = CommandLine::new(["run", "my model.gir", "--device=cuda", "--check", "--budget", "1GiB"]);
        assert_eq!(
            c.with("--device", Some("cpu")).to_string(),
            "graphc run 'my model.gir' --check --budget 1GiB --device cpu"
        );
        assert_eq!(
            c.without("--check", false).without("--budget", true).to_string(),
            "graphc run 'my model.gir' --device=cuda"
        );
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn fit_commands_keep_every_dim_and_option() {
        let r = Rerun {
            command: Some(CommandLine::new(["plan", "m.onnx", "--dim", "batch=8", "--dim=seq=64"])),
            model: "m.onnx".into(),
            dims: vec![("batch".into(), Some(8)), ("seq".into(), Some(64))],
            fit_options: vec!["--precision".into(), "bf16".into()],
        };
        assert_eq!(
            r.fit("batch", "1GiB", None),
            "graphc fit m.onnx --dim batch --dim seq=64 --precision bf16 --budget 1GiB"
        );
        assert_eq!(
            r.with("--weights", "int8"),
            "graphc plan m.onnx --dim batch=8 --dim=seq=64 --weights int8"
        );
        let lib = Rerun::dims(&["batch".into()]);
        assert_eq!(
            lib.fit("batch", "24GiB", None),
            "graphc fit MODEL --dim batch --budget 24GiB"
        );
        assert_eq!(
            lib.with("--precision", "bf16"),
            "graphc plan MODEL --dim batch=N --precision bf16"
        );
        assert_eq!(
            Rerun::default().fit("seq", "1MiB", Some(("--weights", "int4"))),
            "graphc fit MODEL --dim seq --budget 1MiB --weights int4"
        );
    }
}
