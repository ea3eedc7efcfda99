# Sluice — composable Watermill middlewares for reliable consumers.
# `make help` lists the targets.

GO            ?= go
GOLANGCI_LINT ?= $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
TEST_TIMEOUT  ?= 20m
# Tests of one package run 6 at a time (Go's default is GOMAXPROCS, 2 here):
# most wait on a broker, a timer or a private node, not on the CPU — the
# rabbitmq package took over 12 minutes at 2 and 6 at 6.
TEST_PARALLEL ?= 6
# A count, not a duration: a -fuzztime duration races Go's fuzz coordinator
# (golang/go#75804, unfixed in 1.26) and fails a busy run with "context
# deadline exceeded" and no crasher.
FUZZTIME      ?= 20000x
FUZZ_JOBS     ?= 1
# Three modules in one workspace (go.work): the library at the root, the
# operator tools in cmd/, the examples in examples/. In workspace mode ./...
# stops at a nested module, so every target names all three.
MODULES       := . cmd examples
PACKAGES      := ./... ./cmd/... ./examples/...
# The tests about what changes with RabbitMQ 4.x (docs/rabbitmq.md), run
# again on the 4.0 node of scripts/rabbitmq4.sh by test-rabbitmq4: the quorum
# queue's default delivery limit (20) and what spends none of it (the brake,
# the CLI's reads, a shutdown), the poison queue's limit, what 4.3 refuses,
# partitions (4.x refuses a missing exchange type with another code, and
# basic.get on a quorum queue with single active consumer), and every test
# that manages the broker.
RABBITMQ4_PACKAGES := ./internal/testenv ./rabbitmq ./router ./cmd/sluice ./dlq ./deduplication
RABBITMQ4_TESTS    := TestRabbitmqctlManagesTheBrokerUnderTest|TestBrakeWithoutAProbeAnOutageDeadLettersNothing|TestTopologyDeclaresNothingRabbitMQ43Refuses|TestQuorumQueueWithoutDeliveryLimitHasTheBrokersDefault|TestTopologyQuorumDeliveryLimitDeadLettersToPoison|TestApplyNamesThePolicyForAnOldQuorumPoisonQueue|TestRefusedPoisonCopyIsParked|TestBrakeLongOutageOnAQuorumQueueSpendsNoDeliveryLimit|TestShutdownMidHandlerEffectOnce|TestInspectingAQuorumPoisonQueueKeepsItsOrder|TestInspectingAnOldQuorumPoisonQueueKeepsItsOrder|TestTopologyApplyShowsThePoisonQueueLimit|TestPartitionedTopologyDeclares|TestPartitionedTierReturnsToItsPartition|TestPartitionSingleActiveConsumer|TestPartitionedWithoutThePlugin|TestPartitionPoisonReplaysToItsPartition|TestAnOrderedHandlerBehindWatermillsTimeoutWithAForeignProducer|TestAKeysGivenBackDeliveriesSpendNoMoreReturnsThanItsHead|TestAClosingConsumerReturnsWhatNoHandlerTookAfterWhatItHandedOut|TestAnOrderedKeyKeepsItsOrderAcrossRestartsMidLoad|TestAScanPutsAClassicQueueBackInOrder|TestAScanPutsAForeignQuorumQueueAtTheNameLimitBackAsItWas|TestAPartitionsNextOwnerContinuesAReleaseInOrder|TestUnparseableHeadersAreIsolatedNotLooped|TestWatermillSubscribersReadHostileHeadersThroughTheFilter|TestTheREADMEQuickStartKeepsProcessingBehindAHugeHeaderArray
FUZZ_TARGETS  := FuzzFrameFilter:./internal/amqpframe FuzzMarshalerUnmarshal:./rabbitmq FuzzClassifier:. FuzzSummary:./internal/diag FuzzRedactSecret:./internal/diag FuzzPrintable:./internal/diag FuzzEscapeJSON:./internal/diag FuzzTerminal:./internal/diag FuzzKeyFromJSON:.

.DEFAULT_GOAL := help
.PHONY: help run services test figures api test-times test-rabbitmq4 test-race fuzz chaos bench lint fmt tidy cover console-screenshots

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

run: ## run the bundled example on the embedded default (no servers needed)
	$(GO) run ./examples/orders

services: ## make PostgreSQL, RabbitMQ, Redis and MariaDB reachable on 127.0.0.1 (install/start as needed)
	@bash scripts/services.sh

test: services ## every test on the real services (race on), short fuzzing, the short chaos run (restarts RabbitMQ and PostgreSQL)
	@env GO="$(GO)" TEST_TIMEOUT="$(TEST_TIMEOUT)" TEST_PARALLEL="$(TEST_PARALLEL)" FUZZTIME="$(FUZZTIME)" PACKAGES="$(PACKAGES)" bash scripts/test.sh

figures: ## the public surface's figures: exported names and config fields per package, the README's imports, the modules the inbox links (docs/architecture.md)
	$(GO) run ./internal/apifigures

api: ## check the public API against the last release's (scripts/api.sh; make test runs it)
	@env GO="$(GO)" bash scripts/api.sh check

test-times: ## the 25 slowest tests and the 10 slowest packages of the last make test's main go test (from test-times.json)
	$(GO) run ./internal/testtimes -top 25 test-times.json

test-rabbitmq4: services ## the tests about what changes with RabbitMQ 4.x, on the 4.0 node (scripts/rabbitmq4.sh; make test runs them)
	env $$(bash scripts/rabbitmq4.sh env) $(GO) test -race -count=1 -timeout 8m -parallel $(TEST_PARALLEL) -run '^($(RABBITMQ4_TESTS))$$' $(RABBITMQ4_PACKAGES)

fuzz: ## run every fuzz target for FUZZTIME each (default 20000x executions; e.g. make fuzz FUZZTIME=2000000x), FUZZ_JOBS at once (default 1)
	@env GO="$(GO)" FUZZTIME="$(FUZZTIME)" FUZZ_JOBS="$(FUZZ_JOBS)" bash scripts/fuzz.sh $(FUZZ_TARGETS)

test-race: test ## the same as test: the race detector is always on

chaos: services ## the long reliability run: 20,000 events a scenario, 100 kills, a 30 s broker outage in outbox, kill and postgres-stop again with group commit, node kills on a private 3-node cluster, 200 keys × 50 in order through retries, kills and a private broker restart (docs/reliability.md)
	$(GO) run ./cmd/sluice-chaos run -events 20000 -kills 100 -crash-prob 0.002 -same-ids 1000 -postgres-down 10s -rabbitmq-down 5s -outbox-down 30s -outbox-writes 5000 -order-keys 200 -order-per-key 50 -order-poisoned 5 -order-crash-prob 0.001 -timeout 20m

bench: services ## print the benchmark comparison tables (see docs/benchmarks.md)
	$(GO) run ./cmd/sluice-bench

console-screenshots: services ## the console's pages in headless Chromium, saved as docs/console/*.png (docs/console.md)
	mkdir -p docs/console && cd cmd && SLUICE_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/console go test -count=1 -run 'TestConsoleInABrowser|TestConsoleRendersHostileContentsInert' ./sluice/

lint: ## go vet and golangci-lint (.golangci.yml)
	$(GO) vet $(PACKAGES)
	$(GOLANGCI_LINT) run $(PACKAGES)

fmt: ## format the code
	gofmt -w $$(git ls-files '*.go')

tidy: ## tidy the go.mod and go.sum of the three modules
	@for m in $(MODULES); do echo "tidy $$m"; (cd $$m && $(GO) mod tidy) || exit 1; done

cover: services ## test with a coverage report in cover.html
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -coverprofile=cover.out $(PACKAGES)
	$(GO) tool cover -html=cover.out -o cover.html
