//! The repository symbol map end to end: a real rush on a small shop (Python, TypeScript, Rust
//! and Go), with the prompts the fake agent CLI was given (`FAKE_CLAUDE_LOG`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use zerg_tests::*;

const T: Duration = Duration::from_secs(180);

const MODELS_PY: &str = r#""""The shop's catalogue."""
from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class Item:
    sku: str
    name: str
    price: Decimal

    def label(self) -> str:
        return f"{self.name} ({self.sku})"
"#;

const STORE_PY: &str = r#"from typing import Optional

from .models import Item


class Store:
    """Items by SKU."""

    def __init__(self) -> None:
        self._items: dict[str, Item] = {}

    def add(self, item: Item) -> None:
        self._items[item.sku] = item

    def find(self, sku: str) -> Optional[Item]:
        return self._items.get(sku)
"#;

const API_TS: &str = r#"export interface ItemDto {
  sku: string;
  name: string;
  priceCents: number;
}

export async function fetchItems(baseUrl: string): Promise<ItemDto[]> {
  const res = await fetch(`${baseUrl}/items`);
  return (await res.json()) as ItemDto[];
}
"#;

const REPORT_GO: &str = r#"package main

import "fmt"

// Report is the nightly stock report.
type Report struct {
	Lines []string
}

func (r *Report) Render() string {
	return fmt.Sprint(r.Lines)
}

func main() {
	fmt.Println((&Report{}).Render())
}
"#;

const LEDGER_RS: &str = r#"/// The shop's books.
pub struct Ledger {
    entries: Vec<i64>,
}

impl Ledger {
    pub fn post(&mut self, cents: i64) {
        self.entries.push(cents);
    }
}
"#;

/// What level 1 writes: a pricing module and a formatting helper, each by its own task.
const PRICING_PY: &str = r#"from decimal import Decimal

from .models import Item


def apply_discount(price: Decimal, percent: int) -> Decimal:
    """The price after a discount of `percent` percent."""
    return price * (100 - percent) / 100


def sale_price(item: Item, percent: int) -> Decimal:
    return apply_discount(item.price, percent)
"#;

const FORMAT_TS: &str = r#"import type { ItemDto } from './api';

export function formatPrice(cents: number, currency: string): string {
  return new Intl.NumberFormat('en', { style: 'currency', currency }).format(cents / 100);
}

export const describe = (item: ItemDto): string => `${item.name}: ${formatPrice(item.priceCents, 'EUR')}`;
"#;

fn graph(feature: &str) -> String {
    let task = |id: &str,
                level: u32,
                deps: &[&str],
                create: &[&str],
                modify: &[&str],
                read: &[&str],
                check: &str| {
        json!({
            "id": id, "title": format!("Task {id}"), "level": level,
            "description": "See the design.", "dependencies": deps,
            "files": {"create": create, "modify": modify, "read": read},
            "verification": {"command": check, "timeout_seconds": 30}
        })
    };
    let tasks = vec![
        task(
            "SYM-L1-001",
            1,
            &[],
            &["shop/pricing.py"],
            &[],
            &["shop/models.py"],
            "test -f shop/pricing.py",
        ),
        task(
            "SYM-L1-002",
            1,
            &[],
            &["web/src/format.ts"],
            &[],
            &["web/src/api.ts"],
            "test -f web/src/format.ts",
        ),
        // Reads what both level-1 tasks wrote, in two other workers' branches.
        task(
            "SYM-L2-001",
            2,
            &["SYM-L1-001", "SYM-L1-002"],
            &["docs/pricing.md"],
            &[],
            &["shop/pricing.py", "web/src/format.ts"],
            "test -f docs/pricing.md",
        ),
        // Python only: nothing of the TypeScript, Go or Rust code, nor of unrelated Python.
        task(
            "SYM-L2-002",
            2,
            &["SYM-L1-001", "SYM-L1-002"],
            &[],
            &["shop/store.py"],
            &[],
            "test -f shop/store.py",
        ),
    ];
    serde_json::to_string_pretty(&json!({"feature": feature, "version": "2.0", "tasks": tasks}))
        .unwrap()
}

/// The `## Relevant Symbols` section of a prompt, up to the next `## ` heading.
fn section(prompt: &str) -> String {
    let Some(start) = prompt.find("## Relevant Symbols\n") else {
        return String::new();
    };
    let rest = &prompt[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    rest[..end].to_string()
}

fn headings(section: &str) -> Vec<String> {
    section
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|h| h.split(" (").next().unwrap_or(h).to_string())
        .collect()
}

/// The last prompt each task was given.
fn prompts(log: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| {
            (
                v["task_id"].as_str().unwrap_or_default().to_string(),
                v["prompt"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn level_two_prompts_show_what_level_one_wrote_and_only_related_files() {
    let repo = TestRepo::new();
    for (path, content) in [
        ("shop/__init__.py", "from .models import Item\n"),
        ("shop/models.py", MODELS_PY),
        ("shop/store.py", STORE_PY),
        (
            "shop/reports.py",
            "def weekly_report() -> str:\n    return ''\n",
        ),
        ("web/src/api.ts", API_TS),
        ("tools/report/main.go", REPORT_GO),
        ("crates/ledger/src/lib.rs", LEDGER_RS),
    ] {
        let p = repo.path.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    git(&repo.path, &["add", "-A"]);
    git(&repo.path, &["commit", "-q", "-m", "the shop"]);
    repo.write_graph("sym", &graph("sym"));
    // The two level-1 tasks wait for each other, so they run at the same time in two workers.
    let marks = tempfile::tempdir().unwrap();
    let mark = |n: &str| marks.path().join(n).display().to_string();
    let meet = |me: &str, other: &str| {
        vec![
            json!({"op": "touch", "path": mark(me)}),
            json!({"op": "wait_for_file", "path": mark(other), "timeout_ms": 60_000}),
        ]
    };
    let mut l1a = vec![json!({"op": "write", "path": "shop/pricing.py", "content": PRICING_PY})];
    l1a.extend(meet("a", "b"));
    let mut l1b = vec![json!({"op": "write", "path": "web/src/format.ts", "content": FORMAT_TS})];
    l1b.extend(meet("b", "a"));
    repo.write_script(
        "sym",
        &json!({"tasks": {
            "SYM-L1-001": l1a,
            "SYM-L1-002": l1b,
            "SYM-L2-001": [{"op": "write", "path": "docs/pricing.md", "content": "# Pricing\n"}],
            "SYM-L2-002": [{"op": "append", "path": "shop/store.py", "content": "\n\ndef default_store() -> Store:\n    return Store()\n"}],
        }}),
    );
    repo.configure(&Config::fake_agent().fast_workers());
    let log = marks.path().join("prompts.jsonl");
    let d = Daemon::start_with_env(vec![("FAKE_CLAUDE_LOG".into(), log.display().to_string())]);
    let out = d.ctl_in(&repo.path, &["rush", "sym", "--workers", "2"]);
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let st = d.wait_end(&repo.path, "sym", T);
    assert_eq!(st["state"], "complete", "{st}");
    let worker = |t: &str| st["tasks"][t]["worker_id"].as_i64();
    assert_ne!(
        worker("SYM-L1-001"),
        worker("SYM-L1-002"),
        "the level-1 tasks ran in two workers"
    );
    let prompts = prompts(&log);

    // Level 1 already had the map of the base commit.
    let l1 = section(&prompts["SYM-L1-001"]);
    assert!(l1.contains("class Item"), "{l1}");
    assert_eq!(headings(&l1), ["shop/models.py"], "{l1}");

    // Level 2 sees the signatures level 1 wrote, one of them in another worker than its own.
    let l2 = section(&prompts["SYM-L2-001"]);
    assert!(
        l2.contains("- L6 def apply_discount(price: Decimal, percent: int) -> Decimal\n"),
        "{l2}"
    );
    assert!(
        l2.contains("- L3 export function formatPrice(cents: number, currency: string): string\n"),
        "{l2}"
    );
    assert!(
        l2.contains(
            "- L1 export interface ItemDto { sku: string; name: string; priceCents: number; }\n"
        ),
        "{l2}"
    );
    // And one hop further: what those files import.
    let h = headings(&l2);
    for want in [
        "shop/pricing.py",
        "web/src/format.ts",
        "shop/models.py",
        "web/src/api.ts",
    ] {
        assert!(h.iter().any(|x| x == want), "{want} not in {h:?}:\n{l2}");
    }

    // A Python task gets Python symbols of its own files and their imports, nothing else.
    let py = section(&prompts["SYM-L2-002"]);
    assert_eq!(headings(&py), ["shop/store.py", "shop/models.py"], "{py}");
    assert!(
        py.contains("  - L12 def add(self, item: Item) -> None\n"),
        "{py}"
    );
    for unrelated in [
        "web/",
        "tools/",
        "crates/",
        "fetchItems",
        "Report",
        "Ledger",
        "weekly_report",
        "apply_discount",
    ] {
        assert!(
            !py.contains(unrelated),
            "{unrelated} in a Python task's symbols:\n{py}"
        );
    }

    // `zergctl symbols --task` prints exactly what the prompt had (the files SYM-L2-001 reads
    // did not change in level 2, so the staging branch gives the same section).
    let out = d.ctl_in(&repo.path, &["symbols", "--task", "sym", "SYM-L2-001"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), l2);

    // The map is cached by blob: indexing the staging branch again parses nothing, and
    // monitor.log says what the rush indexed and updated.
    let monitor = std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap();
    assert!(monitor.contains("Symbol map built: 7 files"), "{monitor}");
    assert!(
        monitor.contains("Symbol map updated after level 1: 2 changed files (2 parsed"),
        "{monitor}"
    );
    assert!(repo.path.join(".zerg/cache/symbols/v1").is_dir());
    // The cache is not something the user's checkout shows.
    assert!(
        !repo.status_porcelain().iter().any(|l| l.contains("cache")),
        "{:?}",
        repo.status_porcelain()
    );
}

#[test]
fn the_worker_agent_links_no_grammar() {
    let has = |bin: &str, needle: &[u8]| {
        let bytes = std::fs::read(zerg_tests::bin(bin)).expect("the binary is built");
        bytes.windows(needle.len()).any(|w| w == needle)
    };
    // zergd parses with tree-sitter, so the probe finds the grammar there...
    assert!(has("zergd", b"tree_sitter_python"));
    // ...and the agent, which gets each task's section in its lease, links none.
    for needle in [
        &b"tree_sitter_python"[..],
        b"tree_sitter_rust",
        b"ts_parser_new",
    ] {
        assert!(
            !has("zerg-worker-agent", needle),
            "zerg-worker-agent contains {}",
            String::from_utf8_lossy(needle)
        );
    }
}
