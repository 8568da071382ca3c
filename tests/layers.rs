//! The module boundaries, checked from the source: imports point one way
//! (reactor → http → api → governor, with the leaves below what uses them)
//! and no module imports another that imports it back. Also the one build
//! step every configuration passes through, seen from the command line.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::*;

/// Each top-level module and the ones it may import. Anything not listed
/// is refused, so a new edge is a decision written down here.
const ALLOWED: &[(&str, &[&str])] = &[
    ("time", &[]),
    ("ct", &[]),
    ("calendar", &[]),
    ("metrics", &[]),
    ("files", &[]),
    ("stdio", &[]),
    ("config", &["files", "net"]),
    ("state", &["config", "governor", "time"]),
    ("wheel", &["time"]),
    ("http", &["calendar", "time"]),
    ("governor", &["ct", "time", "wheel"]),
    ("report", &["calendar", "governor", "time"]),
    ("access", &["config", "files", "http", "time", "wheel"]),
    ("accesslog", &["calendar", "http", "stdio", "time"]),
    (
        "api",
        &["access", "ct", "accesslog", "config", "governor", "http", "metrics", "report", "state", "time", "wheel"],
    ),
    ("dashboard", &["api", "ct", "governor", "http", "time"]),
    ("net", &["files", "time"]),
    ("proxy", &["api", "config", "governor", "http", "metrics", "net", "report", "time"]),
    (
        "server",
        &[
            "accesslog",
            "api",
            "config",
            "dashboard",
            "http",
            "metrics",
            "net",
            "proxy",
            "state",
            "stdio",
            "time",
            "wheel",
        ],
    ),
];

/// Every module of `src/` by path (`governor::pool`), with its source
/// outside `#[cfg(test)]` blocks and comments.
fn modules() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&root).unwrap().with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                parts.pop();
            }
            if parts.last().is_some_and(|p| p == "tests") {
                continue;
            }
            out.insert(parts.join("::"), code_of(&std::fs::read_to_string(&path).unwrap()));
        }
    }
    out
}

/// The source without comments and without its `#[cfg(test)]` items.
fn code_of(text: &str) -> String {
    let mut code = String::new();
    let mut skip_depth: Option<i32> = None;
    let mut depth = 0i32;
    let mut test_next = false;
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or("");
        let trimmed = line.trim();
        if trimmed.starts_with("#[cfg(test)]") {
            test_next = true;
            continue;
        }
        let opens = line.matches('{').count() as i32;
        let closes = line.matches('}').count() as i32;
        if test_next && !trimmed.is_empty() {
            test_next = false;
            if opens > closes {
                skip_depth = Some(depth);
            } else {
                // A one-line item (`mod tests;`, a `use`): skip it alone.
                continue;
            }
        }
        depth += opens - closes;
        if let Some(d) = skip_depth {
            if depth <= d {
                skip_depth = None;
            }
            continue;
        }
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// The modules `module` imports (by `crate::` and `super::` paths), each
/// resolved to the longest module path it names.
fn imports(module: &str, code: &str, all: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':') {
                continue;
            }
            let path: String =
                code[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
            let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
            let mut base: Vec<&str> = if module.is_empty() { vec![] } else { module.split("::").collect() };
            if segs[0] == "crate" {
                base.clear();
                segs.remove(0);
            } else {
                while segs.first() == Some(&"super") {
                    base.pop();
                    segs.remove(0);
                }
            }
            let mut target = None;
            for n in 0..=segs.len() {
                let candidate = base.iter().chain(&segs[..n]).copied().collect::<Vec<_>>().join("::");
                if all.contains_key(&candidate) {
                    target = Some(candidate);
                }
            }
            if let Some(t) = target.filter(|t| t != module) {
                out.insert(t);
            }
        }
    }
    out
}

fn top(module: &str) -> &str {
    module.split("::").next().unwrap_or("")
}

#[test]
fn top_level_modules_import_only_the_layers_below_them() {
    let all = modules();
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut wrong = Vec::new();
    for (module, code) in &all {
        if module.is_empty() || module == "main" {
            continue;
        }
        let from = top(module);
        let Some(may) = allowed.get(from) else {
            wrong.push(format!("{module}: a top-level module missing from ALLOWED"));
            continue;
        };
        for target in imports(module, code, &all) {
            let to = top(&target);
            if to != from && !may.contains(&to) {
                wrong.push(format!("{module} imports {target}"));
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the layering:\n{}", wrong.join("\n"));
}

/// The edges `from → to` that lie on an import cycle.
fn cycle_edges(all: &BTreeMap<String, String>) -> Vec<String> {
    let graph: BTreeMap<&str, BTreeSet<String>> =
        all.iter().map(|(m, code)| (m.as_str(), imports(m, code, all))).collect();
    // A path from `to` back to `from` closes a cycle through the edge `from → to`.
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(m) = stack.pop() {
            if m == to {
                return true;
            }
            if seen.insert(m.clone()) {
                stack.extend(graph.get(m.as_str()).into_iter().flatten().cloned());
            }
        }
        false
    };
    let mut cycles = Vec::new();
    for (from, targets) in &graph {
        for to in targets {
            if reaches(to, from) {
                cycles.push(format!("{from} → {to}"));
            }
        }
    }
    cycles
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let cycles = cycle_edges(&modules());
    assert!(cycles.is_empty(), "edges on an import cycle:\n{}", cycles.join("\n"));
}

#[test]
fn the_layering_check_sees_a_cycle_when_there_is_one() {
    let mut all = BTreeMap::new();
    all.insert("a".to_string(), "use crate::b::X;\n".to_string());
    all.insert("b".to_string(), "fn f() -> super::a::Y {}\n".to_string());
    all.insert(
        "b::c".to_string(),
        "use super::super::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n}\n".to_string(),
    );
    all.insert("d".to_string(), "// crate::a is named in a comment only\n".to_string());
    let all: BTreeMap<String, String> = all.into_iter().map(|(m, text)| (m, code_of(&text))).collect();
    assert_eq!(imports("b::c", &all["b::c"], &all), BTreeSet::from(["a".to_string()]));
    assert!(imports("d", &all["d"], &all).is_empty());
    assert_eq!(cycle_edges(&all), vec!["a → b".to_string(), "b → a".to_string()]);
    let mut all = all;
    all.insert("b".to_string(), "fn f() {}\n".to_string());
    assert!(cycle_edges(&all).is_empty());
}

/// `--check-config` and start-up build the configuration in the same step:
/// a pool policy they refuse, they refuse alike, naming the field.
#[test]
fn check_config_and_start_up_refuse_a_bad_ip_allow_alike() {
    let dir = scratch_dir();
    let path = dir.join("config.json");
    for (access, field) in
        [(r#""ipAllow":["10.0.0.0/33"]"#, "access.ipAllow"), (r#""trustedProxies":["nope"]"#, "access.trustedProxies")]
    {
        std::fs::write(&path, config(&format!(r#""access":{{{access}}}"#), "")).unwrap();
        let path = path.to_str().unwrap();
        for args in [vec!["--check-config", path], vec!["--config", path, "--listen", "127.0.0.1:0"]] {
            let r = run(&dir, &args);
            assert!(!r.status.success(), "{args:?} accepted {access}");
            assert!(r.stderr.contains(&format!("pools.p.{field}")), "{args:?}: {}", r.stderr);
        }
    }
}

/// A missing `jwksFile` is refused by `--check-config`, not first by start-up.
#[test]
fn check_config_refuses_a_missing_jwks_file() {
    let dir = scratch_dir();
    let path = dir.join("config.json");
    let pool = r#""access":{"cloudflareAccess":{"jwksFile":"absent.json","audience":"a","issuer":"https://t.cloudflareaccess.com"}}"#;
    std::fs::write(&path, config(pool, "")).unwrap();
    let r = run(&dir, &["--check-config", path.to_str().unwrap()]);
    assert!(!r.status.success(), "--check-config accepted a missing jwksFile");
    assert!(r.stderr.contains("jwksFile") && r.stderr.contains("absent.json"), "{}", r.stderr);
}
