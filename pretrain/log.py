"""The application's logger (global rank 0 speaks, so an 8-card run prints each line once), and the
quieting of third-party output that says nothing to a user of this application.

``silence_known_warnings()`` must run before paddle is imported (``run_pretrain.py`` calls it first):
paddle warns about ccache at import. ``quiet_paddlenlp()`` keeps paddlenlp's logger to warnings and
the few lines a user acts on; ``captured_stdout()`` sends paddlenlp's printed chatter while data
indices are built to a file (``<output_dir>/data_build.rank<N>.log``), and to the console only if
that fails.
"""

import contextlib
import logging
import os
import sys
import warnings

# Third-party warnings that are harmless here, as (message regex, category name for the docs):
# re.match against the start of the message, case-insensitive; (?s) lets '.' cross the newlines that
# paddle's deprecation messages start with. Each is emitted by code we do not own.
KNOWN_HARMLESS_WARNINGS = (
    # paddle.utils.cpp_extension at `import paddle`: only matters when compiling custom ops (make ops).
    r"No ccache found",
    # setuptools' distutils shim, when paddlenlp imports distutils before setuptools.
    r"Setuptools is replacing distutils",
    # paddlenlp 3.0.0b4's LLaMA/Qwen2 MLP calls paddle.incubate's swiglu, deprecated in paddle 3.3 (same kernel).
    r"(?s).*paddle\.incubate\.nn\.functional\.swiglu",
)
# paddlenlp INFO lines still shown once quiet_paddlenlp() has run (prefixes): where a run resumes and saves.
PADDLENLP_INFO_KEPT = (
    "Continuing training from checkpoint",
    "Continuing training from global step",
)
# paddlenlp WARNING and ERROR lines that report nothing wrong with the run (prefixes), dropped too:
PADDLENLP_NOT_ERRORS = (
    # GPTTokenizer.__init__ reads its own ``bos_token`` before setting it, and the property logs this when a
    # folder's config names none.
    "Using bos_token, but it is not set yet.",
    # MixtralForCausalLM / Qwen2MoeForCausalLM.__init__ whenever the config names a sliding_window (Mixtral's
    # registry configs do): paddlenlp attends to every earlier token, as docs/models.md says per family.
    "We do not support sliding window attention for now.",
    # moe_gate.py line 47, at the first forward of a gate without a scoring_func (Qwen2MoeGate sets none): it
    # scores with softmax, as Qwen2-MoE does.
    "insupportable scoring function for MoE gating: None",
)
PADDLENLP_LOGGER = "PaddleNLP"  # the logging.Logger behind paddlenlp.utils.log.logger


def _is_rank_zero() -> bool:
    # Set by paddle.distributed.launch for every worker; absent in a single-process run.
    return int(os.environ.get("PADDLE_TRAINER_ID", "0")) == 0


logger = logging.getLogger("pretrain")
if not logger.handlers:
    _handler = logging.StreamHandler(sys.stdout)
    _handler.setFormatter(logging.Formatter("[%(asctime)s] [pretrain] %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO if _is_rank_zero() else logging.WARNING)
    logger.propagate = False


def silence_known_warnings() -> None:
    """Ignore the warnings of ``KNOWN_HARMLESS_WARNINGS`` from now on (call once, before importing paddle).

    Every other warning is shown as before.
    """
    for message in KNOWN_HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


class _KeepUsefulPaddleNLPLines(logging.Filter):
    """Passes paddlenlp's warnings and errors but ``PADDLENLP_NOT_ERRORS``, and its INFO lines that start
    with ``PADDLENLP_INFO_KEPT`` (leading blanks aside: paddlenlp indents some)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage().lstrip()
        if record.levelno >= logging.WARNING:
            return not message.startswith(PADDLENLP_NOT_ERRORS)
        return message.startswith(PADDLENLP_INFO_KEPT)


def quiet_paddlenlp() -> None:
    """Drop paddlenlp's DEBUG and INFO chatter (the 160-line argument dump, seeds, sample counts, per-save
    file lists and "Saving model checkpoint to" beside our "saved ..." line, evaluation banners) and
    its errors that are none (``PADDLENLP_NOT_ERRORS``): this application prints its own header,
    records and summary, and writes the full configuration to ``<output_dir>/run_config.json``. Idempotent.

    Call after paddlenlp is imported (its logger sets its own level at import).
    """
    paddlenlp_logger = logging.getLogger(PADDLENLP_LOGGER)
    if not any(isinstance(f, _KeepUsefulPaddleNLPLines) for f in paddlenlp_logger.filters):
        paddlenlp_logger.addFilter(_KeepUsefulPaddleNLPLines())


def console_loggers() -> list:
    """The loggers whose console output a progress bar must share the terminal with (ours and paddlenlp's)."""
    return [logger, logging.getLogger(PADDLENLP_LOGGER)]


@contextlib.contextmanager
def captured_stdout(keep_path: str):
    """Context manager: what is printed inside, by Python or by C/C++ code writing to file descriptor 1,
    goes to the file ``keep_path`` instead of the console, line by line as it is printed (a build that
    takes long, or waits, shows where it is), and to stderr as well if the block raises. The
    application's own log lines (``logger``, e.g. "index cache ... is damaged: building it again")
    still reach the console.

    For paddlenlp's dataset index building, which prints some 70 lines per run (``print`` in
    paddlenlp.data.causal_dataset, ``std::cout`` in the fast_dataindex helpers): which rank built or
    loaded which index, sample counts, the legacy-format reader.
    """
    os.makedirs(os.path.dirname(os.path.abspath(keep_path)), exist_ok=True)
    sys.stdout.flush()
    saved_fd = os.dup(1)
    streams = [handler for handler in logger.handlers if isinstance(handler, logging.StreamHandler)]
    with open(keep_path, "w+b") as kept, os.fdopen(os.dup(saved_fd), "w") as console:
        os.dup2(kept.fileno(), 1)  # C/C++ output lands in the file directly
        # Python's prints too, a line at a time, through the same open file (one shared offset)
        python_text = open(kept.fileno(), "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        previous = [handler.stream for handler in streams]
        for handler in streams:
            handler.stream = console
        try:
            with contextlib.redirect_stdout(python_text):
                yield
        finally:
            python_text.flush()
            for handler, stream in zip(streams, previous):
                handler.stream = stream
            os.dup2(saved_fd, 1)
            os.close(saved_fd)
            if sys.exc_info()[0] is not None:
                kept.seek(0)
                sys.stderr.write(kept.read().decode(errors="replace"))
