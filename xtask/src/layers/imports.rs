//! Reads a crate's sources and lists every import between its modules:
//! `use` items (private ones too: a child module sees them), and `crate::`,
//! `super::` and `self::` paths written in code. Each import is resolved
//! through `use` aliases and `pub use` re-exports to the module where the
//! name is defined, so a re-export cannot hide an arrow.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use syn::visit::Visit;

/// A module's path below the crate root: `["probes", "gpu"]`; the root is empty.
pub type ModulePath = Vec<String>;

/// One import, once resolved: who names what, and where that lives.
#[derive(Debug, Clone)]
pub struct Import {
    pub file: PathBuf,
    pub line: usize,
    pub from: ModulePath,
    /// The module the imported name is defined in.
    pub to: ModulePath,
    /// The name as written (`crate::gate::CONDITION_TYPE`).
    pub written: String,
}

/// A path as written, with the module it was written in.
#[derive(Debug, Clone)]
struct RawPath {
    file: PathBuf,
    line: usize,
    module: ModulePath,
    segments: Vec<String>,
}

#[derive(Default)]
struct Crate {
    modules: BTreeSet<ModulePath>,
    /// `use` aliases per module: name → path as written there.
    aliases: BTreeMap<ModulePath, BTreeMap<String, RawPath>>,
    paths: Vec<RawPath>,
}

/// Every import between modules of the crate whose root file is `lib_rs`.
pub fn read_crate(lib_rs: &Path) -> Result<Vec<Import>> {
    let src_dir = lib_rs.parent().context("the crate root has a folder")?;
    let mut krate = Crate::default();
    for file in rust_files(src_dir)? {
        let module = module_of(src_dir, &file);
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let parsed = syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
        krate.modules.insert(module.clone());
        let mut reader = FileReader { krate: &mut krate, file: file.clone(), module };
        reader.visit_file(&parsed);
    }
    Ok(krate.resolve_all())
}

fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            found.extend(rust_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

/// `lib.rs` → root, `a.rs` and `a/mod.rs` → `a`, `a/b.rs` → `a::b`.
fn module_of(src_dir: &Path, file: &Path) -> ModulePath {
    let relative = file.strip_prefix(src_dir).unwrap_or(file).with_extension("");
    let mut parts: ModulePath = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

struct FileReader<'a> {
    krate: &'a mut Crate,
    file: PathBuf,
    module: ModulePath,
}

impl FileReader<'_> {
    fn record(&mut self, segments: Vec<String>, line: usize, alias: Option<String>) {
        let raw = RawPath { file: self.file.clone(), line, module: self.module.clone(), segments };
        if let Some(alias) = alias {
            self.krate.aliases.entry(self.module.clone()).or_default().insert(alias, raw.clone());
        }
        self.krate.paths.push(raw);
    }

    fn use_tree(&mut self, prefix: &[String], tree: &syn::UseTree) {
        let grow = |name: String| prefix.iter().cloned().chain([name]).collect::<Vec<_>>();
        match tree {
            syn::UseTree::Path(p) => self.use_tree(&grow(p.ident.to_string()), &p.tree),
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                let line = n.ident.span().start().line;
                if name == "self" {
                    let alias = prefix.last().cloned();
                    self.record(prefix.to_vec(), line, alias);
                } else {
                    self.record(grow(name.clone()), line, Some(name));
                }
            }
            syn::UseTree::Rename(r) => {
                let line = r.ident.span().start().line;
                let target = if r.ident == "self" { prefix.to_vec() } else { grow(r.ident.to_string()) };
                self.record(target, line, Some(r.rename.to_string()));
            }
            syn::UseTree::Glob(g) => {
                let line = g.star_token.spans[0].start().line;
                self.record(prefix.to_vec(), line, None);
            }
            syn::UseTree::Group(g) => {
                for item in &g.items {
                    self.use_tree(prefix, item);
                }
            }
        }
    }
}

impl FileReader<'_> {
    /// Records `crate::a::b`, `super::a` and `self::a` paths in a token stream.
    fn macro_tokens(&mut self, tokens: proc_macro2::TokenStream) {
        use proc_macro2::TokenTree;
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(group) => self.macro_tokens(group.stream()),
                TokenTree::Ident(ident)
                    if ["crate", "super", "self"].contains(&ident.to_string().as_str()) =>
                {
                    let line = ident.span().start().line;
                    let mut segments = vec![ident.to_string()];
                    // `::` is two `:` puncts; take ident after ident.
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (trees.get(i + 1), trees.get(i + 2), trees.get(i + 3))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segments.push(next.to_string());
                        i += 3;
                    }
                    if segments.len() > 1 {
                        self.record(segments, line, None);
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for FileReader<'_> {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&[], &item.tree);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        // An inline `mod name { ... }` is a module of its own (tests, mostly);
        // a `mod name;` is read from its file.
        if item.content.is_some() {
            self.module.push(item.ident.to_string());
            self.krate.modules.insert(self.module.clone());
            syn::visit::visit_item_mod(self, item);
            self.module.pop();
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // A macro's arguments are tokens, not syntax: `eprintln!("{}",
        // crate::x::y(e))` names a module all the same.
        self.macro_tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let anchored = matches!(segments.first().map(String::as_str), Some("crate" | "super" | "self"));
        if anchored && path.leading_colon.is_none() {
            let line = path.segments[0].ident.span().start().line;
            self.record(segments, line, None);
        }
        syn::visit::visit_path(self, path);
    }
}

impl Crate {
    /// The absolute module path a path written in `module` starts from, or
    /// `None` for another crate's name.
    fn anchor(&self, module: &ModulePath, segments: &[String]) -> Option<Vec<String>> {
        let mut base = module.clone();
        let mut rest = segments;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                base.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            Some(first) => {
                // Uniform paths: a child module's name, or a name `use`d here.
                let child: ModulePath = module.iter().cloned().chain([first.to_string()]).collect();
                if !self.modules.contains(&child)
                    && !self.aliases.get(module).is_some_and(|a| a.contains_key(first))
                {
                    return None;
                }
            }
            None => return None,
        }
        Some(base.into_iter().chain(rest.iter().cloned()).collect())
    }

    /// Follows aliases and re-exports to the module that defines the name.
    fn resolve(&self, mut absolute: Vec<String>) -> ModulePath {
        for _ in 0..32 {
            let known = (0..=absolute.len()).rev().find(|&n| self.modules.contains(&absolute[..n]));
            let Some(depth) = known else { return Vec::new() };
            let module = absolute[..depth].to_vec();
            let Some(next) = absolute.get(depth) else { return module };
            let alias = self.aliases.get(&module).and_then(|a| a.get(next));
            let Some(target) = alias.and_then(|raw| self.anchor(&raw.module, &raw.segments)) else {
                return module;
            };
            if target == absolute[..=depth] {
                return module;
            }
            absolute = target.into_iter().chain(absolute[depth + 1..].iter().cloned()).collect();
        }
        Vec::new()
    }

    fn resolve_all(&self) -> Vec<Import> {
        let mut imports = Vec::new();
        for raw in &self.paths {
            let Some(absolute) = self.anchor(&raw.module, &raw.segments) else { continue };
            let to = self.resolve(absolute);
            if to != raw.module {
                imports.push(Import {
                    file: raw.file.clone(),
                    line: raw.line,
                    from: raw.module.clone(),
                    to,
                    written: raw.segments.join("::"),
                });
            }
        }
        imports
    }
}
