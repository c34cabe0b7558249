"""Chromium's own reader of the Trace Event Format, for the tests of
`report --chrome-trace`: headless Chromium's bundled DevTools frontend,
whose Performance panel imports such files, parses the JSON with its trace
model (models/trace/trace.js, TraceModel.Model) through the DevTools
protocol. A minimal protocol client (a WebSocket of text frames) is here:
the standard library has none.

    read(json_text) -> {"processes": {pid: name}, ...}

Skips (pythons.need) where Chromium is absent."""
import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pythons

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FRONTEND = "devtools://devtools/bundled/devtools_app.html"

# Runs in the DevTools frontend: parse with every handler, answer what the
# model found (process names from the metadata events).
PARSE = """(async (text) => {
  const T = await import("./models/trace/trace.js");
  const model = T.TraceModel.Model.createWithAllHandlers();
  const doc = JSON.parse(text);
  await model.parse(doc.traceEvents, {metadata: {}, isFreshRecording: false});
  const d = model.parsedTrace(0).data || model.parsedTrace(0);
  const processes = {};
  for (const [pid, ev] of d.Meta.processNames) processes[pid] = ev.args.name;
  return JSON.stringify({processes});
})"""


class _Socket(object):
    def __init__(self, url):
        hostport, path = url[len("ws://"):].split("/", 1)
        host, port = hostport.split(":")
        self.s = socket.create_connection((host, int(port)), timeout=pythons.HANG_S)
        key = base64.b64encode(os.urandom(16)).decode()
        self.s.sendall(("GET /%s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: "
                        "Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
                        % (path, hostport, key)).encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += self.s.recv(4096)
        assert b" 101 " in buf.split(b"\r\n")[0], buf
        self.buf = buf.split(b"\r\n\r\n", 1)[1]
        self.n = 0

    def _take(self, n):
        while len(self.buf) < n:
            c = self.s.recv(1 << 20)
            if not c:
                raise EOFError("DevTools closed the connection")
            self.buf += c
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def call(self, method, **params):
        self.n += 1
        data = json.dumps({"id": self.n, "method": method, "params": params}).encode()
        n = len(data)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else
                                bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                                bytes([0x80 | 127]) + struct.pack(">Q", n))
        mask = os.urandom(4)
        body = bytes(c ^ mask[i % 4] for i, c in enumerate(data))
        self.s.sendall(head + mask + body)
        msg = b""
        while True:
            b0, b1 = self._take(2)
            ln = b1 & 0x7F
            if ln == 126:
                ln = struct.unpack(">H", self._take(2))[0]
            elif ln == 127:
                ln = struct.unpack(">Q", self._take(8))[0]
            msg += self._take(ln)
            if b0 & 0x80:
                m = json.loads(msg)
                msg = b""
                if m.get("id") == self.n:
                    return m


def read(text):
    if CHROMIUM is None:
        pythons.need("chromium", "chromium is not installed (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="spyreshim-devtools.") as profile:
        proc = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                                 "--no-first-run", "--disable-background-networking",
                                 "--remote-debugging-port=0", "--user-data-dir=" + profile,
                                 "about:blank"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + pythons.HANG_S
            while not (port_file.exists() and port_file.read_text().strip()):
                assert proc.poll() is None and time.monotonic() < deadline, "chromium did not start"
                time.sleep(0.1)
            port = int(port_file.read_text().split()[0])
            targets = json.load(urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port))
            page = _Socket(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
            page.call("Page.enable")
            page.call("Page.navigate", url=FRONTEND)
            while True:       # the frontend's modules load after navigation
                r = page.call("Runtime.evaluate", expression="document.readyState")
                if r["result"]["result"].get("value") == "complete":
                    break
                assert time.monotonic() < deadline, "the DevTools frontend did not load"
                time.sleep(0.1)
            r = page.call("Runtime.evaluate", expression="%s(%s)" % (PARSE, json.dumps(text)),
                          awaitPromise=True)
            res = r["result"]
            assert "exceptionDetails" not in res, res["exceptionDetails"]
            return json.loads(res["result"]["value"])
        finally:
            proc.kill()
            proc.wait()
