#!/usr/bin/env bash
# Checks what `make run` (deps.sh run) or `make test` (deps.sh test) needs
# from the machine, and installs what is missing from Debian's packages
# when run as root; otherwise it prints the one command to run and fails.
# Go 1.26 or newer ($GO, else go on the PATH) it only checks: Debian's is
# older, so it says where to get one. On a machine without make, run this
# script directly first. BATON_DEPS_NO_INSTALL=1 only reports.
# BATON_DEPS_PRETEND_MISSING names checks to treat as failing (tests of
# this script).
set -euo pipefail
what=${1:-run}

missing=()
pretend=" ${BATON_DEPS_PRETEND_MISSING:-} "
need() { # need CHECK PACKAGE...: PACKAGE(s) unless CHECK succeeds
  local check=$1; shift
  if [[ $pretend == *" $check "* ]] || ! "check_$check"; then missing+=("$@"); fi
}
check_cc() { command -v gcc >/dev/null && command -v pkg-config >/dev/null; }
check_openblas() { [ -e /usr/include/x86_64-linux-gnu/cblas.h ] || [ -e /usr/include/cblas.h ] || pkg-config --exists openblas 2>/dev/null; }
check_ucx() { pkg-config --exists ucx 2>/dev/null || [ -e /usr/include/ucp/api/ucp.h ]; }
check_promtool() { command -v promtool >/dev/null; }
check_node() { command -v node >/dev/null && command -v npm >/dev/null; }
check_curl() { command -v curl >/dev/null; }
check_make() { command -v make >/dev/null; }
# The first build downloads Go modules over HTTPS.
check_certs() { [ -s /etc/ssl/certs/ca-certificates.crt ]; }

# go.mod's go line: an older Go refuses to build the module (or, with
# GOTOOLCHAIN, downloads a newer one on every build).
GO_MIN_MINOR=26
go_problem=
gocmd=${GO:-go}
if ! command -v "$gocmd" >/dev/null; then
  go_problem="none found ($gocmd)"
else
  gov=$("$gocmd" env GOVERSION 2>/dev/null || true)
  minor=$(sed -nE 's/^go1\.([0-9]+).*/\1/p' <<<"$gov")
  if [[ $gov =~ ^go[2-9] ]]; then
    :
  elif [ -z "$minor" ] || [ "$minor" -lt "$GO_MIN_MINOR" ]; then
    go_problem="found ${gov:-an unknown version} ($(command -v "$gocmd"))"
  fi
fi

need make make
need certs ca-certificates
need cc build-essential pkg-config
need openblas libopenblas-dev
case $what in
run) need curl curl ;;
test)
  need curl curl # test/gpu's scripts, as a GPU run uses them
  need ucx libucx-dev
  need promtool prometheus
  need node nodejs npm
  ;;
*) echo "usage: $0 run|test" >&2; exit 2 ;;
esac

go_status=0
if [ -n "$go_problem" ]; then
  echo "baton: make $what needs Go 1.26 or newer on the PATH (or named by GO=): $go_problem." >&2
  echo "  Debian's golang package is older: get Go from https://go.dev/dl/, unpack it (tar -C /usr/local -xzf go1.26.*.linux-amd64.tar.gz) and add /usr/local/go/bin to PATH" >&2
  go_status=1
fi
[ ${#missing[@]} -eq 0 ] && exit "$go_status"
cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" = 0 ] && [ -z "${BATON_DEPS_NO_INSTALL:-}" ] && command -v apt-get >/dev/null; then
  echo "baton: installing what make $what needs: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  exit "$go_status"
fi
echo "baton: make $what needs Debian packages that are missing; run (as root):" >&2
echo "  $cmd" >&2
exit 1
