#!/usr/bin/env bash
# `make matrix`: the chart's install-and-serve stack test (tests/integration/test_chart.py)
# against the oldest Kubernetes minor and the Helm major the README claims besides the
# pinned ones, each built from its Go modules like the pinned ones (the first run
# compiles a control plane, a kubelet and a Helm: about an hour on 2 cores; not in CI).
# Prints one line per combination and writes them to test-results/matrix.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."

# kubernetes, crictl, helm: the oldest claimed, then the pinned (a control row)
COMBINATIONS=(
  "v1.30.14 v1.34.0 v4.3.2"
  "v1.37.2 v1.37.0 v3.17.4"
)
mkdir -p test-results
: > test-results/matrix.txt
status=0
for combination in "${COMBINATIONS[@]}"; do
  read -r k8s crictl helm <<<"$combination"
  log="test-results/matrix-k8s$k8s-helm$helm.log"
  start=$(date +%s)
  if KAMA_K8S_VERSION="$k8s" KAMA_CRI_TOOLS_VERSION="$crictl" KAMA_HELM_VERSION="$helm" \
    .venv/bin/pytest -p no:cacheprovider -q tests/integration/test_chart.py >"$log" 2>&1; then
    verdict=pass
  else
    verdict=FAIL
    status=1
  fi
  line="Kubernetes $k8s, Helm $helm: $verdict ($(( $(date +%s) - start )) s, $log)"
  echo "$line" | tee -a test-results/matrix.txt
done
exit $status
