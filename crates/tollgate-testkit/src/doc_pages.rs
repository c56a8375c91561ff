//! The Rust blocks of the README, of `docs/*.md` and of the crates' READMEs, compiled (and run,
//! unless fenced `no_run`) as doc tests of this crate: `cargo test --doc -p tollgate-testkit`.
//! A page is listed here once it has a Rust block; the test below fails for a page with a Rust
//! block that is not listed, so no example goes unchecked.

/// One hidden item per page, its doc the page itself (only when rustdoc collects doc tests).
macro_rules! pages {
    ($($item:ident = $path:literal),* $(,)?) => {
        $(
            #[cfg(doctest)]
            #[allow(dead_code)]
            #[doc = include_str!(concat!("../../../", $path))]
            pub struct $item;
        )*

        /// The pages above, relative to the workspace root.
        #[cfg(test)]
        const PAGES: &[&str] = &[$($path),*];
    };
}

pages! {
    Readme = "README.md",
    LibraryDoc = "docs/library.md",
    RedisDoc = "docs/redis.md",
    PumpDoc = "docs/pump.md",
    CoreReadme = "crates/tollgate/README.md",
    RedisReadme = "crates/tollgate-redis/README.md",
    TowerReadme = "crates/tollgate-tower/README.md",
    PolicyReadme = "crates/tollgate-policy/README.md",
    PaceReadme = "crates/tollgate-pace/README.md",
    SimReadme = "crates/tollgate-sim/README.md",
    TestkitReadme = "crates/tollgate-testkit/README.md",
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::PAGES;

    /// README.md, docs/*.md and crates/*/README.md that hold a ```rust block, relative to the root.
    fn pages_with_rust() -> Vec<String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut pages = vec!["README.md".to_string()];
        for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
            let name = entry.expect("an entry").file_name().into_string().expect("a UTF-8 name");
            if name.ends_with(".md") {
                pages.push(format!("docs/{name}"));
            }
        }
        for entry in std::fs::read_dir(root.join("crates")).expect("crates/") {
            let name = entry.expect("an entry").file_name().into_string().expect("a UTF-8 name");
            if root.join("crates").join(&name).join("README.md").is_file() {
                pages.push(format!("crates/{name}/README.md"));
            }
        }
        pages.retain(|page| {
            let text = std::fs::read_to_string(root.join(page)).expect("a readable page");
            text.lines().any(|line| line.trim_start().starts_with("```rust"))
        });
        pages.sort();
        pages
    }

    #[test]
    fn readme_rust_blocks_are_all_doc_tested() {
        let with_rust = pages_with_rust();
        assert!(with_rust.iter().any(|page| page == "README.md"), "the README has Rust blocks: {with_rust:?}");
        let missing: Vec<String> = with_rust.into_iter().filter(|page| !PAGES.contains(&page.as_str())).collect();
        assert!(missing.is_empty(), "pages with Rust blocks not listed in src/doc_pages.rs: {missing:?}");
    }
}
