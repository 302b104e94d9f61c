//! How long the symbol map takes on a 100,000-line repository of five languages: a cold index
//! (nothing cached), a warm one (everything in the blob cache), and the update after a level
//! that changed 20 files.
//!
//! Run with `cargo bench -p zerg-symbols --bench symbols`.

use std::time::Instant;

use zerg_proto::testkit::git;
use zerg_symbols::{self as symbols, Cache, Settings};

const FILES_PER_LANGUAGE: usize = 100;
const UNITS_PER_FILE: usize = 20;

/// One file of about 200 lines in `lang`; `v` varies its content.
fn file(lang: &str, n: usize, v: usize) -> String {
    let mut s = String::new();
    for u in 0..UNITS_PER_FILE {
        let name = format!("unit{n}_{u}_{v}");
        match lang {
            "py" => s.push_str(&format!(
                "from .mod{m} import Unit{m}\n\n\nclass {name}:\n    \"\"\"Does {u}.\"\"\"\n\n    def run(self, count: int, label: str = \"x\") -> list[str]:\n        out = []\n        for i in range(count):\n            out.append(f\"{{label}}{{i}}\")\n        return out\n",
                m = (n + 1) % FILES_PER_LANGUAGE
            )),
            "js" => s.push_str(&format!(
                "import {{ helper{u} }} from './mod{m}.js';\n\nexport class {name} {{\n  constructor(opts) {{ this.opts = opts; }}\n\n  run(count, label = 'x') {{\n    return Array.from({{ length: count }}, (_, i) => `${{label}}${{i}}`);\n  }}\n}}\n\n",
                m = (n + 1) % FILES_PER_LANGUAGE
            )),
            "ts" => s.push_str(&format!(
                "import type {{ Opts{u} }} from './mod{m}';\n\nexport interface {name}Props {{ count: number; label?: string }}\n\nexport function {name}(props: {name}Props): string[] {{\n  const out: string[] = [];\n  for (let i = 0; i < props.count; i++) out.push(`${{props.label ?? 'x'}}${{i}}`);\n  return out;\n}}\n\n",
                m = (n + 1) % FILES_PER_LANGUAGE
            )),
            "rs" => s.push_str(&format!(
                "/// Unit {u}.\npub struct {name} {{\n    pub count: usize,\n}}\n\nimpl {name} {{\n    pub fn run(&self, label: &str) -> Vec<String> {{\n        (0..self.count).map(|i| format!(\"{{label}}{{i}}\")).collect()\n    }}\n}}\n\n"
            )),
            _ => s.push_str(&format!(
                "// {name} does {u}.\ntype {name} struct {{\n\tCount int\n}}\n\nfunc (x *{name}) Run(label string) []string {{\n\tout := []string{{}}\n\tfor i := 0; i < x.Count; i++ {{\n\t\tout = append(out, label)\n\t}}\n\treturn out\n}}\n\n"
            )),
        }
    }
    s
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    let langs = ["py", "js", "ts", "rs", "go"];
    let mut lines = 0;
    for lang in langs {
        let d = repo.join(lang);
        std::fs::create_dir_all(&d).unwrap();
        for n in 0..FILES_PER_LANGUAGE {
            let text = if lang == "go" {
                format!("package {lang}\n\n{}", file(lang, n, 0))
            } else {
                file(lang, n, 0)
            };
            lines += text.lines().count();
            std::fs::write(d.join(format!("mod{n}.{lang}")), text).unwrap();
        }
    }
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "base"]);
    let settings = Settings::default();
    let cache = Cache::at(dir.path().join("cache"));
    let open = zerg_git::Repo::open(&repo).unwrap();

    let t = Instant::now();
    let (cold, stats) = symbols::build(&open, "HEAD", &settings, Some(&cache)).unwrap();
    let cold_ms = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(stats.parsed, 5 * FILES_PER_LANGUAGE);

    let t = Instant::now();
    let (_, stats) = symbols::build(&open, "HEAD", &settings, Some(&cache)).unwrap();
    let warm_ms = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(stats.parsed, 0);

    // A level that changed 20 files (4 per language).
    for lang in langs {
        for n in 0..4 {
            let text = if lang == "go" {
                format!("package {lang}\n\n{}", file(lang, n, 1))
            } else {
                file(lang, n, 1)
            };
            std::fs::write(repo.join(lang).join(format!("mod{n}.{lang}")), text).unwrap();
        }
    }
    git(&repo, &["commit", "-q", "-am", "level 1"]);
    let t = Instant::now();
    let (_, stats) = symbols::update(&cold, &open, "HEAD", &settings, Some(&cache)).unwrap();
    let update_ms = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(stats.parsed, 20);

    let c = cold.counts();
    println!(
        "{lines} lines, {} files, {} definitions",
        c.indexed, c.definitions
    );
    println!("cold index (nothing cached):   {cold_ms:8.1} ms");
    println!("warm index (all from cache):   {warm_ms:8.1} ms");
    println!("update after 20 changed files: {update_ms:8.1} ms");
}
