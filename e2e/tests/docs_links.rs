//! The front page and the reference point at files that exist: every relative link of
//! `README.md`, `ARCHITECTURE.md` and `docs/*.md` resolves to a file or folder of the repo.

use std::path::{Path, PathBuf};

/// The targets of a Markdown text's inline links (`[text](target)`), anchors dropped.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or_default();
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            targets.push(target.to_owned());
        }
        rest = &rest[end..];
    }
    targets
}

#[test]
fn every_relative_link_of_the_docs_resolves_to_a_file_of_the_repo() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut pages: Vec<PathBuf> = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("a page");
        let dir = page.parent().expect("a folder");
        for target in link_targets(&text) {
            checked += 1;
            if !dir.join(&target).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(
        checked >= 10,
        "only {checked} links found: is the parser right?"
    );
    assert!(
        broken.is_empty(),
        "links to nothing:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_link_parser_finds_relative_targets_only() {
    let text = "see [a](docs/a.md#x), [b](https://e.x/b) and [c](../c)";
    assert_eq!(link_targets(text), ["docs/a.md", "../c"]);
}
