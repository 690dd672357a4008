//! `cargo xtask module-graph [--check] [PATH]`: which top-level modules of a
//! crate refer to which, leaves first, and (`--check`) a failure naming the
//! modules of every cycle.
//!
//! A cheap text scan, not a compiler pass (no build, well under a second):
//!
//! - The modules are the crate root's (`lib.rs`, else `main.rs`) `mod NAME;`
//!   declarations, at `NAME.rs`, `NAME/mod.rs` or their `#[path]`: the files
//!   `src/*.rs` and `src/*/mod.rs` less the root and less any file that is
//!   some other module's `#[path]` submodule (as `backends/vfio`'s
//!   `device_tests.rs` is). A module is all its files: the submodule files
//!   it declares, recursively, count as the module.
//! - A reference is a path `crate::NAME…` (or `$crate::NAME…`), every
//!   branch of a `use crate::{a::X, b}` group, and a `super::…` path that
//!   climbs to the crate root. `NAME` is a module, or a name the root
//!   imports from one: with `pub use offload::Offload;` in `lib.rs`,
//!   `crate::Offload` refers to `offload`. A module's references to itself
//!   are not dependencies.
//! - Not read: comments (doc comments too, so `[crate::x]` links do not
//!   count), string and character literals, attributes, and any item under
//!   `#[cfg(test)]` or `#[cfg(all(test, …))]`: the `mod tests { … }` block is
//!   skipped to its closing brace, a `mod tests;` file is not read, a test
//!   helper is skipped to its end. Unit tests may reach anywhere without
//!   being part of the layering; code after a test block still counts.
//!   Modules the root declares only under `cfg(test)` are not in the graph.
//!
//! Not handled: paths made by macros other than through `$crate`, glob
//! imports in the root (`pub use a::*` cannot say which names come from
//! `a`), and files declared inside inline modules (`mod a { mod b; }`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::Verdict;

/// Options of `cargo xtask module-graph`.
#[derive(Debug, Args)]
pub struct ModuleGraphArgs {
    /// Exit non-zero if some modules refer to each other in a cycle (each
    /// cycle's modules are named on stderr either way).
    #[arg(long)]
    pub check: bool,
    /// The crate's source folder (or the crate's folder); a relative path is
    /// taken from the current folder, else from the workspace root.
    #[arg(value_name = "PATH", default_value = "crypto-offload/src")]
    pub path: PathBuf,
}

/// Runs `module-graph`.
pub fn run(args: &ModuleGraphArgs) -> Result<Verdict> {
    let src = locate(&args.path);
    let graph = read_crate(&src)?;
    let order = components(&graph);
    print!("{}", render(&graph, &order));
    let cycles: Vec<&Vec<String>> = order.iter().filter(|c| c.len() > 1).collect();
    for cycle in &cycles {
        eprintln!(
            "module-graph: a cycle among {}: {}",
            cycle.len(),
            cycle.join(", ")
        );
        for module in *cycle {
            let inside: Vec<&str> = graph[module]
                .iter()
                .filter(|dep| cycle.contains(dep))
                .map(String::as_str)
                .collect();
            eprintln!("  {module} -> {}", inside.join(", "));
        }
    }
    eprintln!(
        "module-graph: {} modules in {}, {} cycle{}",
        graph.len(),
        src.display(),
        cycles.len(),
        if cycles.len() == 1 { "" } else { "s" }
    );
    Ok(if args.check && !cycles.is_empty() {
        Verdict::Fail
    } else {
        Verdict::Pass
    })
}

/// `path` as given if it exists from here, else from the workspace root;
/// a crate's folder stands for its `src`.
fn locate(path: &Path) -> PathBuf {
    let path = if path.is_absolute() || path.exists() {
        path.to_owned()
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
    };
    if !is_root(&path) && is_root(&path.join("src")) {
        path.join("src")
    } else {
        path
    }
}

fn is_root(dir: &Path) -> bool {
    dir.join("lib.rs").is_file() || dir.join("main.rs").is_file()
}

/// Each top-level module of the crate whose source folder is `src`, with
/// the other top-level modules it refers to.
pub fn read_crate(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let root = ["lib.rs", "main.rs"]
        .iter()
        .map(|name| src.join(name))
        .find(|file| file.is_file())
        .with_context(|| format!("{} has no lib.rs or main.rs", src.display()))?;
    let root_scan = scan_file(&root, 0)?;

    // Module name -> the first path segments its files refer to from the root.
    let mut refs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for child in &root_scan.children {
        let (file, child_dir) = resolve(&root, src, child)?;
        // A name declared twice (`#[cfg(unix)] mod sys;`, `#[cfg(windows)]
        // #[path = …] mod sys;`) is one module of both files.
        let module = refs.entry(child.name.clone()).or_default();
        collect(&file, &child_dir, 1, module)?;
    }

    // The names the root imports from a module: `crate::NAME` is that module.
    let mut imported: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, path) in &root_scan.uses {
        let path = match path.first().map(String::as_str) {
            Some("crate" | "self") => &path[1..],
            _ => &path[..],
        };
        if let Some(module) = path.first().filter(|m| refs.contains_key(*m)) {
            imported.insert(name, module);
        }
    }

    Ok(refs
        .iter()
        .map(|(module, names)| {
            let deps = names
                .iter()
                .filter_map(|name| {
                    if refs.contains_key(name) {
                        Some(name.as_str())
                    } else {
                        imported.get(name.as_str()).copied()
                    }
                })
                .filter(|dep| dep != module)
                .map(str::to_owned)
                .collect();
            (module.clone(), deps)
        })
        .collect())
}

/// Adds to `refs` what `file` (a module `depth` levels below the root, whose
/// submodule files are in `child_dir`) and its submodule files refer to.
fn collect(file: &Path, child_dir: &Path, depth: usize, refs: &mut BTreeSet<String>) -> Result<()> {
    let scan = scan_file(file, depth)?;
    refs.extend(scan.refs);
    for child in &scan.children {
        let (child_file, grandchild_dir) = resolve(file, child_dir, child)?;
        collect(&child_file, &grandchild_dir, depth + 1, refs)?;
    }
    Ok(())
}

/// The file of submodule `child` declared in `parent` (whose submodules are
/// in `child_dir`), and the folder of the child's own submodules.
fn resolve(parent: &Path, child_dir: &Path, child: &Child) -> Result<(PathBuf, PathBuf)> {
    if let Some(path) = &child.path {
        // Relative to the declaring file's folder; a #[path] file's own
        // submodules are looked up next to it, as a mod.rs's are.
        let file = parent.parent().unwrap_or(Path::new(".")).join(path);
        let dir = file.parent().unwrap_or(Path::new(".")).to_owned();
        return Ok((file, dir));
    }
    let flat = child_dir.join(format!("{}.rs", child.name));
    let nested = child_dir.join(&child.name).join("mod.rs");
    match (flat.is_file(), nested.is_file()) {
        (true, false) => Ok((flat, child_dir.join(&child.name))),
        (false, true) => Ok((nested, child_dir.join(&child.name))),
        (true, true) => bail!(
            "module {} declared in {} is both {} and {}",
            child.name,
            parent.display(),
            flat.display(),
            nested.display()
        ),
        (false, false) => bail!(
            "module {} declared in {} is neither {} nor {}",
            child.name,
            parent.display(),
            flat.display(),
            nested.display()
        ),
    }
}

fn scan_file(file: &Path, depth: usize) -> Result<Scan> {
    let text = fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    Ok(scan(&tokens(&text), depth))
}

/// A Rust token, as far as the scan needs one.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// An identifier or keyword (`r#name` as `name`).
    Ident(String),
    /// A string literal's text between its quotes, escapes as written.
    Str(String),
    /// One punctuation character (`::` is two).
    Punct(char),
    /// A number, character literal or lifetime.
    Other,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Splits `src` into tokens, dropping whitespace and comments (doc comments
/// included; block comments nest).
fn tokens(src: &str) -> Vec<Token> {
    let chars: Vec<char> = src.chars().collect();
    let at = |i: usize| chars.get(i).copied();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(c) = at(i) {
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == Some('/') {
            while at(i).is_some_and(|c| c != '\n') {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if at(i) == Some('/') && at(i + 1) == Some('*') {
                    depth += 1;
                    i += 2;
                } else if at(i) == Some('*') && at(i + 1) == Some('/') {
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
            let (text, end) = quoted(&chars, i + 1);
            out.push(Token::Str(text));
            i = end;
        } else if c == '\'' {
            i = char_or_lifetime(&chars, i);
            out.push(Token::Other);
        } else if is_ident_start(c) {
            let start = i;
            while at(i).is_some_and(is_ident_continue) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            match (word.as_str(), at(i)) {
                ("b" | "c", Some('"')) => {
                    let (text, end) = quoted(&chars, i + 1);
                    out.push(Token::Str(text));
                    i = end;
                }
                ("b", Some('\'')) => {
                    i = char_or_lifetime(&chars, i);
                    out.push(Token::Other);
                }
                ("r" | "br" | "cr", Some('"' | '#')) => {
                    let mut hashes = 0;
                    while at(i + hashes) == Some('#') {
                        hashes += 1;
                    }
                    if at(i + hashes) == Some('"') {
                        // A raw string: to a quote followed by as many #s.
                        let start = i + hashes + 1;
                        let mut end = start;
                        while end < chars.len()
                            && !(chars[end] == '"'
                                && (1..=hashes).all(|k| at(end + k) == Some('#')))
                        {
                            end += 1;
                        }
                        out.push(Token::Str(
                            chars[start..end.min(chars.len())].iter().collect(),
                        ));
                        i = end + 1 + hashes;
                    } else if word == "r" && hashes == 1 && at(i + 1).is_some_and(is_ident_start) {
                        // A raw identifier.
                        let start = i + 1;
                        i = start;
                        while at(i).is_some_and(is_ident_continue) {
                            i += 1;
                        }
                        out.push(Token::Ident(chars[start..i].iter().collect()));
                    } else {
                        out.push(Token::Ident(word));
                    }
                }
                _ => out.push(Token::Ident(word)),
            }
        } else if c.is_ascii_digit() {
            while at(i).is_some_and(|c| {
                is_ident_continue(c) || (c == '.' && at(i + 1).is_some_and(|d| d.is_ascii_digit()))
            }) {
                i += 1;
            }
            out.push(Token::Other);
        } else {
            out.push(Token::Punct(c));
            i += 1;
        }
    }
    out
}

/// The text of a string literal whose first character is at `start`, and
/// the index after its closing quote.
fn quoted(chars: &[char], start: usize) -> (String, usize) {
    let mut end = start;
    while end < chars.len() && chars[end] != '"' {
        end += if chars[end] == '\\' { 2 } else { 1 };
    }
    let end = end.min(chars.len());
    (chars[start..end].iter().collect(), end + 1)
}

/// The index after the character literal or lifetime quote at `quote`:
/// `'x'` and `'\n'` are literals, `'a` is a lifetime (whose name is then
/// read as an identifier).
fn char_or_lifetime(chars: &[char], quote: usize) -> usize {
    match (chars.get(quote + 1), chars.get(quote + 2)) {
        (Some('\\'), _) => {
            let mut i = quote + 3;
            while chars.get(i).is_some_and(|&c| c != '\'') {
                i += 1;
            }
            i + 1
        }
        (Some(_), Some('\'')) => quote + 3,
        _ => quote + 1,
    }
}

/// A file module declaration `mod NAME;`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Child {
    name: String,
    /// Its `#[path = "…"]`.
    path: Option<String>,
}

/// What one file says, outside comments and test code.
#[derive(Debug, Default)]
struct Scan {
    /// The first segment of every path from the crate root.
    refs: BTreeSet<String>,
    /// Each name a `use` binds at the file's top level, with its path (only
    /// the crate root's are used).
    uses: Vec<(String, Vec<String>)>,
    /// The file modules it declares (outside inline modules).
    children: Vec<Child>,
}

/// Scans the tokens of a file `depth` modules below the crate root (0 for
/// the root itself).
fn scan(tokens: &[Token], depth: usize) -> Scan {
    use Token::{Ident, Punct};
    let ident = |i: usize, word: &str| matches!(tokens.get(i), Some(Ident(w)) if w == word);
    let mut out = Scan::default();
    let mut braces = 0;
    // The brace depth inside each enclosing inline `mod x {`.
    let mut inline: Vec<usize> = Vec::new();
    let mut path_attr = None;
    let mut i = 0;
    while let Some(token) = tokens.get(i) {
        match token {
            Punct('#') => {
                let inner = tokens.get(i + 1) == Some(&Punct('!'));
                let open = i + 1 + usize::from(inner);
                if tokens.get(open) != Some(&Punct('[')) {
                    i += 1;
                    continue;
                }
                let close = matching(tokens, open);
                let attr = &tokens[open + 1..close.min(tokens.len())];
                if is_cfg_test(attr) {
                    if inner && inline.is_empty() {
                        // `#![cfg(test)]`: the whole file is test code.
                        return Scan::default();
                    }
                    i = skip_item(tokens, close + 1);
                    path_attr = None;
                    continue;
                }
                if let [Ident(name), Punct('='), Token::Str(path)] = attr
                    && name == "path"
                {
                    path_attr = Some(path.clone());
                }
                i = close + 1;
            }
            Ident(word) if word == "mod" => match (tokens.get(i + 1), tokens.get(i + 2)) {
                (Some(Ident(name)), Some(Punct(';'))) => {
                    if inline.is_empty() {
                        out.children.push(Child {
                            name: name.clone(),
                            path: path_attr.take(),
                        });
                    }
                    path_attr = None;
                    i += 3;
                }
                (Some(Ident(_)), Some(Punct('{'))) => {
                    braces += 1;
                    inline.push(braces);
                    path_attr = None;
                    i += 3;
                }
                _ => i += 1,
            },
            Ident(word) if word == "use" && depth == 0 && inline.is_empty() && braces == 0 => {
                let start = if is_path_sep(tokens, i + 1) {
                    i + 3
                } else {
                    i + 1
                };
                let mut leaves = Vec::new();
                i = use_tree(tokens, start, &[], &mut leaves);
                for leaf in leaves {
                    if let Some(name) = leaf.name {
                        out.uses.push((name, leaf.path));
                    }
                }
            }
            Ident(word) if word == "crate" && is_path_sep(tokens, i + 1) => {
                i = references(tokens, i + 3, &mut out.refs);
            }
            Ident(word) if word == "super" => {
                let mut supers = 0;
                let mut next = i;
                while ident(next, "super") && is_path_sep(tokens, next + 1) {
                    supers += 1;
                    next += 3;
                }
                if supers > 0 && supers == depth + inline.len() {
                    i = references(tokens, next, &mut out.refs);
                } else {
                    i = next.max(i + 1);
                }
            }
            Punct('{') => {
                braces += 1;
                path_attr = None;
                i += 1;
            }
            Punct('}') => {
                if inline.last() == Some(&braces) {
                    inline.pop();
                }
                braces = braces.saturating_sub(1);
                path_attr = None;
                i += 1;
            }
            Punct(';') => {
                path_attr = None;
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// Adds the first segment of each path of the use tree at `start` (after a
/// crate-root `crate::` or `super::…::`) to `refs`; returns the index after
/// the tree.
fn references(tokens: &[Token], start: usize, refs: &mut BTreeSet<String>) -> usize {
    let mut leaves = Vec::new();
    let next = use_tree(tokens, start, &[], &mut leaves);
    for leaf in leaves {
        if let Some(first) = leaf.path.into_iter().next()
            && first != "self"
        {
            refs.insert(first);
        }
    }
    next.max(start)
}

/// One path of a use tree.
#[derive(Debug)]
struct Leaf {
    path: Vec<String>,
    /// The name it binds: its last segment or `as` alias (none for a glob
    /// or `as _`).
    name: Option<String>,
}

/// Reads the use tree (or path) at `i`, after `prefix`, into `out`: `a::b`,
/// `a::{b, c::{d, self}}`, `a::*`, `a as b`. An expression path such as
/// `a::f(…)` or `a::T::<U>` ends where it stops being a path. Returns the
/// index after it.
fn use_tree(tokens: &[Token], mut i: usize, prefix: &[String], out: &mut Vec<Leaf>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match tokens.get(i) {
            Some(Token::Ident(segment)) => {
                path.push(segment.clone());
                i += 1;
                if is_path_sep(tokens, i) {
                    i += 2;
                    continue;
                }
                let mut name = Some(segment.clone());
                if segment == "self" {
                    path.pop();
                    name = path.last().cloned();
                }
                if matches!(tokens.get(i), Some(Token::Ident(w)) if w == "as") {
                    name = match tokens.get(i + 1) {
                        Some(Token::Ident(alias)) if alias != "_" => Some(alias.clone()),
                        _ => None,
                    };
                    i += 2;
                }
                out.push(Leaf { path, name });
                return i;
            }
            Some(Token::Punct('{')) => {
                i += 1;
                loop {
                    match tokens.get(i) {
                        None => return i,
                        Some(Token::Punct('}')) => return i + 1,
                        Some(Token::Punct(',')) => i += 1,
                        Some(_) => {
                            let next = use_tree(tokens, i, &path, out);
                            i = next.max(i + 1);
                        }
                    }
                }
            }
            Some(Token::Punct('*')) => {
                out.push(Leaf { path, name: None });
                return i + 1;
            }
            _ => {
                if path.len() > prefix.len() {
                    out.push(Leaf { path, name: None });
                }
                return i;
            }
        }
    }
}

fn is_path_sep(tokens: &[Token], i: usize) -> bool {
    tokens.get(i) == Some(&Token::Punct(':')) && tokens.get(i + 1) == Some(&Token::Punct(':'))
}

/// The index of the bracket closing the one at `open` (or the end).
fn matching(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, token) in tokens.iter().enumerate().skip(open) {
        match token {
            Token::Punct('(' | '[' | '{') => depth += 1,
            Token::Punct(')' | ']' | '}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// `cfg(test)` or `cfg(all(…, test, …))`: the attribute of test-only code.
fn is_cfg_test(attr: &[Token]) -> bool {
    use Token::{Ident, Punct};
    let word = |t: &Token, w: &str| matches!(t, Ident(x) if x == w);
    match attr {
        [cfg, Punct('('), test, Punct(')')] => word(cfg, "cfg") && word(test, "test"),
        [
            cfg,
            Punct('('),
            all,
            Punct('('),
            args @ ..,
            Punct(')'),
            Punct(')'),
        ] => {
            word(cfg, "cfg")
                && word(all, "all")
                && args
                    .split(|t| *t == Punct(','))
                    .any(|arg| matches!(arg, [t] if word(t, "test")))
        }
        _ => false,
    }
}

/// The index after the item (or statement, field, arm) starting at `i`,
/// after its further attributes: to its `;` or `,`, or the end of its first
/// `{ … }` block, and never past the end of the block it is in.
fn skip_item(tokens: &[Token], mut i: usize) -> usize {
    use Token::Punct;
    while tokens.get(i) == Some(&Punct('#')) && tokens.get(i + 1) == Some(&Punct('[')) {
        i = matching(tokens, i + 1) + 1;
    }
    let (mut nesting, mut angles) = (0usize, 0usize);
    while let Some(token) = tokens.get(i) {
        let after_arrow = i > 0 && matches!(tokens[i - 1], Punct('-' | '='));
        match token {
            Punct('(' | '[') => nesting += 1,
            Punct(')' | ']' | '}') if nesting == 0 => return i,
            Punct(')' | ']') => nesting -= 1,
            Punct('<') => angles += 1,
            Punct('>') if !after_arrow => angles = angles.saturating_sub(1),
            Punct('{') => {
                let close = matching(tokens, i);
                if nesting == 0 {
                    return close + 1;
                }
                i = close;
            }
            Punct(';') if nesting == 0 => return i + 1,
            Punct(',') if nesting == 0 && angles == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Tarjan's strongly connected components of `graph` (edges to names not in
/// it ignored), each sorted, every one after those it has edges to: leaves
/// first, a valid build order.
pub fn components(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        names: Vec<&'a String>,
        edges: Vec<Vec<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for w in self.edges[v].clone() {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(index) if self.on_stack[w] => self.low[v] = self.low[v].min(index),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = self.stack.pop().expect("v is on the stack");
                    self.on_stack[w] = false;
                    component.push(self.names[w].clone());
                    if w == v {
                        break;
                    }
                }
                component.sort();
                self.out.push(component);
            }
        }
    }

    let names: Vec<&String> = graph.keys().collect();
    let position = |name: &String| names.binary_search(&name).ok();
    let edges = graph
        .values()
        .map(|deps| deps.iter().filter_map(position).collect())
        .collect();
    let n = names.len();
    let mut tarjan = Tarjan {
        names,
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if tarjan.index[v].is_none() {
            tarjan.visit(v);
        }
    }
    tarjan.out
}

/// One line per module, `module -> dep, dep` (`module ->` for a leaf), in
/// the order of `components`.
fn render(graph: &BTreeMap<String, BTreeSet<String>>, order: &[Vec<String>]) -> String {
    let mut out = String::new();
    for module in order.iter().flatten() {
        let deps: Vec<&str> = graph[module].iter().map(String::as_str).collect();
        out.push_str(module);
        out.push_str(" ->");
        if !deps.is_empty() {
            out.push(' ');
            out.push_str(&deps.join(", "));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(src: &str, depth: usize) -> Vec<String> {
        scan(&tokens(src), depth).refs.into_iter().collect()
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// A crate in a fresh temp folder: `(path, contents)` pairs under src/.
    fn write_crate(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("xtask-module-graph-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for (path, text) in files {
            let file = dir.join("src").join(path);
            fs::create_dir_all(file.parent().unwrap()).unwrap();
            fs::write(file, text).unwrap();
        }
        dir
    }

    #[test]
    fn use_groups_count_each_branch() {
        assert_eq!(
            refs("use crate::{a::X, b};\nuse crate::c::{self, d::{E, F}};", 1),
            ["a", "b", "c"]
        );
        assert_eq!(
            refs(
                "use crate::{\n    alg::{AeadAlg, Algorithm},\n    cost as c,\n};",
                1
            ),
            ["alg", "cost"]
        );
    }

    #[test]
    fn expression_paths_count() {
        let src = "fn f() -> crate::a::T<u8> { crate::b::g::<u8>(crate::c::K); $crate::d::h!() }";
        assert_eq!(refs(src, 1), ["a", "b", "c", "d"]);
        // Not a path: `pub(crate)`.
        assert_eq!(refs("pub(crate) fn f() {}", 1), Vec::<String>::new());
    }

    #[test]
    fn comments_and_literals_do_not_count() {
        let src = r###"
            //! The module doc: see [`crate::a::X`].
            /// Uses [crate::b].
            // use crate::c;
            /* crate::d /* nested crate::e */ crate::f */
            #[doc = "crate::g"]
            fn f() -> &'static str {
                let _ = ('"', b'\'', '\\', 'x');
                let _ = r#"crate::h " still"#;
                "crate::i"
            }
            use crate::real;
        "###;
        assert_eq!(refs(src, 1), ["real"]);
    }

    #[test]
    fn test_code_does_not_count() {
        let src = "
            use crate::before;
            #[cfg(test)]
            mod tests {
                use crate::tested;
                fn nested() { { crate::deeper::f(); } }
            }
            #[cfg(test)]
            fn helper() -> crate::helper::T { todo!() }
            #[cfg(all(test, feature = \"x\"))]
            use crate::also_test;
            #[cfg(not(test))]
            use crate::not_test;
            struct S {
                #[cfg(test)]
                probe: crate::probe::P,
                kept: crate::field::F,
            }
            use crate::after;
        ";
        assert_eq!(refs(src, 1), ["after", "before", "field", "not_test"]);
        let whole = "#![cfg(test)]\nuse crate::a;";
        assert_eq!(refs(whole, 1), Vec::<String>::new());
    }

    #[test]
    fn super_counts_where_it_reaches_the_root() {
        let src = "use super::a::X;\nmod inline { use super::super::b; use super::c; }";
        // In src/m.rs: `super::` is the root; in the inline module,
        // `super::super::` is.
        assert_eq!(refs(src, 1), ["a", "b"]);
        // In src/m/n.rs, `super::` is `m` itself.
        assert_eq!(
            refs("use super::{a, b};\nuse super::super::c::D;", 2),
            ["c"]
        );
    }

    #[test]
    fn declarations_and_path_attributes() {
        let src = "
            mod a;
            pub(crate) mod b;
            #[cfg(test)]
            mod tests;
            #[cfg(test)]
            #[path = \"x_tests.rs\"]
            mod more_tests;
            #[path = \"elsewhere.rs\"]
            mod c;
            mod inline { mod ignored; }
        ";
        let children = scan(&tokens(src), 1).children;
        let names: Vec<(&str, Option<&str>)> = children
            .iter()
            .map(|c| (c.name.as_str(), c.path.as_deref()))
            .collect();
        assert_eq!(
            names,
            [("a", None), ("b", None), ("c", Some("elsewhere.rs"))]
        );
    }

    #[test]
    fn tarjan_finds_cycles_leaves_first() {
        let graph: BTreeMap<String, BTreeSet<String>> = [
            ("a", set(&["b"])),
            ("b", set(&["c"])),
            ("c", set(&["a", "d"])),
            ("d", set(&[])),
            ("e", set(&["a", "f"])),
            ("f", set(&["e"])),
            ("g", set(&["d", "missing"])),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let order = components(&graph);
        let position = |m: &str| order.iter().position(|c| c.iter().any(|x| x == m)).unwrap();
        assert!(order.contains(&vec!["a".into(), "b".into(), "c".into()]));
        assert!(order.contains(&vec!["e".into(), "f".into()]));
        assert_eq!(order.iter().filter(|c| c.len() > 1).count(), 2);
        assert!(position("d") < position("a"));
        assert!(position("a") < position("e"));
        assert!(position("d") < position("g"));
        assert_eq!(order.iter().map(Vec::len).sum::<usize>(), 7);
    }

    #[test]
    fn a_crate_with_a_three_cycle() {
        let dir = write_crate(
            "cycle",
            &[
                (
                    "lib.rs",
                    "//! [crate::leaf]\nmod a;\nmod b;\nmod c;\nmod d;\nmod leaf;\n\
                     #[cfg(test)]\nmod only_tests;\npub use d::Thing;\npub use a::{X as Renamed};\n",
                ),
                // a -> b through a `use crate::{..}` group, and the leaf.
                ("a.rs", "use crate::{b::Y, leaf};\npub struct X;\n"),
                // b's submodule file refers to c; a doc comment mentions d.
                (
                    "b/mod.rs",
                    "/// Not [crate::d::Thing].\nmod inner;\npub struct Y;\n",
                ),
                (
                    "b/inner.rs",
                    "pub fn f() { crate::c::g(); super::super::leaf::h(); }\n",
                ),
                // c -> a through the root's re-export, and c -> c is no dependency.
                (
                    "c.rs",
                    "pub fn g() { let _ = crate::Renamed; crate::c::g(); }\n",
                ),
                // d -> a, d -> b; only its tests use c.
                (
                    "d.rs",
                    "pub struct Thing(crate::a::X, crate::b::Y);\n\
                     #[cfg(test)]\nmod tests {\n    use crate::c;\n}\n",
                ),
                ("leaf.rs", "pub fn h() {}\n"),
                ("only_tests.rs", "use crate::d;\n"),
                // Not declared by the root: not a module.
                ("stray.rs", "use crate::a;\n"),
            ],
        );
        let graph = read_crate(&dir.join("src"));
        let check = run(&ModuleGraphArgs {
            check: true,
            path: dir.clone(),
        });
        let listing = run(&ModuleGraphArgs {
            check: false,
            path: dir.join("src"),
        });
        fs::remove_dir_all(&dir).unwrap();
        let graph = graph.unwrap();
        let expected: BTreeMap<String, BTreeSet<String>> = [
            ("a", set(&["b", "leaf"])),
            ("b", set(&["c", "leaf"])),
            ("c", set(&["a"])),
            ("d", set(&["a", "b"])),
            ("leaf", set(&[])),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(graph, expected);
        let order = components(&graph);
        assert_eq!(
            render(&graph, &order),
            "leaf ->\na -> b, leaf\nb -> c, leaf\nc -> a\nd -> a, b\n"
        );
        assert_eq!(check.unwrap(), Verdict::Fail);
        assert_eq!(listing.unwrap(), Verdict::Pass);
    }

    #[test]
    fn an_acyclic_crate_passes_the_check() {
        let dir = write_crate(
            "acyclic",
            &[
                ("main.rs", "mod a;\nmod b;\nfn main() { a::f(); }\n"),
                ("a.rs", "pub fn f() { crate::b::g() }\n"),
                (
                    "b.rs",
                    "pub fn g() {}\n#[cfg(test)]\nmod tests { use crate::a; }\n",
                ),
            ],
        );
        let verdict = run(&ModuleGraphArgs {
            check: true,
            path: dir.join("src"),
        });
        let graph = read_crate(&dir.join("src"));
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(verdict.unwrap(), Verdict::Pass);
        let graph = graph.unwrap();
        assert_eq!(render(&graph, &components(&graph)), "b ->\na -> b\n");
    }

    #[test]
    fn a_missing_module_file_is_an_error() {
        let dir = write_crate("missing", &[("lib.rs", "mod gone;\n")]);
        let error = read_crate(&dir.join("src")).unwrap_err();
        fs::remove_dir_all(&dir).unwrap();
        assert!(format!("{error:#}").contains("gone.rs"), "{error:#}");
    }
}
