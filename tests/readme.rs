//! The documentation's examples are real: every JSON block of the README's
//! Configuration section, the full field reference included, passes
//! `--check-config` as pasted, and the reference names every field; the
//! README's walk-through and the lock API page's `curl` lines run as pasted.

mod common;

use common::*;

/// The ```json blocks between two headings of the README.
fn json_blocks(section: &str, next: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = readme.find(section).unwrap_or_else(|| panic!("no {section:?} in the README"));
    let end = start + readme[start..].find(next).expect("the next section");
    readme[start..end].split("```json\n").skip(1).map(|b| b.split("```").next().unwrap().to_string()).collect()
}

/// A JWKS with one RSA key of 2064 bits: a public key need not be a real one
/// for the file to be checked.
fn jwks() -> String {
    format!(r#"{{"keys":[{{"kty":"RSA","alg":"RS256","use":"sig","kid":"k1","n":"{}","e":"AQAB"}}]}}"#, "_".repeat(344))
}

#[test]
fn every_configuration_example_passes_check_config() {
    let blocks = json_blocks("\n## Configuration\n", "\n## HTTP rules and limits\n");
    assert!(blocks.len() >= 7, "the minimal file, one per feature and the reference: {}", blocks.len());
    assert!(blocks.iter().any(|b| b.contains("cloudflareAccess")), "the reference has every field");
    let dir = scratch_dir();
    std::fs::write(dir.join("certs.json"), jwks()).unwrap();
    for (i, block) in blocks.iter().enumerate() {
        let path = dir.join(format!("example-{i}.json"));
        std::fs::write(&path, block).unwrap();
        let r = run(&dir, &["--check-config", path.to_str().unwrap()]);
        assert!(r.status.success(), "README configuration example {i} fails: {}\n{block}", r.stderr);
    }
}

/// The ```bash blocks of the walk-through at the top of the README.
fn walk_through() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let top = &readme[..readme.find("\n## Contents").expect("a Contents section")];
    top.split("```bash\n").skip(2).map(|b| b.split("```").next().unwrap()).collect::<Vec<_>>().join("\n")
}

#[test]
fn the_walk_through_runs_as_pasted() {
    let tools = ["bash", "curl", "sed", "grep"];
    if let Some(missing) = tools.iter().find(|t| std::process::Command::new(t).arg("--version").output().is_err()) {
        println!("skipped: {missing} is not installed, so the README's shell walk-through cannot run");
        return;
    }
    let demo = r#"{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{"demo":{"keys":["nb_demo_0123456789abcdef"],
        "concurrency":4,"queue":{"size":100,"timeoutMs":30000}}}}"#;
    let s = TestServer::start(demo);
    let script = walk_through().replace("127.0.0.1:7070", &s.addr.to_string());
    assert!(script.contains("SLOT=$("), "the slot id is captured, not hard-coded");
    let out = std::process::Command::new("bash").args(["-euo", "pipefail", "-c", &script]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].contains("\"slotId\""), "{stdout}");
    assert!(lines[1].starts_with("{\"leaseDeadline\":"), "the renew of the captured slot works: {stdout}");
    assert_eq!(lines[2], r#"{"released":true}"#, "{stdout}");
    assert_eq!(lines[3], r#"{"released":true}"#, "{stdout}");
    for shown in
        ["429 Too Many Requests", "x-nthpool-effective-limit: 4", "x-nthpool-deny-reason: cooldown", "Retry-After: "]
    {
        assert!(stdout.contains(shown), "{shown:?} not in {stdout}");
    }
}

/// The field reference names every field the configuration accepts: each
/// object's field list is taken from the parser itself (the error for an
/// unknown field lists the known ones), so a field added to the code and not
/// to the reference fails here.
#[test]
fn the_field_reference_names_every_field() {
    let reference = json_blocks("\n### Field reference\n", "\n## HTTP rules and limits\n").remove(0);
    let pool = |members: &str| format!(r#"{{"pools":{{"p":{{"keys":["k"],{members}}}}}}}"#);
    let access = |members: &str| pool(&format!(r#""access":{{{members}}}"#));
    let sections = [
        ("the top level".to_owned(), r#"{"zzz":1,"pools":{"p":{"keys":["k"]}}}"#.to_owned()),
        ("resolver".to_owned(), r#"{"resolver":{"zzz":1},"pools":{"p":{"keys":["k"]}}}"#.to_owned()),
        ("a pool".to_owned(), pool(r#""zzz":1"#)),
        ("queue".to_owned(), pool(r#""queue":{"zzz":1}"#)),
        ("upstream".to_owned(), pool(r#""upstream":{"zzz":1}"#)),
        ("access".to_owned(), access(r#""zzz":1"#)),
        ("hmac".to_owned(), access(r#""hmac":{"zzz":1}"#)),
        ("jwt".to_owned(), access(r#""jwt":{"zzz":1}"#)),
        ("cloudflareAccess".to_owned(), access(r#""cloudflareAccess":{"zzz":1}"#)),
    ];
    for (section, json) in sections {
        let err = nthpool::config::Config::parse(json.as_bytes()).expect_err(&json).0;
        let (_, expected) = err.split_once("expected").unwrap_or_else(|| panic!("{section}: {err}"));
        let fields: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        assert!(fields.len() >= 2, "{section}: no field list in {err}");
        for field in fields {
            assert!(reference.contains(&format!("\"{field}\":")), "the field reference lacks {section}'s `{field}`");
        }
    }
}

/// The `curl` blocks of the public lock API page (concurrency-locks.md),
/// word for word; only its placeholders (the key, the API host) are the
/// reader's own.
const LOCK_PAGE_FIRST_REQUEST: &str = r#"export POOL_KEY='nb_live_…'
export LOCK_API='https://api.nthpool.cloud/pools/your-pool/lock'

curl -sS -X POST "$LOCK_API/acquire" \
  -H "X-Nthpool-Key: $POOL_KEY" \
  -H "Content-Type: application/json"
"#;
const LOCK_PAGE_RELEASE: &str = r#"curl -sS -X POST "$LOCK_API/$SLOT_ID/release" \
  -H "X-Nthpool-Key: $POOL_KEY" \
  -H "Content-Type: application/json" \
  -d '{"status":200}'
"#;
const LOCK_PAGE_THROTTLE_REPORT: &str = r#"curl -sS -X POST "$LOCK_API/$SLOT_ID/release" \
  -H "X-Nthpool-Key: $POOL_KEY" \
  -H "Content-Type: application/json" \
  -d '{"status":429,"throttled":1,"retryAfterMs":2000}'
"#;

#[test]
fn the_lock_api_pages_examples_run_as_pasted() {
    if let Some(missing) =
        ["bash", "curl"].iter().find(|t| std::process::Command::new(t).arg("--version").output().is_err())
    {
        println!("skipped: {missing} is not installed, so the lock API page's examples cannot run");
        return;
    }
    // A pool with nothing but its key: the page's "typically" values are the defaults.
    let s = TestServer::start(&format!(r#"{{"accessLog":null,"pools":{{"your-pool":{{"keys":["{KEY}"]}}}}}}"#));
    let lock_api = format!("http://{}/pools/your-pool/lock", s.addr);
    let first_request = LOCK_PAGE_FIRST_REQUEST
        .replace("nb_live_…", KEY)
        .replace("https://api.nthpool.cloud/pools/your-pool/lock", &lock_api);
    let paste = |text: &str, slot: &str| -> serde_json::Value {
        let out = std::process::Command::new("bash")
            .args(["-eu", "-c", text])
            .env("POOL_KEY", KEY)
            .env("LOCK_API", &lock_api)
            .env("SLOT_ID", slot)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{text}\nanswered {stdout}: {e}"))
    };

    // "A `200` body looks like": these five fields, numbers but for the slot id.
    let grant = paste(&first_request, "");
    let fields: Vec<&str> = grant.as_object().unwrap().keys().map(String::as_str).collect();
    let mut sorted = fields.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["leaseDeadline", "renewIntervalMs", "requestDeadline", "slotId", "termMs"], "{grant}");
    let slot = grant["slotId"].as_str().unwrap_or_else(|| panic!("{grant}")).to_owned();
    let lease = grant["leaseDeadline"].as_u64().unwrap_or_else(|| panic!("{grant}"));
    let request = grant["requestDeadline"].as_u64().unwrap_or_else(|| panic!("{grant}"));
    assert!(lease > 1_600_000_000_000, "epoch milliseconds: {grant}");
    assert_eq!(request - lease, 30_000, "as in the example's deadlines: {grant}");
    assert_eq!((grant["termMs"].as_u64(), grant["renewIntervalMs"].as_u64()), (Some(30_000), Some(10_000)));

    assert_eq!(paste(LOCK_PAGE_RELEASE, &slot), serde_json::json!({"released": true}));
    assert_eq!(paste(LOCK_PAGE_RELEASE, &slot), serde_json::json!({"released": false}), "idempotent");
    let slot = paste(&first_request, "")["slotId"].as_str().unwrap().to_owned();
    assert_eq!(paste(LOCK_PAGE_THROTTLE_REPORT, &slot), serde_json::json!({"released": true}));
}
