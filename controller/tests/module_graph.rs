//! The controller's module map points one way (issue 26): no import cycle between its modules,
//! at the level of each file and of each top-level module, and the pure parts (the builders,
//! the planner, the view) import no I/O module.
//!
//! A use is any `crate::a::b` path outside comments and `#[cfg(test)]` modules, resolved to the
//! deepest module that exists; a module using its own ancestor or descendant is structure, not
//! a cycle. Run: `cargo test -p etcd-controller --test module_graph`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every module of `src/` (not `bin/`) and its file.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut found = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src/").flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "bin") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path
                .strip_prefix(src)
                .expect("under src/")
                .with_extension("");
            let mut parts: Module = rel
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            if parts
                .last()
                .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
            {
                parts.pop();
            }
            found.insert(parts, path);
        }
    }
    found
}

/// The file's code without comments and without its `#[cfg(test)]` module (written last).
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `crate::...` paths of `code`, `use crate::a::{b, c::d}` groups expanded.
fn crate_paths(code: &str) -> Vec<Module> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `etcd_crate::`, not ours
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':' || c == '{'))
            .unwrap_or(rest.len());
        let head = &rest[..end];
        if let Some(brace) = head.find('{') {
            // A group: take it to its closing brace and expand it.
            let prefix = &head[..brace];
            let mut depth = 0usize;
            let mut close = rest.len();
            for (i, c) in rest[brace..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            close = brace + i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            for item in expand(&rest[brace + 1..close]) {
                paths.push(split(&format!("{prefix}{item}")));
            }
        } else {
            paths.push(split(head));
        }
    }
    paths
}

/// `b, c::{d, e}` -> `b`, `c::d`, `c::e`.
fn expand(group: &str) -> Vec<String> {
    let group: String = group.chars().filter(|c| !c.is_whitespace()).collect();
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    let mut parts = Vec::new();
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&group[start..]);
    for part in parts.into_iter().filter(|p| !p.is_empty()) {
        match part.find('{') {
            Some(brace) if part.ends_with('}') => {
                let (prefix, inner) = (&part[..brace], &part[brace + 1..part.len() - 1]);
                items.extend(expand(inner).into_iter().map(|i| format!("{prefix}{i}")));
            }
            _ => items.push(part.to_string()),
        }
    }
    items
}

fn split(path: &str) -> Module {
    path.split("::")
        .filter(|p| !p.is_empty() && *p != "self")
        .map(str::to_string)
        .collect()
}

/// Module -> the modules it uses, cut to the first `depth` components (0: whole paths).
fn graph(src: &Path, depth: usize) -> BTreeMap<Module, BTreeSet<Module>> {
    let mods = modules(src);
    let cut = |m: &Module| -> Module {
        if depth == 0 {
            m.clone()
        } else {
            m.iter().take(depth).cloned().collect()
        }
    };
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, file) in &mods {
        let test_file = module
            .last()
            .is_some_and(|l| l == "tests" || l.starts_with("tests_") || l == "fixtures");
        if test_file {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("read a module");
        for path in crate_paths(&code(&text)) {
            let Some(used) = (1..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|p| mods.contains_key(p))
            else {
                continue;
            };
            if module.starts_with(&used) || used.starts_with(module) {
                continue; // an ancestor or a descendant
            }
            let (from, to) = (cut(module), cut(&used));
            if from != to {
                graph.entry(from).or_default().insert(to);
            }
        }
    }
    graph
}

/// A cycle of `graph`, if it has one (depth-first search).
fn cycle(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    fn visit(
        node: &Module,
        graph: &BTreeMap<Module, BTreeSet<Module>>,
        done: &mut BTreeSet<Module>,
        path: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut found = path[at..].to_vec();
            found.push(node.clone());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, done, path) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn show(cycle: &[Module]) -> String {
    cycle
        .iter()
        .map(|m| m.join("::"))
        .collect::<Vec<_>>()
        .join(" -> ")
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    for depth in [0, 1] {
        let graph = graph(&src(), depth);
        assert!(
            graph.values().map(BTreeSet::len).sum::<usize>() > 20,
            "the scan found almost no uses: {graph:?}"
        );
        if let Some(found) = cycle(&graph) {
            panic!("an import cycle (depth {depth}): {}", show(&found));
        }
    }
}

#[test]
fn the_pure_parts_import_no_io_module() {
    const PURE: &[&str] = &["builders", "planner", "view"];
    let graph = graph(&src(), 1);
    for pure in PURE {
        let uses = graph
            .get(&vec![pure.to_string()])
            .cloned()
            .unwrap_or_default();
        let io: Vec<String> = uses
            .iter()
            .filter(|m| !PURE.contains(&m[0].as_str()))
            .map(|m| m.join("::"))
            .collect();
        assert!(io.is_empty(), "{pure} imports {io:?}");
    }
}

#[test]
fn the_scan_sees_a_cycle_when_there_is_one() {
    let text = "use crate::a::{b, c::{d, e}};\nfn f() { crate::x::y(); }\n// crate::ignored\n";
    let paths = crate_paths(&code(text));
    let names: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(names, ["a::b", "a::c::d", "a::c::e", "x::y"]);
    let m = |s: &str| split(s);
    let graph: BTreeMap<Module, BTreeSet<Module>> = [
        (m("a"), [m("b")].into()),
        (m("b"), [m("c")].into()),
        (m("c"), [m("a")].into()),
    ]
    .into();
    assert!(cycle(&graph).is_some());
    let acyclic: BTreeMap<Module, BTreeSet<Module>> =
        [(m("a"), [m("b")].into()), (m("b"), [m("c")].into())].into();
    assert!(cycle(&acyclic).is_none());
}
