//! Fuzzes zergd's config parser, `zergd::config::Config::parse`, with arbitrary text as
//! `.zerg/config.yaml` (bytes that are not UTF-8 are read lossily, as an editor might). It
//! must return a config or an error and never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use zergd::config::Config;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match Config::parse(&text, "config.yaml") {
        Ok((_config, warnings)) => {
            for w in &warnings {
                assert!(w.starts_with("config.yaml: "), "{w}");
            }
        }
        Err(e) => {
            assert!(e.to_string().starts_with("config.yaml: "), "{e}");
        }
    }
});
