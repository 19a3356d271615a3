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
    {{py}} -m pytest {{ARGS}}

# Fast local loop: everything but the slow real-model and multi-host tests.
test-fast *ARGS: setup
    {{py}} -m pytest --skip-slow {{ARGS}}

# Regenerate machines, diagrams (.dot) and conformance tests from fsm/*.yaml.
codegen: setup
    {{py}} -m codegen

# Fail when any generated file is stale against fsm/*.yaml.
codegen-check: setup
    {{py}} -m codegen --check

# Render every diagrams/*.dot to SVG and refresh diagrams/README.md.
diagrams: codegen
    {{py}} -m codegen --render

# Lint and type-check.
lint: setup
    {{py}} -m ruff check .
    {{py}} -m mypy --strict swactor codegen

# Benchmarks: `just bench` runs all, `just bench fsm` one of them.
bench *WHICH: setup
    {{py}} -m bench {{WHICH}}

# Native ring helper: build the two-thread C stress test with ThreadSanitizer and run it.
test-native: setup
    mkdir -p native/build
    clang -std=c11 -O1 -g -fsanitize=thread -Wall -Wextra -Werror -o native/build/ring_stress_tsan native/ring_stress.c native/ring.c -lpthread
    TSAN_OPTIONS="halt_on_error=1 exitcode=66" native/build/ring_stress_tsan
