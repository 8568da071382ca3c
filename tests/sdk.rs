//! The official OpenAI and Anthropic Python SDKs, unchanged: first against
//! the mock upstream in `tests/sdk_support` directly (the mock speaks their
//! wire shapes, plain and streamed, and records the credential each sends),
//! then through the proxy to the same mock behind TLS, with the pool key as
//! the SDK's API key and a managed key put in its place.

mod common;
mod sdk_support;
mod tls_support;

use sdk_support::{run_sdk_script, sdk_python, MockLlm};

const API_KEY: &str = "sk-caller-0001";

#[test]
fn the_openai_sdk_works_against_the_mock_and_sends_its_key_as_a_bearer() {
    let Some(python) = sdk_python() else { return };
    let mock = MockLlm::start();
    let out = run_sdk_script(&python, "openai_chat.py", &mock.base_url(), API_KEY);
    assert!(out.contains("openai ok: 4 stream pieces"), "{out}");
    let seen = mock.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for request in &seen {
        assert_eq!((request.method.as_str(), request.path.as_str()), ("POST", "/v1/chat/completions"));
        assert_eq!(request.header("authorization"), Some("Bearer sk-caller-0001"));
    }
    assert!(seen[1].body.contains("\"stream\":true"), "{}", seen[1].body);
}

#[test]
fn the_anthropic_sdk_works_against_the_mock_and_sends_its_key() {
    let Some(python) = sdk_python() else { return };
    let mock = MockLlm::start();
    let out = run_sdk_script(&python, "anthropic_messages.py", &mock.base_url(), API_KEY);
    assert!(out.contains("anthropic ok: 4 stream pieces"), "{out}");
    let seen = mock.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for request in &seen {
        assert_eq!((request.method.as_str(), request.path.as_str()), ("POST", "/v1/messages"));
        // Older releases send the key in x-api-key, newer ones as a bearer;
        // the proxy takes the pool key from either.
        let sent = request.header("x-api-key") == Some(API_KEY)
            || request.header("authorization") == Some("Bearer sk-caller-0001");
        assert!(sent, "no API key in {:?}", request.headers);
        assert!(request.header("anthropic-version").is_some());
    }
    assert!(seen[1].body.contains("\"stream\":true"), "{}", seen[1].body);
}

/// The SDK, unchanged but for its base URL and API key (the pool key),
/// through the proxy to a TLS upstream that needs the managed key in
/// `managed_header`.
fn through_the_proxy(script: &str, managed_header: &str, managed_value: &str) -> Vec<sdk_support::Seen> {
    let Some(python) = sdk_python() else { return Vec::new() };
    let ca = tls_support::Ca::new("test ca");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let up = tls_support::TlsServer::start(
        &ca.leaf(&["localhost"]),
        std::sync::Arc::new(move |stream: &mut tls_support::TlsServerStream| {
            let _ = sdk_support::serve(stream, &seen2);
        }),
    );
    let dir = common::scratch_dir();
    let key_file = dir.join("managed.key");
    std::fs::write(&key_file, "sk-managed-5e2b\n").unwrap();
    let listen = format!("127.0.0.1:{}", common::free_port());
    let pool = format!(
        r#""allowAuthorizationHeader":true,"concurrency":2,"adaptive":false,
        "upstream":{{"url":"https://localhost:{}","listen":"{listen}","caFile":"{}",
        "setHeaders":{{"{managed_header}":"{managed_value}"}}}}"#,
        up.addr.port(),
        ca.write_pem(&dir).display(),
    )
    .replace("MANAGED", &format!("${{file:{}}}", key_file.display()));
    let _server = common::TestServer::start(&common::config(&pool, ""));
    let out = run_sdk_script(&python, script, &format!("http://{listen}"), common::KEY);
    assert!(out.contains("ok: 4 stream pieces"), "{out}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for request in &seen {
        for (name, value) in &request.headers {
            assert!(!value.contains(common::KEY), "the upstream saw the pool key in {name}: {value}");
        }
    }
    seen
}

#[test]
fn the_openai_sdk_works_unchanged_through_the_proxy_and_the_upstream_sees_the_managed_key() {
    for request in through_the_proxy("openai_chat.py", "Authorization", "Bearer MANAGED") {
        assert_eq!(request.header("authorization"), Some("Bearer sk-managed-5e2b"));
        assert_eq!(request.path, "/v1/chat/completions");
    }
}

#[test]
fn the_anthropic_sdk_works_unchanged_through_the_proxy_and_the_upstream_sees_the_managed_key() {
    for request in through_the_proxy("anthropic_messages.py", "x-api-key", "MANAGED") {
        assert_eq!(request.header("x-api-key"), Some("sk-managed-5e2b"));
        assert_eq!(request.header("authorization"), None, "{:?}", request.headers);
        assert_eq!(request.path, "/v1/messages");
    }
}

/// The README's SDK example is a configuration that `--check-config` takes,
/// once the provider key it names is in the environment.
#[test]
fn the_readme_sdk_example_passes_check_config() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = &readme[readme.find("### Use it with the OpenAI / Anthropic SDK").expect("the section")..];
    let block = section.split("```json\n").nth(1).and_then(|b| b.split("```").next()).expect("a json block");
    let dir = common::scratch_dir();
    let path = dir.join("sdk-example.json");
    std::fs::write(&path, block).unwrap();
    let check = |key: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_nthpool"));
        cmd.arg("--check-config").arg(&path).env_remove("OPENAI_API_KEY");
        if let Some(key) = key {
            cmd.env("OPENAI_API_KEY", key);
        }
        cmd.output().unwrap()
    };
    let ok = check(Some("sk-example"));
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let missing = check(None);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("OPENAI_API_KEY"));
}
