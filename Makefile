# Floodgate's entry points. `make demo` and `make test` are the README's first two commands.
CARGO ?= cargo
# Scale of the demo's flood; CI runs it small as a smoke test.
DEMO_ARGS ?=
# Where cargo puts binaries (honours CARGO_TARGET_DIR).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)

.PHONY: demo test e2e bench crds lint build prereqs image image-test

## demo: replay the discovery-flood incident live over loopback: kube-sim, Floodgate and two
## consumers (direct and through Floodgate) as processes, a table a second, then a summary.
demo:
	$(CARGO) build --release --locked -q -p floodgate --bin floodgate
	$(CARGO) build --release --locked -q -p floodgate-e2e --bin demo --bin consumer
	$(TARGET_DIR)/release/demo $(DEMO_ARGS)

# The Python kubernetes client the client tests drive, in a virtualenv of its own.
PY_VENV := $(CURDIR)/target/py-venv
export FLOODGATE_PYTHON := $(PY_VENV)/bin/python

$(PY_VENV)/bin/python:
	python3 -m venv $(PY_VENV)
	$(PY_VENV)/bin/pip install --quiet kubernetes

## prereqs: what the tests need besides the Rust toolchain (cargo-nextest, kubectl, python3-venv,
## chromium and chromium-driver), installed only when missing (Debian's packages).
prereqs:
	.ci/prereqs

## test: the whole suite (unit, property, integration with kubectl, kube-rs and the Python
## client, doc tests), built once, run in parallel.
test: prereqs $(PY_VENV)/bin/python
	$(CARGO) build --locked -p floodgate --bin floodgate
	$(CARGO) nextest run --workspace --locked --no-fail-fast
	$(CARGO) test --workspace --locked --doc

## e2e: full-scale scenarios that do not fit in `make test` (tests marked #[ignore]), then a
## longer fuzz pass (20,000 proptest cases per fuzz test).
e2e:
	$(CARGO) build --locked -p floodgate --bin floodgate
	$(CARGO) nextest run --workspace --locked --run-ignored only --no-fail-fast --no-tests=pass
	PROPTEST_CASES=20000 $(CARGO) nextest run --locked -p floodgate --no-fail-fast -E 'test(/fuzz/)'
	PROPTEST_CASES=20000 $(CARGO) nextest run --locked -p floodgate-link-crd --no-fail-fast -E 'test(/fuzz/)'

## bench: criterion benchmarks (the engine, upstream decoding, the facade), then the scenario
## benchmarks S1 and S2 side by side; writes target/floodgate-bench/report.json and report.md.
bench:
	$(CARGO) bench --workspace --locked
	$(CARGO) build --release --locked -q -p floodgate --bin floodgate
	$(CARGO) build --release --locked -q -p floodgate-e2e --bin scenarios --bin consumer
	$(TARGET_DIR)/release/scenarios --target-dir $(TARGET_DIR)

## crds: regenerate the CRD from the Rust types into manifests/crds/.
crds:
	$(CARGO) run --locked -q -p floodgate -- crd > manifests/crds/links.floodgate.dev.yaml

## lint: formatting and clippy, warnings are errors.
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

build:
	$(CARGO) build --workspace --all-targets --locked

## image: Floodgate's image, built offline from the release binary with buildah, into
## target/image/floodgate.oci.tar, tagged ghcr.io/floodgate-dev/floodgate:0.1.0 (manifests/).
image:
	$(CARGO) build --release --locked -p floodgate --bin floodgate
	.ci/image

## image-test: `make image`'s archive in podman on the host network, as `floodgate run` in front
## of kube-sim: 200 from /livez and from a LIST through the facade.
image-test: image
	$(CARGO) build --locked -p floodgate-e2e --bin kube-sim
	.ci/image-test
