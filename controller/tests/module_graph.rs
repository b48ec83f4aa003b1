//! The module maps of the shipped crates point one way (issues 26 and 36): no import circle
//! between their modules, at the level of each module (a file, or a `mod x { .. }` in one) and
//! of each top-level module, in `etcd-shared`, `etcd-process`, `etcd-webhook` and
//! `etcd-controller`; and the controller's pure parts (the builders, the planner, the view)
//! import no I/O module.
//!
//! A use is any path outside comments, strings and `#[cfg(test)]` items that starts with
//! `crate::`, `super::` or `self::` (in a `use` tree, grouped forms such as
//! `use super::{a, b::c}` expanded, or inline in code, such as `crate::backup::x(..)`), and a
//! `use` path whose first segment is a child module. It is resolved to the deepest module that
//! exists, following `pub use` re-exports to the module that defines the item (so a use of
//! `super::EtcdClusterStatus` counts as a use of `types::status`, where `types` re-exports it
//! from). A module using its own ancestor or descendant is structure, not a circle. Test-only
//! modules (`#[cfg(test)] mod x;`) are left out.
//!
//! Run: `cargo test -p etcd-controller --test module_graph`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// The shipped crates whose `src/` is scanned, from the workspace root.
const CRATES: &[&str] = &["shared", "process", "webhook", "controller"];

// ---------------------------------------------------------------------------------------------
// Tokens: the code without comments, strings and character literals.

/// Identifiers, `::`, and every other character as its own token.
fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let n = chars.len();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < n {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < n && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0usize;
            while i < n {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_string(&chars, i + 1);
        } else if c == '\'' {
            if at(i + 1) == '\\' {
                // An escaped character literal: up to its closing quote.
                i += 2;
                while i < n && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3; // 'x'
            } else {
                i += 1; // a lifetime's quote
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < n && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let raw = (word == "r" || word == "br") && (at(i) == '"' || at(i) == '#');
            if raw && (at(i) == '"' || at(i + 1) == '"' || at(i + 1) == '#') {
                let mut hashes = 0;
                while at(i) == '#' {
                    hashes += 1;
                    i += 1;
                }
                if at(i) != '"' {
                    continue; // `r#ident`: the identifier follows
                }
                i += 1;
                'raw: while i < n {
                    if chars[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                        i += 1 + hashes;
                        break 'raw;
                    }
                    i += 1;
                }
            } else if word == "b" && at(i) == '"' {
                i = skip_string(&chars, i + 1);
            } else if word == "b" && at(i) == '\'' {
                i += 1;
                while i < n && chars[i] != '\'' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            } else {
                out.push(word);
            }
        } else if c == ':' && at(i + 1) == ':' {
            out.push("::".into());
            i += 2;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// The index after the string whose body starts at `i`.
fn skip_string(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

// ---------------------------------------------------------------------------------------------
// One file: its paths, its re-exports, its inline and test-only modules.

/// What a file says, per module it holds (itself and its inline `mod x { .. }`).
#[derive(Debug, Default)]
struct Scan {
    /// Module -> the paths it uses, as written (`super::a::b`, `crate::x`, `child::y`).
    uses: BTreeMap<Module, BTreeSet<Vec<String>>>,
    /// Module -> name it re-exports (`pub use`) -> the path it re-exports, as written.
    reexports: BTreeMap<Module, BTreeMap<String, Vec<String>>>,
    /// Inline modules (`mod x { .. }`), not test-only.
    inline: BTreeSet<Module>,
    /// Child modules declared test-only (`#[cfg(test)] mod x;`).
    test_only: BTreeSet<Module>,
}

/// Scans the tokens of the file of `module`.
fn scan(module: &Module, toks: &[String]) -> Scan {
    let mut s = Scan::default();
    // The module stack: (inline module, brace depth its block closes at).
    let mut stack: Vec<(Module, usize)> = vec![(module.clone(), usize::MAX)];
    let mut depth = 0usize;
    let mut i = 0;
    let t = |i: usize| toks.get(i).map_or("", String::as_str);
    while i < toks.len() {
        let current = stack.last().expect("the file's module").0.clone();
        if t(i) == "#"
            && t(i + 1) == "["
            && t(i + 2) == "cfg"
            && t(i + 3) == "("
            && t(i + 4) == "test"
            && t(i + 5) == ")"
            && t(i + 6) == "]"
        {
            // A test-only item: skipped, and a test-only file module remembered.
            let mut j = skip_attributes(toks, i);
            j = skip_visibility(toks, j);
            if t(j) == "mod" && t(j + 2) == ";" {
                let mut child = current.clone();
                child.push(t(j + 1).to_string());
                s.test_only.insert(child);
            }
            i = skip_item(toks, j);
            continue;
        }
        match t(i) {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if stack.last().is_some_and(|(_, d)| *d == depth) {
                    stack.pop();
                }
            }
            "mod" if t(i + 2) == "{" => {
                let mut inner = current.clone();
                inner.push(t(i + 1).to_string());
                s.inline.insert(inner.clone());
                stack.push((inner, depth));
                depth += 1;
                i += 3;
                continue;
            }
            "use" => {
                let public =
                    i > 0 && (t(i - 1) == "pub" || (t(i - 1) == ")" && is_pub_paren(toks, i - 1)));
                let end = (i..toks.len()).find(|&j| t(j) == ";").unwrap_or(toks.len());
                for (path, name) in use_tree(&toks[i + 1..end]) {
                    if public && let Some(name) = name {
                        s.reexports
                            .entry(current.clone())
                            .or_default()
                            .insert(name, path.clone());
                    }
                    s.uses.entry(current.clone()).or_default().insert(path);
                }
                i = end + 1;
                continue;
            }
            "crate" | "super" | "self" if t(i + 1) == "::" && (i == 0 || t(i - 1) != "::") => {
                let mut path = vec![t(i).to_string()];
                let mut j = i + 1;
                while t(j) == "::" && is_ident(t(j + 1)) {
                    path.push(t(j + 1).to_string());
                    j += 2;
                }
                s.uses.entry(current.clone()).or_default().insert(path);
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    s
}

fn is_ident(tok: &str) -> bool {
    tok.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Whether the `)` at `close` ends a `pub(..)`.
fn is_pub_paren(toks: &[String], close: usize) -> bool {
    let open = (0..close).rev().find(|&j| toks[j] == "(");
    open.is_some_and(|o| o > 0 && toks[o - 1] == "pub")
}

/// The index after the attributes (`#[..]`) starting at `i`.
fn skip_attributes(toks: &[String], mut i: usize) -> usize {
    while toks.get(i).is_some_and(|t| t == "#") && toks.get(i + 1).is_some_and(|t| t == "[") {
        let mut depth = 0usize;
        i += 1;
        while i < toks.len() {
            match toks[i].as_str() {
                "[" => depth += 1,
                "]" => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
    i
}

/// The index after `pub`, `pub(crate)`, `pub(in a::b)` at `i`, if any.
fn skip_visibility(toks: &[String], i: usize) -> usize {
    if toks.get(i).is_none_or(|t| t != "pub") {
        return i;
    }
    if toks.get(i + 1).is_some_and(|t| t == "(") {
        let close = (i + 1..toks.len()).find(|&j| toks[j] == ")");
        return close.map_or(toks.len(), |c| c + 1);
    }
    i + 1
}

/// The index after the item starting at `i`: at its `;` or at the end of its first block.
fn skip_item(toks: &[String], mut i: usize) -> usize {
    let mut depth = 0isize;
    while i < toks.len() {
        match toks[i].as_str() {
            "{" | "(" | "[" => depth += 1,
            "}" | ")" | "]" => {
                depth -= 1;
                if depth == 0 && toks[i] == "}" {
                    return i + 1;
                }
            }
            ";" if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// The leaves of a `use` tree (the tokens between `use` and `;`): each path, and the name it
/// brings into scope (`None` for a glob).
fn use_tree(toks: &[String]) -> Vec<(Vec<String>, Option<String>)> {
    let mut out = Vec::new();
    tree(toks, &mut 0, &[], &mut out);
    out
}

fn tree(
    toks: &[String],
    i: &mut usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(*i).map(String::as_str) {
            Some("::") => *i += 1,
            Some("{") => {
                *i += 1;
                while toks.get(*i).is_some_and(|t| t != "}") {
                    tree(toks, i, &path, out);
                    if toks.get(*i).is_some_and(|t| t == ",") {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Some("*") => {
                *i += 1;
                out.push((path, None));
                return;
            }
            Some(word) if is_ident(word) => {
                *i += 1;
                if word == "self" && !path.is_empty() {
                    // `a::{self, ..}`: `a` itself
                } else {
                    path.push(word.to_string());
                }
                let mut name = path.last().cloned();
                if toks.get(*i).is_some_and(|t| t == "as") {
                    name = toks.get(*i + 1).cloned();
                    *i += 2;
                }
                if toks.get(*i).is_none_or(|t| t != "::") {
                    out.push((path, name.filter(|n| n != "_")));
                    return;
                }
            }
            _ => return,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A crate: its modules, and which module each path names.

/// One crate's modules and what each uses.
struct Crate {
    /// Every module (not test-only) and the file it is in.
    modules: BTreeMap<Module, PathBuf>,
    scan: Scan,
}

impl Crate {
    /// Reads the library of the crate whose sources are in `src` (not `main.rs`, not `bin/`).
    fn read(src: &Path) -> Crate {
        let mut files = BTreeMap::new();
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
                if parts == ["main"] {
                    continue; // the binary: a crate of its own, using the library by name
                }
                if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
                    parts.pop();
                }
                files.insert(parts, path);
            }
        }
        let mut scan = Scan::default();
        for (module, file) in &files {
            let text = std::fs::read_to_string(file).expect("read a module");
            let one = self::scan(module, &tokens(&text));
            scan.uses.extend(one.uses);
            scan.reexports.extend(one.reexports);
            scan.test_only.extend(one.test_only);
            for inline in one.inline {
                scan.inline.insert(inline);
            }
        }
        let mut modules: BTreeMap<Module, PathBuf> = files;
        for inline in &scan.inline {
            let file = modules[&inline[..inline.len() - 1].to_vec()].clone();
            modules.insert(inline.clone(), file);
        }
        let test_only = scan.test_only.clone();
        modules.retain(|m, _| !test_only.iter().any(|t| m.starts_with(t)));
        Crate { modules, scan }
    }

    /// `path` as used in `module`, from the crate root; `None` for an outside crate's.
    fn absolute(&self, module: &Module, path: &[String]) -> Option<Module> {
        let mut at: Module = match path.first().map(String::as_str) {
            Some("crate") => Vec::new(),
            Some("self") => module.clone(),
            Some("super") => module.clone(),
            Some(first) => {
                let mut child = module.clone();
                child.push(first.to_string());
                if !self.modules.contains_key(&child) {
                    return None; // another crate, or a name in scope
                }
                module.clone()
            }
            None => return None,
        };
        let mut rest = match path[0].as_str() {
            "crate" | "self" => &path[1..],
            _ => path,
        };
        while rest.first().is_some_and(|p| p == "super") {
            at.pop()?;
            rest = &rest[1..];
        }
        at.extend(rest.iter().cloned());
        Some(at)
    }

    /// The module that defines what `path` (from the crate root) names: its deepest module,
    /// through the re-exports on the way.
    fn resolve(&self, path: &Module) -> Option<Module> {
        let mut path = path.clone();
        for _ in 0..16 {
            let module = (0..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|p| p.is_empty() || self.modules.contains_key(p))?;
            let Some(item) = path.get(module.len()) else {
                return Some(module);
            };
            let Some(target) = self.scan.reexports.get(&module).and_then(|r| r.get(item)) else {
                return Some(module);
            };
            let Some(mut next) = self.absolute(&module, target) else {
                return Some(module); // a re-export of another crate's item
            };
            next.extend(path[module.len() + 1..].iter().cloned());
            if next == path {
                return Some(module);
            }
            path = next;
        }
        None
    }

    /// Module -> the modules it uses (with a path that shows it), cut to the first `depth`
    /// components (0: whole paths).
    fn graph(&self, depth: usize) -> Graph {
        let cut = |m: &Module| -> Module {
            if depth == 0 {
                m.clone()
            } else {
                m.iter().take(depth).cloned().collect()
            }
        };
        let mut graph = Graph::new();
        for (module, paths) in &self.scan.uses {
            if !self.modules.contains_key(module) {
                continue; // test-only
            }
            for path in paths {
                let Some(used) = self.absolute(module, path).and_then(|p| self.resolve(&p)) else {
                    continue;
                };
                if module.starts_with(&used) || used.starts_with(module) {
                    continue; // an ancestor or a descendant
                }
                let (from, to) = (cut(module), cut(&used));
                if from != to {
                    let shown = format!("`{}` in {}", path.join("::"), name(module));
                    graph.entry(from).or_default().entry(to).or_insert(shown);
                }
            }
        }
        graph
    }
}

/// Module -> used module -> the first path that uses it.
type Graph = BTreeMap<Module, BTreeMap<Module, String>>;

fn name(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// Every circle of `graph`: for each module, the shortest way back to it, each circle once.
fn circles(graph: &Graph) -> Vec<Vec<Module>> {
    let mut found = BTreeSet::new();
    for start in graph.keys() {
        // Breadth-first from `start`'s uses back to `start`.
        let mut came_from: BTreeMap<&Module, &Module> = BTreeMap::new();
        let mut queue: VecDeque<&Module> = VecDeque::from([start]);
        let mut closed = None;
        while let Some(node) = queue.pop_front() {
            for next in graph.get(node).into_iter().flat_map(BTreeMap::keys) {
                if next == start {
                    closed = Some(node);
                    break;
                }
                if !came_from.contains_key(next) {
                    came_from.insert(next, node);
                    queue.push_back(next);
                }
            }
            if closed.is_some() {
                break;
            }
        }
        let Some(mut node) = closed else { continue };
        let mut circle = vec![node.clone()];
        while node != start {
            node = came_from[node];
            circle.push(node.clone());
        }
        circle.reverse();
        // The same circle from any of its modules: start it at its smallest.
        let least = (0..circle.len())
            .min_by_key(|&k| &circle[k])
            .expect("a circle");
        circle.rotate_left(least);
        found.insert(circle);
    }
    found.into_iter().collect()
}

fn show(graph: &Graph, circle: &[Module]) -> String {
    let mut steps = Vec::new();
    for (k, from) in circle.iter().enumerate() {
        let to = &circle[(k + 1) % circle.len()];
        steps.push(format!(
            "{} -> {} ({})",
            name(from),
            name(to),
            graph[from][to]
        ));
    }
    steps.join("; ")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

fn crate_of(dir: &str) -> Crate {
    Crate::read(&workspace().join(dir).join("src"))
}

// ---------------------------------------------------------------------------------------------

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let mut failures = Vec::new();
    for dir in CRATES {
        let krate = crate_of(dir);
        for depth in [0, 1] {
            let graph = krate.graph(depth);
            for circle in circles(&graph) {
                failures.push(format!("{dir} (depth {depth}): {}", show(&graph, &circle)));
            }
        }
    }
    let controller = crate_of("controller").graph(0);
    assert!(
        controller.values().map(BTreeMap::len).sum::<usize>() > 100,
        "the scan found almost no uses: {controller:?}"
    );
    assert!(
        failures.is_empty(),
        "import circles:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_pure_parts_import_no_io_module() {
    const PURE: &[&str] = &["builders", "planner", "view", "object_key"];
    let graph = crate_of("controller").graph(1);
    for pure in PURE {
        let uses = graph
            .get(&vec![pure.to_string()])
            .cloned()
            .unwrap_or_default();
        let io: Vec<String> = uses
            .keys()
            .filter(|m| !PURE.contains(&m[0].as_str()))
            .map(|m| m.join("::"))
            .collect();
        assert!(io.is_empty(), "{pure} imports {io:?}");
    }
}

#[test]
fn the_etcdcluster_reconcile_imports_nothing_of_the_backup_controllers() {
    const CLUSTER_SIDE: &[&str] = &["reconcile", "planner", "observe", "status", "status_writer"];
    let graph = crate_of("controller").graph(1);
    for side in CLUSTER_SIDE {
        let uses = graph
            .get(&vec![side.to_string()])
            .cloned()
            .unwrap_or_default();
        let backup = uses.get(&vec!["backup".to_string()]);
        assert!(backup.is_none(), "{side} imports backup: {backup:?}");
    }
}

/// A crate of `files` (module path -> code) in memory.
fn in_memory(files: &[(&str, &str)]) -> Crate {
    let mut scan = Scan::default();
    let mut modules = BTreeMap::new();
    for (module, text) in files {
        let module: Module = module
            .split("::")
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        let one = self::scan(&module, &tokens(text));
        scan.uses.extend(one.uses);
        scan.reexports.extend(one.reexports);
        for inline in one.inline {
            modules.insert(inline, PathBuf::new());
        }
        modules.insert(module, PathBuf::new());
    }
    Crate { modules, scan }
}

#[test]
fn the_scan_reads_every_path_form() {
    let text = "use crate::a::{b, c::{d, e}};\nuse super::{f, g::h as i};\nuse self::j::*;\n\
        fn f() { crate::x::y(); super::steps::execute(); let s = \"crate::in_string\"; }\n\
        // crate::in_comment\n/* super::in_block */\nfn g<'a>(c: char) { let _ = ('x', '\\'', crate::z); }\n\
        #[cfg(test)]\nmod tests { use crate::test_only; }\n#[cfg(test)]\nuse crate::test_use;\n\
        pub(crate) use super::k::l;\nmod inner { use super::super::m; }\n";
    let s = scan(&vec!["p".to_string(), "q".to_string()], &tokens(text));
    let uses: Vec<String> = s.uses[&vec!["p".to_string(), "q".to_string()]]
        .iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        uses,
        [
            "crate::a::b",
            "crate::a::c::d",
            "crate::a::c::e",
            "crate::x::y",
            "crate::z",
            "self::j",
            "super::f",
            "super::g::h",
            "super::k::l",
            "super::steps::execute",
        ]
    );
    let inner = vec!["p".to_string(), "q".to_string(), "inner".to_string()];
    assert_eq!(
        s.uses[&inner].iter().next().map(|p| p.join("::")),
        Some("super::super::m".into())
    );
    assert_eq!(
        s.reexports[&vec!["p".to_string(), "q".to_string()]]["l"],
        ["super", "k", "l"]
    );
}

#[test]
fn the_scan_sees_a_circle_through_super_and_a_reexport() {
    // `types` re-exports `status::Phase`; `lenient` uses it through `super::Phase`, and
    // `status` uses `lenient` inline.
    let krate = in_memory(&[
        ("", "pub mod types;"),
        (
            "types",
            "mod lenient; pub mod status; pub use status::{Phase, Other};",
        ),
        ("types::lenient", "use super::Phase;"),
        (
            "types::status",
            "pub enum Phase {} fn f() { super::lenient::read(); }",
        ),
        ("x", "use crate::types::Other;"),
    ]);
    let graph = krate.graph(0);
    let found: Vec<String> = circles(&graph)
        .iter()
        .map(|c| c.iter().map(name).collect::<Vec<_>>().join(" -> "))
        .collect();
    assert_eq!(found, ["types::lenient -> types::status"]);
    assert!(graph[&vec!["x".to_string()]].contains_key(&vec!["types".into(), "status".into()]));
    let acyclic = in_memory(&[
        ("a", "use crate::b::f;"),
        ("b", "use super::c::{self, g};"),
        ("c", ""),
    ]);
    assert!(circles(&acyclic.graph(0)).is_empty());
}
