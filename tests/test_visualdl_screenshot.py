"""tools/visualdl_screenshot.py: a run's VisualDL board checked through VisualDL's own server, and
photographed with headless Chromium where it is installed (Debian: apt-get install chromium)."""

import shutil

import pytest
from conftest import load_script, run_script
from tiny_run import tiny_args

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

TOOL = "tools/visualdl_screenshot.py"
CHROMIUM = next(
    (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None
)


@pytest.fixture(scope="module")
def board_run(tmp_path_factory, demo_dir):
    """A 6-step tiny run that reports to VisualDL, evaluating at steps 3 and 6, with a measured peak."""
    tmp = tmp_path_factory.mktemp("board")
    out = str(tmp / "run")
    extra = ["--do_eval", "true", "--evaluation_strategy", "steps", "--eval_steps", "3", "--eval_iters", "2"]
    result = run_script("run_pretrain.py", *tiny_args(out, str(tmp / "cache"), *extra, steps=6, save_steps=100))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_a_runs_board_is_complete(board_run):
    result = run_script(TOOL, board_run, "--no_screenshot")
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert result.stdout.strip() == f"board complete: {board_run}/runs"


def test_what_a_board_lacks_is_listed(tmp_path):
    from visualdl import LogWriter

    # paddlenlp's own board: eval/ sorts before train/, interval_* rates, no MFU or memory, empty hparams tab
    with LogWriter(logdir=str(tmp_path / "runs" / "paddlenlp")) as writer:
        for step in (1, 2):
            for tag in ("train/loss", "train/learning_rate", "train/interval_samples_per_second", "train/global_step"):
                writer.add_scalar(tag, 1.0, step)
        writer.add_scalar("eval/loss", 1.0, 2)
    result = run_script(TOOL, str(tmp_path), "--no_screenshot")
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "missing: scalars: no train/tokens_per_card_per_sec chart",
        "missing: scalars: no train/mfu chart",
        "missing: scalars: no train/peak_memory_gib chart",
        "missing: scalars: the page opens on the 'eval' group, not 'train' (['eval', 'train'])",
        "missing: scalars: train/interval_samples_per_second is noise next to ours",
        "missing: scalars: train/global_step is noise next to ours",
        "missing: hyper-parameters: the tab is empty",
        f"board incomplete: {tmp_path}/runs",
    ]


def test_bad_input_is_one_line(tmp_path, board_run):
    result = run_script(TOOL, str(tmp_path))
    assert result.returncode == 2 and "no VisualDL records" in result.stderr
    result = run_script(TOOL, board_run, "--chromium", str(tmp_path / "no-chromium"))
    assert result.returncode == 2 and "apt-get install chromium" in result.stderr.strip().splitlines()[-1]


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH (make browser installs it)")
def test_screenshots_of_the_scalars_and_hparams_pages(board_run, tmp_path):
    from PIL import Image

    # exit 0 includes the rendered pages' check: the scalars page opened on 'train' with its 5 charts
    # drawn, the hyper-parameters page naming model, layout, batch, learning rate and seq
    result = run_script(TOOL, board_run, "--output_dir", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    for name in ("scalars.png", "hparams.png"):
        with Image.open(tmp_path / name) as image:
            assert image.size == (1600, 1300), name


def test_a_rendered_page_without_charts_is_reported():
    tool = load_script(TOOL)
    scalars, hparams = tool.PAGES["scalars.png"], tool.PAGES["hparams.png"]
    opened = '<h3>train</h3><span class="total">5</span>' + '<div _echarts_instance_="ec_1">' * 5
    assert tool.rendered_problems(scalars, opened) == []
    assert tool.rendered_problems(scalars, opened.replace("train", "eval")) == [
        "scalars page: the first group is ('eval', '5'), not 'train' with 5 charts"
    ]
    assert tool.rendered_problems(scalars, '<h3>train</h3><span class="total">5</span>') == [
        "scalars page: 0 charts drawn"
    ]
    assert tool.rendered_problems(hparams, "<th>model</th><th>layout</th>") == [
        "hyper-parameters page: no global_batch_tokens",
        "hyper-parameters page: no learning_rate",
        "hyper-parameters page: no seq_length",
    ]
