//! The root README's example of the layer is the crate README's, which its doc tests compile.

/// The first code block after `after` in `text`, without its fence lines.
fn block_after<'a>(text: &'a str, after: &str) -> &'a str {
    let from = text.find(after).expect("the heading is there");
    let rest = &text[from..];
    let start = rest.find("```rust").expect("a rust block follows");
    let body = &rest[start..];
    let body = &body[body.find('\n').unwrap() + 1..];
    &body[..body.find("```").unwrap()]
}

#[test]
fn the_root_readmes_layer_example_is_the_doc_tested_one() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let root = std::fs::read_to_string(format!("{dir}/../README.md")).unwrap();
    let crate_readme = std::fs::read_to_string(format!("{dir}/README.md")).unwrap();
    let shown = block_after(&root, "## Idempotency keys for HTTP services");
    let tested = block_after(&crate_readme, "# fencelock-http");
    assert_eq!(shown, tested);
    assert!(
        shown.lines().count() < 20,
        "the example stays under 20 lines"
    );
    // Its handler takes the run from the request's extensions: a request without a key must
    // be refused before it, or axum answers it 500.
    assert!(
        shown.contains("Extension<IdempotencyRun>") && shown.contains(".require_key(true)"),
        "the example's layer requires a key"
    );
}
