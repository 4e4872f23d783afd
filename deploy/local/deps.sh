#!/usr/bin/env bash
# Checks what `make run` (deps.sh run) or `make test` (deps.sh test) needs
# from the machine beyond Go, and installs what is missing from Debian's
# packages when run as root; otherwise it prints the one command to run and
# fails. BATON_DEPS_NO_INSTALL=1 only reports. BATON_DEPS_PRETEND_MISSING
# names checks to treat as failing (tests of this script).
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

need cc build-essential pkg-config
need openblas libopenblas-dev
case $what in
run) need curl curl ;;
test)
  need ucx libucx-dev
  need promtool prometheus
  need node nodejs npm
  ;;
*) echo "usage: $0 run|test" >&2; exit 2 ;;
esac

[ ${#missing[@]} -eq 0 ] && exit 0
cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" = 0 ] && [ -z "${BATON_DEPS_NO_INSTALL:-}" ] && command -v apt-get >/dev/null; then
  echo "baton: installing what make $what needs: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  exit 0
fi
echo "baton: make $what needs Debian packages that are missing; run (as root):" >&2
echo "  $cmd" >&2
exit 1
