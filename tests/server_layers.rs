//! The files of `src/server/` depend on each other one way: no file names an item of a file
//! that names it back, directly or through others (through `mod.rs` included). Rust allows
//! such cycles; they mean that no file can be read "below" another. This reads the paths the
//! files write (`use super::x`, `super::x::Item`, `crate::server::x`), fails on a cycle, and
//! prints the files in an order where each depends only on those before it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A file's code, without comments and without its `#[cfg(test)]` module (where `super::` is
/// the file itself).
fn code(src: &str) -> String {
    let src = src.split("#[cfg(test)]").next().unwrap_or("");
    src.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers a path names first after `prefix`: `x` in `super::x::Y`, and `a`, `b` in
/// `super::{a, b::C}`.
fn first_segments(code: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(ident(item.trim()));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            out.push(ident(item.trim()));
        } else {
            out.push(ident(rest));
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// Each file of `src/server/` and the files it names items of (`mod` for `mod.rs`).
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/server");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("src/server") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let src = std::fs::read_to_string(&path).expect("a source file");
            files.insert(name, code(&src));
        }
    }
    let modules: BTreeSet<String> = files.keys().filter(|n| *n != "mod").cloned().collect();
    let mut deps = BTreeMap::new();
    for (name, code) in &files {
        let mut names = first_segments(code, "crate::server::");
        if name == "mod" {
            // The parent declares its children (`mod x;`) and may re-export from them.
            names.extend(first_segments(code, "use "));
            names.extend(first_segments(code, "mod "));
            names.extend(first_segments(code, "self::"));
        } else {
            names.extend(first_segments(code, "super::"));
        }
        let targets = names
            .into_iter()
            .map(|n| {
                if modules.contains(&n) {
                    n
                } else {
                    "mod".into()
                }
            })
            .filter(|n| n != name && (n != "mod" || name != "mod"))
            // `crate::server::...` from mod.rs, or std/crate paths after `use ` there.
            .filter(|n| name != "mod" || modules.contains(n))
            .collect();
        deps.insert(name.clone(), targets);
    }
    deps
}

#[test]
fn server_files_depend_on_each_other_one_way() {
    let deps = dependencies();
    // Kahn's order: a file comes once every file it depends on came.
    let mut order: Vec<String> = Vec::new();
    let mut left = deps.clone();
    while !left.is_empty() {
        let ready: Vec<String> = left
            .iter()
            .filter(|(_, d)| d.iter().all(|x| order.contains(x)))
            .map(|(n, _)| n.clone())
            .collect();
        assert!(
            !ready.is_empty(),
            "a cycle among the files of src/server/ (each with what it names): {left:#?}"
        );
        for n in ready {
            left.remove(&n);
            order.push(n);
        }
    }
    println!("src/server/ from the bottom up: {}", order.join(", "));
    for n in &order {
        println!("  {n} -> {:?}", deps[n]);
    }
}

#[test]
fn the_shard_runtime_names_no_connection() {
    let deps = dependencies();
    let worker = &deps["worker"];
    for conn_side in [
        "conn", "dispatch", "thread", "session", "surface", "multi", "clients",
    ] {
        assert!(
            !worker.contains(conn_side),
            "worker.rs names {conn_side}.rs: {worker:?}"
        );
    }
}

#[test]
fn the_reader_of_paths_sees_groups_and_nesting() {
    let code = "use super::{a, b::{C, D}, c};\nfn f() { super::d::g(); crate::server::e::h() }";
    assert_eq!(first_segments(code, "super::"), ["a", "b", "c", "d"]);
    assert_eq!(first_segments(code, "crate::server::"), ["e"]);
}
