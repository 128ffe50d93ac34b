//! The documentation's relative links resolve: every `[text](target)` in
//! a Markdown file git tracks (or would: untracked and not ignored) names a
//! file or folder that exists and, with `#anchor`, a heading of that page;
//! and every page of docs/ is linked from the front page, where a reader
//! starts. Web links are not followed: the suite runs offline.
use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::root;

/// Checks every tracked Markdown file of the repository.
pub fn check() -> Result<()> {
    let root = root();
    let listed = Command::new("git")
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.md"])
        .current_dir(&root)
        .output()?;
    if !listed.status.success() {
        bail!("git ls-files failed: {}", String::from_utf8_lossy(&listed.stderr).trim());
    }
    let pages: Vec<PathBuf> = listed
        .stdout
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| root.join(String::from_utf8_lossy(p).as_ref()))
        .filter(|p| p.exists())
        .collect();
    let mut problems = Vec::new();
    let mut links = 0;
    for page in &pages {
        let text = fs::read_to_string(page).with_context(|| page.display().to_string())?;
        for target in link_targets(&text) {
            links += 1;
            if let Err(why) = resolve(page, &target) {
                problems.push(format!("{}: ({target}) {why}", rel(&root, page)));
            }
        }
    }
    problems.extend(unlinked_pages(&root)?);
    if !problems.is_empty() {
        bail!("{} documentation link problems:\n  {}", problems.len(), problems.join("\n  "));
    }
    eprintln!("    {links} relative links in {} Markdown files resolve", pages.len());
    Ok(())
}

fn rel(root: &Path, path: &Path) -> String {
    path.strip_prefix(root).unwrap_or(path).display().to_string()
}

/// Pages of docs/ that README.md does not link to.
fn unlinked_pages(root: &Path) -> Result<Vec<String>> {
    let readme = fs::read_to_string(root.join("README.md")).context("README.md")?;
    let linked: BTreeSet<String> = link_targets(&readme)
        .into_iter()
        .map(|t| t.split('#').next().unwrap_or_default().to_string())
        .collect();
    let mut missing = Vec::new();
    for entry in fs::read_dir(root.join("docs")).context("docs/")? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && !linked.contains(&format!("docs/{name}")) {
            missing.push(format!("README.md does not link to docs/{name}"));
        }
    }
    Ok(missing)
}

/// Whether a link target from `page` resolves: a web or mail link is taken
/// as it is; a path must exist; an anchor must be a heading of its page.
fn resolve(page: &Path, target: &str) -> Result<(), String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return Ok(());
    }
    let (path, anchor) = target.split_once('#').map_or((target, None), |(p, a)| (p, Some(a)));
    let file =
        if path.is_empty() { page.to_path_buf() } else { page.parent().unwrap_or(Path::new(".")).join(path) };
    if !file.exists() {
        return Err("no such file".into());
    }
    let Some(anchor) = anchor else { return Ok(()) };
    if file.extension().is_none_or(|e| e != "md") {
        return Ok(());
    }
    let text = fs::read_to_string(&file).map_err(|e| e.to_string())?;
    if anchors(&text).contains(anchor) {
        Ok(())
    } else {
        Err(format!("no heading with the anchor #{anchor}"))
    }
}

/// The Markdown outside fenced code blocks and inline code spans, where a
/// bracket is text and not a link.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code: every other backtick-separated piece is code.
        for (i, piece) in line.split('`').enumerate() {
            if i % 2 == 0 {
                out.push_str(piece);
            }
        }
        out.push('\n');
    }
    out
}

/// Targets of inline links and images, `[text](target)` or
/// `[text](target "title")`.
fn link_targets(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut targets = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let inside = rest[..end].trim();
        let target = inside.split_whitespace().next().unwrap_or_default();
        if !target.is_empty() {
            targets.push(target.trim_matches(['<', '>']).to_string());
        }
        rest = &rest[end..];
    }
    targets
}

/// The anchors GitHub gives a page's headings: lower case, punctuation but
/// `-` and `_` dropped, spaces as `-`, and `-1`, `-2`, ... for repeats.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let heading = line.trim_start_matches('#');
        if fenced || heading.len() == line.len() || !heading.starts_with(' ') {
            continue;
        }
        let slug = slug(heading.trim());
        let mut unique = slug.clone();
        let mut n = 0;
        while seen.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        seen.insert(unique);
    }
    seen
}

fn slug(heading: &str) -> String {
    heading
        .chars()
        .flat_map(char::to_lowercase)
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_in_code_are_not_links() {
        let text = "See [the hold](docs/how-it-sees.md#the-hold) and `[a](b)`.\n\
                    ```\n[c](d)\n```\n![panel](dashboard-panels.png \"title\")\n";
        assert_eq!(link_targets(text), ["docs/how-it-sees.md#the-hold", "dashboard-panels.png"]);
    }

    #[test]
    fn anchors_are_githubs() {
        let text =
            "# The hold (`--hold`, opt-in)\n## Kernels\n## Kernels\n```\n# not a heading\n```\n#hashtag\n";
        let got = anchors(text);
        let want: BTreeSet<String> =
            ["the-hold---hold-opt-in", "kernels", "kernels-1"].into_iter().map(String::from).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_missing_file_or_heading_is_a_problem() {
        let dir = std::env::temp_dir().join(format!("doclinks-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("temp dir");
        let page = dir.join("page.md");
        fs::write(&page, "# Stranded VRAM\n").expect("page");
        assert_eq!(resolve(&page, "#stranded-vram"), Ok(()));
        assert_eq!(resolve(&page, "page.md#stranded-vram"), Ok(()));
        assert!(resolve(&page, "#stranded").is_err());
        assert!(resolve(&page, "gone.md").is_err());
        assert_eq!(resolve(&page, "https://example.com/gone"), Ok(()));
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// The repository's own pages, so `cargo test -p xtask` finds a broken
    /// link as the lint step does.
    #[test]
    fn the_repositorys_links_resolve() {
        check().expect("documentation links");
    }
}
