//! Every `COMPUTE_*` setting named anywhere in the workspace's sources is in
//! `compute_core::env::SETTINGS`, and the README lists every one of them.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            sources(&path, out);
        } else if name.ends_with(".rs") || name == "run" {
            out.push(path);
        }
    }
}

/// `COMPUTE_*` names that stand alone (not the tail of a longer identifier).
fn names_in(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find("COMPUTE_") {
        let start = at + i;
        let before = start.checked_sub(1).map(|b| bytes[b]);
        let mut end = start + "COMPUTE_".len();
        while end < bytes.len()
            && (bytes[end].is_ascii_uppercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        // `vk::PipelineStageFlags::COMPUTE_SHADER` and the like are constants, not settings.
        let standalone =
            before.is_none_or(|b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b':'));
        if standalone && end > start + "COMPUTE_".len() {
            found.push(text[start..end].trim_end_matches('_').to_owned());
        }
        at = end;
    }
    found
}

#[test]
fn every_setting_in_the_sources_is_in_the_table_and_the_readme() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    sources(root, &mut files);
    assert!(files.len() > 20, "found the workspace sources");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut missing = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for name in names_in(&text) {
            // The test's own example of an undocumented name.
            if name == "COMPUTE_NOT_A_SETTING" {
                continue;
            }
            if !compute_core::env::SETTINGS.iter().any(|s| s.name == name) {
                missing.push(format!("{name} ({} is not in SETTINGS)", file.display()));
            }
        }
    }
    for s in compute_core::env::SETTINGS {
        if !readme.contains(s.name) {
            missing.push(format!("{} (not in README.md)", s.name));
        }
    }
    missing.sort();
    missing.dedup();
    assert!(missing.is_empty(), "undocumented settings: {missing:#?}");
}
