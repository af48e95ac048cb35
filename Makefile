# Everyday entry points. The test suite is scripts/test.sh; benchmarks and the soak run on
# demand only (their figures go to tests/bench/results/*.json).
PYTHON ?= .venv/bin/python
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: test demo sim-scale bench bench-deps bench-throughput bench-churn bench-storm bench-scale bench-startup soak fuzz fuzz-live

test:
	bash scripts/test.sh

demo:
	bash scripts/demo.sh

# SIM_SCALE_NODES (500) daemons of a simulated cluster up, a few pairs resolved, down.
sim-scale:
	bash scripts/sim-scale.sh

# BENCH_FULL=1 adds the 4096-node storm (long); BENCH_SECONDS and BENCH_ROUNDS set the
# seconds and repetitions of each throughput point.
bench: bench-startup bench-throughput bench-storm

# matplotlib (the bench extra) draws the plots of docs/benchmarks.md; offline, the figures
# are still measured.
bench-deps:
	-$(PYTHON) -m pip install -q -e '.[bench]'

# All servers over one-shot connections, cached RESOLVEs (1..4096 clients) and pipelining,
# the uncached first resolution with the daemons' own time (strace), and the churn (root).
bench-throughput: bench-deps
	$(PYTHON) -m tests.bench.throughput --churn

# Root's real ib_acme while another uid churns 3 x 6000 malformed connections (needs root).
bench-churn:
	$(PYTHON) -m tests.bench.churn

bench-storm: bench-deps
	$(PYTHON) -m tests.bench.storm

# A job start of N = 1,024 to 40,000 nodes, sampled: 16 daemons in full, the other nodes
# wire-level peers; per-daemon CPU and RSS, and what the SA answers.
bench-scale: bench-deps
	$(PYTHON) -m tests.bench.scale

bench-startup:
	$(PYTHON) -m tests.bench.startup

# The reliability suites with their long settings (10^5 fuzz inputs and more).
soak:
	IBACM_SOAK=1 $(PYTHON) -m pytest -q -p no:cacheprovider -o timeout=3600 tests/reliability

# Coverage-guided fuzzing (atheris) of the decoders, the config parsers and the provider's MAD
# handler (acmp_handler: ACM MADs received by a live endpoint, SA answers to its route
# queries): FUZZ_RUNS inputs per target, one child process per target; a crash is kept in
# tests/reliability/crashes/.
FUZZ_RUNS ?= 100000
fuzz:
	$(PYTHON) -m tests.reliability.atheris_fuzz all --runs $(FUZZ_RUNS)

# Live MAD fuzz: FUZZ_LIVE_INPUTS crafted class 0x2C MADs into two running daemons through a
# rogue QP, with progress every few seconds (STALLED lines if an input does not settle), the
# daemons checked as it goes and each resolving the other's real path at the end.
FUZZ_LIVE_INPUTS ?= 100000
fuzz-live:
	$(PYTHON) -m tests.reliability.live_mad_fuzz --inputs $(FUZZ_LIVE_INPUTS)
