# keyswap's entry points. `make test` is what CI runs (.ci/run) and what a
# newcomer runs: it installs what it needs, then runs every check and test in
# every module of the repository.

STATICCHECK_VERSION := v0.8.2
BIN := $(CURDIR)/.bin
# Every Go module in the repository: the library and the nested programs.
MODULES := $(patsubst %/,%,$(dir $(shell git ls-files --cached --others --exclude-standard -- 'go.mod' '*/go.mod')))
GO_FILES := $(shell git ls-files --cached --others --exclude-standard -- '*.go')

.PHONY: test quickstart tidy redis-server postgresql fmt vet staticcheck unit install-check

## test: install redis-server and PostgreSQL if missing, then gofmt, go vet, staticcheck and go test -race in every module, and install-check.
test: redis-server postgresql fmt vet staticcheck unit install-check

## quickstart: run the quickstart on an embedded Redis (or -redis URL / REDIS_URL).
quickstart:
	go run ./examples/quickstart

## tidy: go mod tidy in every module, the nested ones against the modules of this checkout.
# go mod tidy ignores go.work, and the nested modules require keyswap's
# modules (the library, goredis) at the version they will be released with,
# which need not exist yet: each is tidied with replace directives to the
# checkout's modules it requires, removed again afterwards, so that no
# go.mod keeps one (go install refuses them) and no go.sum records a hash of
# an unreleased module.
OURS_AWK := '($$1 == "require" && $$2 ~ /^github.com\/keyswap\/keyswap(\/|$$)/) { print $$2 } ($$1 ~ /^github.com\/keyswap\/keyswap(\/|$$)/ && $$2 ~ /^v/) { print $$1 }'
tidy:
	@for m in $(MODULES); do \
		echo "go mod tidy $$m"; \
		ours=$$(awk $(OURS_AWK) $$m/go.mod); \
		if [ "$$m" = . ] || [ -z "$$ours" ]; then \
			(cd $$m && go mod tidy) || exit 1; continue; \
		fi; \
		root=$$(realpath --relative-to=$$m .); \
		(cd $$m && for p in $$ours; do go mod edit -replace=$$p=$$root$${p#github.com/keyswap/keyswap}; done && go mod tidy; rc=$$?; \
			for p in $$ours; do go mod edit -dropreplace=$$p && sed -i "\#^$$p #d" go.sum; done; exit $$rc) || exit 1; \
	done

# The tests start their own redis-server processes; they never use a server
# someone else runs. Install it when missing (as root, through apt-get), or
# stop with a message that says how.
redis-server:
	@if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then \
		redis-server --version; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "redis-server not found: installing the Debian package redis-server"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null && redis-server --version; \
	else \
		echo "redis-server (and redis-cli) not found. The tests start their own servers; install Redis 7, e.g. 'sudo apt-get install redis-server', and run 'make test' again." >&2; \
		exit 1; \
	fi

# The capture module's tests start their own PostgreSQL servers (initdb and
# postgres of any version, found through pg_config or
# /usr/lib/postgresql/*/bin); they never use a server someone else runs.
# Install the Debian package when they are missing (as root), without the
# cluster it would create and start, or stop with a message that says how.
postgresql:
	@if { command -v pg_config >/dev/null && [ -x "$$(pg_config --bindir)/initdb" ]; } || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		ls -d /usr/lib/postgresql/*/bin 2>/dev/null | head -1; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "PostgreSQL's server not found: installing the Debian package postgresql (without a default cluster)"; \
		mkdir -p /etc/postgresql-common && { [ -e /etc/postgresql-common/createcluster.conf ] || echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf; }; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null && ls -d /usr/lib/postgresql/*/bin; \
	else \
		echo "PostgreSQL's initdb and postgres not found. The capture module's tests start their own servers; install them, e.g. 'sudo apt-get install postgresql', and run 'make test' again." >&2; \
		exit 1; \
	fi

fmt:
	@out=$$(gofmt -l $(GO_FILES)); if [ -n "$$out" ]; then echo "gofmt would change:" >&2; echo "$$out" >&2; exit 1; fi

vet:
	@for m in $(MODULES); do echo "go vet $$m/..."; (cd $$m && go vet ./...) || exit 1; done

$(BIN)/staticcheck-$(STATICCHECK_VERSION):
	GOBIN=$(BIN) go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(BIN)/staticcheck $@

staticcheck: $(BIN)/staticcheck-$(STATICCHECK_VERSION)
	@for m in $(MODULES); do echo "staticcheck $$m/..."; (cd $$m && $< ./...) || exit 1; done

unit:
	@for m in $(MODULES); do echo "go test -race $$m/..."; (cd $$m && go test -race -count=1 -timeout 30m ./...) || exit 1; done

## install-check: go install the CLI and go get the library from a module proxy made of the working tree, at the next release's version.
install-check:
	.ci/install-check
