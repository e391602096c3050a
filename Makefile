# Floodgate's entry points. `make demo` and `make test` are the README's first two commands.
CARGO ?= cargo
# Scale of the demo's flood; CI runs it small as a smoke test.
DEMO_ARGS ?=
# The cargo profile the demo is built with. CI's smoke run uses `dev`, the build `make test` already
# made, instead of compiling everything a second time for release.
DEMO_PROFILE ?= release
# Where cargo puts binaries (honours CARGO_TARGET_DIR).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
# Every build names the whole workspace: cargo unifies features over the packages it builds, so
# `-p floodgate` alone resolved other features and recompiled about a hundred dependencies
# that the test build had already compiled.
BUILD := $(CARGO) build --locked --workspace
# The demo's binaries. CI adds `--tests` to reuse the test build's features as they are.
DEMO_TARGETS ?= --bins
DEMO_DIR := $(TARGET_DIR)/$(if $(filter dev,$(DEMO_PROFILE)),debug,$(DEMO_PROFILE))
# The same for `make image`: the profile its binary is built with, and what that build names.
IMAGE_PROFILE ?= dist
IMAGE_TARGETS ?= --bins
IMAGE_DIR := $(TARGET_DIR)/$(if $(filter dev,$(IMAGE_PROFILE)),debug,$(IMAGE_PROFILE))

.PHONY: demo test test-real prereqs-lane realkube e2e bench crds lint build prereqs image image-test \
	monitoring-check monitoring-rules helm chart-check

## demo: replay the discovery-flood incident live over loopback: kube-sim, Floodgate and two
## consumers (direct and through Floodgate) as processes, a table a second, then a summary.
demo:
	$(BUILD) -q --profile $(DEMO_PROFILE) $(DEMO_TARGETS)
	$(DEMO_DIR)/demo $(DEMO_ARGS)

# The Python kubernetes client the client tests drive, in a virtualenv of its own.
PY_VENV := $(CURDIR)/target/py-venv
export FLOODGATE_PYTHON := $(PY_VENV)/bin/python

$(PY_VENV)/bin/python:
	python3 -m venv $(PY_VENV)
	$(PY_VENV)/bin/pip install --quiet kubernetes

## prereqs: what the tests need besides the Rust toolchain (cargo-nextest, kubectl, python3-venv,
## chromium and chromium-driver, promtool), installed only when missing (Debian's packages).
prereqs:
	.ci/prereqs

## test: the whole suite (unit, property, integration with kubectl, kube-rs and the Python
## client, doc tests), built once, run in parallel; the alerts' unit tests and the chart first.
test: prereqs monitoring-check chart-check $(PY_VENV)/bin/python
	$(BUILD) --bins --tests
	$(CARGO) nextest run --workspace --locked --no-fail-fast
	$(CARGO) test --workspace --locked --doc

## realkube: the real-server lane's Go binaries (kube-apiserver and etcd of the pinned release,
## the client-go resolver, the crash-loop driver) into $(TARGET_DIR)/realkube/bin, from Go modules.
realkube:
	CARGO_TARGET_DIR=$(TARGET_DIR) e2e/realkube/build.sh

# What the real-server lane needs of `make prereqs`: all but the browser.
prereqs-lane:
	.ci/prereqs --no-browser

## test-real: the real-server lane: Floodgate in front of a real kube-apiserver and etcd (drop-in
## with kubectl, the Python client and client-go, S1 at 10,000 pods, the outage, cluster mode
## under RBAC). Needs Go and the Go module proxy; the first build takes about 12 minutes
## (docs/development.md, "The real-server lane").
test-real: prereqs-lane realkube $(PY_VENV)/bin/python
	$(BUILD) --bins --tests
	$(CARGO) nextest run --workspace --locked --run-ignored only --no-fail-fast \
		--no-capture -E 'binary(real)'

## e2e: full-scale scenarios that do not fit in `make test` (tests marked #[ignore]), a longer
## fuzz pass (20,000 proptest cases per fuzz test), then the release image in podman.
e2e:
	$(BUILD) --bins --tests
	$(CARGO) nextest run --workspace --locked --run-ignored only --no-fail-fast --no-tests=pass \
		-E 'not binary(real)'
	PROPTEST_CASES=20000 $(CARGO) nextest run --workspace --locked --no-fail-fast \
		-E '(package(floodgate) | package(floodgate-link-crd)) & test(/fuzz/)'
	$(MAKE) image-test

## bench: criterion benchmarks (the engine, upstream decoding, the facade), then the scenario
## benchmarks S1 and S2 side by side; writes target/floodgate-bench/report.json and report.md.
bench:
	$(CARGO) bench --workspace --locked
	$(BUILD) --profile dist -q --bins
	$(TARGET_DIR)/dist/scenarios --target-dir $(TARGET_DIR)

## crds: regenerate the CRD from the Rust types into manifests/crds/.
crds:
	$(CARGO) run --locked -q -p floodgate -- crd > manifests/crds/links.floodgate.dev.yaml

MONITORING := manifests/monitoring

## monitoring-check: the alerts of manifests/monitoring/ checked and unit-tested with promtool
## (under a second; promtool from Debian's prometheus package, installed by prereqs).
monitoring-check: prereqs
	promtool check rules $(MONITORING)/floodgate.rules.yaml
	promtool test rules $(MONITORING)/floodgate.rules.test.yaml

## monitoring-rules: write the PrometheusRule's groups from floodgate.rules.yaml (its header,
## up to `spec:`, is kept); link-crd/tests/monitoring.rs fails when they differ.
monitoring-rules:
	{ sed -n '1,/^spec:$$/p' $(MONITORING)/prometheusrule.yaml; \
	  sed -n '/^groups:/,$$p' $(MONITORING)/floodgate.rules.yaml | sed 's/^./  &/'; \
	} > $(MONITORING)/prometheusrule.yaml.new
	mv $(MONITORING)/prometheusrule.yaml.new $(MONITORING)/prometheusrule.yaml

# helm, built from its Go module (charts/helm/go.mod) by `make helm` (and `make prereqs` when
# missing).
HELM := $(TARGET_DIR)/helm/bin/helm
# The values that switch on every object the defaults leave out, for `helm lint`.
CHART_ALL_ON := --set monitoring.prometheusRule.enabled=true \
	--set monitoring.podMonitor.enabled=true --set monitoring.dashboard.enabled=true \
	--set adminToken.create=true

## helm: helm of the version charts/helm/go.mod pins, built from Go modules into
## $(TARGET_DIR)/helm/bin/helm (no binary downloaded; about 7 min the first time on 2 cores,
## seconds after).
helm:
	CARGO_TARGET_DIR=$(TARGET_DIR) charts/helm/build.sh

## chart-check: `helm lint` of charts/floodgate (its defaults, and every object on), then its
## render test (link-crd/tests/chart.rs): the default values render the kustomize base's objects
## (the CRD but for kustomize's `part-of` label), monitoring on the monitoring component's too.
chart-check: prereqs
	$(HELM) lint --strict -n floodgate charts/floodgate
	$(HELM) lint --strict -n floodgate charts/floodgate $(CHART_ALL_ON)
	FLOODGATE_HELM=$(HELM) $(CARGO) test --locked --workspace --test chart

## lint: formatting and clippy, warnings are errors.
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

build:
	$(CARGO) build --workspace --all-targets --locked

## image: Floodgate's image, built offline from the dist binary (fat LTO) with buildah, into
## target/image/floodgate.oci.tar, tagged ghcr.io/floodgate-dev/floodgate:0.1.0 (manifests/).
## CI builds it from the test build instead (IMAGE_PROFILE=dev IMAGE_TARGETS="--bins --tests").
image:
	$(BUILD) -q --profile $(IMAGE_PROFILE) $(IMAGE_TARGETS)
	FLOODGATE_BIN=$(IMAGE_DIR)/floodgate .ci/image

## image-test: `make image`'s archive in podman on the host network, as `floodgate run` in front
## of kube-sim: 200 from /livez and a ServiceList through the facade.
image-test: image
	$(BUILD) -q --bins --tests
	KUBE_SIM_BIN=$(TARGET_DIR)/debug/kube-sim .ci/image-test
