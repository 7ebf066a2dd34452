//! Where the workspace and its target directory live.

use std::env;
use std::path::{Path, PathBuf};

/// The workspace root: the parent of this crate's manifest directory, as
/// known at compile time.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// The cargo target directory: `$CARGO_TARGET_DIR` when set (a relative
/// value is taken relative to the workspace root, where every child cargo
/// runs), otherwise `<workspace root>/target`.
pub fn target_dir() -> PathBuf {
    let root = workspace_root();
    resolve_target_dir(&root, env::var_os("CARGO_TARGET_DIR").as_deref())
}

/// Pure part of [`target_dir`], for tests.
fn resolve_target_dir(root: &Path, from_env: Option<&std::ffi::OsStr>) -> PathBuf {
    match from_env {
        Some(dir) if !dir.is_empty() => {
            let dir = Path::new(dir);
            if dir.is_absolute() {
                dir.to_path_buf()
            } else {
                root.join(dir)
            }
        }
        _ => root.join("target"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn workspace_root_holds_the_xtask_crate() {
        let root = workspace_root();
        assert!(root.join("xtask").join("Cargo.toml").is_file());
        assert!(root.join("Cargo.toml").is_file());
    }

    #[test]
    fn target_dir_defaults_to_root_target() {
        let root = Path::new("/ws");
        assert_eq!(resolve_target_dir(root, None), PathBuf::from("/ws/target"));
        assert_eq!(
            resolve_target_dir(root, Some(OsStr::new(""))),
            PathBuf::from("/ws/target")
        );
    }

    #[test]
    fn target_dir_from_env_absolute_and_relative() {
        let root = Path::new("/ws");
        assert_eq!(
            resolve_target_dir(root, Some(OsStr::new("/tmp/tgt"))),
            PathBuf::from("/tmp/tgt")
        );
        assert_eq!(
            resolve_target_dir(root, Some(OsStr::new("out/t"))),
            PathBuf::from("/ws/out/t")
        );
    }
}
