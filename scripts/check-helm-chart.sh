#!/usr/bin/env bash
# Renders the Helm chart (deploy/helm/gpufuse) with Helm's own engine and validates every
# object against the Kubernetes 1.34 schemas, the CRDs' own schemas and the examples in
# examples/k8s; see deploy/helm/tests/check_chart.py. Installs its tools from PyPI into
# target/chart-tools (idempotent: reinstalled only when requirements.txt changes).
set -euo pipefail
cd "$(dirname "$0")/.."

req=deploy/helm/tests/requirements.txt
venv=target/chart-tools
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "== installing the chart tools into $venv =="
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
fi
"$venv/bin/python" deploy/helm/tests/check_chart.py "$@"
