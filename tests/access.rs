//! Access policies over the wire (SPEC §8) — HMAC request signing with replay
//! defence, HS256 JWTs, Cloudflare Access with JWKS reloads, the IP allowlist
//! behind trusted proxies — and the access log (SPEC §9). Every refusal is
//! checked for its status and its `error` code, since callers branch on both.

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rsa::traits::PublicKeyParts;
use rsa::{Pkcs1v15Sign, RsaPrivateKey};
use sha2::{Digest, Sha256, Sha384};

use common::*;
use upstream::{exchange, proxied, MockUpstream, HOST};

fn epoch_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn epoch_s() -> u64 {
    epoch_ms() / 1000
}

fn assert_refused(r: &Response, status: u16, code: &str, case: &str) {
    assert_eq!(r.status, status, "{case}: {r:?}");
    assert_eq!(r.error_code(), code, "{case}");
}

fn get_metric(s: &TestServer, name: &str) -> u64 {
    s.metric(name).unwrap_or_else(|| panic!("no sample {name}")) as u64
}

/// Waits until the server has handled `n` SIGHUPs, applied or refused, so a
/// test never races the reload it triggered.
fn wait_for_reloads(s: &TestServer, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let done =
            get_metric(s, "nthpool_config_reloads_total") + get_metric(s, "nthpool_config_reload_failures_total");
        if done >= n {
            return;
        }
        assert!(Instant::now() < deadline, "the server did not handle SIGHUP #{n}");
        thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------- keys

#[test]
fn a_key_digest_of_the_empty_key_is_refused_so_an_empty_key_never_passes() {
    // `printf %s "$KEY" | sha256sum` with `KEY` unset gives the digest of
    // nothing; a pool holding it would take `X-Nthpool-Key:` with no value.
    let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    let dir = scratch_dir();
    let path = dir.join("config.json");
    std::fs::write(&path, config(&format!(r#""keySha256":["{}"]"#, empty.to_uppercase()), "")).unwrap();
    let path = path.to_str().unwrap();
    for args in [vec!["--check-config", path], vec!["--config", path, "--listen", "127.0.0.1:0"]] {
        let r = run(&dir, &args);
        assert!(!r.status.success(), "{args:?} accepted the digest of an empty key");
        assert!(r.stderr.contains("pools.p.keySha256: entry 1 is the SHA-256 of an empty key"), "{}", r.stderr);
    }
    // Nor does a reload bring it in: the empty key stays refused.
    let s = TestServer::start(&config("", ""));
    std::fs::write(&s.config_path, config(&format!(r#""keySha256":["{empty}"]"#), "")).unwrap();
    s.signal("HUP");
    wait_for_reloads(&s, 1);
    assert_eq!(get_metric(&s, "nthpool_config_reload_failures_total"), 1);
    let r = s.request(b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key:\r\n\r\n");
    assert_refused(&r, 401, "unauthorized", "an empty X-Nthpool-Key");
}

/// Without a valid key the answer is one and the same whatever the pool has
/// (every policy at once here) and whether it exists at all: nothing tells
/// which pools exist or which policies they ask for. Only a caller whose
/// key passed is told which policy refused it.
#[test]
fn without_a_valid_key_no_answer_tells_pools_or_policies_apart() {
    let policies = format!(
        r#""access":{{"ipAllow":["10.0.0.0/8"],"hmac":{{"secret":"{HMAC_SECRET}"}},"jwt":{{"hs256Secret":"0123456789abcdef0123"}}}}"#
    );
    let s = TestServer::start(&config(&policies, ""));
    let answer = |path: &str, key: &str| {
        let r = s.request(&post(path, key, "", ""));
        let date = |h: &(String, String)| !h.0.eq_ignore_ascii_case("date");
        (r.status, r.headers.into_iter().filter(date).collect::<Vec<_>>(), r.body)
    };
    let keyless = answer("/pools/nowhere/lock/acquire", "");
    assert_eq!(keyless.0, 401);
    for (path, key) in [
        ("/pools/p/lock/acquire", ""),
        ("/pools/p/lock/acquire", "wrong-key"),
        ("/pools/p/lock/acquire", "other-key"),
        ("/pools/nowhere/lock/acquire", KEY),
        ("/pools/p/lock/AAAAAAAAAAB4Tr1rJvJgQr5ik6IBAP4Vx7qiAQAIJn3GXO4Yk5vl0IE1A0hd/renew", "wrong-key"),
        ("/pools/other/lock/acquire", KEY),
    ] {
        assert_eq!(answer(path, key), keyless, "{path} with key {key:?}");
    }
    // With the key, the first policy that refuses is named: here the address.
    assert_refused(&s.acquire("", ""), 403, "unauthorized", "the key passed, the address did not");
}

// ---------------------------------------------------------------- HMAC

const HMAC_SECRET: &str = "hmac-secret-0001";

fn hmac_pool(extra: &str) -> String {
    format!(r#""access":{{"hmac":{{"secret":"{HMAC_SECRET}","toleranceMs":60000{extra}}}}}"#)
}

/// A nonce never used before in this test binary.
fn fresh_nonce() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("nonce-{}", NEXT.fetch_add(1, Ordering::SeqCst))
}

/// The three signing headers for a request of `path` with `body`, signed at `ts`.
fn signing_headers(path: &str, body: &str, ts: u64, nonce: &str) -> String {
    let ts = ts.to_string();
    let hex = nthpool::access::hmac::sign(
        HMAC_SECRET.as_bytes(),
        "POST",
        path,
        ts.as_bytes(),
        nonce.as_bytes(),
        body.as_bytes(),
    );
    let hex = std::str::from_utf8(&hex).unwrap();
    format!("X-Nthpool-Timestamp: {ts}\r\nX-Nthpool-Nonce: {nonce}\r\nX-Nthpool-Signature: v1={hex}\r\n")
}

/// A correctly signed POST with the pool key.
fn signed(path: &str, body: &str) -> Vec<u8> {
    post(path, KEY, &signing_headers(path, body, epoch_ms(), &fresh_nonce()), body)
}

/// `headers` with the last hex digit of the signature changed.
fn corrupt_signature(headers: &str) -> String {
    headers
        .split_inclusive("\r\n")
        .map(|l| match l.strip_prefix("X-Nthpool-Signature: ") {
            Some(sig) => {
                let mut sig = sig.trim_end().to_string();
                let last = sig.pop().unwrap();
                sig.push(if last == '0' { '1' } else { '0' });
                format!("X-Nthpool-Signature: {sig}\r\n")
            }
            None => l.to_string(),
        })
        .collect()
}

fn without_header(headers: &str, name: &str) -> String {
    headers.split_inclusive("\r\n").filter(|l| !l.starts_with(name)).collect()
}

const ACQUIRE: &str = "/pools/p/lock/acquire";

#[test]
fn hmac_good_signature_is_granted_and_every_bad_one_is_refused() {
    let s = TestServer::start(&config(&hmac_pool(""), ""));
    let body = r#"{"waitMs":0}"#;
    assert_eq!(s.request(&signed(ACQUIRE, body)).status, 200, "a good signature");
    assert_eq!(s.request(&signed(ACQUIRE, "")).status, 200, "a good signature over an empty body");

    let good = signing_headers(ACQUIRE, body, epoch_ms(), &fresh_nonce());
    let bad_sig = corrupt_signature(&good);
    let now = epoch_ms();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("bad signature", post(ACQUIRE, KEY, &bad_sig, body)),
        ("stale timestamp", post(ACQUIRE, KEY, &signing_headers(ACQUIRE, body, now - 120_000, &fresh_nonce()), body)),
        ("future timestamp", post(ACQUIRE, KEY, &signing_headers(ACQUIRE, body, now + 120_000, &fresh_nonce()), body)),
        ("no timestamp", post(ACQUIRE, KEY, &without_header(&good, "X-Nthpool-Timestamp"), body)),
        ("no nonce", post(ACQUIRE, KEY, &without_header(&good, "X-Nthpool-Nonce"), body)),
        ("no signature", post(ACQUIRE, KEY, &without_header(&good, "X-Nthpool-Signature"), body)),
        ("no signing headers at all", post(ACQUIRE, KEY, "", body)),
        ("changed body", post(ACQUIRE, KEY, &signing_headers(ACQUIRE, body, now, &fresh_nonce()), r#"{"waitMs":1}"#)),
        (
            "changed path",
            post(ACQUIRE, KEY, &signing_headers("/pools/other/lock/acquire", body, now, &fresh_nonce()), body),
        ),
        ("a good signature without the pool key", post(ACQUIRE, "", &good, body)),
    ];
    for (case, raw) in &cases {
        assert_refused(&s.request(raw), 401, "unauthorized", case);
    }
    // None of the refusals took a slot or spent the good nonce: it still works once.
    let r = s.request(&post(ACQUIRE, KEY, &good, body));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header_u64("x-nthpool-remaining-slots"), 13, "16 minus the three grants");
}

#[test]
fn hmac_replayed_nonce_is_refused_after_its_first_use() {
    let s = TestServer::start(&config(&hmac_pool(""), ""));
    let request = signed(ACQUIRE, "");
    assert_eq!(s.request(&request).status, 200, "the first use");
    assert_refused(&s.request(&request), 401, "unauthorized", "the same request again");
    // The same nonce under a new, valid signature is still a replay.
    let text = String::from_utf8(request.clone()).unwrap();
    let nonce = text.lines().find_map(|l| l.strip_prefix("X-Nthpool-Nonce: ")).unwrap();
    let resigned = post(ACQUIRE, KEY, &signing_headers(ACQUIRE, "", epoch_ms() + 5, nonce), "");
    assert_refused(&s.request(&resigned), 401, "unauthorized", "the nonce re-signed");
    assert_eq!(s.request(&signed(ACQUIRE, "")).status, 200, "a new nonce passes");
}

#[test]
fn hmac_full_nonce_store_answers_503_with_retry_after() {
    let s = TestServer::start(&config(&hmac_pool(r#","nonceCapacity":2"#), ""));
    // Requests whose MAC fails never occupy the store, or anyone could fill it.
    for _ in 0..5 {
        let broken = corrupt_signature(&signing_headers(ACQUIRE, "", epoch_ms(), &fresh_nonce()));
        assert_refused(&s.request(&post(ACQUIRE, KEY, &broken, "")), 401, "unauthorized", "bad MAC");
    }
    let first = signed(ACQUIRE, "");
    assert_eq!(s.request(&first).status, 200);
    assert_eq!(s.request(&signed(ACQUIRE, "")).status, 200);
    let r = s.request(&signed(ACQUIRE, ""));
    assert_refused(&r, 503, "unavailable", "a third nonce with the store full");
    let retry = r.header_u64("Retry-After");
    assert!((1..=61).contains(&retry), "Retry-After {retry} s: until the oldest nonce leaves the 60 s window");
    let message = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("nonceCapacity, 2;"), "the limit is named with its number: {message}");
    // A full store still recognises a replay: nothing was evicted to make room.
    assert_refused(&s.request(&first), 401, "unauthorized", "replay with the store full");
}

#[test]
fn hmac_nonces_are_remembered_across_reloads() {
    let s = TestServer::start(&config(&hmac_pool(r#","nonceCapacity":100"#), ""));
    let captured = signed(ACQUIRE, "");
    assert_eq!(s.request(&captured).status, 200);
    // A reload that changes nothing about signing.
    std::fs::write(&s.config_path, config(&hmac_pool(r#","nonceCapacity":100"#), "")).unwrap();
    s.signal("HUP");
    wait_for_reloads(&s, 1);
    assert_refused(&s.request(&captured), 401, "unauthorized", "replay after a plain reload");
    // A larger store must not forget what the smaller one held: the nonce is
    // still inside its tolerance window, so forgetting it reopens the replay.
    std::fs::write(&s.config_path, config(&hmac_pool(r#","nonceCapacity":200"#), "")).unwrap();
    s.signal("HUP");
    wait_for_reloads(&s, 2);
    assert_eq!(get_metric(&s, "nthpool_config_reloads_total"), 2, "both reloads applied");
    assert_refused(&s.request(&captured), 401, "unauthorized", "replay after the nonce store was resized");
}

#[test]
fn hmac_a_wider_tolerance_after_a_reload_does_not_reopen_replay() {
    let narrow = format!(r#""access":{{"hmac":{{"secret":"{HMAC_SECRET}","toleranceMs":3000}}}}"#);
    let s = TestServer::start(&config(&narrow, ""));
    let signed_at = Instant::now();
    let captured = signed(ACQUIRE, "");
    assert_eq!(s.request(&captured).status, 200);
    std::fs::write(&s.config_path, config(&hmac_pool(""), "")).unwrap();
    s.signal("HUP");
    wait_for_reloads(&s, 1);
    // Past the old 3 s window, well inside the new 60 s one: the timestamp
    // check now lets the request through, so only the nonce can stop it.
    thread::sleep(Duration::from_millis(4500).saturating_sub(signed_at.elapsed()));
    assert_refused(&s.request(&captured), 401, "unauthorized", "replay inside the widened window");
}

/// A pool removed by a reload forgets its nonces once it holds nothing (they
/// guarded only its leases); named again, it refuses what was signed before
/// it forgot them, as a new process does, so nothing it accepted is replayed.
#[test]
fn hmac_a_pool_removed_and_named_again_does_not_replay_what_it_accepted_before() {
    let s = TestServer::start(&config(&hmac_pool(""), ""));
    let captured = signed(ACQUIRE, "");
    let slot = s.request(&captured).slot();
    let r = s.request(&signed(&format!("/pools/p/lock/{slot}/release"), ""));
    assert_eq!(r.json()["released"], true, "{r:?}");
    std::fs::write(
        &s.config_path,
        r#"{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{"other":{"keys":["other-key"]}}}"#,
    )
    .unwrap();
    s.signal("HUP");
    wait_for_reloads(&s, 1);
    // Drained at once; what it no longer needs goes at the next second's turn.
    thread::sleep(Duration::from_millis(1100));
    assert_eq!(s.get_admin("/healthz").status, 200);
    std::fs::write(&s.config_path, config(&hmac_pool(""), "")).unwrap();
    s.signal("HUP");
    wait_for_reloads(&s, 2);
    let r = s.request(&captured);
    assert_refused(&r, 401, "unauthorized", "replay in the pool named again");
    let message = r.json()["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("signed before this server began remembering nonces"), "{message}");
    assert_eq!(s.request(&signed(ACQUIRE, "")).status, 200, "a request signed now passes");
}

/// Stops `s` with `signal`, waits for it to exit and starts a server again
/// in its directory (configuration, slot secret, snapshot).
fn restart(mut s: TestServer, signal: &str) -> TestServer {
    s.signal(signal);
    s.child.wait().unwrap();
    let config_path = s.config_path.clone();
    TestServer::start_with(s.into_dir(), config_path, &[])
}

#[test]
fn hmac_a_request_signed_before_a_restart_is_not_replayed_after_it() {
    // The nonce store lives in memory only: a new process has never seen
    // the nonces the last one spent, so it refuses what was signed before
    // it started, after a graceful stop (snapshot) and a crash alike.
    let mut s = TestServer::start(&config(&hmac_pool(""), ""));
    for signal in ["TERM", "KILL"] {
        let captured = signed(ACQUIRE, "");
        assert_eq!(s.request(&captured).status, 200);
        assert_refused(&s.request(&captured), 401, "unauthorized", "replay before the restart");
        s = restart(s, signal);
        let r = s.request(&captured);
        assert_refused(&r, 401, "unauthorized", &format!("replay after SIG{signal}"));
        // Its timestamp is inside the tolerance: the sentence says what it is refused for.
        let message = r.json()["message"].as_str().unwrap_or_default().to_owned();
        assert!(message.contains("signed before this server began remembering nonces"), "{message}");
    }
    // A request signed now passes (a crash's re-adoption window answers it, not the signature check).
    let r = s.request(&signed(ACQUIRE, ""));
    assert!(r.status == 200 || r.header("x-nthpool-deny-reason") == Some("recovering"), "{r:?}");
}

#[test]
fn hmac_renew_and_release_need_the_signature_too() {
    let s = TestServer::start(&config(&hmac_pool(""), ""));
    let slot = s.request(&signed(ACQUIRE, "")).slot();
    let renew = format!("/pools/p/lock/{slot}/renew");
    let release = format!("/pools/p/lock/{slot}/release");
    assert_refused(&s.renew(&slot), 401, "unauthorized", "unsigned renew");
    assert_refused(&s.release(&slot, ""), 401, "unauthorized", "unsigned release");
    // A signature made for another route does not carry over.
    let for_acquire = signing_headers(ACQUIRE, "", epoch_ms(), &fresh_nonce());
    assert_refused(&s.request(&post(&renew, KEY, &for_acquire, "")), 401, "unauthorized", "acquire's signature");
    let r = s.request(&signed(&renew, ""));
    assert_eq!(r.status, 200, "{r:?}");
    let report = r#"{"status":200}"#;
    let r = s.request(&signed(&release, report));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["released"], true);
}

/// The head of a POST to `path` announcing `body` with `Expect: 100-continue`.
fn expecting(path: &str, headers: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nX-Nthpool-Key: {KEY}\r\n{headers}\
         Expect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
}

#[test]
fn hmac_expect_continue_is_refused_at_once_when_the_signing_headers_decide() {
    let s = TestServer::start(&config(&hmac_pool(""), ""));
    let body = r#"{"waitMs":0}"#;
    let now = epoch_ms();
    let good = signing_headers(ACQUIRE, body, now, &fresh_nonce());
    let malformed: String = good
        .split_inclusive("\r\n")
        .map(|l| if l.starts_with("X-Nthpool-Signature") { "X-Nthpool-Signature: v1=not-hex\r\n" } else { l })
        .collect();
    for (case, headers) in [
        ("no signing headers at all", String::new()),
        ("a timestamp far outside toleranceMs", signing_headers(ACQUIRE, body, now - 600_000, &fresh_nonce())),
        ("a signature that is not v1= and 64 hex digits", malformed),
    ] {
        // Only the head is sent: the answer must not wait for the body.
        let mut c = s.connect();
        c.write_all(expecting(ACQUIRE, &headers, body).as_bytes()).unwrap();
        let r = read_response(&mut c).unwrap_or_else(|| panic!("{case}: no answer"));
        assert_refused(&r, 401, "unauthorized", case);
        assert_eq!(r.header("connection"), Some("close"), "{case}: the body may still come");
        assert!(is_closed(&mut c), "{case}: the connection closes");
        // The answer the whole request gets, body and all.
        let whole = s.request(&post(ACQUIRE, KEY, &headers, body));
        assert_refused(&whole, 401, "unauthorized", case);
        assert_eq!(r.json(), whole.json(), "{case}: the same refusal");
        assert_eq!(r.header("www-authenticate"), whole.header("www-authenticate"), "{case}");
        assert_eq!(r.header("content-type"), whole.header("content-type"), "{case}");
    }

    // A bad MAC needs the body to tell: 100 Continue, then the refusal.
    let mut c = s.connect();
    let bad_mac = corrupt_signature(&signing_headers(ACQUIRE, body, epoch_ms(), &fresh_nonce()));
    c.write_all(expecting(ACQUIRE, &bad_mac, body).as_bytes()).unwrap();
    assert_eq!(read_response(&mut c).unwrap().status, 100, "a bad MAC is not decided by the head");
    c.write_all(body.as_bytes()).unwrap();
    assert_refused(&read_response(&mut c).unwrap(), 401, "unauthorized", "a bad MAC, after its body");

    // A valid request: 100 Continue, then its grant. The head check spent no
    // nonce, or the whole check would refuse it as a replay.
    let mut c = s.connect();
    let headers = signing_headers(ACQUIRE, body, epoch_ms(), &fresh_nonce());
    c.write_all(expecting(ACQUIRE, &headers, body).as_bytes()).unwrap();
    let interim = read_response(&mut c).unwrap();
    assert_eq!(interim.status, 100, "{interim:?}");
    c.write_all(body.as_bytes()).unwrap();
    read_response(&mut c).unwrap().slot();
}

// ---------------------------------------------------------------- JWT

const JWT_SECRET: &[u8] = b"0123456789abcdef0123";
const JWT_POOL: &str =
    r#""access":{"jwt":{"hs256Secret":"0123456789abcdef0123","issuer":"iss1","audience":"aud1","leewayMs":0}}"#;

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn signing_input(header: &str, claims: &str) -> String {
    format!("{}.{}", b64(header.as_bytes()), b64(claims.as_bytes()))
}

fn hs256(secret: &[u8], header: &str, claims: &str) -> String {
    let input = signing_input(header, claims);
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(input.as_bytes());
    format!("{input}.{}", b64(&mac.finalize().into_bytes()))
}

fn hs384(secret: &[u8], header: &str, claims: &str) -> String {
    let input = signing_input(header, claims);
    let mut mac = Hmac::<Sha384>::new_from_slice(secret).unwrap();
    mac.update(input.as_bytes());
    format!("{input}.{}", b64(&mac.finalize().into_bytes()))
}

fn jwt_claims(iss: &str, aud: &str, exp: u64) -> String {
    format!(r#"{{"iss":"{iss}","aud":{aud},"exp":{exp},"sub":"caller-1"}}"#)
}

fn good_jwt() -> String {
    hs256(JWT_SECRET, r#"{"alg":"HS256","typ":"JWT"}"#, &jwt_claims("iss1", r#""aud1""#, epoch_s() + 300))
}

fn jwt_header(token: &str) -> String {
    format!("X-Nthpool-Jwt: {token}\r\n")
}

#[test]
fn jwt_good_tokens_are_granted_in_either_header() {
    let s = TestServer::start(&config(JWT_POOL, ""));
    let r = s.acquire(&jwt_header(&good_jwt()), "");
    assert_eq!(r.status, 200, "X-Nthpool-Jwt: {r:?}");
    let r = s.acquire(&format!("Authorization: Bearer {}\r\n", good_jwt()), "");
    assert_eq!(r.status, 200, "Authorization: Bearer with the key in X-Nthpool-Key: {r:?}");
    let aud_list =
        hs256(JWT_SECRET, r#"{"alg":"HS256"}"#, &jwt_claims("iss1", r#"["someone-else","aud1"]"#, epoch_s() + 300));
    let r = s.acquire(&jwt_header(&aud_list), "");
    assert_eq!(r.status, 200, "aud array containing the audience: {r:?}");
    // Renew and release need the token as well.
    let slot = r.slot();
    assert_refused(&s.renew(&slot), 401, "unauthorized", "renew without a token");
    let with_token = post(&format!("/pools/p/lock/{slot}/renew"), KEY, &jwt_header(&good_jwt()), "");
    assert_eq!(s.request(&with_token).status, 200);
    assert_refused(&s.release(&slot, ""), 401, "unauthorized", "release without a token");
    let with_token = post(&format!("/pools/p/lock/{slot}/release"), KEY, &jwt_header(&good_jwt()), "");
    assert_eq!(s.request(&with_token).json()["released"], true);
}

#[test]
fn jwt_a_token_repeated_on_one_connection_is_checked_every_time() {
    // The same head on a keep-alive connection is not judged again only
    // when the key alone decides; a token is checked on every request, so
    // it stops working on the second it expires.
    let s = TestServer::start(&config(JWT_POOL, ""));
    let exp = epoch_s() + 2;
    let token = hs256(JWT_SECRET, r#"{"alg":"HS256"}"#, &jwt_claims("iss1", r#""aud1""#, exp));
    let mut c = s.connect();
    let mut send = |raw: Vec<u8>| {
        std::io::Write::write_all(&mut c, &raw).unwrap();
        read_response(&mut c).expect("an answer")
    };
    for _ in 0..3 {
        let r = send(post(ACQUIRE, KEY, &jwt_header(&token), ""));
        assert_eq!(r.status, 200, "{r:?}");
        let path = format!("/pools/p/lock/{}/release", r.slot());
        let release = post(&path, KEY, &jwt_header(&token), r#"{"status":200}"#);
        assert_eq!(send(release).status, 200);
    }
    while epoch_s() <= exp {
        thread::sleep(Duration::from_millis(50));
    }
    let r = send(post(ACQUIRE, KEY, &jwt_header(&token), ""));
    assert_eq!((r.status, r.error_code()), (401, "unauthorized".to_string()), "{r:?}");
}

#[test]
fn jwt_every_bad_token_is_refused() {
    let s = TestServer::start(&config(JWT_POOL, ""));
    let now = epoch_s();
    let good_claims = jwt_claims("iss1", r#""aud1""#, now + 300);
    let hs = r#"{"alg":"HS256","typ":"JWT"}"#;
    let cases: Vec<(&str, String)> = vec![
        ("expired", hs256(JWT_SECRET, hs, &jwt_claims("iss1", r#""aud1""#, now - 5))),
        ("missing exp", hs256(JWT_SECRET, hs, r#"{"iss":"iss1","aud":"aud1"}"#)),
        ("alg none, unsigned", format!("{}.", signing_input(r#"{"alg":"none"}"#, &good_claims))),
        ("alg none carrying a valid MAC", hs256(JWT_SECRET, r#"{"alg":"none"}"#, &good_claims)),
        ("alg HS384", hs384(JWT_SECRET, r#"{"alg":"HS384"}"#, &good_claims)),
        ("alg-swapped RS256 header, HMAC-signed", hs256(JWT_SECRET, r#"{"alg":"RS256"}"#, &good_claims)),
        ("wrong audience", hs256(JWT_SECRET, hs, &jwt_claims("iss1", r#""aud2""#, now + 300))),
        ("aud array without the audience", hs256(JWT_SECRET, hs, &jwt_claims("iss1", r#"["a","b"]"#, now + 300))),
        ("wrong issuer", hs256(JWT_SECRET, hs, &jwt_claims("iss2", r#""aud1""#, now + 300))),
        ("crit present", hs256(JWT_SECRET, r#"{"alg":"HS256","crit":["exp"]}"#, &good_claims)),
        ("another secret", hs256(b"fedcba9876543210fedc", hs, &good_claims)),
        ("not a JWS", "not-a-token".to_string()),
        ("another type of token", hs256(JWT_SECRET, r#"{"alg":"HS256","typ":"at+jwt"}"#, &good_claims)),
    ];
    for (case, token) in &cases {
        assert_refused(&s.acquire(&jwt_header(token), ""), 401, "unauthorized", case);
    }
    let r = s.acquire("", "");
    assert_refused(&r, 401, "unauthorized", "no token");
    assert!(r.json()["message"].as_str().unwrap().contains("X-Nthpool-Jwt"), "names where the token goes: {r:?}");
    // The token never stands in for the pool key.
    let no_key = post(ACQUIRE, "", &format!("Authorization: Bearer {}\r\n", good_jwt()), "");
    assert_refused(&s.request(&no_key), 401, "unauthorized", "token without a key");
    assert_eq!(s.acquire(&jwt_header(&good_jwt()), "").status, 200, "and a good token still passes");
    // A token past the size limit is refused with the limit named.
    let padded = jwt_claims("iss1", &format!(r#""aud1","pad":"{}""#, "x".repeat(8 * 1024)), now + 300);
    let r = s.acquire(&jwt_header(&hs256(JWT_SECRET, hs, &padded)), "");
    assert_refused(&r, 401, "unauthorized", "a token over 8 KiB");
    assert_eq!(r.json()["message"], "The token is larger than 8 KiB.", "{r:?}");
    // Its type may be named as a media type too (RFC 7515 §4.1.9).
    let media = hs256(JWT_SECRET, r#"{"alg":"HS256","typ":"application/jwt"}"#, &good_claims);
    assert_eq!(s.acquire(&jwt_header(&media), "").status, 200, "typ application/jwt");
}

// ---------------------------------------------------------------- Cloudflare Access

const CF_AUD: &str = "aud-cf";
const CF_ISS: &str = "https://team.cloudflareaccess.com";
const CF_POOL: &str = r#""access":{"cloudflareAccess":{"jwksFile":"certs.json","audience":"aud-cf","issuer":"https://team.cloudflareaccess.com"}}"#;

/// DER `DigestInfo` prefix for SHA-256 (RFC 8017 §9.2 note 1): RS256 is
/// PKCS#1 v1.5 over it, built here so the test does not depend on how the
/// server builds its own.
const SHA256_DIGEST_INFO: [u8; 19] =
    [0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20];

/// Two keys of the first JWKS, a key that is never published, and the key
/// the JWKS rotates to.
fn rsa_keys() -> &'static [RsaPrivateKey; 4] {
    static KEYS: OnceLock<[RsaPrivateKey; 4]> = OnceLock::new();
    KEYS.get_or_init(|| {
        let mut rng = StdRng::seed_from_u64(0x6163_6365_7373);
        [(); 4].map(|()| RsaPrivateKey::new(&mut rng, 2048).expect("RSA key generation"))
    })
}

fn jwk(kid: &str, key: &RsaPrivateKey) -> String {
    format!(
        r#"{{"kty":"RSA","kid":"{kid}","alg":"RS256","use":"sig","e":"{}","n":"{}"}}"#,
        b64(&key.e().to_bytes_be()),
        b64(&key.n().to_bytes_be())
    )
}

fn jwks(keys: &[(&str, &RsaPrivateKey)]) -> String {
    let keys: Vec<String> = keys.iter().map(|(kid, key)| jwk(kid, key)).collect();
    format!(r#"{{"keys":[{}]}}"#, keys.join(","))
}

fn rs256(key: &RsaPrivateKey, kid: Option<&str>, claims: &str) -> String {
    let header = match kid {
        Some(kid) => format!(r#"{{"alg":"RS256","kid":"{kid}","typ":"JWT"}}"#),
        None => r#"{"alg":"RS256","typ":"JWT"}"#.to_string(),
    };
    let input = signing_input(&header, claims);
    let scheme = Pkcs1v15Sign { hash_len: Some(32), prefix: Box::new(SHA256_DIGEST_INFO) };
    let sig = key.sign(scheme, &Sha256::digest(input.as_bytes())).unwrap();
    format!("{input}.{}", b64(&sig))
}

fn cf_claims(aud: &str, iss: &str, exp: u64) -> String {
    let now = epoch_s();
    format!(r#"{{"aud":["{aud}"],"email":"a@example.com","exp":{exp},"iat":{now},"iss":"{iss}","sub":"u1"}}"#)
}

fn cf_good_claims() -> String {
    cf_claims(CF_AUD, CF_ISS, epoch_s() + 600)
}

fn cf_header(token: &str) -> String {
    format!("Cf-Access-Jwt-Assertion: {token}\r\n")
}

/// A server for the Cloudflare pool, with `certs` written as its JWKS file
/// (read relative to the server's working directory) before it starts.
fn start_cloudflare(certs: &str) -> TestServer {
    start_cloudflare_pool(certs, "")
}

/// `start_cloudflare` with `extra` members in the pool.
fn start_cloudflare_pool(certs: &str, extra: &str) -> TestServer {
    let dir = scratch_dir();
    std::fs::write(dir.join("certs.json"), certs).unwrap();
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, config(&format!("{CF_POOL}{extra}"), "")).unwrap();
    TestServer::start_with(dir, config_path, &[])
}

#[test]
fn cloudflare_tokens_of_either_published_key_pass_and_bad_ones_fail() {
    let [k1, k2, k3, _] = rsa_keys();
    let s = start_cloudflare(&jwks(&[("k1", k1), ("k2", k2)]));
    let good = cf_good_claims();
    assert_eq!(s.acquire(&cf_header(&rs256(k1, Some("k1"), &good)), "").status, 200, "key 1");
    assert_eq!(s.acquire(&cf_header(&rs256(k2, Some("k2"), &good)), "").status, 200, "key 2");
    assert_eq!(s.acquire(&cf_header(&rs256(k2, None, &good)), "").status, 200, "no kid: every key is tried");
    let now = epoch_s();
    let cases: Vec<(&str, String)> = vec![
        ("unknown kid", rs256(k1, Some("k9"), &good)),
        ("wrong aud", rs256(k1, Some("k1"), &cf_claims("someone-else", CF_ISS, now + 600))),
        ("wrong iss", rs256(k1, Some("k1"), &cf_claims(CF_AUD, "https://evil.cloudflareaccess.com", now + 600))),
        // Well past the server's clock-skew allowance.
        ("expired", rs256(k1, Some("k1"), &cf_claims(CF_AUD, CF_ISS, now - 600))),
        ("signed by a third key, naming key 1", rs256(k3, Some("k1"), &good)),
        ("signed by a third key, no kid", rs256(k3, None, &good)),
        (
            "HS256 with the JWKS as secret",
            hs256(jwks(&[("k1", k1)]).as_bytes(), r#"{"alg":"HS256","kid":"k1"}"#, &good),
        ),
    ];
    for (case, token) in &cases {
        assert_refused(&s.acquire(&cf_header(token), ""), 401, "unauthorized", case);
    }
    let r = s.acquire("", "");
    assert_refused(&r, 401, "unauthorized", "no assertion header");
    assert!(r.json()["message"].as_str().unwrap().contains("Cf-Access-Jwt-Assertion"), "names the header: {r:?}");
}

/// Proxy mode: the Access token reaches the upstream neither in its header
/// nor in the `CF_Authorization` cookie Cloudflare sets with the same token;
/// the client's other cookies do.
#[test]
fn a_proxied_cloudflare_pool_keeps_the_access_token_from_the_upstream() {
    let [k1, ..] = rsa_keys();
    let up = MockUpstream::start(|_| upstream::ok("fine", ""));
    let upstream = format!(r#","upstream":{{"url":"{}","hosts":["{HOST}"]}}"#, up.url());
    let s = start_cloudflare_pool(&jwks(&[("k1", k1)]), &upstream);
    let token = rs256(k1, Some("k1"), &cf_good_claims());
    let cookies = [
        (format!("Cookie: theme=dark; CF_Authorization={token}; session=9\r\n"), vec!["theme=dark; session=9"]),
        (format!("Cookie: CF_Authorization={token}\r\n"), vec![]),
    ];
    for (i, (cookie, forwarded)) in cookies.iter().enumerate() {
        let r = exchange(&s, &proxied("GET", "/v1/models", &format!("{}{cookie}", cf_header(&token)), ""));
        assert_eq!(r.status, 200, "{cookie}: {r:?}");
        let seen = &up.seen()[i];
        assert_eq!(seen.headers("cookie"), *forwarded, "{}", seen.head);
        assert!(!seen.head.contains(&token), "the token reached the upstream: {}", seen.head);
    }
}

#[test]
fn cloudflare_keys_are_reloaded_on_sighup_and_a_broken_file_keeps_the_old_ones() {
    let [k1, k2, _, k4] = rsa_keys();
    let s = start_cloudflare(&jwks(&[("k1", k1), ("k2", k2)]));
    let good = cf_good_claims();
    let old = rs256(k1, Some("k1"), &good);
    let new = rs256(k4, Some("k4"), &good);
    assert_eq!(s.acquire(&cf_header(&old), "").status, 200);
    assert_refused(&s.acquire(&cf_header(&new), ""), 401, "unauthorized", "not published yet");

    std::fs::write(s.dir.join("certs.json"), jwks(&[("k4", k4)])).unwrap();
    s.signal("HUP");
    wait_for_reloads(&s, 1);
    assert_eq!(s.acquire(&cf_header(&new), "").status, 200, "the rotated-in key");
    assert_refused(&s.acquire(&cf_header(&old), ""), 401, "unauthorized", "key 1 after rotation");
    let old2 = rs256(k2, Some("k2"), &good);
    assert_refused(&s.acquire(&cf_header(&old2), ""), 401, "unauthorized", "key 2 after rotation");

    std::fs::write(s.dir.join("certs.json"), "{\"keys\": [ broken").unwrap();
    s.signal("HUP");
    wait_for_reloads(&s, 2);
    assert_eq!(s.acquire(&cf_header(&new), "").status, 200, "a broken JWKS keeps the keys loaded before");
    assert_refused(&s.acquire(&cf_header(&old), ""), 401, "unauthorized", "and brings no old key back");

    // A file newly named must be readable, as at start-up: the reload is
    // refused whole (the next start would refuse that configuration).
    let config_path = s.dir.join("config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, config.replace("certs.json", "absent.json")).unwrap();
    s.signal("HUP");
    wait_for_reloads(&s, 3);
    assert_eq!(get_metric(&s, "nthpool_config_reload_failures_total"), 1, "a reload naming an absent jwksFile");
    assert_eq!(s.acquire(&cf_header(&new), "").status, 200, "the running keys stay");
    std::fs::write(&config_path, &config).unwrap();

    // A well-formed file whose key breaks the rules (under 2048 bits) is
    // refused like a start would refuse it: loudly, not kept in silence.
    let short = RsaPrivateKey::new(&mut StdRng::seed_from_u64(1024), 1024).unwrap();
    std::fs::write(s.dir.join("certs.json"), jwks(&[("k4", k4), ("short", &short)])).unwrap();
    s.signal("HUP");
    wait_for_reloads(&s, 4);
    assert_eq!(get_metric(&s, "nthpool_config_reload_failures_total"), 2, "a key under the rules");

    // A file that names no key at all revokes them all: every token is refused.
    std::fs::write(s.dir.join("certs.json"), r#"{"keys":[]}"#).unwrap();
    s.signal("HUP");
    wait_for_reloads(&s, 5);
    assert_eq!(get_metric(&s, "nthpool_config_reload_failures_total"), 2, "a revocation is applied");
    assert_refused(&s.acquire(&cf_header(&new), ""), 401, "unauthorized", "every key revoked");
}

// ---------------------------------------------------------------- IP policy

fn with_forwarded(xff: &str) -> String {
    format!("X-Forwarded-For: {xff}\r\n")
}

#[test]
fn ip_outside_the_allowlist_is_403() {
    let s = TestServer::start(&config(r#""access":{"ipAllow":["10.0.0.0/8"]}"#, ""));
    assert_refused(&s.acquire("", ""), 403, "unauthorized", "127.0.0.1 outside 10.0.0.0/8");
    // The key is checked first: without it the answer is the 401 of any keyless caller.
    assert_refused(&s.request(&post(ACQUIRE, "", "", "")), 401, "unauthorized", "no key");
}

#[test]
fn ip_inside_the_allowlist_is_granted() {
    let s = TestServer::start(&config(r#""access":{"ipAllow":["127.0.0.1/32","::1/128"]}"#, ""));
    let r = s.acquire("", "");
    assert_eq!(r.status, 200, "{r:?}");
}

#[test]
fn behind_a_trusted_proxy_the_forwarded_address_is_judged() {
    let s =
        TestServer::start(&config(r#""access":{"ipAllow":["203.0.113.0/24"],"trustedProxies":["127.0.0.1/32"]}"#, ""));
    let r = s.acquire(&with_forwarded("203.0.113.9"), "");
    assert_eq!(r.status, 200, "{r:?}");
    let slot = r.slot();
    assert_refused(&s.acquire(&with_forwarded("198.51.100.1"), ""), 403, "unauthorized", "a forwarded outsider");
    assert_refused(&s.acquire("", ""), 403, "unauthorized", "the proxy itself is not allowed");
    // The right-most entry not added by a trusted proxy decides; anything left of it is the client's own claim.
    assert_refused(
        &s.acquire(&with_forwarded("203.0.113.9, 198.51.100.1"), ""),
        403,
        "unauthorized",
        "a forged allowed address to the left",
    );
    assert_eq!(s.acquire(&with_forwarded("198.51.100.1, 203.0.113.9"), "").status, 200);
    // Renew and release are judged by the same policy.
    let renew = format!("/pools/p/lock/{slot}/renew");
    assert_refused(&s.renew(&slot), 403, "unauthorized", "renew from the proxy's own address");
    assert_eq!(s.request(&post(&renew, KEY, &with_forwarded("203.0.113.9"), "")).status, 200);
}

#[test]
fn every_forwarded_for_line_counts_however_many() {
    let s = TestServer::start(&config(r#""access":{"ipAllow":["10.0.0.0/8"],"trustedProxies":["127.0.0.1/32"]}"#, ""));
    // Allowed addresses forged on many lines ahead of the one the proxy appended last.
    let forged = with_forwarded("10.1.1.1").repeat(40);
    let outsider = format!("{forged}{}", with_forwarded("1.2.3.4"));
    assert_refused(&s.acquire(&outsider, ""), 403, "unauthorized", "the proxy's entry after 40 forged lines");
    let insider = format!("{}{forged}", with_forwarded("1.2.3.4"));
    assert_eq!(s.acquire(&insider, "").status, 200, "an allowed address appended last");
}

#[test]
fn a_forwarded_entry_that_is_no_address_is_refused_not_read_as_the_proxy() {
    // The proxy is inside the allowlist, as in the README's example: were
    // `unknown` read as the proxy's own address, these would be granted.
    let s = TestServer::start(&config(r#""access":{"ipAllow":["127.0.0.0/8"],"trustedProxies":["127.0.0.1/32"]}"#, ""));
    for value in ["10.0.0.1, unknown", "garbage", "garbage, 127.0.0.1", "127.0.0.5,,"] {
        let r = s.acquire(&with_forwarded(value), "");
        assert_refused(&r, 403, "unauthorized", value);
        let message = r.json()["message"].as_str().unwrap_or_default().to_string();
        assert!(message.contains("X-Forwarded-For"), "{value}: the message names the cause: {message}");
    }
    assert_eq!(s.acquire(&with_forwarded("127.0.0.5"), "").status, 200, "a forwarded allowed address");
}

#[test]
fn without_trusted_proxies_a_forged_forwarded_for_changes_nothing() {
    let s = TestServer::start(&config(r#""access":{"ipAllow":["203.0.113.0/24"]}"#, ""));
    assert_refused(&s.acquire(&with_forwarded("203.0.113.9"), ""), 403, "unauthorized", "forged X-Forwarded-For");
}

// ---------------------------------------------------------------- access log

/// `config` with the access log written to `access.log` in the server's
/// directory. The harness writes `"accessLog":null` itself, and the strict
/// parser refuses a repeated member, so the value is replaced rather than
/// passed again.
fn config_with_access_log(pool_extra: &str) -> String {
    let c = config(pool_extra, "");
    assert!(c.contains(r#""accessLog":null"#));
    c.replacen(r#""accessLog":null"#, r#""accessLog":"access.log""#, 1)
}

/// `config` with the access log at `log` (a file, or `-`).
fn config_json_with_log(log: &str, pool_extra: &str) -> String {
    config(pool_extra, "").replacen(r#""accessLog":null"#, &format!(r#""accessLog":{log:?}"#), 1)
}

/// The access log's text and its lines.
fn access_log(s: &TestServer) -> (String, Vec<serde_json::Value>) {
    let text = std::fs::read_to_string(s.dir.join("access.log")).unwrap();
    let lines = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (text, lines)
}

/// Each line's status and error code (`-` for none).
fn status_and_error(lines: &[serde_json::Value]) -> Vec<(u64, &str)> {
    lines.iter().map(|l| (l["status"].as_u64().unwrap(), l["error"].as_str().unwrap_or("-"))).collect()
}

fn wait_for_exit(s: &mut TestServer, within: Duration) -> std::process::ExitStatus {
    exit_within(&mut s.child, within).unwrap_or_else(|| panic!("the server did not exit within {within:?} of SIGTERM"))
}

/// A connection to a server started by hand on `port`, once it listens
/// (within 10 s), with a 10 s read timeout.
fn connect_when_listening(port: u16) -> std::net::TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "the server did not listen: {e}"),
        }
        thread::sleep(Duration::from_millis(10));
    };
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c
}

#[test]
fn with_the_log_on_standard_output_that_stream_holds_json_lines_only() {
    // A log shipper parses every line of standard output; the start-up
    // lines go to standard error.
    let (port, dir) = (free_port(), scratch_dir());
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"listen":"127.0.0.1:{port}","adminListen":"127.0.0.1:0","accessLog":"-","pools":{{"p":{{"keys":["{KEY}"]}}}}}}"#
        ),
    )
    .unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_nthpool"))
        .arg("--config")
        .arg(&config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut c = connect_when_listening(port);
    c.write_all(&post(ACQUIRE, KEY, "", "")).unwrap();
    assert_eq!(read_response(&mut c).unwrap().status, 200);
    let ok = std::process::Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    assert!(ok.success());
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stderr.contains("nthpool listening on http://"), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let line: serde_json::Value = serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(line["status"], 200, "{line}");
}

/// A server with `"accessLog":"-"` whose standard output is a pipe nobody
/// reads (standard error too when `shared`, as `2>&1` or systemd's journal
/// make it: one open pipe, whose non-blocking mode both then have). SPEC §9:
/// writing the access log never blocks the event loop. The pipe fills after
/// 64 KiB; answers, `/healthz` and a graceful SIGTERM must go on regardless.
fn a_stalled_standard_output_holds_up_nothing(shared: bool) {
    let (port, admin) = (free_port(), free_port());
    let dir = scratch_dir();
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"listen":"127.0.0.1:{port}","adminListen":"127.0.0.1:{admin}","accessLog":"-",
            "pools":{{"p":{{"keys":["{KEY}"],"concurrency":100000,"adaptive":false}}}}}}"#
        ),
    )
    .unwrap();
    /// Killed if the test fails before the server exits.
    struct Server(std::process::Child);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    // Held open and never read.
    let (_unread, writer) = std::io::pipe().unwrap();
    let stderr = if shared { writer.try_clone().unwrap().into() } else { std::process::Stdio::null() };
    let mut server = Server(
        std::process::Command::new(env!("CARGO_BIN_EXE_nthpool"))
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdout(writer)
            .stderr(stderr)
            .spawn()
            .unwrap(),
    );
    let child = &mut server.0;
    let mut c = connect_when_listening(port);
    // About 200 bytes of log each: ten times what the pipe holds.
    for i in 0..3_000 {
        c.write_all(&post(ACQUIRE, KEY, "", "")).unwrap();
        let r = read_response(&mut c).unwrap_or_else(|| panic!("acquire {i} got no answer"));
        assert_eq!(r.status, 200, "acquire {i}: {r:?}");
    }
    let mut h = std::net::TcpStream::connect(("127.0.0.1", admin)).unwrap();
    h.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    h.write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut h).expect("/healthz answers").status, 200);
    let ok = std::process::Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    assert!(ok.success());
    let status = exit_within(child, Duration::from_secs(5))
        .expect("SIGTERM ends the server within 5 s while its standard output is full");
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_reader_of_standard_output_that_stalls_never_stalls_the_server() {
    a_stalled_standard_output_holds_up_nothing(false);
}

/// Standard output was set back to blocking at the access log's close,
/// while the stop still logged (its snapshot, its last line) to standard
/// error, the same pipe: that write waited for the stalled reader forever.
#[test]
fn a_log_sharing_its_stalled_pipe_with_standard_error_never_holds_up_the_stop() {
    a_stalled_standard_output_holds_up_nothing(true);
}

/// Whether the open file behind descriptor `fd` of process `pid` is
/// non-blocking (`O_NONBLOCK`, 04000 in `/proc/…/fdinfo`'s octal flags).
fn non_blocking(pid: u32, fd: i32) -> bool {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap();
    let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).expect("a flags line").trim();
    u32::from_str_radix(flags, 8).unwrap() & 0o4000 != 0
}

#[test]
fn standard_output_is_left_as_found_by_a_failed_start_and_a_refused_reload() {
    // Non-blocking is a mode of the open pipe, which outlives the server
    // (the next program in a pipeline, the shell's terminal): a start that
    // fails after the log opened, and a reload refused after it opened the
    // log anew, leave it blocking as they found it.
    let dir = scratch_dir();
    let config = dir.join("config.json");
    let pool = &CF_POOL.replace("certs.json", "absent.json");
    // A pool's own listener on a port in use: found after the log opened
    // (a configuration --check-config refuses is refused before).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_at = taken.local_addr().unwrap().to_string();
    let on_taken = format!(r#""upstream":{{"url":"http://127.0.0.1:9","listen":"{taken_at}"}}"#);
    std::fs::write(&config, config_json_with_log("-", &on_taken)).unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    let ours = writer.try_clone().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nthpool"))
        .arg("--config")
        .arg(&config)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&taken_at), "{}", String::from_utf8_lossy(&out.stderr));
    use std::os::fd::AsRawFd;
    assert!(!non_blocking(std::process::id(), ours.as_raw_fd()), "the failed start left standard output non-blocking");
    drop((reader, ours));

    // Running with a file, a reload to standard output is refused (its
    // JWKS file is absent) after it opened that log: still blocking.
    let mut s = TestServer::start(&config_json_with_log("access.log", ""));
    std::fs::write(&s.config_path, config_json_with_log("-", pool)).unwrap();
    s.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while get_metric(&s, "nthpool_config_reload_failures_total") < 1 {
        assert!(Instant::now() < deadline, "the reload was never refused");
        thread::sleep(Duration::from_millis(20));
    }
    assert!(!non_blocking(s.pid(), 1), "the refused reload left standard output non-blocking");
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(5)).success());
}

#[test]
fn a_refused_sighup_still_reopens_the_access_log() {
    let mut s = TestServer::start_logged(&config_with_access_log(""), "info");
    assert_eq!(s.acquire("", "").status, 200);
    // Rotated away, and the configuration broken meanwhile.
    std::fs::rename(s.dir.join("access.log"), s.dir.join("access.log.2")).unwrap();
    std::fs::write(&s.config_path, "{bad").unwrap();
    s.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        if let Some(line) = s.log().lines().find(|l| l.contains("reload refused")) {
            break line.to_string();
        }
        assert!(Instant::now() < deadline, "the reload was never refused: {}", s.log());
        thread::sleep(Duration::from_millis(20));
    };
    // Broken JSON reads as such, with its place, and names no field.
    assert!(refused.contains("JSON syntax error") && refused.ends_with("at line 1 column 2"), "{refused}");
    assert!(!refused.contains('?'), "{refused}");
    assert_eq!(s.acquire("", "").status, 200);
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(10)).success());
    let lines = |name: &str| std::fs::read_to_string(s.dir.join(name)).unwrap_or_default().lines().count();
    assert_eq!((lines("access.log.2"), lines("access.log")), (1, 1), "one line before the SIGHUP, one after");
}

#[test]
fn sigusr1_reopens_the_access_log_sigusr2_is_ignored_and_sigquit_stops_gracefully() {
    let mut s = TestServer::start_logged(&config_with_access_log(""), "info");
    s.acquire("", "").slot();
    std::fs::rename(s.dir.join("access.log"), s.dir.join("access.log.1")).unwrap();
    s.signal("USR1");
    s.signal("USR2");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s.log().contains("SIGUSR2 means nothing") {
        assert!(Instant::now() < deadline, "SIGUSR2 was never handled: {}", s.log());
        thread::sleep(Duration::from_millis(20));
    }
    assert!(s.log().contains("SIGUSR1: reopening the access log"), "{}", s.log());
    assert_eq!(s.acquire("", "").status, 200, "alive after USR1 and USR2");
    // SIGQUIT is a graceful stop: exit 0, the held slots in the snapshot.
    s.signal("QUIT");
    assert!(wait_for_exit(&mut s, Duration::from_secs(10)).success());
    assert!(s.log().contains("stop snapshot of 2 slots"), "{}", s.log());
    let lines = |name: &str| std::fs::read_to_string(s.dir.join(name)).unwrap_or_default().lines().count();
    assert_eq!((lines("access.log.1"), lines("access.log")), (1, 1), "one line before the SIGUSR1, one after");
}

#[test]
fn a_logged_server_time_is_within_what_the_client_waited_for_its_answer() {
    // `serverUs` runs from the turn that read the request to the one that
    // wrote its answer: never longer than the client's own round trip.
    let mut s = TestServer::start(&config_with_access_log(""));
    let mut c = s.connect();
    let mut waited = Vec::new();
    for _ in 0..5 {
        let sent = Instant::now();
        c.write_all(&post(ACQUIRE, KEY, "", "")).unwrap();
        let r = read_response(&mut c).expect("an answer");
        waited.push(sent.elapsed().as_micros() as u64);
        assert_eq!(r.status, 200, "{r:?}");
    }
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(10)).success());
    let text = std::fs::read_to_string(s.dir.join("access.log")).unwrap();
    let server_us: Vec<u64> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["serverUs"].as_u64().unwrap())
        .collect();
    assert_eq!(server_us.len(), waited.len(), "{text}");
    for (server, client) in server_us.iter().zip(&waited) {
        assert!(server <= client, "server time {server} µs, the client waited {client} µs:\n{text}");
    }
}

#[test]
fn access_log_has_one_line_per_acquire_attempt_and_no_secrets() {
    let mut s = TestServer::start(&config_with_access_log(r#""concurrency":1,"queue":{"size":10,"timeoutMs":5000}"#));
    let grant = s.acquire("", "");
    let slot = grant.slot();
    assert_eq!(s.acquire("", "").status, 429);
    let r = s.acquire("", r#"{"waitMs":200}"#);
    assert_eq!(r.status, 504, "{r:?}");
    const WRONG_KEY: &str = "wrong-key-9f8e7d";
    assert_eq!(s.request(&post(ACQUIRE, WRONG_KEY, "", "")).status, 401);
    assert_eq!(s.acquire("", r#"{"waitMs":"soon"}"#).status, 400);
    for _ in 0..2 {
        assert_eq!(s.renew(&slot).status, 200);
    }
    assert_eq!(s.renew("not-a-slot").status, 404);
    assert_eq!(s.release(&slot, r#"{"status":200}"#).json()["released"], true);
    assert_eq!(s.release(&slot, "").json()["released"], false);

    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(10)).success());
    let text = std::fs::read_to_string(s.dir.join("access.log")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let statuses: Vec<u64> = lines.iter().map(|l| l["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, [200, 429, 504, 401, 400], "one line per acquire, none for renew or release:\n{text}");

    let mut previous_time = String::new();
    for l in &lines {
        for field in ["time", "pool", "client", "status", "error", "denyReason", "waitMs", "queuedMs", "serverUs"] {
            assert!(l.get(field).is_some(), "{field} missing in {l}");
        }
        let time = l["time"].as_str().unwrap();
        let b = time.as_bytes();
        assert!(b.len() == 24 && b[4] == b'-' && b[10] == b'T' && b[19] == b'.' && b[23] == b'Z', "{time}");
        assert!(time >= previous_time.as_str(), "times in order");
        previous_time = time.to_string();
        assert_eq!(l["pool"], "p");
        assert_eq!(l["client"], "127.0.0.1");
        assert!(l["serverUs"].is_u64());
    }
    let [granted, denied, timed_out, unauthorized, bad] = &lines[..] else { unreachable!() };
    assert_eq!(granted["error"], serde_json::Value::Null);
    assert_eq!(granted["denyReason"], serde_json::Value::Null);
    assert_eq!((granted["waitMs"].as_u64(), granted["queuedMs"].as_u64()), (Some(0), Some(0)));
    let slot_ref = granted["slot"].as_str().expect("a grant names its slot");
    assert!(!slot_ref.is_empty() && slot_ref != slot, "a short reference, not the slotId: {slot_ref}");

    assert_eq!(denied["error"], "too_many_requests");
    assert_eq!(denied["denyReason"], "concurrency");
    assert_eq!(denied["waitMs"], 0);

    assert_eq!(timed_out["error"], "queue_timeout");
    assert_eq!(timed_out["denyReason"], "concurrency");
    assert_eq!(timed_out["waitMs"], 200);
    assert!(timed_out["queuedMs"].as_u64().unwrap() >= 200, "{timed_out}");
    assert!(timed_out["serverUs"].as_u64().unwrap() >= 190_000, "server time covers the wait: {timed_out}");

    assert_eq!(unauthorized["error"], "unauthorized");
    assert_eq!(bad["error"], "bad_request");
    for l in &lines[1..] {
        assert!(l.get("slot").is_none_or(|v| v.is_null()), "slot only on grants: {l}");
    }

    assert!(!text.contains(&slot), "the whole slotId is never logged");
    assert!(!text.contains(KEY), "the pool key is never logged");
    assert!(!text.contains(WRONG_KEY), "a presented wrong key is never logged");
}

/// An acquire of a pool no configuration has is logged, under the name
/// its path gave only when that could be a pool name: a key a client put
/// in the path by mistake, or a name of thousands of bytes, is never
/// written out (SPEC §9: never a key).
#[test]
fn an_unknown_pools_line_names_it_only_when_it_could_be_a_pool_name() {
    let mut s = TestServer::start(&config_with_access_log(""));
    const IN_PATH: &str = "sk_live_Key0123456789";
    let long = "x".repeat(8_000);
    for (name, status) in [("typo-pool", 401), (IN_PATH, 401), (&format!("p%2F{IN_PATH}"), 400), (&long, 401)] {
        let r = s.request(&post(&format!("/pools/{name}/lock/acquire"), KEY, "", ""));
        assert_eq!(r.status, status, "{r:?}");
    }
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(10)).success());
    let (text, lines) = access_log(&s);
    let pools: Vec<&str> = lines.iter().map(|l| l["pool"].as_str().unwrap()).collect();
    assert_eq!(pools, ["typo-pool", "", "", ""], "{text}");
    assert!(!text.contains("Key0123456789") && text.len() < 2_000, "{text}");
}

/// A key that is itself a DNS label (a UUID, say) put where the pool's name
/// goes is never written out either: any pool's key, plain or given as its
/// SHA-256, is logged as `""`, on an answered acquire and on a refused head.
#[test]
fn a_key_in_the_pool_segment_is_never_logged_even_when_it_could_be_a_pool_name() {
    const UUID_KEY: &str = "0b9f3c1e-2d4a-4f6b-8c7d-9e0f1a2b3c4d";
    const HASHED_KEY: &str = "9d2c41aa-77e0-4b1f-a3c5-5e6f7a8b9c0d";
    let hashed: String = Sha256::digest(HASHED_KEY).iter().map(|b| format!("{b:02x}")).collect();
    let pool = format!(r#""keys":["{KEY}","{UUID_KEY}"],"keySha256":["{hashed}"]"#);
    let mut s = TestServer::start(&config_with_access_log("").replacen(&format!(r#""keys":["{KEY}"]"#), &pool, 1));
    for in_path in [UUID_KEY, HASHED_KEY] {
        let r = s.request(&post(&format!("/pools/{in_path}/lock/acquire"), in_path, "", ""));
        assert_eq!(r.status, 401, "{r:?}");
        let framing = format!(
            "POST /pools/{in_path}/lock/acquire HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        assert_eq!(s.request(framing.as_bytes()).status, 400);
    }
    assert_eq!(s.request(&post("/pools/typo-pool/lock/acquire", KEY, "", "")).status, 401);
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(10)).success());
    let (text, lines) = access_log(&s);
    let pools: Vec<&str> = lines.iter().map(|l| l["pool"].as_str().unwrap()).collect();
    assert_eq!(pools, ["", "", "", "", "typo-pool"], "{text}");
    assert!(!text.contains(UUID_KEY) && !text.contains(HASHED_KEY), "{text}");
}

/// An unknown pool spelled with percent-escapes is logged under the name
/// they spell (`n%6fpe` is `nope`, as the look-up reads it), whether its
/// acquire was answered or cut short, and a name that cannot be a pool's
/// (`-abc-`) under `""` either way.
#[test]
fn an_unknown_pool_spelled_with_escapes_is_logged_under_one_name_answered_or_cut_short() {
    let mut s = TestServer::start(&config_with_access_log(""));
    for name in ["n%6fpe", "-abc-"] {
        let path = format!("/pools/{name}/lock/acquire");
        assert_eq!(s.request(&post(&path, KEY, "", "")).status, 401);
        let mut cut = s.connect();
        cut.write_all(format!("POST {path} HTTP/1.1\r\nHost: h\r\n").as_bytes()).unwrap();
        cut.shutdown(std::net::Shutdown::Write).unwrap();
        cut.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(cut.read_some(&mut buf).unwrap(), 0, "closed without an answer");
    }
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(10)).success());
    let (text, lines) = access_log(&s);
    let logged: Vec<(&str, u64)> =
        lines.iter().map(|l| (l["pool"].as_str().unwrap(), l["status"].as_u64().unwrap())).collect();
    assert_eq!(logged, [("nope", 401), ("nope", 499), ("", 401), ("", 499)], "{text}");
}

/// "Renew and release are not" written to the access log, refused ones
/// neither: a wrong key, another method, a bad or oversized body, a framing
/// error or an unknown slot on a renew or release route leaves no line; the
/// one acquire among them does.
#[test]
fn refused_renews_and_releases_leave_no_access_log_line() {
    let mut s = TestServer::start(&config_with_access_log(r#""concurrency":1"#).replacen(
        r#""accessLog":"access.log""#,
        r#""accessLog":"access.log","maxBodyBytes":64"#,
        1,
    ));
    let slot = s.acquire("", "").slot();
    let mut refusals: Vec<(Vec<u8>, u16)> = Vec::new();
    for action in ["renew", "release"] {
        let path = format!("/pools/p/lock/{slot}/{action}");
        refusals.push((post(&path, "wrong-key", "", ""), 401));
        refusals.push((post(&path, "", "", ""), 401));
        let get = post(&path, KEY, "", "");
        refusals.push(([&b"GET"[..], get.strip_prefix(b"POST").unwrap()].concat(), 405));
        refusals.push((post(&path, KEY, "", "[1]"), 400));
        refusals.push((post(&path, KEY, "", &format!(r#"{{"status":200,"pad":"{}"}}"#, "x".repeat(100))), 413));
        let framing =
            format!("POST {path} HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n");
        refusals.push((framing.into_bytes(), 400));
    }
    refusals.push((post("/pools/p/lock/not-a-slot/renew", KEY, "", ""), 404));
    for (raw, status) in &refusals {
        assert_eq!(s.request(raw).status, *status, "{}", String::from_utf8_lossy(raw));
    }
    assert_eq!(s.release(&slot, "").json()["released"], true, "none of the refusals touched the slot");
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(10)).success());
    let text = std::fs::read_to_string(s.dir.join("access.log")).unwrap();
    let statuses: Vec<u64> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200], "only the acquire is logged:\n{text}");
}

#[test]
fn access_log_counts_gone_waiters_framing_refusals_and_shutdown_waits() {
    let mut s = TestServer::start(&config_with_access_log(r#""concurrency":1,"queue":{"size":10,"timeoutMs":10000}"#));
    let _held = s.acquire("", "").slot();
    let queue = |s: &TestServer| {
        let mut c = s.connect();
        std::io::Write::write_all(&mut c, &post(ACQUIRE, KEY, "", r#"{"waitMs":5000}"#)).unwrap();
        // Long enough to be queued and to have waited a measurable time.
        thread::sleep(Duration::from_millis(400));
        c
    };
    drop(queue(&s));
    queue(&s).shutdown(std::net::Shutdown::Write).unwrap();
    // One that resets: nothing can be written to it, so it is gone (499).
    let reset = socket2::Socket::from(queue(&s));
    reset.set_linger(Some(Duration::ZERO)).unwrap();
    drop(reset);
    thread::sleep(Duration::from_millis(100));
    let framing = [
        format!(
            "POST {ACQUIRE} HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        ),
        format!("POST {ACQUIRE} HTTP/1.1\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\n\r\n"),
    ];
    for raw in &framing {
        assert_eq!(s.request(raw.as_bytes()).status, 400, "{raw}");
    }
    // A request line refused for bytes that are not UTF-8 still names an
    // acquire route: logged too.
    let raw = b"POST /pools/p\xff\\\"/lock/acquire HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n";
    assert_eq!(s.request(raw).status, 400);
    // An absolute-form target with an empty path names the root, whatever
    // its query holds (here `/pools/...`): no acquire, so not logged.
    let raw = b"POST http://h?/pools/p/lock/acquire HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n";
    assert_eq!(s.request(raw).status, 404);
    // One whose authority (in place of `Host`) is invalid names its acquire
    // all the same: refused, and logged as an invalid `Host` is.
    let raw = b"POST http://a@b/pools/p/lock/acquire HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n";
    assert_eq!(s.request(raw).status, 400);
    // A fragment is refused in a target, but it ends the path: the line
    // still names an acquire.
    let raw = b"POST /pools/p/lock/acquire#frag HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n";
    assert_eq!(s.request(raw).status, 400);
    let mut at_shutdown = queue(&s);
    thread::sleep(Duration::from_millis(400));
    s.signal("TERM");
    let r = common::read_response(&mut at_shutdown).expect("the waiter is answered at shutdown");
    assert_eq!(r.status, 503, "{r:?}");
    assert!(wait_for_exit(&mut s, Duration::from_secs(10)).success());

    let (text, lines) = access_log(&s);
    let summary = status_and_error(&lines);
    assert_eq!(
        summary,
        [
            (200, "-"),
            (504, "client_gone"),
            (504, "client_gone"),
            (499, "client_gone"),
            (400, "bad_request"),
            (400, "bad_request"),
            (400, "bad_request"),
            (400, "bad_request"),
            (400, "bad_request"),
            (503, "unavailable")
        ],
        "one line per acquire attempt:\n{text}"
    );
    for l in [&lines[1], &lines[2], &lines[3]] {
        assert_eq!(l["waitMs"], 5000, "{l}");
        assert!(l["queuedMs"].as_u64().unwrap() >= 100, "a gone waiter's line shows its wait: {l}");
    }
    assert!(lines[9]["queuedMs"].as_u64().unwrap() >= 300, "the wait before shutdown is logged: {}", lines[9]);
    assert!(lines[4..6].iter().all(|l| l["pool"] == "p" && l["client"] == "127.0.0.1"), "{text}");
    // A name no pool could have is not written out.
    assert_eq!(lines[6]["pool"], "", "{text}");
    assert_eq!(lines[7]["pool"], "p", "{text}");
    assert_eq!(lines[8]["pool"], "p", "{text}");
}

/// A log file an earlier run left in the middle of a line (a full disk or a
/// file size limit tore its last line, then it stopped or was killed) gets
/// the newline that ends it before this run's first line: no line runs into
/// another, across runs too.
#[test]
fn a_log_file_left_in_the_middle_of_a_line_is_ended_before_the_next_run_writes() {
    let dir = scratch_dir();
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, config_with_access_log("")).unwrap();
    let torn = r#"{"time":"2026-12-05T21:37"#;
    std::fs::write(dir.join("access.log"), torn).unwrap();
    let mut s = TestServer::start_with(dir, config_path, &[]);
    assert_eq!(s.acquire("", "").status, 200);
    // A reload reopens the file, which now ends a line: nothing is added.
    s.signal("HUP");
    assert_eq!(s.acquire("", "").status, 200);
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(10)).success());
    let text = std::fs::read_to_string(s.dir.join("access.log")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], torn, "{text}");
    for line in &lines[1..] {
        let line: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(line["status"], 200, "{text}");
    }
}

/// An acquire that never completes gets no answer (SPEC §4: the connection
/// closes), but it was an attempt: one line says how it ended. A renew cut
/// short is not logged, as no renew is.
#[test]
fn access_log_counts_acquires_cut_short_before_they_were_complete() {
    let json = config_with_access_log("").replacen(r#""accessLog""#, r#""headTimeoutMs":1500,"accessLog""#, 1);
    let mut s = TestServer::start(&json);
    let partial =
        format!("POST {ACQUIRE} HTTP/1.1\r\nHost: h\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 10\r\n\r\n{{\"wa");
    let send = |raw: &str| {
        let mut c = s.connect();
        std::io::Write::write_all(&mut c, raw.as_bytes()).unwrap();
        c
    };
    // Its deadline passes: closed unanswered, logged 408.
    let mut timed_out = send(&partial);
    timed_out.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(timed_out.read_some(&mut buf).unwrap(), 0, "closed without an answer");
    // Its client half-closes mid-body, or resets mid-head: 499.
    send(&partial).shutdown(std::net::Shutdown::Write).unwrap();
    let reset = socket2::Socket::from(send(&format!("POST {ACQUIRE} HTTP/1.1\r\nHost: h\r\n")));
    thread::sleep(Duration::from_millis(100));
    reset.set_linger(Some(Duration::ZERO)).unwrap();
    drop(reset);
    drop(send("POST /pools/p/lock/AAAA/renew HTTP/1.1\r\nHost: h\r\n"));
    thread::sleep(Duration::from_millis(200));
    // Still arriving when the stop's grace ends: 503.
    let _arriving = send(&partial);
    thread::sleep(Duration::from_millis(100));
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(10)).success());

    let (text, lines) = access_log(&s);
    let summary = status_and_error(&lines);
    assert_eq!(
        summary,
        [(408, "request_timeout"), (499, "client_gone"), (499, "client_gone"), (503, "unavailable")],
        "one line per acquire cut short:\n{text}"
    );
    assert!(lines.iter().all(|l| l["pool"] == "p" && l["client"] == "127.0.0.1"), "{text}");
}

#[test]
fn a_file_size_limit_costs_counted_lines_never_the_server_nor_a_whole_line() {
    // A file size limit (`ulimit -f`, systemd's `LimitFSIZE=`) makes a log
    // write fail halfway through a line, and by default kills the writer
    // with SIGXFSZ. The server must go on answering, count every line it
    // could not write, and never leave a torn line that the next one runs
    // into: once the limit is lifted the file holds whole JSON lines only,
    // and the server's log says how many were dropped meanwhile.
    let s = TestServer::start_logged(&config_with_access_log(""), "warn");
    if !tear_a_line_at_a_file_size_limit(&s) {
        return;
    }
    assert_refused(&s.request(&post(ACQUIRE, "wrong-key", "", "")), 401, "unauthorized", "after the failed write");
    assert!(file_size_limit(&s, "unlimited"), "the limit could not be lifted");
    assert_refused(&s.request(&post(ACQUIRE, "wrong-key", "", "")), 401, "unauthorized", "after the limit");
    let lines = get_metric(&s, "nthpool_access_log_lines_total");
    assert_eq!(lines, 14);
    let deadline = Instant::now() + Duration::from_secs(10);
    let (text, dropped) = loop {
        let text = std::fs::read_to_string(s.dir.join("access.log")).unwrap();
        let dropped = get_metric(&s, "nthpool_access_log_dropped_total");
        if text.ends_with('\n') && text.lines().count() as u64 + dropped == lines {
            break (text, dropped);
        }
        assert!(
            Instant::now() < deadline,
            "{lines} lines logged, {dropped} counted as dropped, the file holds:\n{text}"
        );
        thread::sleep(Duration::from_millis(20));
    };
    assert!(dropped > 0, "the limit dropped nothing:\n{text}");
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}\n{text}"));
        assert_eq!(v["status"], 401, "{line}");
    }
    let log = s.log();
    assert_eq!(log.matches("access log write failed").count(), 1, "{log}");
    let said = format!("access log: writes work again; {dropped} lines were dropped while its writes failed");
    assert!(log.contains(&said), "{log}");
}

/// A log rotated while its writes fail halfway through a line: the rest
/// of that line is dropped at the reopen, and the count the reopen writes
/// in the server's log includes it, as the dropped-lines counter does.
#[test]
fn a_reopen_while_writes_fail_counts_the_torn_line_it_drops() {
    let s = TestServer::start_logged(&config_with_access_log(""), "warn");
    if !tear_a_line_at_a_file_size_limit(&s) {
        return;
    }
    std::fs::rename(s.dir.join("access.log"), s.dir.join("access.log.1")).unwrap();
    s.signal("USR1");
    eventually("the reopen is logged", || s.log().contains("the log was reopened;"));
    let dropped = get_metric(&s, "nthpool_access_log_dropped_total");
    let rotated = std::fs::read_to_string(s.dir.join("access.log.1")).unwrap();
    assert!(!rotated.ends_with('\n'), "the write was not torn, nothing to drop at the reopen: {rotated}");
    let said = format!("access log: the log was reopened; {dropped} lines were dropped while its writes failed");
    let log = s.log();
    assert!(log.contains(&said), "{log}");
}

/// A stop that finds the log's writes still failing says so, counting
/// every line dropped since they began, those it drops itself included;
/// it does not say a reader left them, as of a pipe's.
#[test]
fn a_stop_while_writes_fail_counts_what_it_drops_with_the_failures() {
    let mut s = TestServer::start_logged(&config_with_access_log(""), "warn");
    if !tear_a_line_at_a_file_size_limit(&s) {
        return;
    }
    let lines = get_metric(&s, "nthpool_access_log_lines_total");
    s.signal("TERM");
    let status = exit_within(&mut s.child, Duration::from_secs(10)).expect("the server exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    let text = std::fs::read(s.dir.join("access.log")).unwrap();
    let whole = text.iter().filter(|&&c| c == b'\n').count() as u64;
    let log = s.log();
    let said = format!("its writes still fail at the stop; {} lines were dropped since they began", lines - whole);
    assert!(log.contains(&said), "{lines} lines, {whole} in the file: {log}");
    assert!(!log.contains("not taken by its reader"), "{log}");
}

/// Sets the server's soft file size limit (`prlimit`): false where it cannot.
fn file_size_limit(s: &TestServer, limit: &str) -> bool {
    std::process::Command::new("prlimit")
        .arg("--pid")
        .arg(s.pid().to_string())
        .arg(format!("--fsize={limit}:"))
        .status()
        .is_ok_and(|status| status.success())
}

/// Under a file size limit of 1 000 bytes, 12 refused acquires (about 190
/// bytes a line: the sixth is torn at the limit), until a log write has
/// failed; false (the test is skipped) where the limit cannot be set.
fn tear_a_line_at_a_file_size_limit(s: &TestServer) -> bool {
    if !file_size_limit(s, "1000") {
        eprintln!("skipped: `prlimit` cannot set the server's file size limit here");
        return false;
    }
    for i in 0..12 {
        assert_refused(&s.request(&post(ACQUIRE, "wrong-key", "", "")), 401, "unauthorized", &format!("acquire {i}"));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while get_metric(s, "nthpool_access_log_write_errors_total") == 0 {
        assert!(Instant::now() < deadline, "no log write ever failed");
        thread::sleep(Duration::from_millis(20));
    }
    true
}

/// A scratch directory holding a named pipe, `access.fifo`, and a
/// configuration that logs to it: (directory, pipe, configuration file).
/// `None`, with a note, where `mkfifo` is not available.
fn fifo_log_setup() -> Option<(Scratch, std::path::PathBuf, std::path::PathBuf)> {
    let dir = scratch_dir();
    let fifo = dir.join("access.fifo");
    match std::process::Command::new("mkfifo").arg(&fifo).status() {
        Ok(status) if status.success() => {}
        other => {
            eprintln!("skipped: `mkfifo` is not available here ({other:?})");
            return None;
        }
    }
    let config_path = dir.join("config.json");
    let config = config("", "").replacen(r#""accessLog":null"#, r#""accessLog":"access.fifo""#, 1);
    std::fs::write(&config_path, config).unwrap();
    Some((dir, fifo, config_path))
}

#[test]
fn a_named_pipe_whose_reader_left_never_blocks_a_sighup_or_a_stop() {
    // SPEC §9: writing the access log never blocks the event loop. A log
    // shipper reading a named pipe may go away; the SIGHUP of a log rotation
    // must then not wait for it to come back (opening a pipe for writing
    // waits for a reader), and the lines wait in the pipe for the next one.
    let Some((dir, fifo, config_path)) = fifo_log_setup() else {
        return;
    };
    // Reads the pipe until it has a line, then closes it (the reader leaves).
    let read_a_line = |fifo: std::path::PathBuf| {
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            let mut line = String::new();
            let mut reader = std::io::BufReader::new(std::fs::File::open(fifo).unwrap());
            std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
            let _ = tx.send(line);
        });
        rx
    };
    let first = read_a_line(fifo.clone());
    let mut s = TestServer::start_with(dir, config_path, &[]);
    assert_refused(&s.request(&post(ACQUIRE, "wrong-key", "", "")), 401, "unauthorized", "first");
    let line = first.recv_timeout(Duration::from_secs(10)).expect("the first line reaches the reader");
    assert!(line.contains(r#""status":401"#), "{line}");
    // The reader is gone: a rotation's SIGHUP reopens the pipe.
    s.signal("HUP");
    wait_for_reloads(&s, 1);
    assert_refused(&s.request(&post(ACQUIRE, "wrong-key", "", "")), 401, "unauthorized", "after the SIGHUP");
    let line = read_a_line(fifo).recv_timeout(Duration::from_secs(10)).expect("the next reader gets the line");
    assert!(line.contains(r#""status":401"#), "{line}");
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(5)).success());
}

#[test]
fn a_pipe_reader_that_fell_behind_gets_the_backlog_without_traffic_and_at_the_stop() {
    // A log shipper on a named pipe that stopped reading while hundreds of
    // KiB of lines piled up: once it reads again the backlog comes every
    // 200 ms with no traffic to push it, and a stop waits (until its
    // snapshot must begin) for a reader to take what is buffered.
    const LINES: usize = 2500;
    let Some((dir, fifo, config_path)) = fifo_log_setup() else {
        return;
    };
    let mut s = TestServer::start_with(dir, config_path, &[]);
    let mut c = s.connect();
    for _ in 0..LINES {
        c.write_all(&post(ACQUIRE, "wrong-key", "", "")).unwrap();
        assert_eq!(read_response(&mut c).unwrap().status, 401);
    }
    // The reader comes back; no request follows.
    let (tx, rx) = std::sync::mpsc::channel();
    let reader_fifo = fifo.clone();
    thread::spawn(move || {
        let mut pipe = std::fs::File::open(reader_fifo).unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = std::io::Read::read(&mut pipe, &mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while count_lines(&got) < LINES {
        assert!(Instant::now() < deadline, "{} of {LINES} lines came without traffic", count_lines(&got));
        if let Ok(piece) = rx.recv_timeout(Duration::from_millis(100)) {
            got.extend(piece);
        }
    }
    // Another backlog, written as fast as the server takes it, then a stop
    // at once: the stop waits for the reader to take it all.
    let mut pipelined = Vec::new();
    for _ in 0..LINES {
        pipelined.extend(post(ACQUIRE, "wrong-key", "", ""));
    }
    c.write_all(&pipelined).unwrap();
    for _ in 0..LINES {
        assert_eq!(read_response(&mut c).unwrap().status, 401);
    }
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(5)).success());
    while let Ok(piece) = rx.recv_timeout(Duration::from_secs(2)) {
        got.extend(piece);
    }
    assert_eq!(count_lines(&got), 2 * LINES, "every line reached the reader by the stop");
}

#[test]
fn lines_left_unread_in_a_named_pipe_at_a_stop_are_reported() {
    // The server holds the pipe open for reading too, so what it wrote
    // lives in the pipe while no shipper reads, and is gone once the stop
    // closes the last descriptor of it: the stop says so.
    let Some((_dir, fifo, _)) = fifo_log_setup() else {
        return;
    };
    let logged = config("", "").replacen(r#""accessLog":null"#, &format!(r#""accessLog":{fifo:?}"#), 1);
    let mut s = TestServer::start_logged(&logged, "warn");
    assert_eq!(s.request(&post(ACQUIRE, "wrong-key", "", "")).status, 401);
    thread::sleep(Duration::from_millis(300));
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(5)).success());
    assert!(s.log().contains("bytes were still in the named pipe at the stop"), "{}", s.log());

    // A SIGHUP that reopens the same pipe (a rotation) keeps what it holds
    // and says nothing; one that moves the log to a file says what it left.
    let Some((_dir, fifo, _)) = fifo_log_setup() else {
        return;
    };
    let on_fifo = config("", "").replacen(r#""accessLog":null"#, &format!(r#""accessLog":{fifo:?}"#), 1);
    let s = TestServer::start_logged(&on_fifo, "warn");
    assert_eq!(s.request(&post(ACQUIRE, "wrong-key", "", "")).status, 401);
    thread::sleep(Duration::from_millis(300));
    s.signal("HUP");
    wait_for_reloads(&s, 1);
    assert!(!s.log().contains("still in the named pipe"), "{}", s.log());
    std::fs::write(&s.config_path, config_json_with_log("access.log", "")).unwrap();
    s.signal("HUP");
    wait_for_reloads(&s, 2);
    assert!(s.log().contains("still in the named pipe at a reload that moved the log off it"), "{}", s.log());
}

fn count_lines(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b == b'\n').count()
}

/// A credential header sent twice is refused as a one-value control header
/// is (`400` naming it), whatever the copies say: which one counts would be
/// a guess. Sent once, the same values pass.
#[test]
fn a_credential_header_sent_twice_is_refused_naming_it() {
    let s = TestServer::start(&config(JWT_POOL, ""));
    let twice = format!("{}{}", jwt_header(&good_jwt()), jwt_header(&good_jwt()));
    assert_refused(&s.acquire(&twice, ""), 400, "bad_request", "X-Nthpool-Jwt twice");
    assert!(s.acquire(&twice, "").json()["message"].as_str().unwrap().contains("X-Nthpool-Jwt"));
    assert_eq!(s.acquire(&jwt_header(&good_jwt()), "").status, 200);

    let s = TestServer::start(&config(&hmac_pool(""), ""));
    for name in ["X-Nthpool-Timestamp", "X-Nthpool-Nonce", "X-Nthpool-Signature"] {
        let good = signing_headers(ACQUIRE, "", epoch_ms(), &fresh_nonce());
        let line = good.split_inclusive("\r\n").find(|l| l.starts_with(name)).unwrap().to_string();
        let r = s.request(&post(ACQUIRE, KEY, &format!("{good}{line}"), ""));
        assert_refused(&r, 400, "bad_request", name);
        assert!(r.json()["message"].as_str().unwrap().contains(name), "{r:?}");
        // The refusal spent no nonce: the same headers once still pass.
        assert_eq!(s.request(&post(ACQUIRE, KEY, &good, "")).status, 200, "{name} once");
    }

    let [k1, ..] = rsa_keys();
    let s = start_cloudflare(&jwks(&[("k1", k1)]));
    let token = cf_header(&rs256(k1, Some("k1"), &cf_good_claims()));
    assert_refused(&s.acquire(&format!("{token}{token}"), ""), 400, "bad_request", "Cf-Access-Jwt-Assertion twice");
    assert_eq!(s.acquire(&token, "").status, 200);
}

/// On a dual-stack listener an IPv4 client arrives as `::ffff:127.0.0.1`;
/// the log, `ipAllow` and `trustedProxies` see it as `127.0.0.1`, as on an
/// IPv4 listener, whatever the pool's policies.
#[test]
fn a_dual_stack_listener_logs_and_matches_ipv4_clients_as_ipv4() {
    if std::net::TcpListener::bind("[::]:0").is_err() {
        eprintln!("SKIPPED: no IPv6 on this machine, so no dual-stack listener");
        return;
    }
    let dir = scratch_dir();
    let pools = r#""pools":{"p":{"keys":["test-key-0001"],"access":{"ipAllow":["127.0.0.0/8"]}},"#;
    let json = config_with_access_log("").replacen(r#""pools":{"p":{"keys":["test-key-0001"]},"#, pools, 1);
    assert!(json.contains("ipAllow"), "{json}");
    std::fs::write(dir.join("config.json"), &json).unwrap();
    let config_path = dir.join("config.json");
    let mut s = TestServer::start_with(dir, config_path, &["--listen", "[::]:0"]);
    let v4 = std::net::SocketAddr::from(([127, 0, 0, 1], s.addr.port()));
    for pool in ["p", "other"] {
        let key = if pool == "p" { KEY } else { "other-key" };
        let mut c = std::net::TcpStream::connect(v4).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(&post(&format!("/pools/{pool}/lock/acquire"), key, "", "")).unwrap();
        let r = read_response(&mut c).expect("an answer");
        assert_eq!(r.status, 200, "{pool}: {r:?}");
    }
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(10)).success());
    let (text, lines) = access_log(&s);
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines.iter().all(|l| l["client"] == "127.0.0.1"), "{text}");
}

/// A client whose trace id changes on every request, behind a trusted
/// proxy whose `X-Forwarded-For` changes too (one connection, as HAProxy
/// reuses one for many clients): every acquire is logged with its own
/// client address, and a key of the same length that is wrong is refused,
/// however often the rest of the head repeats.
#[test]
fn a_changing_trace_id_carries_no_client_address_or_key_over() {
    let json = config_with_access_log(r#""adaptive":false,"access":{"trustedProxies":["127.0.0.1/32"]}"#);
    let mut s = TestServer::start(&json);
    let mut c = s.connect();
    let mut sent: Vec<(String, u64)> = Vec::new();
    for i in 0..40u32 {
        // The first half from one client: the memo learns the trace id.
        let client = format!("10.0.0.{}", if i < 20 { 10 } else { 10 + i % 7 });
        let key = if i % 9 == 8 { "test-key-000X" } else { KEY };
        let headers = format!("Traceparent: 00-{:032x}-{:016x}-01\r\nX-Forwarded-For: {client}\r\n", i * 7919, i);
        c.write_all(&post("/pools/p/lock/acquire", key, &headers, "")).unwrap();
        let r = read_response(&mut c).expect("an answer");
        if key == KEY {
            assert_eq!(r.status, 200, "request {i}: {r:?}");
            let report = r#"{"status":200}"#;
            c.write_all(&post(&format!("/pools/p/lock/{}/release", r.slot()), KEY, &headers, report)).unwrap();
            assert_eq!(read_response(&mut c).expect("an answer").status, 200, "release {i}");
        } else {
            assert_eq!(r.status, 401, "request {i} with a wrong key: {r:?}");
        }
        sent.push((client, if key == KEY { 200 } else { 401 }));
    }
    s.signal("TERM");
    assert!(wait_for_exit(&mut s, Duration::from_secs(10)).success());
    let (text, lines) = access_log(&s);
    let logged: Vec<(String, u64)> =
        lines.iter().map(|l| (l["client"].as_str().unwrap().to_string(), l["status"].as_u64().unwrap())).collect();
    assert_eq!(logged, sent, "{text}");
}

/// A reload that removes the key a queued acquire presented, or stops
/// admitting its address, refuses it at once (`401`, `403`), as a new
/// request would be: granted, it would hold a slot it could neither renew
/// nor release until its term ran out. A waiter whose key stays waits on
/// and is granted as before.
#[test]
fn a_reload_that_revokes_a_waiters_key_or_address_refuses_it() {
    let json = |keys: &str, extra: &str| {
        format!(
            r#"{{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{{"p":{{"keys":[{keys}],
            "concurrency":1,"adaptive":false,"queue":{{"size":10,"timeoutMs":20000}}{extra}}}}}}}"#
        )
    };
    const KEPT: &str = "kept-key-0123456";
    let both = format!(r#""{KEY}","{KEPT}""#);
    let s = TestServer::start(&json(&both, ""));
    let holder = s.request(&post("/pools/p/lock/acquire", KEY, "", "")).slot();
    let queue = |key: &str| {
        let mut c = s.connect();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(&post("/pools/p/lock/acquire", key, "", r#"{"waitMs":15000}"#)).unwrap();
        c
    };
    let waiting = |n: f64| eventually("the waiters queued", || s.metric("nthpool_waiters{pool=\"p\"}") == Some(n));
    let mut revoked = queue(KEY);
    waiting(1.0);
    let mut kept = queue(KEPT);
    waiting(2.0);
    s.reload(&json(&format!(r#""{KEPT}""#), ""));
    let r = read_response(&mut revoked).expect("an answer at the reload");
    assert_eq!((r.status, r.error_code()), (401, "unauthorized".to_string()), "{r:?}");
    waiting(1.0);
    // The slot the removed key holds is released with a key the pool still has.
    let released = s.request(&post(&format!("/pools/p/lock/{holder}/release"), KEPT, "", ""));
    assert_eq!(released.status, 200, "{released:?}");
    let r = read_response(&mut kept).expect("the kept key's grant");
    assert_eq!(r.status, 200, "{r:?}");
    // A key moved from `keys` to `keySha256` still opens the pool: its waiter waits on.
    let digest: String = Sha256::digest(KEPT.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let mut moved = queue(KEPT);
    waiting(1.0);
    s.reload(&json(r#""other-key-0123456""#, &format!(r#","keySha256":["{digest}"]"#)));
    let holder = r.slot();
    let released = s.request(&post(&format!("/pools/p/lock/{holder}/release"), KEPT, "", ""));
    assert_eq!(released.status, 200, "{released:?}");
    let r = read_response(&mut moved).expect("the moved key's grant");
    assert_eq!(r.status, 200, "{r:?}");
    s.reload(&json(&format!(r#""{KEPT}""#), ""));
    // The pool now admits only 10.0.0.0/8: a waiter from 127.0.0.1 is refused.
    let mut outside = queue(KEPT);
    waiting(1.0);
    s.reload(&json(&format!(r#""{KEPT}""#), r#","access":{"ipAllow":["10.0.0.0/8"]}"#));
    let r = read_response(&mut outside).expect("an answer at the reload");
    assert_eq!((r.status, r.error_code()), (403, "unauthorized".to_string()), "{r:?}");
    waiting(0.0);
}

/// A reload that removes a waiter's key and raises the pool's limit: the
/// waiter is refused before the room the reload makes is granted, so it is
/// answered `401`, not granted a slot its key can no longer renew.
#[test]
fn a_reload_that_revokes_a_waiters_key_and_raises_the_limit_refuses_it_first() {
    let json = |keys: &str, concurrency: u32| {
        format!(
            r#"{{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{{"p":{{"keys":[{keys}],
            "concurrency":{concurrency},"adaptive":false,"queue":{{"size":10,"timeoutMs":20000}}}}}}}}"#
        )
    };
    const KEPT: &str = "kept-key-0123456";
    let s = TestServer::start(&json(&format!(r#""{KEY}","{KEPT}""#), 1));
    s.request(&post("/pools/p/lock/acquire", KEPT, "", "")).slot();
    let mut revoked = s.connect();
    revoked.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    revoked.write_all(&post("/pools/p/lock/acquire", KEY, "", r#"{"waitMs":15000}"#)).unwrap();
    eventually("the waiter queued", || s.metric("nthpool_waiters{pool=\"p\"}") == Some(1.0));
    s.reload(&json(&format!(r#""{KEPT}""#), 2));
    let r = read_response(&mut revoked).expect("an answer at the reload");
    assert_eq!((r.status, r.error_code()), (401, "unauthorized".to_string()), "{r:?}");
    assert_eq!(s.metric("nthpool_slots_held{pool=\"p\"}"), Some(1.0), "the waiter took no slot");
    assert_eq!(s.metric("nthpool_grants_total{pool=\"p\"}"), Some(1.0));
}
