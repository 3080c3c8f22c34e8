#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The crate's shape, checked from its source: the modules at every level form a DAG, and the
//! agent runtime stays free of HTTP, ingress, delivery and platform code.
//!
//! The module tree is read as the compiler sees it: from `src/lib.rs`, following `mod`
//! declarations (test modules left out), with `syn`. Every path a module names (`use`, types,
//! calls) is resolved to the module that defines it, through `use` re-exports, so that
//! `crate::agent::Tool` counts as a use of `agent::tools` when that is where `Tool` lives.
//! Paths inside macro invocations are not seen.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

type ModPath = Vec<String>;

/// One module: where it is written, what it imports by name, and the paths it names.
#[derive(Default)]
struct Module {
    file: PathBuf,
    /// `use` aliases: the name in this module → the absolute path it stands for.
    imports: BTreeMap<String, ModPath>,
    /// Every absolute path named in this module (its `use` items included).
    named: Vec<ModPath>,
    /// Paths into other crates, as written.
    external: Vec<ModPath>,
}

struct Crate {
    modules: BTreeMap<ModPath, Module>,
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Meta>()
                .is_ok_and(|meta| meta.path().is_ident("test"))
    })
}

/// `path` (as written in module `here`) as an absolute path, when it is one of the crate's.
fn absolute(here: &[String], path: &[String]) -> Option<ModPath> {
    let mut out: ModPath;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            out = Vec::new();
            rest = &path[1..];
        }
        Some("self") => {
            out = here.to_vec();
            rest = &path[1..];
        }
        Some("super") => {
            out = here.to_vec();
            while rest.first().map(String::as_str) == Some("super") {
                out.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    out.extend(rest.iter().cloned());
    Some(out)
}

/// Collects the use trees of one module as (alias, path as written) pairs.
fn use_paths(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Option<String>, ModPath)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            let mut full = prefix.clone();
            if name != "self" {
                full.push(name.clone());
            }
            let alias = if name == "self" {
                prefix.last().cloned()
            } else {
                Some(name)
            };
            out.push((alias, full));
        }
        syn::UseTree::Rename(r) => {
            let mut full = prefix.clone();
            full.push(r.ident.to_string());
            out.push((Some(r.rename.to_string()), full));
        }
        syn::UseTree::Glob(_) => out.push((None, prefix.clone())),
        syn::UseTree::Group(g) => {
            for item in &g.items {
                use_paths(item, prefix, out);
            }
        }
    }
}

/// Gathers the paths of one module's items (nested inline modules are modules of their own).
struct PathCollector<'a> {
    here: &'a [String],
    uses: Vec<(Option<String>, ModPath)>,
    paths: Vec<ModPath>,
}

impl<'ast> Visit<'ast> for PathCollector<'_> {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        use_paths(&item.tree, &mut Vec::new(), &mut self.uses);
    }
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}
    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.paths
            .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
    /// serde's `with`, `deserialize_with`, `serialize_with` and `default` name functions by a
    /// path in a string.
    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        if !attr.path().is_ident("serde") {
            return;
        }
        let _ = attr.parse_nested_meta(|meta| {
            let named = ["with", "deserialize_with", "serialize_with", "default"]
                .iter()
                .any(|key| meta.path.is_ident(key));
            if named && meta.input.peek(syn::Token![=]) {
                let text: syn::LitStr = meta.value()?.parse()?;
                if let Ok(path) = text.parse::<syn::Path>() {
                    self.visit_path(&path);
                }
            } else if meta.input.peek(syn::Token![=]) {
                let _: syn::Expr = meta.value()?.parse()?;
            } else if meta.input.peek(syn::token::Paren) {
                let _ = meta.parse_nested_meta(|_| Ok(()));
            }
            Ok(())
        });
    }
    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_fn(self, item);
        }
    }
    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_impl(self, item);
        }
    }
}

impl Crate {
    fn read(src: &Path) -> Self {
        let mut krate = Crate {
            modules: BTreeMap::new(),
        };
        krate.read_file(&src.join("lib.rs"), src, Vec::new());
        krate
    }

    /// Reads the module at `file` (path `here`), whose child modules' files are in `dir`.
    fn read_file(&mut self, file: &Path, dir: &Path, here: ModPath) {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        self.read_items(&parsed.items, file, dir, here);
    }

    fn read_items(&mut self, items: &[syn::Item], file: &Path, dir: &Path, here: ModPath) {
        let mut collector = PathCollector {
            here: &here,
            uses: Vec::new(),
            paths: Vec::new(),
        };
        for item in items {
            if let syn::Item::Mod(module) = item {
                if is_test_only(&module.attrs) {
                    continue;
                }
                let mut child = here.clone();
                child.push(module.ident.to_string());
                let child_dir = dir.join(module.ident.to_string());
                match &module.content {
                    Some((_, items)) => self.read_items(items, file, &child_dir, child),
                    None => {
                        let flat = dir.join(format!("{}.rs", module.ident));
                        let (path, below) = if flat.exists() {
                            (flat, child_dir)
                        } else {
                            (child_dir.join("mod.rs"), child_dir)
                        };
                        self.read_file(&path, &below, child);
                    }
                }
                continue;
            }
            let test_only = match item {
                syn::Item::Fn(f) => is_test_only(&f.attrs),
                syn::Item::Impl(i) => is_test_only(&i.attrs),
                syn::Item::Use(u) => is_test_only(&u.attrs),
                syn::Item::Const(c) => is_test_only(&c.attrs),
                syn::Item::Struct(s) => is_test_only(&s.attrs),
                _ => false,
            };
            if !test_only {
                collector.visit_item(item);
            }
        }
        let here_for_paths = collector.here.to_vec();
        let mut module = Module {
            file: file.to_path_buf(),
            ..Module::default()
        };
        for (alias, written) in collector.uses {
            let Some(abs) = absolute(&here_for_paths, &written) else {
                module.external.push(written);
                continue;
            };
            if let Some(alias) = alias {
                module.imports.insert(alias, abs.clone());
            }
            module.named.push(abs);
        }
        for written in collector.paths {
            let resolved = absolute(&here_for_paths, &written).or_else(|| {
                // A path that starts with a name this module imported.
                let first = written.first()?;
                let target = module.imports.get(first)?;
                let mut abs = target.clone();
                abs.extend(written[1..].iter().cloned());
                Some(abs)
            });
            match resolved {
                Some(abs) => module.named.push(abs),
                None => module.external.push(written),
            }
        }
        self.modules.insert(here_for_paths, module);
    }

    /// The module that defines what `path` names, following `use` re-exports.
    fn defining_module(&self, path: &[String]) -> ModPath {
        let mut path = path.to_vec();
        for _ in 0..16 {
            let module_len = (0..=path.len())
                .rev()
                .find(|&n| self.modules.contains_key(&path[..n]))
                .unwrap_or(0);
            let module = &self.modules[&path[..module_len]];
            match path
                .get(module_len)
                .and_then(|name| module.imports.get(name))
            {
                Some(target) if target.as_slice() != path.as_slice() => {
                    let mut next = target.clone();
                    next.extend(path[module_len + 1..].iter().cloned());
                    path = next;
                }
                _ => return path[..module_len].to_vec(),
            }
        }
        path
    }

    /// Every module's dependencies on another module: (from, to) → an example path.
    fn edges(&self) -> BTreeMap<(ModPath, ModPath), String> {
        let mut edges = BTreeMap::new();
        for (from, module) in &self.modules {
            for named in &module.named {
                let to = self.defining_module(named);
                if &to != from {
                    edges.entry((from.clone(), to)).or_insert_with(|| {
                        format!("{} names {}", module.file.display(), named.join("::"))
                    });
                }
            }
        }
        edges
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The cycles among the children of each module: for a dependency from `a::x::..` to `a::y::..`,
/// `x` depends on `y` among `a`'s children. A child's use of its parent (or the reverse) is
/// the ordinary shape of a module and not counted.
fn sibling_cycles(krate: &Crate) -> Vec<String> {
    let mut graphs: BTreeMap<ModPath, BTreeMap<(String, String), String>> = BTreeMap::new();
    for ((from, to), example) in krate.edges() {
        let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        if common < from.len() && common < to.len() {
            graphs
                .entry(from[..common].to_vec())
                .or_default()
                .entry((from[common].clone(), to[common].clone()))
                .or_insert(example);
        }
    }
    let mut cycles = Vec::new();
    for (parent, arcs) in graphs {
        let nodes: BTreeSet<&String> = arcs.keys().flat_map(|(a, b)| [a, b]).collect();
        let next = |node: &String| -> Vec<&String> {
            arcs.keys()
                .filter(|(a, _)| a == node)
                .map(|(_, b)| b)
                .collect()
        };
        // Depth-first search for a back edge, reporting the cycle it closes.
        let mut state: BTreeMap<&String, u8> = BTreeMap::new();
        fn visit<'a>(
            node: &'a String,
            next: &dyn Fn(&String) -> Vec<&'a String>,
            state: &mut BTreeMap<&'a String, u8>,
            stack: &mut Vec<&'a String>,
            found: &mut Vec<Vec<String>>,
        ) {
            state.insert(node, 1);
            stack.push(node);
            for child in next(node) {
                match state.get(child) {
                    Some(1) => {
                        let start = stack.iter().position(|n| *n == child).unwrap_or(0);
                        let mut cycle: Vec<String> =
                            stack[start..].iter().map(|s| s.to_string()).collect();
                        cycle.push(child.to_string());
                        found.push(cycle);
                    }
                    Some(_) => {}
                    None => visit(child, next, state, stack, found),
                }
            }
            stack.pop();
            state.insert(node, 2);
        }
        let mut found = Vec::new();
        for node in &nodes {
            if !state.contains_key(node) {
                visit(node, &next, &mut state, &mut Vec::new(), &mut found);
            }
        }
        for cycle in found {
            let scope = if parent.is_empty() {
                "crate".to_owned()
            } else {
                parent.join("::")
            };
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    format!(
                        "    {} -> {}: {}",
                        w[0],
                        w[1],
                        arcs[&(w[0].clone(), w[1].clone())]
                    )
                })
                .collect();
            cycles.push(format!(
                "in {scope}: {}\n{}",
                cycle.join(" -> "),
                steps.join("\n")
            ));
        }
    }
    cycles
}

#[test]
fn the_modules_at_every_level_form_a_dag() {
    let krate = Crate::read(&src());
    assert!(
        krate.modules.len() > 50,
        "the module tree was read: {} modules",
        krate.modules.len()
    );
    let cycles = sibling_cycles(&krate);
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

/// The crate's modules the agent runtime may use besides its own: leaves that use nothing
/// above them. Everything else (the server, ingress, delivery, the store, config, the memory
/// worker) is above the agent and reaches it, never the reverse.
const FOR_THE_AGENT: &[&str] = &[
    "agent", "beneath", "live", "retry", "sandbox", "secret", "units",
];
/// Crates the agent's production code must never name (its tests may serve a mock over axum).
/// The channel toolkit is among them: what a run hands out (`RunOutputs`, presented files) is
/// plain data, turned into outbound messages by the ingress.
const CRATES_NOT_FOR_THE_AGENT: &[&str] = &[
    "axum",
    "hyper",
    "antler_channel",
    "antler_discord",
    "antler_feishu",
    "antler_slack",
    "antler_telegram",
    "teloxide",
    "slack_morphism",
    "serenity",
];

/// What the agent's modules name outside what [`FOR_THE_AGENT`] allows.
fn agent_offences(krate: &Crate) -> Vec<String> {
    let in_agent = |path: &ModPath| path.first().map(String::as_str) == Some("agent");
    let mut offences = Vec::new();
    for ((from, to), example) in krate.edges() {
        // `to` empty: an item of the crate root (`now_ms`).
        if in_agent(&from)
            && to
                .first()
                .is_some_and(|m| !FOR_THE_AGENT.contains(&m.as_str()))
        {
            offences.push(example);
        }
    }
    for (path, module) in krate.modules.iter().filter(|(path, _)| in_agent(path)) {
        for written in &module.external {
            if written
                .first()
                .is_some_and(|first| CRATES_NOT_FOR_THE_AGENT.contains(&first.as_str()))
            {
                offences.push(format!(
                    "{} ({}) names {}",
                    module.file.display(),
                    path.join("::"),
                    written.join("::")
                ));
            }
        }
    }
    offences.sort();
    offences.dedup();
    offences
}

#[test]
fn the_agent_uses_no_http_server_ingress_delivery_or_platform_code() {
    let offences = agent_offences(&Crate::read(&src()));
    assert!(
        offences.is_empty(),
        "the agent reaches outside itself:\n{}",
        offences.join("\n")
    );
}

#[test]
fn a_planted_reach_out_of_the_agent_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod agent;\nmod http;\nmod units;\n").unwrap();
    std::fs::create_dir(src.join("agent")).unwrap();
    std::fs::write(
        src.join("agent/mod.rs"),
        "mod run;\nuse crate::units::size;\n#[cfg(test)]\nmod tests { use crate::http::Router; }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("agent/run.rs"),
        "use crate::{units, http::{self}};\nfn f() -> axum::Json<()> { super::super::http::g() }\n",
    )
    .unwrap();
    std::fs::write(src.join("http.rs"), "pub fn g() {}\npub struct Router;\n").unwrap();
    std::fs::write(src.join("units.rs"), "pub fn size() {}\n").unwrap();
    let offences = agent_offences(&Crate::read(src));
    assert_eq!(offences.len(), 2, "{offences:#?}");
    assert!(
        offences.iter().any(|o| o.contains("names http")),
        "{offences:?}"
    );
    assert!(
        offences.iter().any(|o| o.contains("names axum::Json")),
        "{offences:?}"
    );
}

#[test]
fn a_planted_cycle_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(
        src.join("lib.rs"),
        "mod a;\nmod b;\nmod c;\n#[cfg(test)]\nmod t;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("a.rs"),
        "pub use crate::b::Thing;\npub(crate) fn f() {}\n",
    )
    .unwrap();
    std::fs::create_dir(src.join("b")).unwrap();
    std::fs::write(src.join("b/mod.rs"), "mod inner;\npub use inner::Thing;\n").unwrap();
    std::fs::write(
        src.join("b/inner.rs"),
        "pub struct Thing;\nfn g() { crate::c::h() }\n",
    )
    .unwrap();
    std::fs::write(src.join("c.rs"), "use crate::a;\npub fn h() { a::f() }\n").unwrap();
    std::fs::write(src.join("t.rs"), "use crate::a::f;\n").unwrap();
    let krate = Crate::read(src);
    let cycles = sibling_cycles(&krate);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(
        cycles[0].starts_with("in crate: a -> b -> c -> a"),
        "{}",
        cycles[0]
    );
    assert!(
        !krate.modules.contains_key(&vec!["t".to_owned()]),
        "test modules are left out"
    );
}

/// Prints the dependencies among the crate's top-level modules (`cargo test --test structure
/// -- --ignored --nocapture`), for the picture in docs/architecture.md.
#[test]
#[ignore = "prints the module graph; asserts nothing"]
fn print_the_top_level_graph() {
    let krate = Crate::read(&src());
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in krate.edges().into_keys() {
        if let (Some(a), Some(b)) = (from.first(), to.first()) {
            if a != b {
                uses.entry(a.clone()).or_default().insert(b.clone());
            }
        }
    }
    for (module, used) in uses {
        println!(
            "{module} -> {}",
            used.into_iter().collect::<Vec<_>>().join(" ")
        );
    }
}
