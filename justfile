# swactor tasks. `just --list` shows them all.
set shell := ["bash", "-euo", "pipefail", "-c"]

py := ".venv/bin/python"

# Show the recipes.
default:
    @just --list

# Create .venv, install swactor (editable, dev extra), clang, graphviz and the SmolLM2 model.
setup:
    @scripts/setup.sh

# Run the whole test suite (pass --skip-slow to skip real-model and multi-host tests).
test *ARGS: setup codegen-check
    scripts/test.sh {{ARGS}}

# Fast local loop: everything but the slow real-model and multi-host tests.
test-fast *ARGS: setup
    {{py}} -m pytest --skip-slow {{ARGS}}

# Multi-host tests (root): nodes and orchestrator in Linux network namespaces on one bridge.
multihost *ARGS: setup
    {{py}} -m pytest -m multihost {{ARGS}}

# Regenerate machines, diagrams (.dot) and conformance tests from fsm/*.yaml.
codegen: setup
    {{py}} -m codegen

# Fail when any generated file is stale against fsm/*.yaml.
codegen-check: setup
    {{py}} -m codegen --check

# Render every diagrams/*.dot to SVG and refresh diagrams/README.md.
diagrams: codegen
    {{py}} -m codegen --render

# A 3-stage `swactor run` of "hello world" on SmolLM2: 3 local node processes + orchestrator;
# streams the text, prints a summary; every process's event log goes to $SWACTOR_DEMO_EVENTS.
demo *ARGS: setup
    {{py}} -m swactor.cli run --nodes 3 --prompt "hello world" --events-dir "${SWACTOR_DEMO_EVENTS:-/tmp/swactor-demo-events}" {{ARGS}}
    @echo "events: swactor events ${SWACTOR_DEMO_EVENTS:-/tmp/swactor-demo-events}/*.jsonl"
    @echo "check:  swactor check ${SWACTOR_DEMO_EVENTS:-/tmp/swactor-demo-events}/*.jsonl"

# Serve SmolLM2 over an OpenAI-compatible HTTP API (`swactor serve`): local nodes (default
# 1, `just serve --nodes 3`), port 8000; Ctrl-C stops and tears down.
serve *ARGS: setup
    {{py}} -m swactor.cli serve {{ARGS}}

# Prove docker/ without a Docker engine (root): replay docker/Dockerfile on a bare Debian
# bookworm root (debootstrap, cached in ~/.cache/swactor/imagecheck), start compose.yaml's
# services from it in network namespaces, compare their hello-world run with `swactor run`.
docker-check *ARGS: setup
    {{py}} -m swactor.imagecheck check {{ARGS}}

# Lint and type-check.
lint: setup
    {{py}} -m ruff check .
    {{py}} -m mypy --strict swactor codegen

# Benchmarks: `just bench` runs all and writes bench/report.md + report.json (~35 min);
# `just bench fsm` runs one of them.
bench *WHICH: setup
    {{py}} -m bench {{ if WHICH == "" { "report" } else { WHICH } }}

# On whatever device tinygrad finds (the CPU when there is no GPU; DEV=CUDA picks one): the
# checks a GPU machine runs first. Decode benchmark (dense, blocks), 1/2/3-stage greedy
# equality (SmolLM2, K-quants), batched decode by rows per step, one-stage serving at 1 and
# 4 clients, and the served API with 4 concurrent streams each equal to its prompt alone.
gpu-check: setup
    {{py}} -c "from tinygrad import Device; print('gpu-check on tinygrad device', Device.DEFAULT)"
    timeout 300 {{py}} -m bench model --variants f16:dense,f16:blocks,f32:blocks --repeat 1 --tokens 32
    timeout 300 {{py}} -m pytest -q -p no:cacheprovider tests/model/test_smollm2.py tests/model/test_stage_role.py -k "identical or block_decode"
    timeout 300 {{py}} -m bench batch --sizes 1,2,4 --steps 16 --rounds 2
    timeout 400 {{py}} -m bench serve --stages 1 --levels 1,4 --no-llama --max-tokens 32 --long-tokens 128
    timeout 300 {{py}} -m pytest -q -p no:cacheprovider tests/serve/test_e2e_serve.py -k "completion_and_chat or streaming_gives or four_concurrent"

# Fault matrix: one injected fault per run on a 3-node loopback cluster with a tiny
# GGUF; rewrites the README "Fault behaviour" table from the rows (also when a case fails).
faults: setup
    #!/usr/bin/env bash
    set -uo pipefail
    rows="$(mktemp -t swactor-faults.XXXXXX.json)"
    SWACTOR_FAULTS_JSON="$rows" {{py}} -m pytest tests/faults/test_matrix.py -q -p no:cacheprovider; rc=$?
    {{py}} -m swactor.faults.table "$rows" README.md && rm -f "$rows"
    exit $rc

# Fuzz each parser of outside input, SWACTOR_FUZZ_EXAMPLES (default 100000) inputs: atheris, else Hypothesis.
fuzz *TARGETS: setup
    #!/usr/bin/env bash
    set -uo pipefail
    export SWACTOR_FUZZ_EXAMPLES="${SWACTOR_FUZZ_EXAMPLES:-100000}"
    if {{py}} -c "import atheris" 2>/dev/null; then
        exec {{py}} -m tests.faults.atheris_fuzz {{TARGETS}}
    fi
    echo "atheris is not importable: fuzzing with Hypothesis instead (slower)"
    exec {{py}} -m pytest tests/faults/test_fuzz.py -q -p no:cacheprovider --timeout 0

# Soak (not in `just test`): RUNS runs (default 50) on one 3-node loopback cluster, a fault in
# every fifth; prints fds, threads, RSS and leases of each node and worker before and after,
# and each one's RSS slope against its jitter. ARGS: --trace DIR [--frames N] [--trim] [--keep DIR].
soak RUNS="50" *ARGS: setup
    {{py}} -m tests.faults.soak {{RUNS}} {{ARGS}}

# Long end-to-end checks kept out of `just test` for its time budget (pytest marker `soak`):
# RunEngine serving 4 sequences on 1 and 3 real stages; SmolLM2 in 4 KV slots, 1 stage and a split.
soak-tests *ARGS: setup
    {{py}} -m pytest -m soak {{ARGS}} tests

# Native helpers: the ring's two-thread C stress test and the kernel replay pool's under
# ThreadSanitizer, and the QUIC bulk path's qf_open on mangled datagrams under
# AddressSanitizer + UBSan.
test-native: setup
    mkdir -p native/build
    clang -std=c11 -O1 -g -fsanitize=thread -Wall -Wextra -Werror -o native/build/ring_stress_tsan native/ring_stress.c native/ring.c -lpthread
    TSAN_OPTIONS="halt_on_error=1 exitcode=66" native/build/ring_stress_tsan
    clang -std=c11 -O1 -g -fsanitize=thread -Wall -Wextra -Werror -o native/build/replay_stress_tsan native/replay_stress.c native/replay.c -lpthread
    TSAN_OPTIONS="halt_on_error=1 exitcode=66" native/build/replay_stress_tsan
    clang -std=c11 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -Wall -Wextra -Werror -o native/build/quicfast_fuzz native/quicfast_fuzz.c native/quicfast.c -lcrypto
    native/build/quicfast_fuzz

# Not part of `just test`. First run builds llama-cpp-python in its own venv (~15 min on 2 cores;
# AMX off, as a native build dies with SIGILL here); prints where the two first differ. Then
# `just quants` and every file of tests/model/test_llama_cpp_quants.py (skipped without the venv;
# where it exists `just test` checks one file and `just soak-tests` the rest).
# Compare tokenizer ids and greedy tokens with llama.cpp's: SmolLM2 and its llama.cpp quants.
# The server extra also installs llama.cpp's OpenAI-compatible server (llama_cpp.server).
reference: setup
    #!/usr/bin/env bash
    set -euo pipefail
    venv="${SWACTOR_REFERENCE_VENV:-$HOME/.cache/swactor/venv-reference}"
    if ! "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
      python3 -m venv "$venv"
      "$venv/bin/pip" install -q --upgrade pip
      CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
        "$venv/bin/pip" install --no-cache-dir "llama-cpp-python[server]" numpy
    fi
    status=0
    {{py}} -m tests.model.reference_llama_cpp --python "$venv/bin/python" || status=1
    SWACTOR_REFERENCE_VENV="$venv" {{py}} -m tests.model.llama_cpp_quants
    SWACTOR_REFERENCE_VENV="$venv" SWACTOR_REQUIRE_REFERENCE=1 \
      {{py}} -m pytest -q -s -p no:cacheprovider tests/model/test_llama_cpp_quants.py || status=1
    exit $status

# Needs the venv `just reference` builds (tests/model/llama_cpp_quants.py); files made once.
# SmolLM2 requantised by llama.cpp's quantiser (Q4_K_M Q5_K_M Q6_K Q8_0 Q4_0 Q3_K_S Q2_K-pure) in the model cache,
# and llama.cpp's tokenizer test files from llama-cpp-python's source (tests/model/llama_cpp_vocab.py).
quants: setup
    {{py}} -m tests.model.llama_cpp_quants
