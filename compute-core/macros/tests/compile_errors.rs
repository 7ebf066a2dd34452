//! Misuses of `#[kernel]` are compile errors pointing at the construct (the `.stderr` files pin
//! the messages). Two cases only: each one compiles a crate.

#[test]
fn compile_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/unsupported.rs");
    t.compile_fail("tests/ui/misuse.rs");
}
