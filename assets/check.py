#!/usr/bin/env python3
"""Sanity check of the state bundles: run `python3 assets/check.py` from the repo root.

Every file holds one object with apiVersion, kind and metadata.name; namespaced objects leave
the namespace to the operator; DaemonSet selectors name the DaemonSet and match their pod
labels; RBAC uses no wildcards; only OpenShift-only kinds live in files named *openshift*.
"""
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent
OPENSHIFT_ONLY = {"SecurityContextConstraints", "PrometheusRule"}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "RuntimeClass", "SecurityContextConstraints"}


def check(path, errors):
    def err(msg):
        errors.append(f"{path.relative_to(ROOT)}: {msg}")

    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    if len(docs) != 1:
        return err(f"expected one object, found {len(docs)}")
    obj = docs[0]
    kind = obj.get("kind")
    meta = obj.get("metadata") or {}
    if not (obj.get("apiVersion") and kind and meta.get("name")):
        return err("missing apiVersion, kind or metadata.name")
    if "namespace" in meta:
        err("metadata.namespace must be left to the operator")
    if kind in OPENSHIFT_ONLY and "openshift" not in path.name:
        err(f"{kind} is OpenShift-only: its file name must contain 'openshift'")
    if kind in ("Role", "ClusterRole"):
        for rule in obj.get("rules") or []:
            for key in ("verbs", "resources", "apiGroups"):
                if "*" in (rule.get(key) or []):
                    err(f"wildcard in {key}")
    if kind in ("RoleBinding", "ClusterRoleBinding"):
        for s in obj.get("subjects") or []:
            if s.get("kind") == "ServiceAccount" and "openshift" not in path.name \
                    and s.get("namespace") != "FILLED_BY_OPERATOR":
                err("ServiceAccount subject namespace must be FILLED_BY_OPERATOR")
    if kind == "DaemonSet":
        sel = obj["spec"]["selector"]["matchLabels"]
        tmpl = obj["spec"]["template"]["metadata"]["labels"]
        # NVIDIA's DaemonSets select their pods by `app`, the VFIO manager's by `name`.
        if meta["name"] not in (sel.get("app"), sel.get("name")):
            err("selector app (or name) label must equal the DaemonSet name")
        if any(tmpl.get(k) != v for k, v in sel.items()):
            err("selector does not match the pod template labels")
        pod = obj["spec"]["template"]["spec"]
        names = {v["name"] for v in pod.get("volumes") or []}
        for c in (pod.get("initContainers") or []) + pod["containers"]:
            if c.get("image") != "FILLED_BY_OPERATOR":
                err(f"container {c['name']}: image must be FILLED_BY_OPERATOR")
            for m in c.get("volumeMounts") or []:
                if m["name"] not in names:
                    err(f"container {c['name']}: mount of unknown volume {m['name']}")


def main():
    errors, count = [], 0
    for path in sorted(ROOT.glob("state-*/*.yaml")):
        count += 1
        check(path, errors)
    for e in errors:
        print(e)
    print(f"{count} files, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
