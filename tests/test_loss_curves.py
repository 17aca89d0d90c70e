"""The loss plots of tools/compare_loss.py and tools/benchmark.py: integer steps, one step axis, the
verdict's running mean against the tolerance, short labels, 1200 px wide."""

import pytest
from PIL import Image

from pretrain.metrics.loss_curves import loss_figure, plot_loss_curves, relative_errors, running_mean, short_label


def test_running_mean_is_the_verdicts_figure():
    assert running_mean([(21, 0.01), (22, 0.03), (23, 0.05)]) == pytest.approx([(21, 0.01), (22, 0.02), (23, 0.03)])
    assert running_mean([]) == []


def test_short_labels():
    assert short_label("/data/runs/llama_demo_cpu/") == "llama_demo_cpu"
    assert short_label("output/llama_demo_cpu/loss_history.json") == "llama_demo_cpu"
    assert short_label("reference/megatron_losses.txt") == "megatron_losses.txt"


def _curves():
    run = [(step, 3.0 - 0.01 * step) for step in range(1, 26)]
    reference = [(step, 3.0 - 0.0105 * step) for step in range(1, 26)]
    return run, reference


def test_compare_figure_shares_integer_steps_and_plots_the_running_mean():
    import matplotlib.pyplot as plt

    run, reference = _curves()
    errors = relative_errors(run, reference)  # steps 21..25: a matplotlib default would tick 21.5, 22.0, ...
    figure = loss_figure({"run: a": run, "reference: b": reference}, "title", errors, tolerance=0.02)
    try:
        assert figure.get_size_inches()[0] * figure.dpi == 1200
        loss_axes, error_axes = figure.axes
        assert loss_axes.get_shared_x_axes().joined(loss_axes, error_axes)
        figure.canvas.draw()
        for axes in (loss_axes, error_axes):
            ticks = [tick for tick in axes.get_xticks() if axes.get_xlim()[0] <= tick <= axes.get_xlim()[1]]
            assert ticks and all(tick == int(tick) for tick in ticks)
        lines = {line.get_label(): line for line in error_axes.get_lines()}
        mean = lines["mean relative error from step 21 (the verdict)"]
        assert list(mean.get_xdata()) == [21, 22, 23, 24, 25]
        assert list(mean.get_ydata()) == pytest.approx([100 * m for _, m in running_mean(errors)])
        assert list(lines["2% tolerance"].get_ydata()) == [2.0, 2.0]
        assert [text.get_text() for text in loss_axes.get_legend().get_texts()] == ["run: a", "reference: b"]
    finally:
        plt.close(figure)


def test_plot_is_a_1200_px_png(tmp_path):
    run, _ = _curves()
    plot_loss_curves({"train": run}, str(tmp_path / "loss.png"), "title")
    with Image.open(tmp_path / "loss.png") as image:
        assert image.format == "PNG" and image.size == (1200, 400)
