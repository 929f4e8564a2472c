"""A headless Chromium driven over the DevTools protocol (websocket-client, no other driver): load a
page at a window size, evaluate JavaScript in it, take screenshots, collect uncaught errors."""

import base64
import io
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

CHROMIUM = shutil.which("chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0", "--remote-allow-origins=*"]


class Browser:
    """One Chromium process with one page; ``with Browser(tmp) as b: b.open(url, 1280, 900)``."""

    def __init__(self, profile: Path) -> None:
        import websocket

        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.time() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("Chromium did not start")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(p for p in pages if p["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self.next_id, self.errors = 0, []
        self.send("Runtime.enable")
        self.send("Page.enable")

    def send(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("method") == "Runtime.exceptionThrown":
                self.errors.append(msg["params"]["exceptionDetails"].get("text", "") + " " + json.dumps(
                    msg["params"]["exceptionDetails"].get("exception", {}).get("description", "")))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def open(self, url: str, width: int, height: int) -> None:
        """Load ``url`` in a window of ``width`` x ``height`` CSS pixels and wait until it has loaded."""
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.send("Page.navigate", url=url)
        deadline = time.time() + 60
        while self.js("document.readyState") != "complete":
            if time.time() > deadline:
                raise RuntimeError(f"{url} did not finish loading")
            time.sleep(0.1)
        time.sleep(0.3)  # let the page's scripts (circuitsvis) render

    def js(self, expression: str):
        """The value of a JavaScript expression in the page (JSON values only: a DOM element comes back
        as None, so test for one with ``!!``)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r:.80}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def screenshot(self, clip=None):
        """A PIL image of the viewport, or of ``clip`` = (x, y, width, height) in page coordinates."""
        from PIL import Image

        params = {"format": "png", "captureBeyondViewport": clip is not None}
        if clip is not None:
            x, y, w, h = clip
            params["clip"] = {"x": x, "y": y, "width": w, "height": h, "scale": 1}
        data = base64.b64decode(self.send("Page.captureScreenshot", **params)["data"])
        return Image.open(io.BytesIO(data)).convert("RGB")

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            self.proc.wait(timeout=30)
