//! The crate's layers (docs/design.md, "Layout"): a module reads only modules of the layers
//! below its own, so the module graph has no cycle. Read from the source, as a reviewer would
//! grep it: every `crate::<module>` path outside comments, strings and character literals,
//! per top-level module of `src/lib.rs` (the house writes a path to another module from
//! `crate::`; `super::` stays inside one).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The design, lowest layer first: a module reads only modules of earlier layers (and itself).
/// Placing a new module here is deciding what it may read.
const LAYERS: &[&[&str]] = &[
    // Values and schemes every layer reads.
    &["domain", "signature", "tls"],
    // Running a jq program: no claim, no store.
    &["transform"],
    // The subscriptions' model and its one check (the config hands it its defaults).
    &["subscriptions"],
    // Settings: the whole TOML shape, validated through the layers below.
    &["config"],
    // All SQL.
    &["store"],
    &["ingest", "handlers", "secrets", "telemetry"],
    &["metrics"],
    // The workers: in-process effects, call-outs, the edge's refusals, the purge.
    &["consumer", "forward", "rejections", "retention"],
    &["pull", "alerts"],
    &["served"],
    &["routes"],
    &["startup"],
    &["cli"],
];

/// What a module reads: module -> (module read -> files that read it).
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<PathBuf>>>;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level modules `src/lib.rs` declares.
fn modules() -> Vec<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix("pub ").unwrap_or(l.trim());
            l.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(str::to_string)
        })
        .collect()
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` with its comments, strings and character literals blanked out (lifetimes kept).
fn code_of(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let at = |i: usize, s: &str| s.chars().enumerate().all(|(k, x)| c.get(i + k) == Some(&x));
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        if at(i, "//") {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if at(i, "/*") {
            let mut depth = 0usize;
            while i < c.len() {
                if at(i, "/*") {
                    depth += 1;
                    i += 2;
                } else if at(i, "*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c[i] == 'r'
            && (i == 0
                || !is_ident(c[i - 1])
                || (c[i - 1] == 'b' && (i < 2 || !is_ident(c[i - 2]))))
            && matches!(c.get(i + 1), Some('"' | '#'))
        {
            // A raw string: r"..." or r#"..."#, as many `#` closing as opening.
            let hashes = c[i + 1..].iter().take_while(|x| **x == '#').count();
            if c.get(i + 1 + hashes) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            i += 2 + hashes;
            while i < c.len() && !at(i, &close) {
                i += 1;
            }
            i += close.len();
            out.push(' ');
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(' ');
        } else if c[i] == '\'' && c.get(i + 1) == Some(&'\\') {
            // An escaped character: its closing quote comes after the escape's first character.
            i += 3;
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push(' ');
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            i += 3;
            out.push(' ');
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The first path segment after each `crate::` (each of a `crate::{a, b::c}` group's too).
fn reads(code: &str) -> Vec<String> {
    let c: Vec<char> = code.chars().collect();
    let ident_at = |mut i: usize| {
        while c.get(i).is_some_and(|x| x.is_whitespace()) {
            i += 1;
        }
        let start = i;
        while c.get(i).is_some_and(|x| is_ident(*x)) {
            i += 1;
        }
        c[start..i].iter().collect::<String>()
    };
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(k) = code[from..].find("crate::") {
        let byte = from + k;
        from = byte + "crate::".len();
        if code[..byte].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let mut i = code[..from].chars().count();
        while c.get(i).is_some_and(|x| x.is_whitespace()) {
            i += 1;
        }
        if c.get(i) != Some(&'{') {
            found.push(ident_at(i));
            continue;
        }
        let mut depth = 0;
        while i < c.len() {
            match c[i] {
                '{' => {
                    depth += 1;
                    if depth == 1 {
                        found.push(ident_at(i + 1));
                    }
                }
                ',' if depth == 1 => found.push(ident_at(i + 1)),
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
    found.retain(|m| !m.is_empty());
    found
}

fn graph() -> Graph {
    let modules = modules();
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let rel = file.strip_prefix(&root).unwrap().to_path_buf();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.strip_suffix(".rs").unwrap_or(&first).to_string();
        if !modules.contains(&module) {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        for read in reads(&code) {
            if read != module && modules.contains(&read) {
                graph
                    .entry(module.clone())
                    .or_default()
                    .entry(read)
                    .or_default()
                    .insert(rel.clone());
            }
        }
    }
    graph
}

/// A cycle of `graph`, as the modules along it (the first again at the end).
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        at: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|m| m == at) {
            let mut found = path[start..].to_vec();
            found.push(at.to_string());
            return Some(found);
        }
        if done.contains(at) {
            return None;
        }
        path.push(at.to_string());
        for next in graph.get(at).into_iter().flat_map(|reads| reads.keys()) {
            if let Some(found) = visit(graph, next, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(at.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(graph, m, &mut Vec::new(), &mut done))
}

fn why(graph: &Graph, from: &str, to: &str) -> String {
    let files: Vec<String> = graph[from][to]
        .iter()
        .map(|f| format!("src/{}", f.display()))
        .collect();
    format!("{from} reads {to} in {}", files.join(", "))
}

#[test]
fn the_modules_read_one_way() {
    let graph = graph();
    if let Some(cycle) = cycle(&graph) {
        let steps: Vec<String> = cycle
            .windows(2)
            .map(|w| why(&graph, &w[0], &w[1]))
            .collect();
        panic!(
            "the module graph has a cycle: {}\n  {}",
            cycle.join(" -> "),
            steps.join("\n  ")
        );
    }
    let layer = |m: &str| LAYERS.iter().position(|l| l.contains(&m));
    let modules = modules();
    let unplaced: Vec<&String> = modules.iter().filter(|m| layer(m).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "modules of src/lib.rs in none of LAYERS (place each): {unplaced:?}"
    );
    let gone: Vec<&&str> = LAYERS
        .iter()
        .flat_map(|l| l.iter())
        .filter(|m| !modules.iter().any(|d| d == *m))
        .collect();
    assert!(
        gone.is_empty(),
        "LAYERS names modules src/lib.rs does not: {gone:?}"
    );
    let upward: Vec<String> = graph
        .iter()
        .flat_map(|(from, reads)| reads.keys().map(move |to| (from, to)))
        .filter(|(from, to)| layer(to) >= layer(from))
        .map(|(from, to)| why(&graph, from, to))
        .collect();
    assert!(
        upward.is_empty(),
        "reads at or above the reader's own layer (LAYERS in tests/api/layout.rs is the \
         design: move the value down, or have the caller pass it):\n  {}",
        upward.join("\n  ")
    );
}

/// The crate doc's Layout names every module, so that a reader finds each there.
#[test]
fn the_crate_doc_names_every_module() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let doc: String = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let missing: Vec<String> = modules()
        .into_iter()
        .filter(|m| !doc.contains(&format!("[`{m}`]")))
        .collect();
    assert!(
        missing.is_empty(),
        "src/lib.rs's Layout does not name {missing:?}"
    );
}

/// What the scan counts as a read, and what it does not.
#[test]
fn the_scan_reads_paths_not_comments_or_strings() {
    let text = r##"
        use crate::store::{Claimed, Store};
        use crate::{config::Settings, domain::{self, time}};
        // crate::handlers in a comment
        /* crate::pull /* nested */ crate::served */
        let s = "crate::routes"; let r = r#"crate::cli "quoted""#;
        let q = '"'; let e = '\''; fn f<'a>(x: &'a str) -> &'a str { $crate::metrics::m() }
        pub(crate) fn g() -> crate::forward::Via { x }
    "##;
    assert_eq!(
        reads(&code_of(text)),
        ["store", "config", "domain", "metrics", "forward"]
    );
    let mut two = Graph::new();
    two.entry("a".into())
        .or_default()
        .insert("b".into(), BTreeSet::new());
    assert_eq!(cycle(&two), None);
    two.entry("b".into())
        .or_default()
        .insert("a".into(), BTreeSet::new());
    assert_eq!(cycle(&two), Some(vec!["a".into(), "b".into(), "a".into()]));
}
