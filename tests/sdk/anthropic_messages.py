"""The official Anthropic SDK, unchanged, against SDK_BASE_URL with
SDK_API_KEY: a message, then the same streamed; checks the text that came back
(SDK_EXPECT: a JSON list of the pieces the stream must deliver, in order)."""
import json
import os

from anthropic import Anthropic

expected = json.loads(os.environ["SDK_EXPECT"])
client = Anthropic(
    base_url=os.environ["SDK_BASE_URL"],
    api_key=os.environ["SDK_API_KEY"],
    max_retries=0,
    timeout=20,
)
messages = [{"role": "user", "content": "Say hello."}]

reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=messages)
text = "".join(block.text for block in reply.content if block.type == "text")
assert text == "".join(expected), f"plain message said {text!r}"

with client.messages.stream(model="claude-sonnet-4-5", max_tokens=64, messages=messages) as stream:
    pieces = list(stream.text_stream)
assert pieces == expected, f"stream delivered {pieces!r}"
print("anthropic ok:", len(pieces), "stream pieces")
