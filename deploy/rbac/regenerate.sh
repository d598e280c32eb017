#!/usr/bin/env bash
# Regenerates deploy/rbac/*.yaml from the chart (deploy/helm/kiln), the source of the operator's
# RBAC, for namespace gpu-operator: `helm template` of templates/operator.yaml without the
# Deployment, and of templates/node-patch-policy.yaml and templates/admission-policies.yaml.
# host/operator/tests/chart/deploy.rs fails when the copies drift. Needs testcluster/bin/helm
# (`testcluster/build.sh`) or HELM=path.
set -euo pipefail
cd "$(dirname "$0")/../.."
helm="${HELM:-testcluster/bin/helm}"
render() {
  "$helm" template kiln deploy/helm/kiln --namespace gpu-operator --show-only "$1" \
    | grep -v '^# Source:' \
    | awk -v drop="$2" 'BEGIN { RS = "\n---\n"; ORS = "" }
        drop != "" && $0 ~ ("\nkind: " drop "\n") { next }
        { sub(/^---\n/, ""); if (n++) printf "---\n"; print $0 "\n" }'
}
{
  cat <<'HEAD'
# RBAC of the kiln operator: the chart's objects (deploy/helm/kiln/templates/operator.yaml, rules
# in files/*rules.yaml) for namespace gpu-operator, written by deploy/rbac/regenerate.sh; do not
# edit (host/operator/tests/chart/deploy.rs keeps them equal). Least privilege: no wildcards, no
# `escalate`, `bind`/`patch`/`delete` on RBAC objects only for the operand roles named in
# assets/, namespaced rights in a Role in the operator namespace (Secrets included), Events in
# `default`. See deploy/operator/README.md.
HEAD
  render templates/operator.yaml Deployment
} > deploy/rbac/kiln-operator.yaml
{
  cat <<'HEAD'
# The chart's ValidatingAdmissionPolicy (deploy/helm/kiln/templates/node-patch-policy.yaml) for
# namespace gpu-operator, written by deploy/rbac/regenerate.sh; do not edit. RBAC cannot limit
# a node `patch` to some label keys, so this policy does: an update of a Node by the operator's
# ServiceAccount may change only the node labels it owns, the driver upgrade's annotations and
# `spec.unschedulable` (cordon and uncordon for driver upgrades; only on NVIDIA GPU nodes), never
# ownerReferences, finalizers, taints, the rest of the spec or the status. kiln's device plugin
# (kiln-device-plugin-node-health, -node-events) may change only the GPUHealthy condition and the
# nvidia.com/gpu-unhealthy taint of the node its pod runs on. Kubernetes >= 1.30.
HEAD
  render templates/node-patch-policy.yaml ""
} > deploy/rbac/node-patch-policy.yaml
{
  cat <<'HEAD'
# The chart's other ValidatingAdmissionPolicies (deploy/helm/kiln/templates/admission-policies.yaml,
# data in files/admission.yaml) for namespace gpu-operator, written by deploy/rbac/regenerate.sh;
# do not edit. What RBAC cannot scope: operand roles and bindings only (a binding binds its
# operand's ServiceAccount only), RuntimeClasses only of the names the policy renders, pods
# deleted only in gpu-operator and evicted only for a driver upgrade (GPU pods of a node in
# pod-deletion-required, any pod of a node in drain-required). Kubernetes >= 1.30.
HEAD
  render templates/admission-policies.yaml ""
} > deploy/rbac/admission-policies.yaml
