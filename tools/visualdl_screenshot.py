"""Check a run's VisualDL board and photograph it with headless Chromium.

    python tools/visualdl_screenshot.py RUN_DIR [--output_dir DIR] [--chromium PATH] [--no_screenshot]

RUN_DIR is a run's output directory (its ``runs/`` folder is read) or a VisualDL log directory.
The board is served by VisualDL's own app (what the ``visualdl`` command serves, here threaded)
on a free local port, stopped at the end. Through the board's API the
tool checks what a user would see (``check_board``):

- the scalars page opens on the ``train`` group (VisualDL opens only the first group, by name), which
  charts loss, learning rate, tokens/card/s, MFU and peak memory, and nothing else of ours is noise;
- the hyper-parameters tab lists the run's key settings (model, layout, batch, learning rate, seq).

Then it writes ``scalars.png`` and ``hparams.png`` (``WINDOW_WIDTH`` px wide) into DIR (default
RUN_DIR), with Chromium's own ``--screenshot`` (Debian: ``apt-get install chromium``; no driver needed),
and checks in the DOM Chromium rendered (``--dump-dom``, same page) that the picture is of a board
with data: the scalars page opened on the ``train`` group with a drawn chart for each required
scalar, the hyper-parameters page naming each required setting (``rendered_problems``).

Exit status: 0 the board is complete (and photographed), 1 something is missing (each listed on
stdout), 2 bad input (``error: ...``: no board, no Chromium).
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

from pretrain.errors import ArgumentParser, UserError, run_cli

# What a pretraining run's board must show (pretrain/metrics/board.py writes them)
TRAIN_GROUP = "train"
REQUIRED_SCALARS = (
    "train/loss",
    "train/learning_rate",
    "train/tokens_per_card_per_sec",
    "train/mfu",
    "train/peak_memory_gib",
)
REQUIRED_HPARAMS = ("model", "layout", "global_batch_tokens", "learning_rate", "seq_length")
PAGES = {"scalars.png": "/app/scalar", "hparams.png": "/app/hyper-parameter"}  # picture -> page
WINDOW_WIDTH = 1600
WINDOW_HEIGHT = 1300
# Headless Chromium in a closed network: no sandbox (root in containers), no GPU, no background
# connections (refused here, and they slow the start), a fresh profile each time.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
RENDER_BUDGET_MS = 15000  # virtual time the page gets to fetch its data and draw the charts
CHROMIUM_SECONDS = 90  # wall-clock limit of one render (it takes 3-8 s on 2 busy cores)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def log_dir(run_dir: str) -> str:
    """The VisualDL log directory of ``run_dir``: its ``runs/`` folder if it has one, else itself.

    Raises:
        UserError: no VisualDL record file under it.
    """
    folder = os.path.join(run_dir, "runs") if os.path.isdir(os.path.join(run_dir, "runs")) else run_dir
    for _, _, files in os.walk(folder):
        if any(name.startswith("vdlrecords.") for name in files):
            return folder
    raise UserError(
        f"{run_dir}: no VisualDL records (vdlrecords.*) in it or its runs/ folder; train with --report_to visualdl"
    )


TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
SERVER_START_SECONDS = 60  # VisualDL imports Flask and reads the records before it answers


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _serve(logdir: str, port: str) -> None:
    """VisualDL's app for ``logdir`` on 127.0.0.1:``port``, threaded: a page loads some 200 files and polls
    the API at once, which the single-threaded server of the ``visualdl`` command serves one by one (and
    under load slowly enough that headless Chromium's virtual clock stalls)."""
    from visualdl.server.app import create_app
    from visualdl.server.args import ParseArgs
    from werkzeug.serving import run_simple

    app = create_app(ParseArgs(logdir=[logdir], host="127.0.0.1", port=int(port), telemetry=False))
    run_simple("127.0.0.1", int(port), app, threaded=True)


@contextmanager
def visualdl_server(logdir: str):
    """Context manager: VisualDL serving ``logdir`` on a free 127.0.0.1 port, in a child process (VisualDL
    starts threads that never end), its output discarded; yields its base URL and stops the child at the end.

    Raises:
        UserError: the server did not answer within SERVER_START_SECONDS.
    """
    port = free_port()
    serve = f"import sys; sys.path.insert(0, {TOOLS_DIR!r}); import visualdl_screenshot as t; t._serve(*sys.argv[1:])"
    server = subprocess.Popen(
        [sys.executable, "-c", serve, logdir, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while True:
            try:
                api(base_url, "scalar/tags")
                break
            except (urllib.error.URLError, ConnectionError):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise UserError(
                        f"VisualDL did not start on port {port} for {logdir}; run `visualdl --logdir {logdir}` "
                        "to see why"
                    ) from None
                time.sleep(0.5)
        yield base_url
    finally:
        server.terminate()
        server.wait(timeout=30)


def api(base_url: str, path: str):
    """The ``data`` of a VisualDL API answer (``/app/api/<path>``)."""
    with urllib.request.urlopen(f"{base_url}/app/api/{path}", timeout=60) as response:
        return json.load(response)["data"]


def check_board(base_url: str) -> list:
    """What the board lacks, one line each (empty: complete). See the module docstring."""
    problems = []
    scalar_tags = sorted({tag for run_tags in api(base_url, "scalar/tags")["tags"] for tag in run_tags})
    for tag in REQUIRED_SCALARS:
        if tag not in scalar_tags:
            problems.append(f"scalars: no {tag} chart")
    groups = sorted({tag.split("/")[0] for tag in scalar_tags}, key=str.upper)  # VisualDL's order
    if groups and groups[0] != TRAIN_GROUP:
        problems.append(f"scalars: the page opens on the '{groups[0]}' group, not '{TRAIN_GROUP}' ({groups})")
    noise = [tag for tag in scalar_tags if tag.startswith(f"{TRAIN_GROUP}/") and "interval_" in tag]
    noise += [tag for tag in scalar_tags if tag.endswith(("/global_step", "/progress_or_epoch"))]
    problems += [f"scalars: {tag} is noise next to ours" for tag in noise]
    trials = api(base_url, "hparams/list")
    if not trials:
        problems.append("hyper-parameters: the tab is empty")
    for trial in trials:
        missing = [name for name in REQUIRED_HPARAMS if name not in trial["hparams"]]
        if missing:
            problems.append(f"hyper-parameters: {trial['name']} lacks {', '.join(missing)}")
    return problems


def find_chromium(path: str = None) -> str:
    """The Chromium executable: ``path`` if given, else the first of CHROMIUM_NAMES on PATH.

    Raises:
        UserError: none found.
    """
    found = path if path else next((shutil.which(name) for name in CHROMIUM_NAMES if shutil.which(name)), None)
    if not found or not os.access(found, os.X_OK):
        raise UserError(
            f"no Chromium ({path or ', '.join(CHROMIUM_NAMES)} not found); install it (`make browser`, or "
            "apt-get install chromium), pass --chromium PATH, or --no_screenshot to check the board without pictures"
        )
    return found


def run_chromium(chromium: str, url: str, *flags: str) -> str:
    """Render ``url`` in headless Chromium (WINDOW_WIDTH x WINDOW_HEIGHT, RENDER_BUDGET_MS of virtual time)
    with ``flags`` (``--screenshot=PATH``, ``--dump-dom``); return its stdout. A render that has not
    finished after CHROMIUM_SECONDS is tried once more.

    Raises:
        UserError: Chromium failed, or did not finish twice.
    """
    for _ in range(2):
        with tempfile.TemporaryDirectory(prefix="chromium-profile-", ignore_cleanup_errors=True) as profile:
            command = [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={WINDOW_WIDTH},{WINDOW_HEIGHT}",
                f"--virtual-time-budget={RENDER_BUDGET_MS}",
                *flags,
                url,
            ]
            try:
                result = subprocess.run(command, capture_output=True, text=True, timeout=CHROMIUM_SECONDS)
            except subprocess.TimeoutExpired:
                continue
        if result.returncode != 0:
            raise UserError(f"{chromium} could not render {url} (exit {result.returncode}): {result.stderr[-500:]}")
        return result.stdout
    raise UserError(f"{chromium} did not finish rendering {url} in {CHROMIUM_SECONDS} s, twice")


def rendered_problems(page: str, dom: str) -> list:
    """What the DOM of a rendered page lacks, one line each.

    Scalar charts are canvases (their titles are not DOM text): the open group's header is checked
    (``<h3>train</h3><span class="total">N</span>``, N charts in it) and the drawn ECharts instances
    counted. The hyper-parameters page names its settings as DOM text.
    """
    if page == PAGES["scalars.png"]:
        opened = re.search(r"<h3>([^<]+)</h3><span class=\"total\">(\d+)</span>", dom)
        if opened is None or opened.group(1) != TRAIN_GROUP or int(opened.group(2)) < len(REQUIRED_SCALARS):
            return [
                f"scalars page: the first group is {opened.groups() if opened else None}, not '{TRAIN_GROUP}' "
                f"with {len(REQUIRED_SCALARS)} charts"
            ]
        drawn = dom.count("_echarts_instance_=")
        return [] if drawn >= len(REQUIRED_SCALARS) else [f"scalars page: {drawn} charts drawn"]
    return [f"hyper-parameters page: no {name}" for name in REQUIRED_HPARAMS if f">{name}<" not in dom]


def photograph(chromium: str, base_url: str, output_dir: str) -> tuple:
    """Write the PAGES' pictures into ``output_dir``; return (paths written, what a rendered page does not name)."""
    os.makedirs(output_dir, exist_ok=True)
    written, problems = [], []
    for name, page in PAGES.items():
        png_path = os.path.abspath(os.path.join(output_dir, name))
        run_chromium(chromium, base_url + page, f"--screenshot={png_path}")
        if not os.path.isfile(png_path):
            raise UserError(f"{chromium} wrote no picture of {base_url + page}")
        written.append(png_path)
        problems += rendered_problems(page, run_chromium(chromium, base_url + page, "--dump-dom"))
    return written, problems


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="A run's output directory, or a VisualDL log directory.")
    parser.add_argument("--output_dir", default=None, help="Where to write the PNGs (default: RUN_DIR).")
    parser.add_argument("--chromium", default=None, help="Chromium executable (default: found on PATH).")
    parser.add_argument(
        "--no_screenshot", action="store_true", help="Only check the board through its API (no browser)."
    )
    args = parser.parse_args(argv)
    logdir = log_dir(args.run_dir)
    chromium = None if args.no_screenshot else find_chromium(args.chromium)
    output_dir = args.output_dir or args.run_dir
    with visualdl_server(logdir) as base_url:
        problems = check_board(base_url)
        written = []
        if chromium:
            written, page_problems = photograph(chromium, base_url, output_dir)
            problems += page_problems
    for problem in problems:
        print(f"missing: {problem}")
    print(("board incomplete" if problems else "board complete") + f": {logdir}")
    if written:
        print("wrote " + ", ".join(written))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
