"""A reference nthpool client: standard library only, about 70 lines.

    with Slot("http://127.0.0.1:7070", "demo", "nb_demo_0123456789abcdef", wait_ms=5000) as slot:
        status, headers = call_upstream()           # stop early if slot.lost.is_set()
        slot.report(status, headers)                 # what the upstream said
"""
import json, sys, threading, time, urllib.error, urllib.request


class Busy(Exception):
    """No slot now (429, 503 or 504): try again in `retry_after` seconds."""
    def __init__(self, status, retry_after):
        super().__init__(f"nthpool answered {status}; retry in {retry_after} s")
        self.status, self.retry_after = status, retry_after


class Slot:
    def __init__(self, base, pool, key, wait_ms=0):
        self.url, self.key, self.wait_ms = f"{base}/pools/{pool}/lock", key, wait_ms
        self.outcome, self.lost, self.done = {}, threading.Event(), threading.Event()

    def _post(self, path, body, timeout):
        data = json.dumps(body).encode() if body is not None else b""
        headers = {"X-Nthpool-Key": self.key, "Content-Type": "application/json"}
        req = urllib.request.Request(self.url + path, data, headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read()), r.headers
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read() or b"{}"), e.headers
            except ValueError:  # not nthpool's answer: a proxy in front (HAProxy's 502, 503, 504)
                return e.code, {}, e.headers

    def __enter__(self):
        # The HTTP timeout outlasts the wait budget: a queued acquire is never cut short.
        status, body, headers = self._post("/acquire", {"waitMs": self.wait_ms}, self.wait_ms / 1000 + 10)
        if status in (429, 502, 503, 504):
            raise Busy(status, int(headers.get("Retry-After", "1")))
        if status != 200:  # 400, 401, 403, 413: a bug or a wrong key; retrying will not help
            raise RuntimeError(f"nthpool refused the acquire: {status} {body}")
        self.slot = body["slotId"]
        every, term = body["renewIntervalMs"] / 1000, body["termMs"] / 1000
        threading.Thread(target=self._renew, args=(every, term), daemon=True).start()
        return self

    def _renew(self, every, term):
        renewed = time.monotonic()
        while not self.done.wait(every):  # the server's clock decides; renew early, not late
            try:
                status = self._post(f"/{self.slot}/renew", None, 10)[0]
            except OSError:  # nthpool unreachable (a crash, the network)
                status = None
            if status in (None, 502, 503, 504):  # or a proxy in front could not reach it (a failover)
                if time.monotonic() - renewed < term:
                    continue  # try again next time: renewing is idempotent
                status = None  # a whole term without a renewal: the lease is over on any server
            if status != 200:  # 404 reclaimed, 409 capped, or unreachable for a term
                return self.lost.set()  # the lease has ended or will: stop the upstream work
            renewed = time.monotonic()

    def report(self, status, headers=None, **fields):
        self.outcome = {"status": status, "headers": dict(headers or {}), **fields}

    def __exit__(self, *_):
        self.done.set()  # no report (the upstream never answered): release without one
        try:
            status = self._post(f"/{self.slot}/release", self.outcome or None, 10)[0]
        except OSError:
            status = None
        if status in (None, 502, 503, 504):  # unreachable: the slot comes back at the end of its term
            self.lost.set()


if __name__ == "__main__":  # python3 nthpool_client.py BASE POOL KEY WAIT_MS WORK_SECONDS
    base, pool, key, wait_ms, work = sys.argv[1:6]
    try:
        with Slot(base, pool, key, int(wait_ms)) as slot:
            time.sleep(float(work))  # the upstream call
            slot.report(200, {"x-ratelimit-remaining": "99"})
        print(json.dumps({"released": slot.slot[:8], "lost": slot.lost.is_set()}))
    except Busy as busy:
        print(json.dumps({"busy": busy.status, "retryAfter": busy.retry_after}))
