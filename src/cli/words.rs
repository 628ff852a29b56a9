//! Where `run`'s options end and its command begins, as ssh reads its own command line:
//! options may stand before `TARGET` or right after it; the first word that is not an option
//! starts the command (so `run HOST ls -l` passes `-l` to `ls`); `--` ends the options, and a
//! command after it is the exact argv (no shell).
//!
//! clap parses the options; this reads the same words once more to learn what clap cannot
//! say: whether the command came after `--`, and exactly which words are the command. It
//! knows which options take a value from clap's own definition, so the two cannot disagree
//! about where an option's value is.

use std::collections::HashSet;
use std::ffi::OsString;

/// The command part of `run`'s words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandWords {
    /// The target, if one was given (`None` with `--local`, or none at all).
    pub target: Option<String>,
    /// The command's words.
    pub command: Vec<String>,
    /// They came after `--`: the exact argv (else words for `/bin/sh -c`).
    pub exact: bool,
}

/// The options of a clap command that take a value: long names and short letters.
#[derive(Debug, Default)]
pub struct ValueOptions {
    long: HashSet<String>,
    short: HashSet<char>,
}

impl ValueOptions {
    /// Read them from `cmd`'s definition.
    pub fn of(cmd: &clap::Command) -> ValueOptions {
        let mut v = ValueOptions::default();
        for a in cmd.get_arguments() {
            if a.is_positional() || !a.get_action().takes_values() {
                continue;
            }
            if let Some(l) = a.get_long() {
                v.long.insert(l.to_string());
            }
            for alias in a.get_all_aliases().unwrap_or_default() {
                v.long.insert(alias.to_string());
            }
            if let Some(s) = a.get_short() {
                v.short.insert(s);
            }
        }
        v
    }
}

/// Split `words` (what follows `run` on the command line) into the target and the command.
/// `local`: `--local` was given, so no word is a target. A word that is not UTF-8 is an
/// error naming it.
pub fn split(
    words: &[OsString],
    values: &ValueOptions,
    local: bool,
) -> Result<CommandWords, String> {
    let text: Vec<String> = words
        .iter()
        .map(|w| {
            w.to_str()
                .map(str::to_string)
                .ok_or_else(|| format!("{w:?} is not UTF-8"))
        })
        .collect::<Result<_, _>>()?;
    let mut target = None;
    let mut i = 0;
    while i < text.len() {
        let w = &text[i];
        if w == "--" {
            let mut rest = text[i + 1..].to_vec();
            if target.is_none() && !local && !rest.is_empty() {
                target = Some(rest.remove(0));
            }
            return Ok(CommandWords {
                target,
                command: rest,
                exact: true,
            });
        }
        if let Some(long) = w.strip_prefix("--") {
            let takes = !long.contains('=') && values.long.contains(long);
            i += if takes { 2 } else { 1 };
            continue;
        }
        if w.len() > 1 && w.starts_with('-') {
            // A cluster of short flags: the first that takes a value takes the rest of the
            // word, or the next word.
            let mut skip_next = false;
            for (j, c) in w[1..].char_indices() {
                if values.short.contains(&c) {
                    skip_next = w[1 + j + c.len_utf8()..].is_empty();
                    break;
                }
            }
            i += if skip_next { 2 } else { 1 };
            continue;
        }
        if target.is_none() && !local {
            target = Some(w.clone());
            i += 1;
            continue;
        }
        return Ok(CommandWords {
            target,
            command: text[i..].to_vec(),
            exact: false,
        });
    }
    Ok(CommandWords {
        target,
        command: Vec::new(),
        exact: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> ValueOptions {
        let mut v = ValueOptions::default();
        v.long
            .extend(["timeout", "env", "server-key"].map(String::from));
        v.short.extend(['e', 'C']);
        v
    }

    fn split_of(words: &[&str], local: bool) -> CommandWords {
        let os: Vec<OsString> = words.iter().map(OsString::from).collect();
        split(&os, &values(), local).unwrap()
    }

    fn cw(target: Option<&str>, command: &[&str], exact: bool) -> CommandWords {
        CommandWords {
            target: target.map(String::from),
            command: command.iter().map(|s| s.to_string()).collect(),
            exact,
        }
    }

    #[test]
    fn options_before_and_right_after_the_target_and_the_command_after() {
        assert_eq!(
            split_of(&["HOST", "ls", "-l"], false),
            cw(Some("HOST"), &["ls", "-l"], false)
        );
        assert_eq!(
            split_of(
                &[
                    "-t",
                    "HOST",
                    "-e",
                    "A=1",
                    "--timeout",
                    "5",
                    "ls",
                    "-l",
                    "--",
                    "x"
                ],
                false
            ),
            cw(Some("HOST"), &["ls", "-l", "--", "x"], false)
        );
        assert_eq!(
            split_of(
                &["URL", "--server-key", "K", "-eA", "--", "cmd", "-x"],
                false
            ),
            cw(Some("URL"), &["cmd", "-x"], true)
        );
        assert_eq!(
            split_of(&["--timeout=5", "-tn", "HOST", "echo", "hi"], false),
            cw(Some("HOST"), &["echo", "hi"], false)
        );
        assert_eq!(split_of(&["HOST"], false), cw(Some("HOST"), &[], false));
        assert_eq!(split_of(&[], false), cw(None, &[], false));
        assert_eq!(
            split_of(&["--", "HOST", "ls"], false),
            cw(Some("HOST"), &["ls"], true)
        );
        assert_eq!(split_of(&["-t"], false), cw(None, &[], false));
    }

    #[test]
    fn with_local_no_word_is_a_target() {
        assert_eq!(
            split_of(&["ls", "-l"], true),
            cw(None, &["ls", "-l"], false)
        );
        assert_eq!(
            split_of(&["--", "ls", "-l"], true),
            cw(None, &["ls", "-l"], true)
        );
    }
}
