//! The fenced blocks of the README, of `docs/*.md` and of the crates' READMEs, checked:
//!
//! - every fence pairs up and every block opens with a language, so no stray fence swallows a
//!   heading or turns an example into plain text;
//! - every ```` ```sh ```` block is run here, each command against the built `tollgate` binary from
//!   the workspace root, and must succeed; when a ```` ```text ```` block follows it, that is what
//!   the commands print. Shell that needs Redis, a network or a long build is fenced
//!   ```` ```console ```` on purpose and not run; ```` ```bash ```` and ```` ```shell ```` are refused, so
//!   every shell block is one or the other;
//! - Python blocks stand only where `crates/tollgate-py/tests/test_readme.py` runs them.
//!
//! Rust blocks are compiled as doc tests elsewhere; this test only reads them as blocks.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The languages a block may open with.
const LANGUAGES: &[&str] = &["rust", "sh", "console", "text", "yaml", "python", "json"];

/// The pages whose Python blocks `crates/tollgate-py/tests/test_readme.py` runs.
const PYTHON_PAGES: &[&str] = &["README.md", "crates/tollgate-py/README.md"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the workspace root")
}

/// README.md, docs/*.md and crates/*/README.md, relative to the root, sorted.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![PathBuf::from("README.md")];
    for (dir, name) in [("docs", None), ("crates", Some("README.md"))] {
        for entry in std::fs::read_dir(root.join(dir)).expect("a directory of the workspace") {
            let path = entry.expect("a directory entry").path();
            let page = match name {
                None if path.extension().is_some_and(|e| e == "md") => path,
                Some(name) if path.join(name).is_file() => path.join(name),
                _ => continue,
            };
            pages.push(page.strip_prefix(&root).expect("under the root").to_path_buf());
        }
    }
    pages.sort();
    pages
}

/// A fenced block: its language (the first word of the info string), the line it opens on, its text.
#[derive(Debug)]
struct Block {
    language: String,
    line: usize,
    text: String,
}

/// The blocks of a page, or the first place where a fence does not pair up.
fn blocks(page: &Path, markdown: &str) -> Result<Vec<Block>, String> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start();
        if !fence.starts_with("```") {
            if let Some(block) = open.as_mut() {
                block.text.push_str(line);
                block.text.push('\n');
            }
            continue;
        }
        let info = fence.trim_start_matches('`').trim();
        match open.take() {
            Some(block) if info.is_empty() => blocks.push(block),
            Some(block) => {
                return Err(format!(
                    "{}:{}: a fence with a language inside the block opened on line {}",
                    page.display(),
                    i + 1,
                    block.line
                ));
            }
            None if info.is_empty() => {
                return Err(format!(
                    "{}:{}: a block opens without a language (a stray fence?); say ```text for plain text",
                    page.display(),
                    i + 1
                ));
            }
            None => {
                let language = info.split([',', ' ']).next().unwrap_or_default().to_string();
                open = Some(Block { language, line: i + 1, text: String::new() });
            }
        }
    }
    match open {
        Some(block) => Err(format!("{}:{}: this block is never closed", page.display(), block.line)),
        None => Ok(blocks),
    }
}

/// Words of a shell command: whitespace-separated, with single and double quotes.
fn words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in command.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    assert!(quote.is_none(), "an unclosed quote in `{command}`");
    words.extend(word);
    words
}

/// The commands of a ```sh block: lines joined at a trailing `\`, comments and blank lines left out.
fn commands(text: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if current.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                commands.push(std::mem::take(&mut current));
            }
        }
    }
    assert!(current.is_empty(), "a command continues past the end of its block: `{current}`");
    commands
}

/// Runs one documented command; `--out FILE` writes into `scratch` instead. Returns its stdout.
fn run(page: &Path, block: &Block, command: &str, scratch: &Path) -> String {
    let mut args = words(command);
    let place = format!("{}:{}: `{command}`", page.display(), block.line);
    assert_eq!(args.first().map(String::as_str), Some("tollgate"), "{place}: a ```sh command runs `tollgate`");
    for word in &args {
        assert!(
            !matches!(word.as_str(), "|" | "||" | "&&" | ";" | ">" | ">>" | "<" | "&"),
            "{place}: no pipes or redirections in a ```sh block (fence it ```console)"
        );
    }
    args.remove(0);
    if let Some(at) = args.iter().position(|a| a == "--out") {
        let file = Path::new(&args[at + 1]).file_name().expect("--out names a file").to_owned();
        args[at + 1] = scratch.join(file).to_string_lossy().into_owned();
    }
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(&args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("{place}: cannot run: {e}"));
    assert!(
        output.status.success(),
        "{place}: exited with {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// Lines without their trailing spaces, and no trailing blank lines.
fn normalised(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    lines.join("\n").trim_end().to_string()
}

#[test]
fn readme_and_docs_fences_pair_up() {
    let root = root();
    let mut errors = Vec::new();
    for page in pages() {
        let markdown = std::fs::read_to_string(root.join(&page)).expect("a readable page");
        match blocks(&page, &markdown) {
            Err(e) => errors.push(e),
            Ok(blocks) => {
                for block in blocks {
                    let place = format!("{}:{}", page.display(), block.line);
                    if !LANGUAGES.contains(&block.language.as_str()) {
                        errors.push(format!(
                            "{place}: ```{} is not one of {LANGUAGES:?} (shell: ```sh is run by this test, ```console is not)",
                            block.language
                        ));
                    }
                    if block.language == "python" && !PYTHON_PAGES.contains(&page.to_str().unwrap_or_default()) {
                        errors.push(format!("{place}: a Python block where test_readme.py does not run it"));
                    }
                }
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn readme_and_docs_sh_blocks_run() {
    let root = root();
    let scratch = std::env::temp_dir().join(format!("tollgate-readme-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("a scratch directory");
    let mut ran = 0;
    for page in pages() {
        let markdown = std::fs::read_to_string(root.join(&page)).expect("a readable page");
        let blocks = blocks(&page, &markdown).unwrap_or_else(|e| panic!("{e}"));
        let lines: Vec<&str> = markdown.lines().collect();
        for (i, block) in blocks.iter().enumerate() {
            if block.language != "sh" {
                continue;
            }
            let mut stdout = String::new();
            for command in commands(&block.text) {
                stdout.push_str(&run(&page, block, &command, &scratch));
                ran += 1;
            }
            // A ```text block right after it (blank lines between at most) is what it prints.
            let closed = block.line + block.text.lines().count() + 1; // the closing fence's line number
            if let Some(next) = blocks.get(i + 1).filter(|next| next.language == "text") {
                let between = &lines[closed..next.line - 1];
                if between.iter().all(|l| l.trim().is_empty()) {
                    assert_eq!(
                        normalised(&stdout),
                        normalised(&next.text),
                        "{}:{}: the commands print something else than the block after them",
                        page.display(),
                        block.line
                    );
                }
            }
        }
    }
    std::fs::remove_dir_all(&scratch).ok();
    assert!(ran >= 5, "only {ran} documented commands found: were the ```sh blocks renamed?");
}
