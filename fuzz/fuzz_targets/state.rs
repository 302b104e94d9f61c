//! Fuzzes zergd's state loader, `zergd::state::StateStore::load`, with arbitrary bytes as the
//! state file `<feature>.json` (and no backup). It must return and never panic, and an error
//! must name the file.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use zergd::state::StateStore;

/// One directory for the whole run; each input overwrites the same state file.
fn dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory"))
}

fuzz_target!(|data: &[u8]| {
    let store = StateStore::new(dir().path(), "fuzz");
    std::fs::write(store.path(), data).expect("write the state file");
    if let Err(e) = store.load() {
        let shown = e.to_string();
        assert!(
            shown.contains(&store.path().display().to_string()),
            "the error does not name the file: {shown}"
        );
    }
});
