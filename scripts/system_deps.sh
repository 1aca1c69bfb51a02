#!/usr/bin/env bash
# System programs the tests and benchmarks use, from Debian's packages, installed when missing:
#   redis-server  the GCS fault-tolerance tests (tests/hosts/test_head_restart.py) and
#                 benchmarks/faults.py: Ray's GCS keeps its state in a real Redis
#   hey           the serving benchmark's load (benchmarks/serving.py)
# Needs root and apt-get; without them it says what is missing (the tests that need a program
# fail with a line naming it) and exits 0, so `make test` still runs everything else.
set -uo pipefail
want=()
command -v redis-server >/dev/null 2>&1 || want+=(redis-server)
command -v hey >/dev/null 2>&1 || want+=(hey)
[ ${#want[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "scripts/system_deps.sh: missing ${want[*]} (install them: apt-get install -y ${want[*]})" >&2
    exit 0
fi
echo "scripts/system_deps.sh: installing ${want[*]} (Debian packages)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${want[@]}" >/dev/null 2>&1 || {
    apt-get update -q >/dev/null 2>&1
    apt-get install -y -q --no-install-recommends "${want[@]}" >/dev/null 2>&1 ||
        echo "scripts/system_deps.sh: apt-get could not install ${want[*]}" >&2
}
exit 0
