"""The official OpenAI SDK, unchanged, against SDK_BASE_URL with SDK_API_KEY:
a chat completion, then the same streamed; checks the text that came back
(SDK_EXPECT: a JSON list of the pieces the stream must deliver, in order)."""
import json
import os

from openai import OpenAI

expected = json.loads(os.environ["SDK_EXPECT"])
client = OpenAI(
    base_url=os.environ["SDK_BASE_URL"] + "/v1",
    api_key=os.environ["SDK_API_KEY"],
    max_retries=0,
    timeout=20,
)
messages = [{"role": "user", "content": "Say hello."}]

reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
text = reply.choices[0].message.content
assert text == "".join(expected), f"plain completion said {text!r}"

pieces = []
for chunk in client.chat.completions.create(model="gpt-4o-mini", messages=messages, stream=True):
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
assert pieces == expected, f"stream delivered {pieces!r}"
print("openai ok:", len(pieces), "stream pieces")
