# Two commands on a fresh machine: `make demo` and `make test`. Each bootstraps .venv from the
# pinned lock file, so a clean clone needs nothing but Python >= 3.11.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUNTIME := $(VENV)/.installed-runtime
STAMP  := $(VENV)/.installed-dev
PIP    := $(BIN)/pip install --quiet --disable-pip-version-check -c requirements.lock
# The Lambda bundle (make package): defined before the rules that need it, which expand it when read.
LAMBDA_ARCH ?= arm64
LAMBDA_PYTHON ?= 3.14
PACKAGE := build/lambda/package.json
PACKAGE_SOURCES := $(shell find scheduler_core adapters manifests shares application lambdas -name '*.py') requirements.lock tools/package_lambda.py

# The tiers (docs/testing.md): test-fast is the pure core and everything that needs no server.
.PHONY: demo test test-fast venv lint typecheck unit bench bench-quality lock clean package synth system-packages

# The demo needs only the runtime dependencies; the tests add the dev ones on top.
# bench/ and testing/ are not installed: a .pth puts the checkout on the venv's path, so that the demo's
# live step, `gpu-scheduler bench` and the tests import them from the source tree (most of bench/ and
# testing/ also need the dev extras).
$(RUNTIME): pyproject.toml requirements.lock
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	@bash tools/heartbeat.sh "installing the pinned runtime dependencies into .venv (about a minute, once)" \
		$(PIP) -e '.[cdk]'
	@echo "$(CURDIR)" > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/eks-gpu-scheduler-checkout.pth"
	@touch $(RUNTIME)

# The CLI alone (.venv/bin/gpu-scheduler), for the examples and a cluster of your own.
venv: $(RUNTIME)

$(STAMP): $(RUNTIME)
	@bash tools/heartbeat.sh "installing the pinned test dependencies into .venv (once)" $(PIP) -e '.[dev]'
	@touch $(STAMP)

# The demo, then a synth of the CDK app; only what they need: etcd and openssl for the live step (which
# runs where the Kubernetes binaries are, docs/testing.md), Node.js for the synth.
demo: $(RUNTIME) $(PACKAGE)
	@bash tools/system-packages.sh etcd openssl node
	$(BIN)/gpu-scheduler demo --synth

test: system-packages lint typecheck unit

# Prometheus, etcd, openssl and Node.js from Debian: apt-get as root, else the command to run.
system-packages:
	@bash tools/system-packages.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP) system-packages
	$(BIN)/pytest -q

# About a minute: no server, no CDK synth, no openb trace, no control plane; `make test` still runs all.
test-fast: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider -m "not e2e and not server and not slow"

bench: $(STAMP)
	$(BIN)/gpu-scheduler bench extender

# Every sharing policy on every public openb trace, 10 seeds (about 30 minutes on 2 cores).
bench-quality: $(STAMP)
	$(BIN)/python -m bench.quality --jobs 2

# Re-pin after changing dependencies in pyproject.toml.
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install --quiet --disable-pip-version-check '.[dev]'
	.venv-lock/bin/pip freeze --exclude eks-gpu-scheduler | sort > requirements.lock
	rm -rf .venv-lock

clean:
	rm -rf $(VENV) build cdk.out .pytest_cache .mypy_cache .ruff_cache

# Lambda bundle and dependency layer, built without Docker (DESIGN section 8). Rebuilt when the code
# or the pins change; `make package` forces it.
$(PACKAGE): $(RUNTIME) $(PACKAGE_SOURCES)
	@bash tools/heartbeat.sh "building the Lambda bundles and layers (build/lambda, once)" \
		$(BIN)/python tools/package_lambda.py --arch $(LAMBDA_ARCH) --python-version $(LAMBDA_PYTHON) >/dev/null
	@echo "Lambda bundles in build/lambda ($(LAMBDA_ARCH), Python $(LAMBDA_PYTHON))"

package: $(RUNTIME)
	$(BIN)/python tools/package_lambda.py --arch $(LAMBDA_ARCH) --python-version $(LAMBDA_PYTHON)

# cdk.out: the CloudFormation template, cdk-nag's report and cdk.out/manifests/gpu-scheduler.yaml.
# Without CONTEXT it synthesises for a cluster named demo-gpu-cluster in a demo VPC; for yours:
#   make synth CONTEXT="-c clusterName=prod -c vpcId=vpc-... -c subnetIds=subnet-a,subnet-b -c routeTableIds=rtb-a,rtb-b -c clusterSecurityGroupId=sg-..."
CONTEXT ?= -c clusterName=demo-gpu-cluster
synth: $(RUNTIME) $(PACKAGE)
	@bash tools/system-packages.sh node
	$(BIN)/python cdk/app.py -c lambdaArchitecture=$(LAMBDA_ARCH) $(CONTEXT)
