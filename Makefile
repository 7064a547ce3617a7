# `make demo` and `make test` each set up the environment on a fresh machine, then run.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO := twostep/demo/model

.PHONY: setup test demo clean cpp cpp-bench mutation

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

# LibreTranslate's own API tests (in its wheel, never installed) run against `twostep serve`:
# tests/serving/test_libretranslate_suite.py
LT_WHEEL := $(VENV)/libretranslate/libretranslate-1.9.6-py3-none-any.whl

$(LT_WHEEL): $(STAMP)
	$(BIN)/python -m pip download -q --no-deps libretranslate==1.9.6 -d $(VENV)/libretranslate

# The suite on 2 workers (pytest-xdist), each test module on one worker; then, alone, the few tests marked
# `serial` that measure memory and would measure the other worker too (docs/testing.md#how-make-test-runs).
test: setup $(LT_WHEEL)
	$(BIN)/lint-imports
	$(BIN)/ruff check twostep tests benchmarks scripts
	$(BIN)/python -m pytest -n 2 --dist loadscope -m "not serial" --durations=25
	$(BIN)/python -m pytest -p no:xdist -m serial

# Mutation testing (docs/testing.md): hours on 2 cores, so neither `make test` nor CI runs it. SCOPES=files runs
# one scope of pyproject.toml's [tool.mutmut.scopes]; results and reports land in mutants/.
MUTATION_STAMP := $(VENV)/.mutation-stamp

$(MUTATION_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev,mutation]"
	touch $(MUTATION_STAMP)

mutation: $(MUTATION_STAMP)
	$(BIN)/python scripts/mutation $(SCOPES)

ART := artifacts/demo

demo: setup
	$(BIN)/twostep evaluate $(DEMO) --split test
	$(BIN)/twostep export $(DEMO) --out $(ART) --force
	$(BIN)/twostep inspect $(ART)
	$(BIN)/twostep verify $(ART) --checkpoint $(DEMO) --backend ort-cpu
	$(BIN)/twostep translate $(ART) --beam 4 "three hundred and forty-two" \
		"nineteen thousand, eight hundred and seven" "six hundred and fifty-one thousand, two hundred and ninety-nine"
	$(BIN)/twostep bench $(ART) --backend ort-cpu,torch --checkpoint $(DEMO) --batch 1,32 --new-tokens 32 \
		--warmup 1 --iters 3

# The C++ embedding (also built and tested by `make test`, through tests/cpp/test_cpp.py).
cpp: setup
	PYTHON=$(BIN)/python cpp/fetch_deps.sh
	cmake -S cpp -B cpp/build -DCMAKE_BUILD_TYPE=Release
	cmake --build cpp/build -j2
	cd cpp/build && ctest --output-on-failure

artifacts/cppbase/manifest.json: | setup
	$(BIN)/twostep init --preset base --vocab 32000 --out runs/cppbase --force
	$(BIN)/twostep export runs/cppbase --out artifacts/cppbase --force

cpp-bench: cpp artifacts/cppbase/manifest.json
	$(BIN)/python cpp/bench.py artifacts/cppbase

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info artifacts runs cpp/build cpp/third_party
