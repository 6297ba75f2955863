//! Everything derived from the command table: `COMMAND`, `COMMAND INFO`, `COMMAND DOCS`,
//! `COMMAND GETKEYS` and `<container> HELP` replies and the command reference in
//! `docs/commands.md`.

use std::borrow::Cow;

use bytes::Bytes;

use super::table::{lookup, lookup_full, AclCat, Arg, ArgType, Cmd, CommandSpec, Flag, COMMANDS};
use crate::error::Error;
use crate::protocol::Reply;

/// Version reported as `since` for every permitd command.
const SINCE: &str = "0.1.0";

fn simple_list(words: impl Iterator<Item = &'static str>) -> Reply {
    Reply::Array(words.map(Reply::simple).collect())
}

/// One `COMMAND INFO` entry (Redis 7's ten fields).
pub fn info(spec: &CommandSpec) -> Reply {
    let (first, last, step) = if spec.first_key > 0 {
        (spec.first_key as i64, spec.first_key as i64, 1)
    } else {
        (0, 0, 0)
    };
    let key_specs = if spec.first_key > 0 {
        let flags = if spec.flags.has(Flag::Write) {
            ["RW", "UPDATE"]
        } else {
            ["RO", "ACCESS"]
        };
        vec![Reply::fields(vec![
            ("flags", simple_list(flags.into_iter())),
            (
                "begin_search",
                Reply::fields(vec![
                    ("type", Reply::text("index")),
                    ("spec", Reply::fields(vec![("index", Reply::Int(first))])),
                ]),
            ),
            (
                "find_keys",
                Reply::fields(vec![
                    ("type", Reply::text("range")),
                    (
                        "spec",
                        Reply::fields(vec![
                            ("lastkey", Reply::Int(0)),
                            ("keystep", Reply::Int(1)),
                            ("limit", Reply::Int(0)),
                        ]),
                    ),
                ]),
            ),
        ])]
    } else {
        Vec::new()
    };
    Reply::Array(vec![
        Reply::text(spec.name),
        Reply::Int(spec.arity as i64),
        simple_list(spec.flags.iter().map(Flag::as_str)),
        Reply::Int(first),
        Reply::Int(last),
        Reply::Int(step),
        simple_list(spec.acl.iter().map(AclCat::as_str)),
        Reply::Array(Vec::new()),
        Reply::Array(key_specs),
        Reply::Array(spec.subcommands.iter().map(info).collect()),
    ])
}

fn arg_doc(a: &Arg, key_index: &mut i64) -> Reply {
    let mut f = vec![
        ("name", Reply::text(a.name)),
        ("type", Reply::text(a.kind.as_str())),
    ];
    if a.kind == ArgType::Key {
        f.push(("key_spec_index", Reply::Int(*key_index)));
        *key_index += 1;
    }
    if let Some(t) = a.token {
        f.push(("token", Reply::text(t)));
    }
    let mut flags = Vec::new();
    if a.optional {
        flags.push(Reply::simple("optional"));
    }
    if a.multiple {
        flags.push(Reply::simple("multiple"));
    }
    if !flags.is_empty() {
        f.push(("flags", Reply::Array(flags)));
    }
    if !a.args.is_empty() {
        let inner = a.args.iter().map(|x| arg_doc(x, key_index)).collect();
        f.push(("arguments", Reply::Array(inner)));
    }
    Reply::fields(f)
}

/// One `COMMAND DOCS` entry's value.
pub fn doc(spec: &CommandSpec) -> Reply {
    let mut key_index = 0;
    let mut f = vec![
        ("summary", Reply::text(spec.summary)),
        ("since", Reply::text(SINCE)),
        ("group", Reply::text(spec.group)),
        ("complexity", Reply::text(spec.complexity)),
    ];
    if !spec.args.is_empty() {
        let args = spec
            .args
            .iter()
            .map(|a| arg_doc(a, &mut key_index))
            .collect();
        f.push(("arguments", Reply::Array(args)));
    }
    if !spec.subcommands.is_empty() {
        let subs = spec
            .subcommands
            .iter()
            .map(|s| (Reply::text(s.name), doc(s)))
            .collect();
        f.push(("subcommands", Reply::Map(subs)));
    }
    Reply::fields(f)
}

/// `COMMAND` / `COMMAND INFO [names]`: all commands, or the named ones (null when unknown).
pub fn info_reply(names: &[Bytes]) -> Reply {
    if names.is_empty() {
        return Reply::Array(COMMANDS.iter().map(info).collect());
    }
    Reply::Array(
        names
            .iter()
            .map(|n| lookup_full(n).map_or(Reply::Null, info))
            .collect(),
    )
}

/// `COMMAND DOCS [names]`: a map of name to doc (unknown names left out).
pub fn docs_reply(names: &[Bytes]) -> Reply {
    let specs: Vec<&CommandSpec> = if names.is_empty() {
        COMMANDS.iter().collect()
    } else {
        names.iter().filter_map(|n| lookup_full(n)).collect()
    };
    Reply::Map(
        specs
            .into_iter()
            .map(|s| (Reply::text(s.name), doc(s)))
            .collect(),
    )
}

/// Redis's HELP reply (its `addReplyHelp`): a header naming `command`, the `lines` (each
/// subcommand's usage, then what it does, indented by four spaces), and HELP's own entry last.
pub fn help(command: &str, lines: impl IntoIterator<Item = Cow<'static, str>>) -> Reply {
    let header = format!(
        "{} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        command.to_uppercase()
    );
    let mut out = vec![Reply::simple(header)];
    out.extend(lines.into_iter().map(Reply::Simple));
    out.push(Reply::simple("HELP"));
    out.push(Reply::simple("    Prints this help."));
    Reply::Array(out)
}

/// `<container> HELP`: [`help`] over the container's subcommands that run here, in the table's
/// order (the CLIENT subcommands of client-side caching, which only refuse, are left out),
/// after the container's own entry when it also runs alone, as COMMAND does.
pub fn container_help(container: &str) -> Reply {
    let Some(c) = lookup(container.as_bytes()) else {
        return help(container, []);
    };
    let alone = c
        .arity_ok(1)
        .then(|| ("(no subcommand)".to_string(), c.summary));
    // A subcommand's usage starts with its container's name and a space.
    let subs = c
        .subcommands
        .iter()
        .filter(|s| !matches!(s.cmd, Cmd::Help | Cmd::ClientUnsupported))
        .map(|s| (s.usage()[c.name.len() + 1..].to_string(), s.summary));
    let lines = alone
        .into_iter()
        .chain(subs)
        .flat_map(|(usage, summary)| [Cow::Owned(usage), Cow::Owned(format!("    {summary}"))]);
    help(c.name, lines)
}

/// `COMMAND COUNT`: the top-level commands (subcommands do not count).
pub fn count_reply() -> Reply {
    Reply::Int(COMMANDS.len() as i64)
}

/// `COMMAND GETKEYS command args...`: the namespace of a keyed command.
pub fn getkeys_reply(argv: &[Bytes]) -> Result<Reply, Error> {
    let spec = super::table::lookup(&argv[0])
        .ok_or_else(|| Error::Err("Invalid command specified".into()))?;
    if !spec.arity_ok(argv.len()) {
        return Err(Error::Err(
            "Invalid number of arguments specified for command".into(),
        ));
    }
    if spec.first_key == 0 {
        return Err(Error::Err("The command has no key arguments".into()));
    }
    Ok(Reply::Array(vec![Reply::Bulk(
        argv[spec.first_key as usize].clone(),
    )]))
}

/// The command reference (`docs/commands.md`), generated from the table.
pub fn markdown() -> String {
    let mut s = String::from(
        "# Command reference\n\n\
         Generated from the command table (`src/command/table.rs`); a test checks that this file \
         matches it. Regenerate with `permitd --print-command-docs > docs/commands.md`.\n\n\
         Arity follows Redis: it counts the command name, and is negative when more arguments \
         may follow. Option words are case-insensitive and may come in any order after the \
         fixed arguments; `META` comes last. In a complexity, N is the size of what the command \
         looks into (a shard's namespaces, a namespace's semaphores or leases, the clients); \
         other letters are named where they appear.\n",
    );
    let mut group = "";
    for c in COMMANDS {
        if c.group != group {
            group = c.group;
            s.push_str(&format!("\n## {group}\n"));
        }
        write_entry(&mut s, c);
        for sub in c.subcommands {
            write_entry(&mut s, sub);
        }
    }
    s
}

fn write_entry(s: &mut String, c: &CommandSpec) {
    let flags = if c.flags.is_empty() {
        "-".to_string()
    } else {
        let names: Vec<&str> = c.flags.iter().map(Flag::as_str).collect();
        names.join(", ")
    };
    let acl: Vec<&str> = c.acl.iter().map(AclCat::as_str).collect();
    let keys = if c.first_key > 0 {
        format!("namespace at {}", c.first_key)
    } else {
        "none".to_string()
    };
    s.push_str(&format!(
        "\n### `{}`\n\n{}\n\n- arity: {}; flags: {}; keys: {}; ACL: {}\n- complexity: {}\n",
        c.usage(),
        c.summary,
        c.arity,
        flags,
        keys,
        acl.join(" "),
        c.complexity
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_file_matches_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/commands.md");
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == markdown(),
            "docs/commands.md is stale: run `cargo run -- --print-command-docs > docs/commands.md`"
        );
    }

    #[test]
    fn info_of_acquire_has_blocking_flag_and_key_positions() {
        let r = info(super::super::table::lookup(b"sem.acquire").unwrap());
        let Reply::Array(f) = r else { panic!() };
        assert_eq!(f[1], Reply::Int(-6));
        assert!(matches!(&f[2], Reply::Array(v) if v.contains(&Reply::simple("blocking"))));
        assert_eq!(
            (&f[3], &f[4], &f[5]),
            (&Reply::Int(1), &Reply::Int(1), &Reply::Int(1))
        );
    }
}
