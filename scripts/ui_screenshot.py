"""Check in a real headless browser that the Prefect UI shows the report artifact's images.

    python scripts/ui_screenshot.py [--report data/report/report.md] [--out .cache/ui_screenshot]

1. Starts `prefect server start` on a free port with a temporary PREFECT_HOME.
2. Runs a flow that publishes a report through `flows.pipeline.publish_results`, the
   code the pipeline flow runs: `--report` (default: a sample report.md with two PNG
   figures, written to a temporary folder), and the same markdown with its relative
   image paths as they were published before (key `report-relative`), as a control.
3. Opens each artifact's page (/artifacts/artifact/<id>) in headless Chromium
   (/usr/bin/chromium, driven over the DevTools protocol) and waits until every <img>
   in the page has loaded; counts the images that decoded (naturalWidth > 0).
4. Saves a full-page screenshot of each page under --out, prints what it found,
   stops Chromium and the server by their PIDs.

Exit status 0 when the embedded report shows all its images and the control shows
none of them (so the check can tell a broken image from a shown one).
Needs Chromium: `apt-get install -y chromium`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flows.serve import prefect_env, start_server, stop_server, wait_healthy  # noqa: E402
from scripts.prefect_server_check import free_port  # noqa: E402

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1400,1800"]
# Every image of the page once all have finished loading (or failed to), else null.
IMAGES_JS = """(() => {
  const imgs = Array.from(document.querySelectorAll('img'));
  if (!document.body || !document.body.innerText.includes(%s) || imgs.some(i => !i.complete)) return null;
  return JSON.stringify(imgs.map(i => ({src: i.getAttribute('src').slice(0, 40), width: i.naturalWidth})));
})()"""


def wait_devtools(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    """Until Chromium's DevTools endpoint answers; raises if Chromium exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=2):
                return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode}") from None
            time.sleep(0.5)
    raise TimeoutError(f"chromium's DevTools port {port} did not answer within {timeout_s:.0f} s")


def sample_report(folder: Path) -> Path:
    """A report.md like the report stage's: a heading, a table and two PNG figures beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, ys in (("rl_curves.png", [0.1, 0.3, 0.35, 0.5, 0.55]), ("success_by_level.png", [0.4, 0.35])):
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.plot(ys, marker="o") if name.startswith("rl") else ax.bar(["w2-o3-q4", "w4-o6-q8"], ys)
        ax.set_title(name.removesuffix(".png"))
        fig.savefig(folder / name, dpi=80)
        plt.close(fig)
    text = ("# Report\n\n| level | rl |\n|---|---:|\n| w2-o3-q4 | 40% |\n\n"
            "## RL learning curves\n\n![RL learning curves](rl_curves.png)\n\n"
            "## Success by level\n\n![Success by level](success_by_level.png)\n")
    (folder / "report.md").write_text(text)
    return folder / "report.md"


def publish(report: Path) -> dict[str, str]:
    """Run a flow that publishes `report` as the pipeline does, and the unembedded control;
    return {artifact key: artifact id}."""
    from prefect import flow
    from prefect.artifacts import create_markdown_artifact
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.pipeline import publish_results

    @flow(name="ui-screenshot-check")
    def check() -> None:
        publish_results(report.parent, "no-metrics.json", report.name)
        create_markdown_artifact(report.read_text(), key="report-relative", description="relative image paths")

    check()
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["report", "report-relative"])))
    return {a.key: str(a.id) for a in found}


async def look(debug_port: int, url: str, heading: str, shot: Path, timeout_s: float) -> list[dict]:
    """Open `url` in the running Chromium, wait for its images, screenshot it; return the images."""
    import websockets

    with urllib.request.urlopen(f"http://127.0.0.1:{debug_port}/json/list") as r:
        page = next(t for t in json.load(r) if t["type"] == "page")
    async with websockets.connect(page["webSocketDebuggerUrl"], max_size=2**28) as ws:
        counter = 0

        async def call(method: str, **params):
            nonlocal counter
            counter += 1
            await ws.send(json.dumps({"id": counter, "method": method, "params": params}))
            while True:
                msg = json.loads(await ws.recv())
                if msg.get("id") == counter:
                    return msg.get("result", {})

        await call("Page.enable")
        await call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        images = None
        while images is None and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            res = await call("Runtime.evaluate", expression=IMAGES_JS % json.dumps(heading), returnByValue=True)
            value = res.get("result", {}).get("value")
            images = json.loads(value) if value else None
        # The UI scrolls inside its own panel: make the window as tall as that panel's content.
        tall = await call("Runtime.evaluate", returnByValue=True, expression=(
            "Math.max(...Array.from(document.querySelectorAll('*')).map(e => e.scrollHeight))"))
        height = min(int(tall.get("result", {}).get("value") or 1800), 8000)
        await call("Emulation.setDeviceMetricsOverride", width=1400, height=height, deviceScaleFactor=1, mobile=False)
        await asyncio.sleep(2.0)  # let the page settle before the picture
        shot_data = await call("Page.captureScreenshot", format="png")
        shot.write_bytes(base64.b64decode(shot_data["data"]))
        if images is None:
            raise TimeoutError(f"{url}: the report did not finish loading within {timeout_s:.0f} s")
        return images


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", type=Path, help="a report.md with images beside it (default: a sample)")
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "ui_screenshot")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds for the server, and for each page")
    args = parser.parse_args(argv)
    if not Path(args.chromium).exists():
        print(f"no Chromium at {args.chromium}: apt-get install -y chromium", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ui-screenshot-"))
    report = args.report.resolve() if args.report else sample_report(tmp)
    heading = next((ln.lstrip("# ").strip() for ln in report.read_text().splitlines() if ln.startswith("#")), "")

    port, debug_port = free_port(), free_port()
    env = prefect_env(tmp / "prefect-home")
    env["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
    server = start_server("127.0.0.1", port, env, tmp / "server.log")
    browser = None
    ok = False
    try:
        print(f"prefect server pid {server.pid}: healthy after {wait_healthy(env['PREFECT_API_URL'], server, args.timeout):.0f} s")
        os.environ.update(env)  # before prefect is imported (flows.pipeline imports it)
        from flows.pipeline import IMAGE

        targets = [target for _, target in IMAGE.findall(report.read_text())]
        n_images = len(targets)
        ids = publish(report)
        browser = subprocess.Popen([args.chromium, *CHROMIUM_FLAGS, f"--remote-debugging-port={debug_port}",
                                    f"--user-data-dir={tmp / 'chromium'}", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_devtools(debug_port, browser, 60)
        print(f"chromium pid {browser.pid}; the report has {n_images} images")
        shown = {}
        for key in ("report", "report-relative"):
            url = f"http://127.0.0.1:{port}/artifacts/artifact/{ids[key]}"
            shot = args.out / f"{key}.png"
            images = asyncio.run(look(debug_port, url, heading, shot, args.timeout))
            ours = [i for i in images if i["src"].startswith("data:image/") or i["src"] in targets]  # not the UI's own
            shown[key] = sum(i["width"] > 0 for i in ours)
            print(f"{key}: {url}\n  images in the page: {images}\n  shown: {shown[key]} of {n_images}; screenshot {shot}")
        ok = shown["report"] == n_images > 0 and shown["report-relative"] == 0
    except Exception as e:  # report, stop everything, fail
        print(f"FAILED: {type(e).__name__}: {e}")
    finally:
        if browser is not None:
            stop_server(browser)  # by its PID, with its renderer processes
        stop_server(server)
        print(f"chromium and server stopped (server exit {server.returncode})")
        shutil.rmtree(tmp, ignore_errors=True)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
