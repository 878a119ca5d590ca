#!/usr/bin/env python3
"""Writes Kubernetes' own schemas for the core types the TFDataService CRD embeds.

The CRD is hand-written, except the blocks between ``# BEGIN generated <definition>`` and
``# END generated <definition>`` markers: those are the structural form of a Kubernetes
OpenAPI v3 definition (affinity, tolerations, resources, topology spread, volumes, volume
mounts, environment variables, NetworkPolicy peers), so the API server refuses a wrong type
inside them at ``kubectl apply`` instead of the operator's server-side apply of a child
failing later.

The definitions come from the OpenAPI v3 documents in ``hack/openapi/`` (trimmed to what the
CRD needs and committed, so the drift test needs no cluster):

    hack/crd-schemas.py            # rewrite the generated blocks in crds/ from hack/openapi/
    hack/crd-schemas.py --check    # exit 1 if the CRD differs from what would be written
    hack/crd-schemas.py --fetch    # first refresh hack/openapi/ from a live cluster's /openapi/v3

A structural schema (what a CRD needs) has no ``$ref``, no ``allOf``/``oneOf`` and a type on
every node, so references are inlined, Quantity and IntOrString become
``x-kubernetes-int-or-string``, and the extensions CRDs do not accept (patch strategies,
unions) are dropped. Kubernetes' defaults are dropped too: the operator passes the user's
values through and the API server defaults the child. Every string, list and map gets a
generous bound, so the API server can estimate the cost of CEL rules above them and the
CRD says how big an object may be.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "tfdata.dev_tfdataservices.yaml"
# The same schemas for the operator's own checks (`tfdata-operator render` sees files no API server saw).
PACKAGE_COPY = ROOT / "operator" / "src" / "tfdata_operator" / "api" / "coretypes.json"
OPENAPI = ROOT / "hack" / "openapi"

# OpenAPI v3 document (as in /openapi/v3/<path>) -> the definitions the CRD embeds from it.
DOCUMENTS: dict[str, tuple[str, ...]] = {
    "api/v1": (
        "io.k8s.api.core.v1.Affinity",
        "io.k8s.api.core.v1.Toleration",
        "io.k8s.api.core.v1.ResourceRequirements",
        "io.k8s.api.core.v1.TopologySpreadConstraint",
        "io.k8s.api.core.v1.Volume",
        "io.k8s.api.core.v1.VolumeMount",
        "io.k8s.api.core.v1.EnvVar",
        "io.k8s.api.core.v1.EnvFromSource",
    ),
    "apis/networking.k8s.io/v1": ("io.k8s.api.networking.v1.NetworkPolicyPeer",),
}
# Fields left out of a definition:
# - ResourceRequirements.claims names pod-level resource claims, which a TFDataService cannot
#   declare, so any value would be refused later.
# - VolumeMount.mountPropagation: the servers run unprivileged, so Bidirectional is refused when
#   the pod is created, and read-only training data needs no propagation (None, the default).
# - EnvVarSource.fileKeyRef reads an env file from a volume behind the EnvFiles feature gate
#   (alpha in Kubernetes 1.34, off by default): the API server would drop it.
OMIT: dict[str, frozenset[str]] = {
    "io.k8s.api.core.v1.ResourceRequirements": frozenset({"claims"}),
    "io.k8s.api.core.v1.VolumeMount": frozenset({"mountPropagation"}),
    "io.k8s.api.core.v1.EnvVarSource": frozenset({"fileKeyRef"}),
}
# Fields kept of a definition, where fewer are kept than left out. A Volume keeps the sources
# that carry training data or the credentials to read it:
# - persistentVolumeClaim (any storage the cluster provisions, e.g. a ReadOnlyMany claim of
#   TFRecords), nfs, csi (inline CSI volumes, e.g. a bucket mounted by a FUSE driver), hostPath
#   (data already on the nodes; Pod Security "baseline" refuses it), configMap and secret
#   (credentials files, small lookup tables), emptyDir (scratch space, e.g. a local cache).
# Left out: ephemeral (a claim per pod from a template embedding ObjectMeta and a whole
# PersistentVolumeClaimSpec, about 22 KB of schema twice over, which would push the CRD past
# what a client-side `kubectl apply` can store; it only brings empty or snapshot-filled scratch
# space), projected, downwardAPI and image (not training data; a service account token for
# cloud credentials is projected by the cloud's own webhook), and the deprecated in-tree
# cloud and network volume plugins (awsElasticBlockStore, glusterfs, ...; CSI replaces them).
ONLY: dict[str, frozenset[str]] = {
    "io.k8s.api.core.v1.Volume": frozenset(
        {"name", "persistentVolumeClaim", "configMap", "secret", "emptyDir", "hostPath", "nfs", "csi"}
    ),
}
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# Generous bounds: far above what a pod's scheduling rules need, low enough to keep an object small.
MAX_STRING = 1024
MAX_ITEMS = 64
MAX_PROPERTIES = 64
# The x-kubernetes-* extensions a CRD schema accepts.
CRD_EXTENSIONS = frozenset({"x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type"})
KEPT = frozenset(
    {
        "type",
        "format",
        "description",
        "enum",
        "required",
        "properties",
        "items",
        "additionalProperties",
    }
)

BEGIN = re.compile(r"^(?P<indent> *)# BEGIN generated (?P<name>\S+)")
END = "# END generated "


def document_file(path: str) -> Path:
    return OPENAPI / (path.replace("/", "__") + ".json")


def load_schemas() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for path in DOCUMENTS:
        file = document_file(path)
        if not file.exists():
            sys.exit(f"{file} is missing: run hack/crd-schemas.py --fetch against a cluster")
        schemas.update(json.loads(file.read_text())["components"]["schemas"])
    return schemas


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {_ref_name(node["$ref"])} if "$ref" in node else set()
        for value in node.values():
            found |= _refs(value)
        return found
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node)) if node else set()
    return set()


def kept(owner: str, properties: dict[str, Any]) -> dict[str, Any]:
    """The properties of ``owner`` the CRD embeds (OMIT and ONLY applied)."""
    omit = OMIT.get(owner, frozenset())
    only = ONLY.get(owner)
    return {k: v for k, v in properties.items() if k not in omit and (only is None or k in only)}


def reachable(schemas: dict[str, Any], roots: tuple[str, ...]) -> set[str]:
    """The definitions ``roots`` refer to through the fields the CRD keeps, directly or not
    (what a trimmed document keeps)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            schema = schemas[name]
            if "properties" in schema:
                schema = {**schema, "properties": kept(name, schema["properties"])}
            todo += sorted(_refs(schema) - seen)
    return seen


def structural(schemas: dict[str, Any], name: str, stack: tuple[str, ...] = ()) -> dict[str, Any]:
    """The structural CRD schema of one definition, every reference inlined."""
    if name in stack:
        raise SystemExit(f"{' -> '.join((*stack, name))}: a recursive type cannot be inlined into a CRD")
    if name == QUANTITY:
        return {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
        }
    if name == INT_OR_STRING:
        return {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
        }
    return _convert(schemas, schemas[name], (*stack, name))


def _convert(schemas: dict[str, Any], node: dict[str, Any], stack: tuple[str, ...]) -> dict[str, Any]:
    if "$ref" in node or "allOf" in node:
        refs = [node["$ref"]] if "$ref" in node else [part["$ref"] for part in node["allOf"]]
        if len(refs) != 1:
            raise SystemExit(f"{stack[-1]}: cannot inline allOf with {len(refs)} parts")
        out = structural(schemas, _ref_name(refs[0]), stack)
        if "description" in node:  # the field's own words beat the type's
            out["description"] = node["description"]
        elif "description" in out and "x-kubernetes-int-or-string" in out:
            del out["description"]  # Quantity's grammar is a page long
        return out
    if "oneOf" in node or "anyOf" in node:
        raise SystemExit(f"{stack[-1]}: oneOf/anyOf is not structural")
    owner = stack[-1]
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in CRD_EXTENSIONS:
            out[key] = value
        elif key not in KEPT:
            continue  # default, x-kubernetes-patch-*, x-kubernetes-unions, ...
        elif key == "properties":
            out[key] = {prop: _convert(schemas, sub, stack) for prop, sub in sorted(kept(owner, value).items())}
        elif key in ("items", "additionalProperties"):
            out[key] = _convert(schemas, value, stack)
        else:
            out[key] = value
    if "properties" in out or "additionalProperties" in out:
        out.setdefault("type", "object")
    kind = out.get("type")
    if kind == "string" and "enum" not in out and "format" not in out:
        out["maxLength"] = MAX_STRING
    elif kind == "array":
        out["maxItems"] = MAX_ITEMS
    elif kind == "object" and "additionalProperties" in out:
        out["maxProperties"] = MAX_PROPERTIES
    return out


def _ordered(node: Any) -> Any:
    """Keys in a reading order (type and description first), recursively."""
    if not isinstance(node, dict):
        return [_ordered(v) for v in node] if isinstance(node, list) else node
    first = [k for k in ("type", "description") if k in node]
    return {k: _ordered(node[k]) for k in first + sorted(k for k in node if k not in first)}


def block(schemas: dict[str, Any], name: str, indent: str) -> list[str]:
    """The YAML lines of one generated block: the definition's body (the field's type and
    description stay hand-written above the marker)."""
    schema = structural(schemas, name)
    body = {k: v for k, v in schema.items() if k not in ("type", "description")}
    text = yaml.safe_dump(_ordered(body), sort_keys=False, width=120, allow_unicode=True)
    return [indent + line if line else line for line in text.splitlines()]


def package_copy(schemas: dict[str, Any]) -> str:
    """The schemas without their descriptions, which the operator's checks do not need."""
    roots = [name for names in DOCUMENTS.values() for name in names]
    copy = {name: _undocumented(structural(schemas, name)) for name in sorted(roots)}
    return json.dumps(copy, indent=1, sort_keys=True) + "\n"


def _undocumented(schema: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in schema.items() if k != "description"}
    if "properties" in out:
        out["properties"] = {name: _undocumented(sub) for name, sub in out["properties"].items()}
    for key in ("items", "additionalProperties"):
        if key in out:
            out[key] = _undocumented(out[key])
    return out


def render(text: str, schemas: dict[str, Any]) -> str:
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = BEGIN.match(lines[i])
        out.append(lines[i])
        i += 1
        if not match:
            continue
        name, indent = match["name"], match["indent"]
        end = f"{indent}{END}{name}"
        try:
            stop = lines.index(end, i)
        except ValueError:
            raise SystemExit(f"{CRD}: '# BEGIN generated {name}' has no '{end.strip()}' line") from None
        out += block(schemas, name, indent)
        out.append(lines[stop])
        i = stop + 1
    return "\n".join(out) + "\n"


def kubectl(*args: str) -> str:
    binary = os.environ.get("KUBECTL") or str(Path(_bin_dir()) / "kubectl")
    env = {
        **os.environ,
        "KUBECONFIG": os.environ.get("KUBECONFIG", str(ROOT / ".local" / "kubeconfig")),
    }
    return subprocess.run([binary, *args], check=True, capture_output=True, text=True, env=env).stdout


def _bin_dir() -> str:
    return subprocess.run(
        [str(ROOT / "devcluster" / "k8s-binaries.sh"), "--print"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def fetch() -> None:
    """Refreshes hack/openapi/ from the cluster in $KUBECONFIG (default: the dev cluster's)."""
    OPENAPI.mkdir(parents=True, exist_ok=True)
    for path, roots in DOCUMENTS.items():
        doc = json.loads(kubectl("get", "--raw", f"/openapi/v3/{path}"))
        schemas = doc["components"]["schemas"]
        keep = reachable(schemas, roots)
        trimmed = {
            "openapi": doc["openapi"],
            "info": doc["info"],
            "x-fetched-from": f"/openapi/v3/{path} of Kubernetes {_server_version()}",
            "components": {"schemas": {k: schemas[k] for k in sorted(keep)}},
        }
        document_file(path).write_text(json.dumps(trimmed, indent=1, sort_keys=True) + "\n")
        print(f"wrote {document_file(path).relative_to(ROOT)} ({len(keep)} definitions)")


def _server_version() -> str:
    return str(json.loads(kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report whether the CRD is up to date")
    parser.add_argument(
        "--fetch",
        action="store_true",
        help="refresh hack/openapi/ from a live cluster first",
    )
    args = parser.parse_args()
    if args.fetch:
        fetch()
    schemas = load_schemas()
    outputs = {
        CRD: render(CRD.read_text(), schemas),
        PACKAGE_COPY: package_copy(schemas),
    }
    stale = [path for path, text in outputs.items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} differs from hack/crd-schemas.py's output: run hack/crd-schemas.py")
        return 1 if stale else 0
    for path in stale:
        path.write_text(outputs[path])
        print(f"rewrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
