"""tools/compare_loss.py: the published loss alignment rule, on real short runs of the demo."""

import json
import os

import pytest
from conftest import load_script, run_script
from PIL import Image
from tiny_run import python_script, run, tiny_args

from pretrain.errors import UserError
from pretrain.metrics.loss_curves import load_train_losses, relative_errors

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_text_and_json_loss_files_read_the_same(tmp_path):
    (tmp_path / "loss_history.json").write_text(json.dumps({"train": [[2, 3.0], [1, 4.0]], "eval": []}))
    (tmp_path / "ref.txt").write_text("# step loss\n1 4.0\n\n2, 3.0\n")
    assert load_train_losses(str(tmp_path)) == load_train_losses(str(tmp_path / "ref.txt")) == [(1, 4.0), (2, 3.0)]


def test_bad_loss_files_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_train_losses(str(tmp_path / "missing"))
    (tmp_path / "bad.txt").write_text("1 4.0\nstep twenty\n")
    with pytest.raises(UserError, match="bad.txt:2"):
        load_train_losses(str(tmp_path / "bad.txt"))
    (tmp_path / "bad.json").write_text(json.dumps({"losses": []}))
    with pytest.raises(UserError, match="not a loss history"):
        load_train_losses(str(tmp_path / "bad.json"))


def test_header_and_non_finite_losses_are_user_errors_naming_the_line(tmp_path):
    (tmp_path / "header.txt").write_text("step loss\n1 4.0\n")  # the documented header starts with '#'
    with pytest.raises(UserError, match=r"header.txt:1: 'step loss' is not an integer step and a loss; .*'#'"):
        load_train_losses(str(tmp_path / "header.txt"))
    (tmp_path / "nan.txt").write_text("1 4.0\n2 nan\n3 3.0\n")
    with pytest.raises(UserError, match="nan.txt:2: loss nan at step 2 is not a finite number"):
        load_train_losses(str(tmp_path / "nan.txt"))
    (tmp_path / "loss_history.json").write_text('{"train": [[1, 4.0], [2, Infinity]], "eval": []}')
    with pytest.raises(UserError, match="loss_history.json: train loss inf at step 2 is not a finite number"):
        load_train_losses(str(tmp_path))


def test_a_zero_reference_loss_is_a_user_error_not_a_division_by_zero():
    run, reference = [(21, 2.0), (22, 2.0)], [(21, 2.0), (22, 0.0)]
    with pytest.raises(UserError, match="ref.txt: loss 0 at step 22, so the relative error .* is undefined"):
        relative_errors(run, reference, reference_name="ref.txt")
    assert relative_errors(run, reference, first_step=23) == []  # a step not compared is not checked


def test_plot_path_is_checked_before_anything_is_read(tmp_path):
    compare_loss = load_script("tools/compare_loss.py")
    missing = str(tmp_path / "missing.txt")  # never read: the --plot check comes first
    with pytest.raises(UserError, match=f"--plot {tmp_path} is a folder; give a PNG file path such as"):
        compare_loss.main([missing, missing, "--plot", str(tmp_path)])
    with pytest.raises(UserError, match=f"--plot .*: folder {tmp_path}/no does not exist"):
        compare_loss.main([missing, missing, "--plot", str(tmp_path / "no" / "x.png")])
    assert os.listdir(tmp_path) == []


def test_relative_errors_from_step_21_at_common_steps():
    run = [(step, 2.2) for step in range(1, 31)]
    reference = [(step, 2.0) for step in range(1, 26)]
    errors = relative_errors(run, reference)
    assert [step for step, _ in errors] == list(range(21, 26))
    assert errors[0][1] == pytest.approx(0.1)


def test_no_common_steps_is_a_user_error(tmp_path):
    (tmp_path / "short.txt").write_text("1 4.0\n2 3.0\n")
    result = run_script("tools/compare_loss.py", str(tmp_path / "short.txt"), str(tmp_path / "short.txt"))
    assert result.returncode == 2
    assert "share no logged step >= 21" in result.stderr


def pretrain(output_dir: str, cache: str, *extra: str) -> str:
    """A tiny 25-step run (tests/tiny_run.py), loss logged every step; returns its output directory."""
    args = tiny_args(
        output_dir, cache, "--report_to", "none", "--measure_peak_flops", "false", *extra, steps=25, save_steps=1000
    )
    assert run(python_script(*args), log_path=output_dir + ".log") == 0, f"see {output_dir}.log"
    return output_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_dir):
    """Two tiny 25-step runs: the demo config's learning rate (reference) and a 10x smaller one."""
    root = tmp_path_factory.mktemp("runs")
    cache = str(root / "cache")
    return {
        "reference": pretrain(str(root / "reference"), cache),
        "low_lr": pretrain(str(root / "low_lr"), cache, "--learning_rate", "0.0002", "--min_learning_rate", "0.00002"),
    }


@pytest.mark.slow
def test_a_run_is_aligned_with_itself_and_the_plot_is_a_png(runs, tmp_path):
    plot = tmp_path / "self.png"
    result = run_script("tools/compare_loss.py", runs["reference"], runs["reference"], "--plot", str(plot))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ALIGNED: mean relative loss error 0.000% over 5 steps (21..25)")
    assert plot.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(plot) as image:
        image.verify()
        assert image.format == "PNG" and image.size[0] > 100


@pytest.mark.slow
def test_a_different_learning_rate_is_not_aligned(runs):
    result = run_script("tools/compare_loss.py", runs["low_lr"], runs["reference"])
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stdout.startswith("NOT ALIGNED")
    assert os.path.isfile(os.path.join(runs["low_lr"], "loss_compare.png"))  # default: next to RUN
