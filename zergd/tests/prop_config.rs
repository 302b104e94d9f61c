//! Property tests of `.zerg/config.yaml` parsing ([`Config::parse`]): whatever the text, the
//! parser returns instead of panicking; a generated valid config parses to the values written;
//! and a value of the wrong type under any key is an error that names the key path.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config as RunnerConfig;
use serde_yaml::{Mapping, Value};
use zergd::config::{BackoffStrategy, ByteSize, Config, ConfigError};

/// `cases` cases, or `PROPTEST_CASES` when it is set (for a longer run by hand).
fn runner(cases: u32) -> RunnerConfig {
    RunnerConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(cases),
        // Shrunk failures are printed; no regression files are written into the tree.
        failure_persistence: None,
        ..RunnerConfig::default()
    }
}

/// Parses `text`; any outcome but a panic is fine, and an error names the file.
fn parse_checked(text: &str) -> Result<Config, String> {
    match Config::parse(text, "cfg/config.yaml") {
        Ok((config, warnings)) => {
            assert!(warnings.iter().all(|w| w.starts_with("cfg/config.yaml: ")));
            Ok(config)
        }
        Err(e @ ConfigError::Invalid { .. }) => {
            let shown = e.to_string();
            assert!(shown.starts_with("cfg/config.yaml: "), "{shown}");
            Err(shown)
        }
        Err(ConfigError::Io { .. }) => panic!("parse does no I/O"),
    }
}

// ------------------------------------------------------------------------------------------
// The keys
// ------------------------------------------------------------------------------------------

/// The type of a config key, for generating good and bad values.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// A count (`u32`).
    Count,
    /// Seconds that must be positive.
    Seconds,
    /// Seconds that may be zero.
    SecondsOrZero,
    Bool,
    Strategy,
    /// A string that may be absent.
    Text,
    /// A list of strings (the agent's argv).
    Argv,
    Memory,
    /// `resources.container_cpu_limit`: a positive number.
    Cpus,
    /// `resources.container_pids_limit`: an `i64`.
    Pids,
}

/// Every key this engine reads (sections and names), with its type. The heartbeat pair and
/// the quality gates are generated separately, as they constrain each other.
const KEYS: &[(&str, &str, Kind)] = &[
    ("workers", "retry_attempts", Kind::Count),
    ("workers", "backoff_strategy", Kind::Strategy),
    ("workers", "backoff_base_seconds", Kind::Seconds),
    ("workers", "backoff_max_seconds", Kind::Seconds),
    ("workers", "spawn_retry_attempts", Kind::Count),
    ("workers", "spawn_backoff_strategy", Kind::Strategy),
    ("workers", "spawn_backoff_base_seconds", Kind::Seconds),
    ("workers", "spawn_backoff_max_seconds", Kind::Seconds),
    ("workers", "task_stale_timeout_seconds", Kind::Seconds),
    ("workers", "auto_respawn", Kind::Bool),
    ("workers", "max_respawn_attempts", Kind::Count),
    ("workers", "respawn_window_seconds", Kind::Seconds),
    ("workers", "spawn_ready_timeout_seconds", Kind::Seconds),
    ("workers", "stop_grace_seconds", Kind::SecondsOrZero),
    ("workers", "reconcile_interval_seconds", Kind::Seconds),
    ("workers", "max_concurrent", Kind::Count),
    ("workers", "launcher_type", Kind::Text),
    ("resilience", "enabled", Kind::Bool),
    ("agent", "command", Kind::Argv),
    ("agent", "timeout_seconds", Kind::Seconds),
    ("verification_tiers", "tier1_blocking", Kind::Bool),
    ("verification_tiers", "tier1_command", Kind::Text),
    ("verification_tiers", "tier2_blocking", Kind::Bool),
    ("verification_tiers", "tier3_command", Kind::Text),
    ("verification_tiers", "timeout_seconds", Kind::Seconds),
    ("container", "image", Kind::Text),
    ("container", "network", Kind::Text),
    ("resources", "container_memory_limit", Kind::Memory),
    ("resources", "container_cpu_limit", Kind::Cpus),
    ("resources", "container_pids_limit", Kind::Pids),
];

/// A good value of `kind` and what it must parse to, as text for comparison.
fn good_value(kind: Kind) -> BoxedStrategy<(Value, String)> {
    match kind {
        Kind::Count => any::<u32>()
            .prop_map(|n| (Value::from(n), n.to_string()))
            .boxed(),
        Kind::Seconds | Kind::SecondsOrZero => {
            let low = if kind == Kind::Seconds { 1 } else { 0 };
            prop_oneof![
                (low..=1_000_000u64).prop_map(|n| (Value::from(n), format!("{:?}", secs(n)))),
                (0.001f64..1e6)
                    .prop_map(|f| (Value::from(f), format!("{:?}", Duration::from_secs_f64(f)))),
            ]
            .boxed()
        }
        Kind::Bool => any::<bool>()
            .prop_map(|b| (Value::from(b), b.to_string()))
            .boxed(),
        Kind::Strategy => prop_oneof![
            Just(BackoffStrategy::Exponential),
            Just(BackoffStrategy::Linear),
            Just(BackoffStrategy::Fixed),
        ]
        .prop_map(|s| {
            let name = format!("{s:?}").to_lowercase();
            (Value::from(name), format!("{s:?}"))
        })
        .boxed(),
        Kind::Text => "[ -~]{1,20}"
            .prop_filter("blank", |s| !s.trim().is_empty())
            .prop_map(|s| (Value::from(s.clone()), s))
            .boxed(),
        Kind::Argv => prop::collection::vec("[a-z][a-z0-9=_-]{0,10}", 1..4)
            .prop_map(|argv| {
                let shown = format!("{argv:?}");
                (
                    Value::Sequence(argv.into_iter().map(Value::from).collect()),
                    shown,
                )
            })
            .boxed(),
        Kind::Memory => (
            1u32..=1024,
            prop_oneof![
                Just(("", 1i64)),
                Just(("k", 1 << 10)),
                Just(("m", 1 << 20)),
                Just(("g", 1 << 30)),
                Just(("KB", 1 << 10)),
                Just(("M", 1 << 20)),
            ],
        )
            .prop_map(|(n, (unit, mult))| {
                let bytes = i64::from(n) * mult;
                (
                    Value::from(format!("{n}{unit}")),
                    format!("{:?}", ByteSize(bytes)),
                )
            })
            .boxed(),
        Kind::Cpus => (0.01f64..256.0)
            .prop_map(|f| (Value::from(f), format!("{f:?}")))
            .boxed(),
        Kind::Pids => any::<i64>()
            .prop_map(|n| (Value::from(n), n.to_string()))
            .boxed(),
    }
}

/// A value of the wrong type (or out of range) for `kind`.
fn bad_value(kind: Kind) -> BoxedStrategy<Value> {
    let list = Just(Value::Sequence(vec![Value::from(1)]));
    let map = Just(Value::Mapping(Mapping::from_iter([(
        Value::from("a"),
        Value::from(1),
    )])));
    let word = "[a-z]{3,8}".prop_map(|w| Value::from(format!("not-{w}")));
    match kind {
        Kind::Count => prop_oneof![
            list,
            map,
            word,
            (i64::MIN..0).prop_map(Value::from),
            (u64::from(u32::MAX) + 1..=u64::MAX).prop_map(Value::from),
            Just(Value::from(1.5)),
        ]
        .boxed(),
        Kind::Seconds | Kind::SecondsOrZero => prop_oneof![
            list,
            map,
            word,
            (i64::MIN..0).prop_map(Value::from),
            (-1e9f64..-0.001).prop_map(Value::from),
            Just(Value::from(f64::INFINITY)),
            Just(Value::from(f64::NAN)),
        ]
        .boxed(),
        Kind::Bool => prop_oneof![list, map, word, Just(Value::from(1))].boxed(),
        Kind::Strategy => prop_oneof![list, map, word, Just(Value::from(2))].boxed(),
        Kind::Text | Kind::Argv => prop_oneof![
            map,
            list.prop_map(move |l| match kind {
                // A list of lists: wrong for argv as well.
                Kind::Argv => Value::Sequence(vec![l]),
                _ => l,
            })
        ]
        .boxed(),
        Kind::Memory => prop_oneof![
            list,
            map,
            word,
            Just(Value::from(0)),
            (i64::MIN..0).prop_map(Value::from),
        ]
        .boxed(),
        Kind::Cpus => prop_oneof![list, map, word].boxed(),
        Kind::Pids => prop_oneof![list, map, word, Just(Value::from(1.5))].boxed(),
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The parsed value under `section.key`, as text, for comparison with what was written.
fn read_back(c: &Config, section: &str, key: &str) -> String {
    let w = &c.workers;
    let v = &c.verification_tiers;
    match (section, key) {
        ("workers", "retry_attempts") => w.retry_attempts.to_string(),
        ("workers", "backoff_strategy") => format!("{:?}", w.backoff_strategy),
        ("workers", "backoff_base_seconds") => format!("{:?}", w.backoff_base_seconds),
        ("workers", "backoff_max_seconds") => format!("{:?}", w.backoff_max_seconds),
        ("workers", "spawn_retry_attempts") => w.spawn_retry_attempts.to_string(),
        ("workers", "spawn_backoff_strategy") => format!("{:?}", w.spawn_backoff_strategy),
        ("workers", "spawn_backoff_base_seconds") => {
            format!("{:?}", w.spawn_backoff_base_seconds)
        }
        ("workers", "spawn_backoff_max_seconds") => format!("{:?}", w.spawn_backoff_max_seconds),
        ("workers", "task_stale_timeout_seconds") => {
            format!("{:?}", w.task_stale_timeout_seconds)
        }
        ("workers", "auto_respawn") => w.auto_respawn.to_string(),
        ("workers", "max_respawn_attempts") => w.max_respawn_attempts.to_string(),
        ("workers", "respawn_window_seconds") => format!("{:?}", w.respawn_window_seconds),
        ("workers", "spawn_ready_timeout_seconds") => {
            format!("{:?}", w.spawn_ready_timeout_seconds)
        }
        ("workers", "stop_grace_seconds") => format!("{:?}", w.stop_grace_seconds),
        ("workers", "reconcile_interval_seconds") => {
            format!("{:?}", w.reconcile_interval_seconds)
        }
        ("workers", "max_concurrent") => {
            w.max_concurrent.map(|n| n.to_string()).unwrap_or_default()
        }
        ("workers", "launcher_type") => w.launcher_type.clone().unwrap_or_default(),
        ("resilience", "enabled") => c.resilience.enabled.to_string(),
        ("agent", "command") => format!("{:?}", c.agent.command),
        ("agent", "timeout_seconds") => format!("{:?}", c.agent.timeout_seconds),
        ("verification_tiers", "tier1_blocking") => v.tier1_blocking.to_string(),
        ("verification_tiers", "tier1_command") => v.tier1_command.clone().unwrap_or_default(),
        ("verification_tiers", "tier2_blocking") => v.tier2_blocking.to_string(),
        ("verification_tiers", "tier3_command") => v.tier3_command.clone().unwrap_or_default(),
        ("verification_tiers", "timeout_seconds") => format!("{:?}", v.timeout_seconds),
        ("container", "image") => c.container.image.clone(),
        ("container", "network") => c.container.network.clone(),
        ("resources", "container_memory_limit") => {
            format!("{:?}", c.resources.container_memory_limit)
        }
        ("resources", "container_cpu_limit") => format!("{:?}", c.resources.container_cpu_limit),
        ("resources", "container_pids_limit") => c.resources.container_pids_limit.to_string(),
        other => panic!("no read-back for {other:?}"),
    }
}

// ------------------------------------------------------------------------------------------
// Generated configs
// ------------------------------------------------------------------------------------------

/// A generated valid config: the document and, per key written, the expected value.
#[derive(Debug, Clone)]
struct GenConfig {
    doc: BTreeMap<String, BTreeMap<String, Value>>,
    expected: Vec<(&'static str, &'static str, String)>,
    gates: Vec<(String, String, bool, u64)>,
    heartbeat: Option<(u64, u64)>,
}

impl GenConfig {
    fn to_value(&self) -> Value {
        let mut root = Mapping::new();
        for (section, keys) in &self.doc {
            let m: Mapping = keys
                .iter()
                .map(|(k, v)| (Value::from(k.clone()), v.clone()))
                .collect();
            root.insert(Value::from(section.clone()), Value::Mapping(m));
        }
        if !self.gates.is_empty() {
            let gates = self
                .gates
                .iter()
                .map(|(name, command, required, timeout)| {
                    Value::Mapping(Mapping::from_iter([
                        (Value::from("name"), Value::from(name.clone())),
                        (Value::from("command"), Value::from(command.clone())),
                        (Value::from("required"), Value::from(*required)),
                        (Value::from("timeout"), Value::from(*timeout)),
                    ]))
                })
                .collect();
            root.insert(Value::from("quality_gates"), Value::Sequence(gates));
        }
        Value::Mapping(root)
    }

    fn to_text(&self) -> String {
        serde_yaml::to_string(&self.to_value()).expect("a generated config serialises")
    }
}

fn valid_config() -> impl Strategy<Value = GenConfig> {
    let entries: Vec<_> = KEYS
        .iter()
        .map(|&(section, key, kind)| {
            prop::option::weighted(0.6, good_value(kind)).prop_map(move |v| (section, key, v))
        })
        .collect();
    let gate = (
        "[a-z][a-z0-9 _-]{0,12}",
        "[a-z][ -~]{0,20}",
        any::<bool>(),
        1u64..100_000,
    );
    (
        entries,
        prop::collection::vec(gate, 0..3),
        prop::option::of((1u64..1000, 1u64..1000)),
    )
        .prop_map(|(entries, gates, heartbeat)| {
            let mut doc: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
            let mut expected = Vec::new();
            for (section, key, v) in entries {
                if let Some((value, shown)) = v {
                    doc.entry(section.to_owned())
                        .or_default()
                        .insert(key.to_owned(), value);
                    expected.push((section, key, shown));
                }
            }
            if let Some((interval, extra)) = heartbeat {
                let w = doc.entry("workers".to_owned()).or_default();
                w.insert("heartbeat_interval_seconds".into(), Value::from(interval));
                w.insert(
                    "heartbeat_stale_threshold".into(),
                    Value::from(interval + extra),
                );
            }
            GenConfig {
                doc,
                expected,
                gates,
                heartbeat: heartbeat.map(|(i, e)| (i, i + e)),
            }
        })
}

proptest! {
    #![proptest_config(runner(128))]

    #[test]
    fn generated_valid_configs_parse_to_the_values_written(g in valid_config()) {
        let text = g.to_text();
        let c = match parse_checked(&text) {
            Ok(c) => c,
            Err(e) => return Err(TestCaseError::fail(format!("refused: {e}\n{text}"))),
        };
        for (section, key, want) in &g.expected {
            prop_assert_eq!(&read_back(&c, section, key), want, "{}.{}", section, key);
        }
        if let Some((interval, threshold)) = g.heartbeat {
            prop_assert_eq!(c.workers.heartbeat_interval_seconds, secs(interval));
            prop_assert_eq!(c.workers.heartbeat_stale_threshold, secs(threshold));
        }
        prop_assert_eq!(c.quality_gates.len(), g.gates.len());
        for (read, (name, command, required, timeout)) in c.quality_gates.iter().zip(&g.gates) {
            prop_assert_eq!(&read.name, name);
            prop_assert_eq!(&read.command, command);
            prop_assert_eq!(read.required, *required);
            prop_assert_eq!(read.timeout, secs(*timeout));
        }
    }

    #[test]
    fn a_wrong_type_names_the_key_path(
        (g, which, value) in (valid_config(), 0..KEYS.len()).prop_flat_map(|(g, which)| {
            (Just(g), Just(which), bad_value(KEYS[which].2))
        }),
        flow in any::<bool>(),
    ) {
        let (section, key, _) = KEYS[which];
        let mut g = g;
        g.doc.entry(section.to_owned()).or_default().insert(key.to_owned(), value.clone());
        let text = if flow {
            // The same document in flow style, to vary the text the parser sees.
            serde_json::to_string(&g.to_value()).expect("JSON is YAML")
        } else {
            g.to_text()
        };
        match parse_checked(&text) {
            Ok(_) => return Err(TestCaseError::fail(format!(
                "{section}.{key} = {value:?} was accepted\n{text}"
            ))),
            Err(e) => prop_assert!(
                e.contains(&format!("{section}.{key}")),
                "{}.{} = {:?}: the error does not name the key: {}", section, key, value, e
            ),
        }
    }

    #[test]
    fn a_wrong_type_in_a_quality_gate_names_its_index(
        g in valid_config(),
        field in prop_oneof![Just("name"), Just("command"), Just("required"), Just("timeout")],
        bad in prop_oneof![
            Just(Value::Sequence(vec![Value::from(1)])),
            Just(Value::Mapping(Mapping::from_iter([(Value::from("a"), Value::from(1))]))),
        ],
    ) {
        let mut v = g.to_value();
        let gate = Value::Mapping(Mapping::from_iter([
            (Value::from("name"), Value::from("g")),
            (Value::from("command"), Value::from("true")),
            (Value::from(field), bad),
        ]));
        let root = v.as_mapping_mut().expect("a mapping");
        let mut gates = match root.remove("quality_gates") {
            Some(Value::Sequence(s)) => s,
            _ => Vec::new(),
        };
        let i = gates.len();
        gates.push(gate);
        root.insert(Value::from("quality_gates"), Value::Sequence(gates));
        let text = serde_yaml::to_string(&v).expect("serialises");
        match parse_checked(&text) {
            Ok(_) => return Err(TestCaseError::fail(format!("accepted:\n{text}"))),
            Err(e) => prop_assert!(
                e.contains(&format!("quality_gates[{i}].{field}")),
                "the error does not name quality_gates[{}].{}: {}", i, field, e
            ),
        }
    }
}

// ------------------------------------------------------------------------------------------
// Arbitrary text
// ------------------------------------------------------------------------------------------

/// YAML-ish text: lines of known and unknown keys at several depths, with scalars chosen to
/// sit on the edges of the value types (huge, tiny, negative, infinite, not a number, tagged,
/// anchors and aliases, bad indentation).
fn yaml_ish() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("workers".to_owned()),
        Just("agent".to_owned()),
        Just("resources".to_owned()),
        Just("quality_gates".to_owned()),
        Just("verification_tiers".to_owned()),
        Just("project".to_owned()),
        prop::sample::select(KEYS).prop_map(|(_, k, _)| k.to_owned()),
        Just("heartbeat_interval_seconds".to_owned()),
        Just("heartbeat_stale_threshold".to_owned()),
        Just("timeout".to_owned()),
        "[a-z_]{1,8}",
    ];
    let scalar = prop_oneof![
        Just("1".to_owned()),
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("1.5".to_owned()),
        Just("1e30".to_owned()),
        Just("1e308".to_owned()),
        Just("1e-30".to_owned()),
        Just("18446744073709551615".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("-9223372036854775808".to_owned()),
        Just(".inf".to_owned()),
        Just("-.inf".to_owned()),
        Just(".nan".to_owned()),
        Just("nan".to_owned()),
        Just("inf".to_owned()),
        Just("4g".to_owned()),
        Just("1e-30g".to_owned()),
        Just("0.0001k".to_owned()),
        Just("9e18t".to_owned()),
        Just("~".to_owned()),
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("yes".to_owned()),
        Just("'x'".to_owned()),
        Just("\"\\u0000\"".to_owned()),
        Just("[]".to_owned()),
        Just("{}".to_owned()),
        Just("[a, 1]".to_owned()),
        Just("&a 1".to_owned()),
        Just("*a".to_owned()),
        Just("!!str 5".to_owned()),
        Just("!!binary aGk=".to_owned()),
        Just("!custom x".to_owned()),
        Just("exponential".to_owned()),
        Just("|\n  block".to_owned()),
        "[ -~]{0,8}",
    ];
    // Known keys under their own sections, so that the scalars reach the value parsers.
    let entry = (prop::sample::select(KEYS), scalar.clone());
    let structured = prop::collection::vec(entry, 0..12).prop_map(|entries| {
        let mut sections: Vec<(&str, Vec<String>)> = Vec::new();
        for ((section, key, _), v) in entries {
            let line = format!("  {key}: {v}");
            match sections.iter_mut().find(|(s, _)| *s == section) {
                Some((_, lines)) => lines.push(line),
                None => sections.push((section, vec![line])),
            }
        }
        sections
            .into_iter()
            .map(|(s, lines)| format!("{s}:\n{}\n", lines.join("\n")))
            .collect::<String>()
    });
    let line = (0usize..4, any::<bool>(), key, scalar).prop_map(|(depth, dash, k, v)| {
        let indent = "  ".repeat(depth);
        let dash = if dash { "- " } else { "" };
        format!("{indent}{dash}{k}: {v}")
    });
    prop_oneof![
        2 => structured,
        1 => prop::collection::vec(line, 0..24).prop_map(|l| l.join("\n")),
        1 => "[a-z_:{}\\[\\],&*!|>'\"#.0-9 \n-]{0,200}",
        1 => any::<String>(),
    ]
}

proptest! {
    #![proptest_config(runner(256))]

    #[test]
    fn yaml_ish_text_never_panics(text in yaml_ish()) {
        let _ = parse_checked(&text);
    }

    #[test]
    fn any_scalar_under_any_key_never_panics(
        which in any::<Index>(),
        value in prop_oneof![
            any::<f64>().prop_map(|f| format!("{f:e}")),
            any::<f64>().prop_map(|f| format!("{f}")),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            (any::<f64>(), prop::sample::select(vec!["", "b", "k", "m", "g", "t", "kb", "TB"]))
                .prop_map(|(f, u)| format!("{f}{u}")),
            "[ -~]{0,12}".prop_map(|s| format!("{s:?}")),
        ],
    ) {
        let (section, key, _) = *which.get(KEYS);
        let _ = parse_checked(&format!("{section}:\n  {key}: {value}\n"));
    }
}

/// Outcome of parsing `key: value` under `section`: `None` when it is fine (refused naming the
/// key, or accepted with a value `usable` approves), else what is wrong.
fn edge_problem(
    section: &str,
    key: &str,
    value: &str,
    usable: impl Fn(&Config) -> bool,
) -> Option<String> {
    let text = format!("{section}:\n  {key}: {value}\n");
    let outcome = std::panic::catch_unwind(|| Config::parse(&text, "c.yaml"));
    match outcome {
        Err(_) => Some(format!("{section}.{key}: {value}: panicked")),
        Ok(Err(e)) if !e.to_string().contains(&format!("{section}.{key}")) => Some(format!(
            "{section}.{key}: {value}: the error does not name the key: {e}"
        )),
        Ok(Err(_)) => None,
        Ok(Ok((c, _))) if !usable(&c) => Some(format!(
            "{section}.{key}: {value}: accepted as an unusable value"
        )),
        Ok(Ok(_)) => None,
    }
}

fn seconds_keys() -> impl Iterator<Item = (&'static str, &'static str)> {
    KEYS.iter()
        .filter(|(_, _, kind)| matches!(kind, Kind::Seconds | Kind::SecondsOrZero))
        .map(|&(section, key, _)| (section, key))
}

/// Values on the edges of the float type under every key that holds seconds: each is either
/// accepted or refused with the key named, never a panic.
#[test]
fn edge_seconds_are_accepted_or_refused_naming_the_key() {
    let failures: Vec<String> = seconds_keys()
        .flat_map(|(section, key)| {
            [
                "1e-300", "5e-324", "-0", "0.0", "-0.0", ".nan", ".inf", "-.inf", "nan", "inf",
                "1e19", "0x10", "1_000",
            ]
            .into_iter()
            .filter_map(move |v| edge_problem(section, key, v, |_| true))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Seconds too many for a `Duration` (2^64 and more) are refused naming the key: a plain
/// `Duration::from_secs_f64` would panic on them.
#[test]
fn huge_seconds_are_refused_naming_the_key() {
    let failures: Vec<String> = seconds_keys()
        .flat_map(|(section, key)| {
            [
                "1.8446744073709552e19",
                "1e30",
                "1e300",
                "1.7976931348623157e308",
            ]
            .into_iter()
            .filter_map(move |v| edge_problem(section, key, v, |_| true))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Sizes of a byte or more are accepted; anything else is refused naming the key.
#[test]
fn edge_memory_limits_are_accepted_or_refused_naming_the_key() {
    let positive = |c: &Config| c.resources.container_memory_limit.0 > 0;
    let failures: Vec<String> = [
        "1", "1b", "0.5k", "1e3", "4g", "8t", "0", "-1", "-0", "0k", "-1g", "'x'", ".inf", "k", "",
    ]
    .into_iter()
    .filter_map(|v| edge_problem("resources", "container_memory_limit", v, positive))
    .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `nan` and sizes below one byte are refused: as 0 bytes they would reach Docker as "no
/// limit".
#[test]
fn memory_limits_of_no_bytes_are_refused() {
    let positive = |c: &Config| c.resources.container_memory_limit.0 > 0;
    let failures: Vec<String> = ["nan", "nank", "NaNg", "1e-30g", "0.0001k", "0.5"]
        .into_iter()
        .filter_map(|v| edge_problem("resources", "container_memory_limit", v, positive))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
