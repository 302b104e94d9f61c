//! Tests of the symbol map: extraction per language on fixture files written like real code
//! (`zerg-symbols/tests/fixtures/symbols/`), hostile input, import resolution, the index built from
//! git with its cache and updates, and the per-task section.

use std::path::Path;
use std::process::Command;

use super::*;
use zerg_proto::graph::Files;
use zerg_proto::testkit::git;

fn fixture(name: &str) -> &'static str {
    match name {
        "inventory_service.py" => include_str!("../tests/fixtures/symbols/inventory_service.py"),
        "cart.js" => include_str!("../tests/fixtures/symbols/cart.js"),
        "api.ts" => include_str!("../tests/fixtures/symbols/api.ts"),
        "ItemList.tsx" => include_str!("../tests/fixtures/symbols/ItemList.tsx"),
        "ledger.rs" => include_str!("../tests/fixtures/symbols/ledger.rs"),
        "report.go" => include_str!("../tests/fixtures/symbols/report.go"),
        _ => panic!("no fixture {name}"),
    }
}

fn symbols_of(name: &str) -> FileSymbols {
    let g = Grammar::of_path(name).expect("a supported extension");
    extract(g, fixture(name).as_bytes()).expect("the fixture parses")
}

#[track_caller]
fn def<'a>(s: &'a FileSymbols, name: &str) -> &'a Definition {
    s.definitions
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("no definition {name} in {:#?}", s.definitions))
}

fn names(s: &FileSymbols) -> Vec<&str> {
    s.definitions.iter().map(|d| d.name.as_str()).collect()
}

fn imports(s: &FileSymbols) -> Vec<(&str, Vec<&str>)> {
    s.imports
        .iter()
        .map(|i| {
            (
                i.from.as_str(),
                i.names.iter().map(String::as_str).collect(),
            )
        })
        .collect()
}

// === Extraction, per language ===

#[test]
fn python_decorators_nested_classes_methods_imports_and_all() {
    let s = symbols_of("inventory_service.py");
    assert_eq!(s.language, Language::Python);
    let r = def(&s, "Reservation");
    assert_eq!((r.kind, r.line, r.depth), (Kind::Class, 24, 0));
    assert_eq!(r.signature, "@dataclass(frozen=True) class Reservation");
    // Nested classes, two deep.
    let meta = def(&s, "Meta");
    assert_eq!(
        (meta.kind, meta.depth, meta.parent.as_str()),
        (Kind::Class, 1, "Reservation")
    );
    let index = def(&s, "Index");
    assert_eq!(
        (index.depth, index.parent.as_str(), index.line),
        (2, "Meta", 34)
    );
    let p = def(&s, "is_open");
    assert_eq!(p.kind, Kind::Method);
    assert_eq!(p.signature, "@property def is_open(self) -> bool");
    let reserve = def(&s, "reserve");
    assert_eq!(
        reserve.signature,
        "async def reserve(self, sku: str, quantity: int = 1) -> Reservation"
    );
    // A signature over several lines is one line; the decorator comes first.
    assert_eq!(
        def(&s, "value_of").signature,
        "@staticmethod def value_of(items: Iterable[Item], discount: Decimal = Decimal(\"0\")) -> Decimal"
    );
    assert_eq!(
        def(&s, "restock").signature,
        "def restock(service: InventoryService, category: Category, amount: int) -> list[Item]"
    );
    // A function's locals are not part of the map.
    assert!(!names(&s).contains(&"_check"), "{:?}", names(&s));
    // `__all__` decides what the module exports.
    assert_eq!(s.exports, ["InventoryService", "Reservation", "restock"]);
    assert!(def(&s, "restock").exported);
    assert!(!def(&s, "_internal_helper").exported);
    assert!(!def(&s, "_reindex").exported);
    assert!(def(&s, "__init__").exported);
    let imps = imports(&s);
    for want in [
        ("logging", vec![]),
        ("os.path", vec![]),
        ("dataclasses", vec!["dataclass", "field"]),
        (".", vec!["pricing"]),
        (".models", vec!["Category", "Item"]),
        ("..core.db", vec!["Session"]),
        // Imports under `if TYPE_CHECKING:` count too.
        (".events", vec!["StockEvent"]),
    ] {
        assert!(imps.contains(&want), "{want:?} not in {imps:?}");
    }
    assert!(!imps.iter().any(|(f, _)| *f == "__future__"), "{imps:?}");
}

#[test]
fn javascript_default_exports_arrow_functions_private_members_and_require() {
    let s = symbols_of("cart.js");
    assert_eq!(s.language, Language::JavaScript);
    let cart = def(&s, "Cart");
    assert_eq!(cart.kind, Kind::Class);
    assert_eq!(
        cart.signature,
        "export default class Cart extends EventEmitter"
    );
    assert!(cart.exported);
    assert_eq!(
        def(&s, "cartTotal").signature,
        "export const cartTotal = (lines, { currency = 'EUR' } = {}) =>"
    );
    assert_eq!(
        def(&s, "lineTotal").signature,
        "export function lineTotal(line)"
    );
    let add = def(&s, "add");
    assert_eq!(
        (add.kind, add.depth, add.parent.as_str(), add.line),
        (Kind::Method, 1, "Cart", 30)
    );
    assert_eq!(def(&s, "restore").signature, "static async restore(id)");
    assert_eq!(def(&s, "size").signature, "get size()");
    assert!(!def(&s, "#persist").exported);
    // Exported through a list under another name.
    assert!(def(&s, "lineIds").exported);
    assert_eq!(def(&s, "lineIds").signature, "function* lineIds(lines)");
    assert_eq!(
        s.exports,
        [
            "default",
            "helpers",
            "lineIds as ids",
            "* from ./discounts",
            "default as Coupon from ./coupon"
        ]
    );
    let imps = imports(&s);
    for want in [
        ("events", vec!["EventEmitter", "once"]),
        ("./money.js", vec!["* as money"]),
        ("../format", vec!["formatPrice"]),
        ("./storage", vec!["storage"]),
        ("lodash", vec!["debounce", "throttle"]),
        ("./discounts", vec!["*"]),
        ("./coupon", vec!["default"]),
    ] {
        assert!(imps.contains(&want), "{want:?} not in {imps:?}");
    }
}

#[test]
fn typescript_generics_interfaces_overloads_namespaces_and_re_exports() {
    let s = symbols_of("api.ts");
    assert_eq!(s.language, Language::TypeScript);
    // A short interface is shown whole; generics stay.
    assert_eq!(
        def(&s, "Page").signature,
        "export interface Page<T> { items: T[]; next?: string; }"
    );
    let opts = def(&s, "ClientOptions");
    assert_eq!(opts.kind, Kind::Interface);
    let on_retry = def(&s, "onRetry");
    assert_eq!(
        (on_retry.kind, on_retry.parent.as_str()),
        (Kind::Method, "ClientOptions")
    );
    assert_eq!(def(&s, "ItemFilter").kind, Kind::Type);
    assert_eq!(
        def(&s, "SortOrder").signature,
        "export enum SortOrder { Ascending = 'asc', Descending = 'desc', }"
    );
    let res = def(&s, "Resource");
    assert_eq!(
        res.signature,
        "export abstract class Resource<T extends { id: string }>"
    );
    assert_eq!(
        def(&s, "parse").signature,
        "abstract parse(raw: unknown): T"
    );
    assert_eq!(
        def(&s, "get").signature,
        "async get(id: string): Promise<T>"
    );
    // Overloads are listed each.
    let overloads = s
        .definitions
        .iter()
        .filter(|d| d.name == "encodeQuery")
        .count();
    assert_eq!(overloads, 3);
    assert_eq!(
        def(&s, "fetchJson").signature,
        "export async function fetchJson<T>(url: string, init?: RequestInit): Promise<T>"
    );
    let paging = def(&s, "Paging");
    assert_eq!(paging.kind, Kind::Module);
    let pages = def(&s, "pages");
    assert_eq!(
        (pages.kind, pages.parent.as_str(), pages.depth),
        (Kind::Function, "Paging", 1)
    );
    // `export default Client;` exports a class declared without `export`.
    assert!(def(&s, "Client").exported);
    assert!(
        s.exports.contains(&"* from ./models".to_string()),
        "{:?}",
        s.exports
    );
    assert!(
        s.exports
            .contains(&"default as RetryPolicy from ./retry".to_string())
    );
    assert!(s.exports.contains(&"default (Client)".to_string()));
    let imps = imports(&s);
    assert!(
        imps.contains(&("./models", vec!["Item", "Category"])),
        "{imps:?}"
    );
    assert!(imps.contains(&("./models", vec!["*"])), "{imps:?}");
    assert!(
        imps.contains(&("./retry", vec!["default", "backoff"])),
        "{imps:?}"
    );
}

#[test]
fn tsx_components_hooks_and_default_export() {
    let s = symbols_of("ItemList.tsx");
    assert_eq!(s.language, Language::TypeScript);
    let list = def(&s, "ItemList");
    assert_eq!(
        list.signature,
        "export default function ItemList({ items, currency, onSelect }: ItemListProps): JSX.Element"
    );
    assert!(list.exported);
    assert_eq!(
        def(&s, "useSorted").signature,
        "export function useSorted<T>(items: T[], key: (t: T) => string): T[]"
    );
    let row = def(&s, "Row");
    assert!(!row.exported);
    assert!(
        row.signature.starts_with("const Row = ({ item, currency }"),
        "{}",
        row.signature
    );
    assert_eq!(def(&s, "ItemListProps").kind, Kind::Interface);
    assert!(imports(&s).contains(&("../format", vec!["formatPrice"])));
}

#[test]
fn rust_impl_blocks_traits_generics_use_trees_and_re_exports() {
    let s = symbols_of("ledger.rs");
    assert_eq!(s.language, Language::Rust);
    // Comments inside a type are left out of its signature.
    assert_eq!(
        def(&s, "Account").signature,
        "pub struct Account { pub name: String, pub(crate) balance: Amount, }"
    );
    assert_eq!(def(&s, "PostError").kind, Kind::Enum);
    let journal = def(&s, "Journal");
    assert_eq!((journal.kind, journal.exported), (Kind::Trait, true));
    let record = def(&s, "record");
    assert_eq!(
        (record.kind, record.parent.as_str()),
        (Kind::Method, "Journal")
    );
    assert_eq!(
        record.signature,
        "fn record(&mut self, entry: &Entry) -> Result<(), PostError>"
    );
    assert_eq!(
        def(&s, "replay").signature,
        "fn replay<I>(&mut self, entries: I) -> Result<usize, PostError> where I: IntoIterator<Item = Entry>,"
    );
    let impls: Vec<&Definition> = s
        .definitions
        .iter()
        .filter(|d| d.kind == Kind::Impl)
        .collect();
    assert_eq!(impls.len(), 2);
    assert_eq!(impls[0].signature, "impl<J: Journal> Ledger<J>");
    assert_eq!(impls[1].signature, "impl<J: Journal> Display for Ledger<J>");
    let post = def(&s, "post");
    assert_eq!(
        (post.depth, post.parent.as_str(), post.line),
        (1, "Ledger<J>", 58)
    );
    assert_eq!(
        post.signature,
        "pub fn post(&mut self, entry: Entry) -> Result<(), PostError>"
    );
    assert!(!def(&s, "account_mut").exported);
    // Trait impl methods are public through the trait.
    assert!(def(&s, "fmt").exported);
    assert_eq!(
        def(&s, "settle").signature,
        "pub(crate) async fn settle<'a>(ledger: &'a mut Ledger, day: u32) -> Balances"
    );
    assert_eq!(def(&s, "Balances").kind, Kind::Type);
    // A function's inner items and `#[cfg(test)]` modules are not part of the map.
    assert!(!names(&s).contains(&"empty"), "{:?}", names(&s));
    assert!(!names(&s).contains(&"tests") && !names(&s).contains(&"posts"));
    let froms: Vec<&str> = s.imports.iter().map(|i| i.from.as_str()).collect();
    for want in [
        "self::entry",
        "self::report",
        "std::collections::BTreeMap",
        "std::collections::HashMap",
        "std::fmt",
        "std::fmt::Display",
        "crate::money::Amount",
        "crate::money::Currency",
        "super::audit::Trail",
        "entry::Entry",
        "entry::EntryKind",
    ] {
        assert!(froms.contains(&want), "{want} not in {froms:?}");
    }
    assert_eq!(s.exports, ["entry::Entry", "entry::EntryKind as Kind"]);
}

#[test]
fn go_structs_interfaces_methods_generics_and_import_groups() {
    let s = symbols_of("report.go");
    assert_eq!(s.language, Language::Go);
    assert_eq!(def(&s, "Format").signature, "type Format int");
    assert_eq!(def(&s, "Format").kind, Kind::Type);
    let renderer = def(&s, "Renderer");
    assert_eq!(renderer.kind, Kind::Interface);
    let name = def(&s, "Name");
    assert_eq!(
        (name.kind, name.parent.as_str(), name.signature.as_str()),
        (Kind::Method, "Renderer", "Name() string")
    );
    assert_eq!(
        def(&s, "Report").signature,
        "type Report struct { Title string Items []inventory.Item total money.Amount }"
    );
    let render: Vec<&Definition> = s
        .definitions
        .iter()
        .filter(|d| d.name == "Render")
        .collect();
    assert_eq!(render.len(), 2);
    assert_eq!(
        render[1].signature,
        "func (r *Report) Render(w io.Writer) error"
    );
    assert_eq!((render[1].parent.as_str(), render[1].depth), ("Report", 1));
    assert!(!def(&s, "lowStock").exported);
    assert_eq!(
        def(&s, "Map").signature,
        "func Map[T any, U any](in []T, f func(T) U) []U"
    );
    assert!(def(&s, "New").exported);
    let froms: Vec<&str> = s.imports.iter().map(|i| i.from.as_str()).collect();
    assert_eq!(
        froms,
        [
            "fmt",
            "io",
            "strings",
            "github.com/acme/shop/internal/inventory",
            "github.com/acme/shop/pkg/money"
        ]
    );
}

#[test]
fn an_export_at_the_very_start_of_a_file_keeps_its_keyword() {
    let s = extract(
        Grammar::TypeScript,
        b"export interface A { x: number }\nexport const f = (a: A): number => a.x;\n",
    )
    .unwrap();
    assert_eq!(
        s.definitions[0].signature,
        "export interface A { x: number }"
    );
    assert_eq!(
        s.definitions[1].signature,
        "export const f = (a: A): number =>"
    );
    let s = extract(Grammar::JavaScript, b"export default function main() {}\n").unwrap();
    assert_eq!(s.definitions[0].signature, "export default function main()");
}

#[test]
fn languages_come_from_extensions() {
    assert_eq!(crate::language_of("a/b.pyi"), Some(Language::Python));
    assert_eq!(crate::language_of("web/x.mjs"), Some(Language::JavaScript));
    assert_eq!(Grammar::of_path("web/x.tsx"), Some(Grammar::Tsx));
    assert_eq!(crate::language_of("web/x.tsx"), Some(Language::TypeScript));
    assert_eq!(crate::language_of("README.md"), None);
    assert_eq!(crate::language_of("Makefile"), None);
    assert_eq!(crate::language_of("dir.rs/file"), None);
}

// === Hostile input ===

#[test]
fn hostile_files_never_panic_and_stay_bounded() {
    let grammars = [
        Grammar::Python,
        Grammar::JavaScript,
        Grammar::TypeScript,
        Grammar::Tsx,
        Grammar::Rust,
        Grammar::Go,
    ];
    let mut inputs: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"\xff\xfe\xfd not utf-8 \xc3\x28 def f(\xff): pass\nfn \xe2\x82(".to_vec(),
        // A 2 MB line.
        {
            let mut v = b"def f(".to_vec();
            v.extend(std::iter::repeat_n(b'a', 2 << 20));
            v
        },
        // Deep nesting of every bracket.
        b"(".repeat(100_000),
        b"{".repeat(100_000),
        b"[".repeat(100_000),
        // Deeply nested definitions.
        (0..3000)
            .map(|i| format!("{}class C{i}:\n", " ".repeat(i)))
            .collect::<String>()
            .into_bytes(),
        "mod m { ".repeat(4000).into_bytes(),
        "namespace N { ".repeat(4000).into_bytes(),
    ];
    // Pseudo-random bytes.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..4 {
        inputs.push(
            (0..20_000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Printable-ish so that it is not taken for binary.
                    (x % 94) as u8 + 32
                })
                .collect(),
        );
    }
    for g in grammars {
        for input in &inputs {
            if let Ok(s) = extract(g, input) {
                assert!(s.definitions.len() <= MAX_DEFINITIONS);
                assert!(s.imports.len() <= MAX_IMPORTS);
                for d in &s.definitions {
                    assert!(d.signature.len() <= MAX_SIGNATURE, "{g:?}");
                    assert!(d.name.len() <= MAX_NAME, "{g:?}");
                    assert!(d.depth <= extract::MAX_DEPTH + 1, "{g:?}");
                }
            }
        }
    }
    // Very many definitions: the list stops at its limit and says so.
    let many: String = (0..3000)
        .map(|i| format!("def f{i}(x: int) -> int:\n    return x\n"))
        .collect();
    let many = extract(Grammar::Python, many.as_bytes()).unwrap();
    assert!(many.truncated && many.definitions.len() == MAX_DEFINITIONS);
    let many: String = (0..3000).map(|i| format!("pub fn f{i}() {{}}\n")).collect();
    let many = extract(Grammar::Rust, many.as_bytes()).unwrap();
    assert!(many.truncated && many.definitions.len() == MAX_DEFINITIONS);
    assert_eq!(
        extract(Grammar::Rust, b"fn main() {}\0\x01\x02"),
        Err(SkipReason::Binary)
    );
    // Invalid UTF-8 in a name becomes U+FFFD, and the rest is still found.
    let s = extract(Grammar::Python, b"def ok(): pass\ndef bad\xff(x): pass\n").unwrap();
    assert_eq!(s.definitions[0].name, "ok");
}

// === The index, from git ===

fn write(repo: &Path, path: &str, content: &[u8]) {
    let p = repo.join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

fn open(repo: &Path) -> zerg_git::Repo {
    zerg_git::Repo::open(repo).unwrap()
}

fn commit(repo: &Path, msg: &str) -> String {
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", msg]);
    git(repo, &["rev-parse", "HEAD"])
}

/// A small shop: Python, TypeScript, Rust and Go, plus files the index skips.
fn shop() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("shop");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    write(
        &repo,
        "inventory/__init__.py",
        b"from .models import Item\n",
    );
    write(&repo, "inventory/models.py", b"from dataclasses import dataclass\n\n\n@dataclass\nclass Item:\n    sku: str\n    price_cents: int\n\n    def label(self) -> str:\n        return self.sku\n");
    write(
        &repo,
        "inventory/service.py",
        fixture("inventory_service.py").as_bytes(),
    );
    write(&repo, "inventory/store.py", b"from .models import Item\nfrom . import pricing\n\n\nclass Store:\n    def add(self, item: Item) -> None:\n        pass\n");
    write(&repo, "inventory/pricing.py", b"from decimal import Decimal\n\n\ndef apply_discount(price: Decimal, percent: int) -> Decimal:\n    return price\n");
    write(&repo, "web/src/api.ts", fixture("api.ts").as_bytes());
    write(&repo, "web/src/models.ts", b"export interface Item { sku: string; priceCents: number }\nexport type Category = 'food' | 'tools';\n");
    write(
        &repo,
        "web/src/components/ItemList.tsx",
        fixture("ItemList.tsx").as_bytes(),
    );
    write(&repo, "web/src/format.ts", b"export function formatPrice(cents: number, currency: string): string {\n  return `${cents}`;\n}\n");
    write(
        &repo,
        "crates/ledger/src/lib.rs",
        fixture("ledger.rs").as_bytes(),
    );
    write(
        &repo,
        "crates/ledger/src/entry.rs",
        b"pub struct Entry { pub amount: i64 }\npub enum EntryKind { Debit, Credit }\n",
    );
    write(
        &repo,
        "crates/ledger/src/report.rs",
        b"use super::Ledger;\npub fn summary(l: &Ledger) -> String { String::new() }\n",
    );
    write(
        &repo,
        "tools/report/report.go",
        fixture("report.go").as_bytes(),
    );
    write(
        &repo,
        "internal/inventory/item.go",
        b"package inventory\n\ntype Item struct { SKU string }\n",
    );
    write(&repo, "README.md", b"# shop\n");
    write(&repo, "assets/logo.py", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR");
    write(&repo, "generated/big.py", &b"x = 1\n".repeat(2000));
    commit(&repo, "shop");
    (dir, repo)
}

fn small_files() -> Settings {
    Settings {
        max_file_bytes: 10_000,
        ..Settings::default()
    }
}

#[test]
fn an_index_is_built_from_a_commit_and_counts_what_it_skipped() {
    let (_d, repo) = shop();
    // A file changed in the working tree but not committed is not what the index sees.
    write(&repo, "inventory/pricing.py", b"def uncommitted(): pass\n");
    let (ix, stats) = build(&open(&repo), "HEAD", &small_files(), None).unwrap();
    assert_eq!(ix.commit(), git(&repo, &["rev-parse", "HEAD"]));
    let c = ix.counts();
    assert_eq!(
        c.indexed,
        14,
        "{:?}",
        ix.files().map(|(p, _)| p).collect::<Vec<_>>()
    );
    assert_eq!((c.other_language, c.binary, c.too_large), (1, 1, 1));
    assert_eq!(stats.parsed, 14);
    assert_eq!(ix.skipped("assets/logo.py"), Some(SkipReason::Binary));
    assert_eq!(ix.skipped("generated/big.py"), Some(SkipReason::TooLarge));
    assert_eq!(ix.skipped("README.md"), Some(SkipReason::OtherLanguage));
    let pricing = ix.get("inventory/pricing.py").unwrap();
    assert_eq!(pricing.definitions[0].name, "apply_discount");
    // Only the languages asked for.
    let py_only = Settings {
        languages: vec![Language::Python],
        ..small_files()
    };
    let (ix, _) = build(&open(&repo), "HEAD", &py_only, None).unwrap();
    assert!(ix.files().all(|(_, s)| s.language == Language::Python));
    assert_eq!(ix.counts().indexed, 5);
    // A revision that is not a commit, or looks like an option, is refused.
    assert!(build(&open(&repo), "--all", &py_only, None).is_err());
    assert!(build(&open(&repo), "no-such-branch", &py_only, None).is_err());
}

#[test]
fn the_cache_makes_a_second_index_parse_nothing_and_updates_parse_only_changes() {
    let (_d, repo) = shop();
    let cache = Cache::in_repo(&repo);
    let settings = small_files();
    let (first, s1) = build(&open(&repo), "HEAD", &settings, Some(&cache)).unwrap();
    assert_eq!((s1.parsed, s1.cached), (14, 0));
    // The cache hides itself from git.
    assert_eq!(
        git(&repo, &["status", "--porcelain", "--untracked-files=all"]),
        ""
    );
    let (second, s2) = build(&open(&repo), "HEAD", &settings, Some(&cache)).unwrap();
    assert_eq!((s2.parsed, s2.cached), (0, 14));
    assert_eq!(first, second);
    // A broken cache entry is parsed again, not trusted.
    let blob = git(&repo, &["rev-parse", "HEAD:inventory/models.py"]);
    let entry = cache
        .dir()
        .join(format!("v{}", cache::FORMAT))
        .join(&blob[..2])
        .join(format!("{}.python.json", &blob[2..]));
    std::fs::write(&entry, b"{\"language\": \"rust\", \"definitions\": 7").unwrap();
    let (third, s3) = build(&open(&repo), "HEAD", &settings, Some(&cache)).unwrap();
    assert_eq!((s3.parsed, s3.cached), (1, 13));
    assert_eq!(third, first);

    // One level later: a file changed, one added, one removed.
    write(&repo, "inventory/pricing.py", b"from decimal import Decimal\n\n\ndef apply_discount(price: Decimal, percent: int) -> Decimal:\n    return price\n\n\ndef round_cents(value: Decimal) -> int:\n    return int(value)\n");
    write(&repo, "web/src/cart.js", fixture("cart.js").as_bytes());
    std::fs::remove_file(repo.join("internal/inventory/item.go")).unwrap();
    let head = commit(&repo, "level 1");
    let (moved, s4) = update(&first, &open(&repo), &head, &settings, Some(&cache)).unwrap();
    assert_eq!((s4.parsed, s4.cached, s4.changed), (2, 0, 2));
    assert_eq!(s4.reused, 12);
    assert!(moved.get("internal/inventory/item.go").is_none());
    assert!(names(moved.get("inventory/pricing.py").unwrap()).contains(&"round_cents"));
    // An update gives exactly what a fresh build of the same commit gives.
    let (fresh, _) = build(&open(&repo), &head, &settings, None).unwrap();
    assert_eq!(moved, fresh);
    // Other settings mean a rebuild, never a mix.
    let (rebuilt, _) = update(
        &first,
        &open(&repo),
        &head,
        &Settings::default(),
        Some(&cache),
    )
    .unwrap();
    assert_eq!(rebuilt.skipped("generated/big.py"), None);
    assert!(rebuilt.get("generated/big.py").is_some());
}

#[test]
fn a_hostile_environment_does_not_redirect_the_index() {
    // `GIT_DIR` pointing elsewhere is ignored, as zergd ignores it.
    let (_d, repo) = shop();
    let (_d2, other) = shop();
    let settings = small_files();
    // The variable is set in a child process (this test binary, running `index_child`) only.
    let out = Command::new(std::env::current_exe().unwrap())
        .arg("--exact")
        .arg("tests::index_child")
        .arg("--nocapture")
        .env("ZERG_SYMBOLS_TEST_REPO", &repo)
        .env("GIT_DIR", other.join(".git"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let (ix, _) = build(&open(&repo), "HEAD", &settings, None).unwrap();
    assert!(text.contains(&format!("commit {}", ix.commit())), "{text}");
}

/// Run by [`a_hostile_environment_does_not_redirect_the_index`] in a child process.
#[test]
fn index_child() {
    let Some(repo) = std::env::var_os("ZERG_SYMBOLS_TEST_REPO") else {
        return;
    };
    let (ix, _) = build(&open(Path::new(&repo)), "HEAD", &small_files(), None).unwrap();
    println!("commit {}", ix.commit());
}

// === Import resolution ===

fn index_of(files: &[(&str, &str)]) -> SymbolIndex {
    let mut ix = SymbolIndex::new("");
    for (path, src) in files {
        let g = Grammar::of_path(path).unwrap();
        ix.insert(
            path,
            "0000000000000000000000000000000000000000",
            extract(g, src.as_bytes()).unwrap(),
        );
    }
    ix
}

fn resolved(ix: &SymbolIndex, path: &str) -> Vec<String> {
    resolve::imported_files(ix, path, ix.get(path).unwrap())
}

#[test]
fn imports_resolve_to_files_per_language() {
    let ix = index_of(&[
        ("src/shop/__init__.py", ""),
        ("src/shop/models.py", "class Item: pass\n"),
        ("src/shop/pricing.py", "def apply(): pass\n"),
        ("src/shop/api/__init__.py", ""),
        (
            "src/shop/api/views.py",
            "from ..models import Item\nfrom .. import pricing\nimport shop.models\nimport os\n",
        ),
        ("src/shop/core/db.py", "from shop.api import views\n"),
        (
            "web/src/api.ts",
            "import { x } from './models.js';\nimport y from '../lib';\nimport z from 'react';\nexport * from './util';\n",
        ),
        ("web/src/models.ts", ""),
        ("web/src/util/index.ts", ""),
        ("web/lib/index.js", ""),
        (
            "crates/a/src/lib.rs",
            "mod config;\nmod net;\nuse crate::net::http::Client;\nuse serde::Serialize;\n",
        ),
        (
            "crates/a/src/config.rs",
            "use super::net;\nuse self::inner::X;\n",
        ),
        ("crates/a/src/config/inner.rs", "pub struct X;\n"),
        ("crates/a/src/net/mod.rs", "pub mod http;\n"),
        (
            "crates/a/src/net/http.rs",
            "use super::super::config;\npub struct Client;\n",
        ),
        (
            "cmd/app/main.go",
            "package main\nimport (\n\"fmt\"\n\"github.com/acme/app/internal/auth\"\n)\n",
        ),
        ("internal/auth/auth.go", "package auth\n"),
        ("internal/auth/token.go", "package auth\n"),
        ("internal/auth/auth_test.go", "package auth\n"),
    ]);
    assert_eq!(
        resolved(&ix, "src/shop/api/views.py"),
        [
            "src/shop/models.py",
            "src/shop/pricing.py",
            "src/shop/__init__.py"
        ]
    );
    assert_eq!(
        resolved(&ix, "src/shop/core/db.py"),
        ["src/shop/api/views.py", "src/shop/api/__init__.py"]
    );
    assert_eq!(
        resolved(&ix, "web/src/api.ts"),
        [
            "web/src/models.ts",
            "web/lib/index.js",
            "web/src/util/index.ts"
        ]
    );
    assert_eq!(
        resolved(&ix, "crates/a/src/lib.rs"),
        [
            "crates/a/src/config.rs",
            "crates/a/src/net/mod.rs",
            "crates/a/src/net/http.rs"
        ]
    );
    assert_eq!(
        resolved(&ix, "crates/a/src/config.rs"),
        ["crates/a/src/net/mod.rs", "crates/a/src/config/inner.rs"]
    );
    assert_eq!(
        resolved(&ix, "crates/a/src/net/http.rs"),
        ["crates/a/src/config.rs"]
    );
    assert_eq!(
        resolved(&ix, "cmd/app/main.go"),
        ["internal/auth/auth.go", "internal/auth/token.go"]
    );
}

// === The section of a task ===

fn files(create: &[&str], modify: &[&str], read: &[&str]) -> Files {
    let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
    Files {
        create: v(create),
        modify: v(modify),
        read: v(read),
    }
}

fn headings(section: &str) -> Vec<&str> {
    section
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .collect()
}

#[test]
fn a_section_has_the_task_files_then_what_they_import() {
    let (_d, repo) = shop();
    let (ix, _) = build(&open(&repo), "HEAD", &small_files(), None).unwrap();
    let s = task_section(
        &ix,
        &files(&[], &["inventory/store.py"], &["inventory/pricing.py"]),
        4096,
    );
    assert!(s.starts_with("## Relevant Symbols\n"), "{s}");
    assert_eq!(
        headings(&s),
        [
            "inventory/store.py (modified)",
            "inventory/pricing.py (read)",
            "inventory/models.py (imported by inventory/store.py)",
        ]
    );
    assert!(
        s.contains("- L5 class Store\n  - L6 def add(self, item: Item) -> None\n"),
        "{s}"
    );
    assert!(
        s.contains("- L4 def apply_discount(price: Decimal, percent: int) -> Decimal\n"),
        "{s}"
    );
    assert!(s.contains("- L5 @dataclass class Item\n"), "{s}");
    // A Python-only task sees nothing of the other languages.
    for other in [
        "web/",
        "crates/",
        "tools/",
        "internal/",
        "formatPrice",
        "Ledger",
    ] {
        assert!(!s.contains(other), "{other} in {s}");
    }
    // A read directory brings what is under it.
    let s = task_section(&ix, &files(&[], &[], &["crates/ledger/"]), 4096);
    assert!(
        headings(&s).contains(&"crates/ledger/src/entry.rs (in crates/ledger/)"),
        "{s}"
    );
    // A task that only creates files sees the files beside them, in its language only.
    let s = task_section(&ix, &files(&["web/src/cart.ts"], &[], &[]), 4096);
    let h = headings(&s);
    assert!(
        h.contains(&"web/src/format.ts (beside web/src/cart.ts)"),
        "{s}"
    );
    assert!(
        h.iter()
            .all(|h| h.strip_prefix("web/src/").is_some_and(|rest| !rest
                .split(' ')
                .next()
                .unwrap()
                .contains('/'))),
        "{h:?}"
    );
    assert!(!s.contains("components/"), "{s}");
    let s = task_section(
        &ix,
        &files(&["inventory/reports/weekly.py"], &[], &[]),
        4096,
    );
    assert!(
        headings(&s)
            .iter()
            .all(|h| h.starts_with("inventory/") && h.contains(".py")),
        "{s}"
    );
    assert!(!headings(&s).is_empty());
    // Nothing to show: no section.
    assert_eq!(
        task_section(&ix, &files(&[], &["README.md"], &[]), 4096),
        ""
    );
    assert_eq!(
        task_section(&SymbolIndex::default(), &files(&[], &["a.py"], &[]), 4096),
        ""
    );
}

#[test]
fn a_section_keeps_to_its_budget_and_ranks_what_it_keeps() {
    let (_d, repo) = shop();
    let (ix, _) = build(&open(&repo), "HEAD", &small_files(), None).unwrap();
    let task = files(
        &[],
        &["inventory/service.py"],
        &["web/src/", "crates/ledger/src/lib.rs"],
    );
    let full = task_section(&ix, &task, 1 << 20);
    assert!(!full.contains("more symbols left out"), "{full}");
    let mut last_len = 0;
    for budget in [300, 400, 600, 1000, 2000, 4096, 8000] {
        let s = task_section(&ix, &task, budget);
        assert!(s.len() <= budget, "{budget}: {} bytes", s.len());
        assert!(s.len() >= last_len, "a larger budget never shows less");
        last_len = s.len();
        if s.is_empty() {
            continue;
        }
        // The modified file comes first, its top level before its methods.
        assert_eq!(headings(&s)[0], "inventory/service.py (modified)", "{s}");
        assert!(s.contains("- L42 class InventoryService"), "{budget}: {s}");
        if budget >= 600 {
            assert!(
                s.contains("- L24 @dataclass(frozen=True) class Reservation"),
                "{budget}: {s}"
            );
        }
        if budget < 4096 {
            assert!(s.contains("more symbols left out"), "{budget}: {s}");
        }
    }
    let s = task_section(&ix, &task, 1000);
    assert!(s.contains("- L64 def restock("), "{s}");
    // Too small for anything: no section rather than a heading alone.
    assert_eq!(task_section(&ix, &task, 100), "");
}
