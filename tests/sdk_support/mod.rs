//! A mock LLM upstream speaking the wire shapes of the OpenAI chat
//! completions and Anthropic messages APIs (plain JSON and server-sent
//! events), recording the credentials each request carried; and the Python
//! environment with the official SDKs that `.ci/run` prepares.
#![allow(dead_code)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The text every answer carries, cut into these pieces when streamed.
pub const REPLY_PIECES: [&str; 4] = ["Hello ", "from ", "the mock ", "upstream."];

/// What one request showed the upstream.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Every header, names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// The mock upstream on `127.0.0.1:0`: keep-alive HTTP/1.1, one thread per
/// connection, as long as the test runs.
pub struct MockLlm {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl MockLlm {
    pub fn start() -> MockLlm {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(tcp) = tcp else { continue };
                tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let seen = seen2.clone();
                std::thread::spawn(move || {
                    let _ = serve(tcp, &seen);
                });
            }
        });
        MockLlm { addr, seen }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Serves requests on one connection until the client closes it. Generic
/// over the stream so it runs over TLS as well.
pub fn serve<S: Read + Write>(stream: S, seen: &Mutex<Vec<Seen>>) -> io::Result<()> {
    let mut stream = BufReader::new(stream);
    loop {
        let Some(request) = read_request(&mut stream)? else {
            return Ok(());
        };
        seen.lock().unwrap().push(request.clone());
        let out = stream.get_mut();
        answer(&request, out)?;
        out.flush()?;
    }
}

fn read_request<R: BufRead>(r: &mut R) -> io::Result<Option<Seen>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    let mut request = Seen { method, path, headers, body: String::new() };
    let mut body = Vec::new();
    if let Some(len) = request.header("content-length") {
        body.resize(len.parse().unwrap_or(0), 0);
        r.read_exact(&mut body)?;
    } else if request.header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }
    request.body = String::from_utf8_lossy(&body).into_owned();
    Ok(Some(request))
}

fn answer<W: Write>(request: &Seen, out: &mut W) -> io::Result<()> {
    let body: serde_json::Value = match serde_json::from_str(&request.body) {
        Ok(v) => v,
        Err(_) => return json(out, 400, &serde_json::json!({"error": {"message": "body is not JSON"}})),
    };
    let stream = body["stream"].as_bool().unwrap_or(false);
    let model = body["model"].as_str().unwrap_or("").to_owned();
    if model.is_empty() || !body["messages"].is_array() {
        return json(out, 400, &serde_json::json!({"error": {"message": "model and messages are required"}}));
    }
    match (request.method.as_str(), request.path.as_str()) {
        ("POST", "/v1/chat/completions") if stream => openai_stream(out, &model),
        ("POST", "/v1/chat/completions") => json(out, 200, &openai_completion(&model)),
        ("POST", "/v1/messages") if stream => anthropic_stream(out, &model),
        ("POST", "/v1/messages") => json(out, 200, &anthropic_message(&model)),
        _ => json(out, 404, &serde_json::json!({"error": {"message": "no such route"}})),
    }
}

fn reply_text() -> String {
    REPLY_PIECES.concat()
}

fn openai_completion(model: &str) -> serde_json::Value {
    serde_json::json!({
        "id": "chatcmpl-mock1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": reply_text()},
            "finish_reason": "stop",
            "logprobs": null
        }],
        "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    })
}

fn anthropic_message(model: &str) -> serde_json::Value {
    serde_json::json!({
        "id": "msg_mock1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": reply_text()}],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        "usage": {"input_tokens": 5, "output_tokens": 4}
    })
}

fn json<W: Write>(out: &mut W, status: u16, value: &serde_json::Value) -> io::Result<()> {
    let body = value.to_string();
    let reason = if status == 200 { "OK" } else { "Error" };
    write!(
        out,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Starts a chunked `text/event-stream` answer.
fn sse_head<W: Write>(out: &mut W) -> io::Result<()> {
    out.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
}

/// One event as one chunk, flushed, so it leaves at once.
fn sse_event<W: Write>(out: &mut W, event: Option<&str>, data: &str) -> io::Result<()> {
    let mut text = String::new();
    if let Some(event) = event {
        text.push_str("event: ");
        text.push_str(event);
        text.push('\n');
    }
    text.push_str("data: ");
    text.push_str(data);
    text.push_str("\n\n");
    write!(out, "{:x}\r\n{text}\r\n", text.len())?;
    out.flush()
}

fn sse_end<W: Write>(out: &mut W) -> io::Result<()> {
    out.write_all(b"0\r\n\r\n")
}

fn openai_stream<W: Write>(out: &mut W, model: &str) -> io::Result<()> {
    sse_head(out)?;
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        serde_json::json!({
            "id": "chatcmpl-mock1",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]
        })
        .to_string()
    };
    sse_event(out, None, &chunk(serde_json::json!({"role": "assistant", "content": ""}), serde_json::Value::Null))?;
    for piece in REPLY_PIECES {
        sse_event(out, None, &chunk(serde_json::json!({"content": piece}), serde_json::Value::Null))?;
    }
    sse_event(out, None, &chunk(serde_json::json!({}), "stop".into()))?;
    sse_event(out, None, "[DONE]")?;
    sse_end(out)
}

fn anthropic_stream<W: Write>(out: &mut W, model: &str) -> io::Result<()> {
    sse_head(out)?;
    let mut start = anthropic_message(model);
    start["content"] = serde_json::json!([]);
    start["stop_reason"] = serde_json::Value::Null;
    start["usage"]["output_tokens"] = 0.into();
    let events = std::iter::once(("message_start", serde_json::json!({"type": "message_start", "message": start})))
        .chain(std::iter::once((
            "content_block_start",
            serde_json::json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        )))
        .chain(REPLY_PIECES.iter().map(|piece| {
            (
                "content_block_delta",
                serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}),
            )
        }))
        .chain([
            ("content_block_stop", serde_json::json!({"type": "content_block_stop", "index": 0})),
            (
                "message_delta",
                serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 4}}),
            ),
            ("message_stop", serde_json::json!({"type": "message_stop"})),
        ]);
    for (name, data) in events {
        sse_event(out, Some(name), &data.to_string())?;
    }
    sse_end(out)
}

/// The Python with the `openai` and `anthropic` packages: `NTHPOOL_SDK_PYTHON`,
/// else the virtual environment `.ci/run` makes under `target/`. None (the
/// test skips) outside CI; under CI a missing one fails the test.
pub fn sdk_python() -> Option<PathBuf> {
    let candidate = std::env::var_os("NTHPOOL_SDK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/sdk-venv/bin/python"));
    let works =
        Command::new(&candidate).args(["-c", "import openai, anthropic"]).output().is_ok_and(|o| o.status.success());
    if works {
        return Some(candidate);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set but {} cannot import openai and anthropic (.ci/run makes it)",
        candidate.display()
    );
    println!("skipped: no Python with the openai and anthropic SDKs at {} (run .ci/run once)", candidate.display());
    None
}

/// Runs `tests/sdk/<script>` with `base_url` and `api_key`; returns its
/// stdout, panicking with its output if it failed.
pub fn run_sdk_script(python: &PathBuf, script: &str, base_url: &str, api_key: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk").join(script);
    let out = Command::new(python)
        .arg(&path)
        .env("SDK_BASE_URL", base_url)
        .env("SDK_API_KEY", api_key)
        .env("SDK_EXPECT", serde_json::json!(REPLY_PIECES).to_string())
        // Nothing from the caller's environment may steer the SDKs.
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .env("NO_PROXY", "*")
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{script} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
