//! The structure of the core crate, checked: every `crate::` path in `src/` (outside test
//! code) points at the file's own layer or a lower one, the modules of the top layer do not use
//! each other, and the API reaches the transport only through the engine. DESIGN.md §1 draws
//! the same layers, names every file of the library in its map and every export in its public
//! surface.
//!
//! Test modules are left out: a unit test may drive its layer through the public API.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first; modules in one entry share a rank.
const LAYERS: &[&[&str]] = &[
    &["base"],
    &["protocol"],
    &["transport"],
    &["engine"],
    &["api"],
    &["admin", "blocking", "observability", "sql"],
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The top-level module a source file belongs to (`src/engine/wait.rs` -> `engine`), or `None`
/// for `lib.rs`, the root that re-exports the public API.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).expect("a file under src/");
    let first = relative.components().next()?.as_os_str().to_string_lossy();
    let name = first.trim_end_matches(".rs");
    (name != "lib").then(|| name.to_owned())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether a file is test code of its own: named `tests.rs` or `*_tests.rs`, or inside a
/// `tests/` folder of a module.
fn is_test_file(path: &Path) -> bool {
    let name = path.file_name().unwrap().to_string_lossy();
    name == "tests.rs"
        || name.ends_with("_tests.rs")
        || path
            .parent()
            .is_some_and(|dir| dir.iter().any(|part| part == "tests"))
}

/// The code of a file without comments and without its test modules (by convention the last
/// item of a file, or a file of its own: [`is_test_file`]).
fn production_code(path: &Path, text: &str) -> String {
    if is_test_file(path) {
        return String::new();
    }
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// Every top-level name after `crate::` in `code` (`crate::engine::wait::Wake` -> `engine`,
/// `crate::{Error, LockClient}` -> `Error`, `LockClient`).
fn crate_references(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        // `fencelock::` or `some_crate::` are other crates, not ours.
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            names.extend(
                group
                    .split(',')
                    .map(|item| {
                        item.trim()
                            .split("::")
                            .next()
                            .unwrap_or("")
                            .trim()
                            .to_owned()
                    })
                    .filter(|n| !n.is_empty()),
            );
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            names.push(name);
        }
    }
    names
}

/// What the root re-exports, by name: `pub use api::lock::Lock;` -> `Lock` is `api`'s.
fn root_exports(lib: &str) -> BTreeMap<String, String> {
    let mut exports = BTreeMap::new();
    for line in lib.lines().map(str::trim) {
        let Some(path) = line
            .strip_prefix("pub use ")
            .and_then(|p| p.strip_suffix(';'))
        else {
            continue;
        };
        let module = path.split("::").next().unwrap().to_owned();
        let names = match path.find('{') {
            Some(open) => path[open + 1..path.len() - 1]
                .split(',')
                .map(|n| n.trim().to_owned())
                .collect(),
            None => vec![path.rsplit("::").next().unwrap().to_owned()],
        };
        for name in names {
            exports.insert(name, module.clone());
        }
    }
    exports
}

/// Every reference that runs against the layering, as `file: module -> referenced module`.
fn violations(src: &Path) -> Vec<String> {
    let lib = fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let exports = root_exports(&lib);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in &files {
        let Some(module) = module_of(src, file) else {
            continue;
        };
        let own = rank(&module).unwrap_or_else(|| {
            panic!(
                "{module} (in {}) is in no layer: add it to LAYERS and to DESIGN.md §1",
                file.display()
            )
        });
        let text = fs::read_to_string(file).expect("source file");
        let relative = file.strip_prefix(src).unwrap();
        for name in crate_references(&production_code(relative, &text)) {
            let target = exports.get(&name).cloned().unwrap_or(name);
            if target == module {
                continue;
            }
            let Some(theirs) = rank(&target) else {
                continue; // a macro or item of the root itself
            };
            if theirs >= own {
                found.push(format!(
                    "{}: {module} (layer {own}) uses {target} (layer {theirs})",
                    relative.display()
                ));
            } else if target == "transport" && own >= rank("api").unwrap() {
                // The one way down from the API: the engine (connections, retries, waiting,
                // replica acknowledgement) and the protocol's script calls, never the
                // transport itself.
                found.push(format!(
                    "{}: {module} (layer {own}) uses transport past the engine",
                    relative.display()
                ));
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn every_import_runs_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&src);
    assert!(
        found.is_empty(),
        "imports that run up or across the layers (lower layers never import higher ones; \
         DESIGN.md §1):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_check_sees_an_upward_import_in_every_form() {
    let dir = std::env::temp_dir().join(format!("fencelock-layering-{}", std::process::id()));
    let src = dir.join("src");
    fs::create_dir_all(src.join("base")).unwrap();
    fs::create_dir_all(src.join("engine")).unwrap();
    fs::write(src.join("lib.rs"), "pub use api::client::LockClient;\n").unwrap();
    fs::write(
        src.join("base/mod.rs"),
        "use crate::engine::Engine;\nfn f() { crate::api::x(); }\nuse crate::{LockClient, base};\n\
         // crate::admin in a comment is not an import\n#[cfg(test)]\nmod tests {\n    use crate::admin;\n}\n",
    )
    .unwrap();
    fs::write(
        src.join("engine/mod.rs"),
        "use crate::base::error::Error;\n",
    )
    .unwrap();
    fs::write(src.join("sql.rs"), "use crate::blocking::LockClient;\n").unwrap();
    fs::create_dir_all(src.join("api")).unwrap();
    fs::write(
        src.join("api/lock.rs"),
        "use crate::engine::Engine;\nuse crate::transport::ack_pool;\n",
    )
    .unwrap();
    let found = violations(&src);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        found,
        [
            "api/lock.rs: api (layer 4) uses transport past the engine",
            "base/mod.rs: base (layer 0) uses api (layer 4)",
            "base/mod.rs: base (layer 0) uses engine (layer 3)",
            "sql.rs: sql (layer 5) uses blocking (layer 5)",
        ]
    );
}

/// DESIGN.md §1, from its heading to the next section's.
fn design_map(design: &str) -> &str {
    let start = design.find("## 1. Architecture").expect("DESIGN.md has §1");
    let end = design[start..]
        .find("\n## 2.")
        .map_or(design.len(), |at| start + at);
    &design[start..end]
}

/// The names in backticks of `text`.
fn ticked(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// What the public surface and the map of `design` miss or name in vain, against the crate
/// rooted at `src`; empty when they match.
fn map_mismatches(src: &Path, design: &str) -> Vec<String> {
    let map = design_map(design);
    let lib = fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    // The root's own items (not those of its inline modules, which are indented).
    let top: Vec<&str> = lib
        .lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
        .collect();
    let mut public: BTreeSet<String> = root_exports(&top.join("\n")).into_keys().collect();
    public.extend(
        lib.lines()
            .filter_map(|l| l.trim().strip_prefix("pub mod "))
            .map(|rest| rest.trim_end_matches([';', ' ', '{']).to_owned()),
    );
    let surface = map
        .find("Public surface")
        .map(|at| ticked(&map[at..]))
        .unwrap_or_default();
    let mut found = Vec::new();
    for name in &public {
        if !surface.contains(name) {
            found.push(format!("exported but not in the public surface: {name}"));
        }
    }
    // The drawing: every file of the library named (a folder module by `folder/`), and no
    // name of a file that is not there.
    let drawing = map.split("```").nth(1).unwrap_or("");
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut names = BTreeSet::new();
    for file in &files {
        let relative = file.strip_prefix(src).unwrap();
        let parts: Vec<String> = relative
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if is_test_file(relative) || parts == ["lib.rs"] {
            continue;
        }
        let name = match parts.as_slice() {
            [.., folder, last] if last == "mod.rs" => format!("{folder}/"),
            [.., last] => last.clone(),
            [] => unreachable!(),
        };
        if !drawing.contains(&name) {
            found.push(format!(
                "{} is not named in the map (as {name})",
                relative.display()
            ));
        }
        names.insert(name);
        names.insert(parts.last().unwrap().clone());
    }
    for word in drawing.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.')) {
        if word.ends_with(".rs") && !names.contains(word) {
            found.push(format!(
                "the map names {word}, which is no file of the library"
            ));
        }
    }
    found
}

#[test]
fn the_design_map_names_every_export_and_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = fs::read_to_string(root.join("DESIGN.md")).expect("DESIGN.md");
    let found = map_mismatches(&root.join("src"), &design);
    assert!(
        found.is_empty(),
        "DESIGN.md §1 does not match the crate:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_map_check_sees_a_missing_export_a_missing_file_and_a_stale_name() {
    let dir = std::env::temp_dir().join(format!("fencelock-map-{}", std::process::id()));
    let src = dir.join("src");
    fs::create_dir_all(src.join("api/job/tests")).unwrap();
    fs::write(
        src.join("lib.rs"),
        "pub mod admin;\npub use api::lock::{Lock, Guard};\n",
    )
    .unwrap();
    for file in [
        "api/lock.rs",
        "api/job/mod.rs",
        "api/job/ticks.rs",
        "api/job/tests/x.rs",
    ] {
        fs::write(src.join(file), "").unwrap();
    }
    fs::write(src.join("admin.rs"), "").unwrap();
    let design = "## 1. Architecture\n```\n api/ lock.rs job/ gone.rs\n```\n\
                  Public surface: `Lock`, `admin`.\n## 2. Next\n";
    let mut found = map_mismatches(&src, design);
    fs::remove_dir_all(&dir).unwrap();
    found.sort();
    assert_eq!(
        found,
        [
            "admin.rs is not named in the map (as admin.rs)",
            "api/job/ticks.rs is not named in the map (as ticks.rs)",
            "exported but not in the public surface: Guard",
            "the map names gone.rs, which is no file of the library",
        ]
    );
}
