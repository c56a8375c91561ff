//! The map of the code holds: the server's layers point one way (`serve/mod.rs` lists them), and
//! no two files of the server or of the core use each other, directly or round a loop.
//!
//! Read from the source: each file's `use` paths and inline `crate::`/`super::` paths outside
//! comments and its `#[cfg(test)]` module. Paths inside the server name modules, not re-exports
//! (`crate::serve::engine::Engine`, not `crate::serve::Engine`), so that a path says its layer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The server's layers, lowest first: a file may use its own layer and those before it.
const LAYERS: [&str; 8] = ["model", "store", "engine", "ops", "protocol", "net", "server", "fuzzing"];

/// Every `.rs` file under `root`, by module path (`serve::store::redis::common`).
fn modules(root: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(root).unwrap().with_extension("");
                let mut module: Vec<String> = relative.iter().map(|s| s.to_string_lossy().into_owned()).collect();
                if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                    module.pop();
                }
                found.insert(module, path);
            }
        }
    }
    found
}

/// The source without comments and without its test module.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines().map(|line| line.split("//").next().unwrap()).collect::<Vec<_>>().join("\n")
}

/// The paths a file names: `crate::a::b`, `super::a`, and each item of `use x::{a, b::c}` as
/// `x::a`, `x::b::c` (one level of braces, as the code writes them).
fn paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let ident = |c: char| c.is_alphanumeric() || c == '_' || c == ':';
    for start in ["crate::", "super::", "self::"] {
        let mut rest = code;
        while let Some(at) = rest.find(start) {
            let before = rest[..at].chars().last();
            let tail = &rest[at..];
            let end = tail.find(|c: char| !ident(c)).unwrap_or(tail.len());
            let path = tail[..end].trim_end_matches(':').to_string();
            if before.is_none_or(|c| !ident(c)) {
                if tail[end..].starts_with('{') {
                    let group = &tail[end + 1..tail[end..].find('}').map_or(tail.len(), |e| end + e)];
                    for item in group.split(',') {
                        let item = item.split_whitespace().next().unwrap_or("");
                        if !item.is_empty() && item != "self" {
                            paths.push(format!("{path}::{item}"));
                        }
                    }
                }
                paths.push(path);
            }
            rest = &rest[at + start.len()..];
        }
    }
    paths
}

/// The module a path from `from` lands in: the longest prefix that is a file.
fn resolve(modules: &BTreeMap<Vec<String>, PathBuf>, from: &[String], path: &str) -> Option<Vec<String>> {
    let mut segments = path.split("::").peekable();
    let mut base: Vec<String> = match segments.peek() {
        Some(&"crate") => {
            segments.next();
            Vec::new()
        }
        _ => from.to_vec(),
    };
    while let Some(&s) = segments.peek() {
        match s {
            "super" => drop(base.pop()),
            "self" => {}
            _ => break,
        }
        segments.next();
    }
    base.extend(segments.map(str::to_string));
    (1..=base.len()).rev().map(|n| base[..n].to_vec()).find(|m| modules.contains_key(m))
}

/// Each file's uses of other files (not of the modules it is inside: those only declare it).
fn uses(root: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let modules = modules(root);
    modules
        .iter()
        .map(|(module, path)| {
            let used = paths(&code(path))
                .iter()
                .filter_map(|p| resolve(&modules, module, p))
                .filter(|m| m != module && !module.starts_with(m))
                .collect();
            (module.clone(), used)
        })
        .collect()
}

/// A loop of files using each other, if there is one.
fn cycle(uses: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    fn visit(
        at: &Vec<String>,
        uses: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        path: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        if let Some(i) = path.iter().position(|m| m == at) {
            return Some(path[i..].to_vec());
        }
        if !done.insert(at.clone()) {
            return None;
        }
        path.push(at.clone());
        for next in uses.get(at).into_iter().flatten() {
            if let Some(found) = visit(next, uses, path, done) {
                return Some(found);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    uses.keys().find_map(|m| visit(m, uses, &mut Vec::new(), &mut done))
}

fn src(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(krate).join("src")
}

#[test]
fn no_file_of_the_server_or_the_core_uses_another_round_a_loop() {
    for krate in ["tollgate-server", "tollgate"] {
        let uses = uses(&src(krate));
        assert!(uses.len() > 10, "{krate}: read {} files", uses.len());
        let loop_ = cycle(&uses).map(|c| c.iter().map(|m| m.join("::")).collect::<Vec<_>>().join(" -> "));
        assert_eq!(loop_, None, "{krate}: files that use each other");
    }
}

#[test]
fn the_servers_layers_point_one_way() {
    let layer = |module: &[String]| match module {
        [serve, layer, ..] if serve == "serve" => LAYERS.iter().position(|l| l == layer),
        _ => None,
    };
    let uses = uses(&src("tollgate-server"));
    let mut checked = 0;
    for (module, used) in &uses {
        let Some(own) = layer(module) else { continue };
        checked += 1;
        for other in used {
            if let Some(theirs) = layer(other) {
                assert!(
                    theirs <= own,
                    "{} ({}) uses {} ({}), a layer above it",
                    module.join("::"),
                    LAYERS[own],
                    other.join("::"),
                    LAYERS[theirs]
                );
            }
        }
    }
    assert!(checked > 30, "{checked} files checked");
    let sample = ["serve", "store", "memory"].map(String::from);
    assert!(uses[&sample.to_vec()].iter().any(|m| layer(m) == Some(0)), "the reading finds store -> model");
}
