//! The official OpenAI and Anthropic Python SDKs, unchanged, against the mock
//! upstream in `tests/sdk_support`: proves the mock speaks their wire shapes
//! (plain and streamed) and records the credential each SDK sends, so the
//! same mock can stand behind the proxy.

mod sdk_support;

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
