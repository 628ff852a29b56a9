//! The exec policy (`protocol.md` §7): rules that allow, deny or **ask** about a process by
//! its program, first match wins, and a default for a program no rule matches.
//!
//! # Layout
//!
//! - this file: [`ExecPolicy`] (parse the TOML, decide), [`Action`], [`Verdict`];
//! - [`resolve`]: the program's resolved path (the `PATH` lookup `execvp` will do for the
//!   child), the second name a rule is matched against;
//! - [`file`](mod@file): [`PolicyFile`], the policy of `--exec-policy FILE`, re-read when the file
//!   changes (a bad edit keeps the previous policy and is logged).
//!
//! A leaf (layer 1): it imports only `config`, knows no session or process, and never spawns
//! anything. It must never be mistaken for a sandbox: it looks at `argv[0]` and the file it
//! resolves to, and a client may run the same program under another name (a copy, a
//! symlink, `sh -c`). `SECURITY.md` says what it is for.
//!
//! # Matching
//!
//! `program` is a glob (the `globset` crate's syntax: `*`, `?`, `[…]`, `{a,b}`, `**`), and
//! `*` never crosses a `/`. A glob **with** a `/` is matched against the whole of `argv[0]`
//! and against the whole resolved path; a glob **without** a `/` against their file names
//! (the last component), so `rm` catches `rm`, `/bin/rm` and `./rm` alike: an operator
//! writing `program = "rm"` means the program, however it is spelled.

pub mod file;
pub mod resolve;

use std::path::Path;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde::Deserialize;

use crate::config::{MAX_POLICY_RULES, MAX_POLICY_RULE_TEXT_BYTES};

pub use file::PolicyFile;

/// What a rule (or the default) does with a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Start it.
    Allow,
    /// Refuse it: `process/start` fails with `-32006`, nothing is spawned.
    Deny,
    /// Ask the client (`process/approve`); a client that cannot answer gets a denial.
    Ask,
}

/// The policy's answer for one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// What to do.
    pub action: Action,
    /// What to tell the client about the rule that decided: its `reason` if it has one,
    /// otherwise `program = "GLOB"`; `default` when no rule matched.
    pub rule: String,
}

/// A policy file that cannot be used, with what is wrong (shown at start, logged on reload).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    default: Action,
    #[serde(default)]
    rule: Vec<RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    program: String,
    action: Action,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Debug, Clone)]
struct Rule {
    action: Action,
    /// Sent to the client as `rule`.
    label: String,
}

/// A parsed exec policy: rules in file order and the default.
#[derive(Debug, Clone)]
pub struct ExecPolicy {
    default: Action,
    rules: Vec<Rule>,
    /// Globs with a `/`, matched against whole paths; indices into `rules` in `whole_index`.
    whole: GlobSet,
    whole_index: Vec<usize>,
    /// Globs without a `/`, matched against file names.
    names: GlobSet,
    names_index: Vec<usize>,
}

impl ExecPolicy {
    /// A policy that allows everything (no `--exec-policy`).
    pub fn allow_all() -> ExecPolicy {
        ExecPolicy {
            default: Action::Allow,
            rules: Vec::new(),
            whole: GlobSet::empty(),
            whole_index: Vec::new(),
            names: GlobSet::empty(),
            names_index: Vec::new(),
        }
    }

    /// Parse a policy file's text. `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<ExecPolicy, PolicyError> {
        let raw: RawPolicy =
            toml::from_str(text).map_err(|e| PolicyError(format!("{origin}: {e}")))?;
        if raw.rule.len() > MAX_POLICY_RULES {
            return Err(PolicyError(format!(
                "{origin}: {} rules, at most {MAX_POLICY_RULES} are allowed",
                raw.rule.len()
            )));
        }
        let mut whole = GlobSetBuilder::new();
        let mut names = GlobSetBuilder::new();
        let (mut whole_index, mut names_index) = (Vec::new(), Vec::new());
        let mut rules = Vec::with_capacity(raw.rule.len());
        for (i, r) in raw.rule.into_iter().enumerate() {
            let n = i + 1;
            if r.program.is_empty() {
                return Err(PolicyError(format!("{origin}: rule {n}: empty program")));
            }
            let longest = r
                .program
                .len()
                .max(r.reason.as_ref().map_or(0, String::len));
            if longest > MAX_POLICY_RULE_TEXT_BYTES {
                return Err(PolicyError(format!(
                    "{origin}: rule {n}: program or reason over {MAX_POLICY_RULE_TEXT_BYTES} bytes"
                )));
            }
            let glob = GlobBuilder::new(&r.program)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| PolicyError(format!("{origin}: rule {n}: {e}")))?;
            if r.program.contains('/') {
                whole.add(glob);
                whole_index.push(i);
            } else {
                names.add(glob);
                names_index.push(i);
            }
            let label = match r.reason {
                Some(reason) if !reason.is_empty() => reason,
                _ => format!("program = {:?}", r.program),
            };
            rules.push(Rule {
                action: r.action,
                label,
            });
        }
        let build =
            |b: GlobSetBuilder| b.build().map_err(|e| PolicyError(format!("{origin}: {e}")));
        Ok(ExecPolicy {
            default: raw.default,
            rules,
            whole: build(whole)?,
            whole_index,
            names: build(names)?,
            names_index,
        })
    }

    /// The verdict for a process whose `argv[0]` is `program`, resolving (if it could) to
    /// `resolved`: the first rule matching either name, else the default.
    pub fn decide(&self, program: &str, resolved: Option<&Path>) -> Verdict {
        let mut first: Option<usize> = None;
        let mut consider = |i: usize| {
            if first.is_none_or(|f| i < f) {
                first = Some(i);
            }
        };
        let candidates = std::iter::once(Path::new(program)).chain(resolved);
        for path in candidates {
            for m in self.whole.matches(path) {
                consider(self.whole_index[m]);
            }
            if let Some(name) = path.file_name() {
                for m in self.names.matches(Path::new(name)) {
                    consider(self.names_index[m]);
                }
            }
        }
        match first.and_then(|i| self.rules.get(i)) {
            Some(r) => Verdict {
                action: r.action,
                rule: r.label.clone(),
            },
            None => Verdict {
                action: self.default,
                rule: "default".to_string(),
            },
        }
    }

    /// How many rules the policy has.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
default = "allow"
[[rule]]
program = "rm"
action = "ask"
reason = "deletes files"
[[rule]]
program = "/usr/sbin/*"
action = "deny"
[[rule]]
program = "{curl,wget}"
action = "deny"
reason = "no network tools"
[[rule]]
program = "/opt/**/bin/danger"
action = "ask"
"#;

    fn policy() -> ExecPolicy {
        ExecPolicy::parse(EXAMPLE, "policy.toml").unwrap()
    }

    fn verdict(p: &ExecPolicy, argv0: &str, resolved: Option<&str>) -> (Action, String) {
        let v = p.decide(argv0, resolved.map(Path::new));
        (v.action, v.rule)
    }

    #[test]
    fn the_protocol_example_decides_as_written() {
        let p = policy();
        assert_eq!(p.rule_count(), 4);
        let ask = (Action::Ask, "deletes files".to_string());
        assert_eq!(verdict(&p, "rm", Some("/usr/bin/rm")), ask);
        assert_eq!(verdict(&p, "/bin/rm", Some("/bin/rm")), ask, "full path");
        assert_eq!(verdict(&p, "./rm", None), ask, "relative path");
        assert_eq!(
            verdict(&p, "iptables", Some("/usr/sbin/iptables")),
            (Action::Deny, "program = \"/usr/sbin/*\"".into()),
            "matched through the resolved path"
        );
        assert_eq!(
            verdict(&p, "wget", None),
            (Action::Deny, "no network tools".into())
        );
        assert_eq!(
            verdict(&p, "ls", Some("/usr/bin/ls")),
            (Action::Allow, "default".into())
        );
    }

    #[test]
    fn star_does_not_cross_a_slash_but_double_star_does() {
        let p = policy();
        assert_eq!(
            verdict(&p, "/usr/sbin/a/b", None).0,
            Action::Allow,
            "`*` stays in one component"
        );
        assert_eq!(verdict(&p, "/opt/x/y/bin/danger", None).0, Action::Ask);
        assert_eq!(verdict(&p, "/opt/bin/danger", None).0, Action::Ask);
    }

    #[test]
    fn the_first_matching_rule_wins_whichever_name_matched() {
        let p = ExecPolicy::parse(
            r#"
default = "deny"
[[rule]]
program = "/usr/bin/*"
action = "allow"
[[rule]]
program = "python3"
action = "ask"
"#,
            "p",
        )
        .unwrap();
        // Both rules match; the first one (by the resolved path) decides.
        assert_eq!(
            verdict(&p, "python3", Some("/usr/bin/python3")).0,
            Action::Allow
        );
        // Only the second matches.
        assert_eq!(
            verdict(&p, "python3", Some("/usr/local/bin/python3")).0,
            Action::Ask
        );
        assert_eq!(verdict(&p, "ls", None), (Action::Deny, "default".into()));
    }

    #[test]
    fn bad_files_are_errors_that_say_where() {
        let cases = [
            ("", "missing field `default`"),
            ("default = \"maybe\"", "unknown variant"),
            ("default = \"allow\"\nextra = 1", "unknown field"),
            (
                "default = \"allow\"\n[[rule]]\nprogram = \"[\"\naction = \"deny\"",
                "rule 1",
            ),
            (
                "default = \"allow\"\n[[rule]]\nprogram = \"\"\naction = \"deny\"",
                "rule 1: empty program",
            ),
            (
                "default = \"allow\"\n[[rule]]\nprogram = \"x\"\naction = \"deny\"\nwhy = \"\"",
                "unknown field",
            ),
            (
                "default = \"allow\"\n[[rule]]\nprogram = \"x\"",
                "missing field `action`",
            ),
        ];
        for (text, needle) in cases {
            let e = ExecPolicy::parse(text, "pol.toml").unwrap_err();
            assert!(e.0.starts_with("pol.toml"), "{e}");
            assert!(e.0.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn the_rule_count_is_bounded_at_its_edge() {
        let rule = "[[rule]]\nprogram = \"x\"\naction = \"deny\"\n";
        let at = format!("default = \"allow\"\n{}", rule.repeat(MAX_POLICY_RULES));
        assert_eq!(
            ExecPolicy::parse(&at, "p").unwrap().rule_count(),
            MAX_POLICY_RULES
        );
        let over = format!("default = \"allow\"\n{}", rule.repeat(MAX_POLICY_RULES + 1));
        let e = ExecPolicy::parse(&over, "p").unwrap_err();
        assert!(e.0.contains("at most"), "{e}");
        let long = "x".repeat(MAX_POLICY_RULE_TEXT_BYTES + 1);
        let text =
            format!("default = \"allow\"\n[[rule]]\nprogram = \"{long}\"\naction = \"deny\"");
        assert!(ExecPolicy::parse(&text, "p").is_err());
        let text = format!(
            "default = \"allow\"\n[[rule]]\nprogram = \"{}\"\naction = \"deny\"",
            &long[1..]
        );
        assert!(ExecPolicy::parse(&text, "p").is_ok());
    }

    #[test]
    fn allow_all_allows() {
        assert_eq!(
            verdict(&ExecPolicy::allow_all(), "rm", None),
            (Action::Allow, "default".into())
        );
    }
}
