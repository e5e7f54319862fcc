#!/usr/bin/env python3
"""Checks the files `isolane export` writes against schemas (docs/export.md, "How the files are
checked"); run by the isolane-export crate's tests with the Python that ISOLANE_PYTHON names.

    check_exports.py FILE...

Every Kubernetes object is validated with kubernetes-validate (PyPI), strict (an unknown field
is an error), against Kubernetes 1.34, the first release with resource.k8s.io/v1, and the
newest the package knows. Objects it has no schema for, and the files that are no Kubernetes
object, are checked against the strict schemas below, written from their owners' definitions:

- ServiceMonitor: the Prometheus Operator's CRD (monitoring.coreos.com/v1), the fields the
  export writes, with the CRD's types, patterns, enums and required fields;
- the opaque GpuConfig of a ResourceClaimTemplate: NVIDIA's DRA driver's
  resource.nvidia.com/v1beta1 GpuConfig (sharing strategy, time-slicing interval, MPS config);
- a device plugin configuration (a ConfigMap's value): NVIDIA's device plugin config v1 flags;
- mig-parted.yaml: nvidia-mig-parted's config v1.

Prints one line per object and exits 1 if any did not validate.
"""

import sys

import jsonschema
import kubernetes_validate.utils as kv
import yaml

K8S_VERSIONS = ["1.34.0", kv.latest_version()]

STRICT = {"additionalProperties": False}
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
META = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": LABELS},
    **STRICT,
}

SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": META,
        "spec": {
            "type": "object",
            "required": ["endpoints", "selector"],
            "properties": {
                "selector": {
                    "type": "object",
                    "properties": {"matchLabels": LABELS},
                    **STRICT,
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {
                                "type": "string",
                                "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?"
                                r"(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
                            },
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                        },
                        **STRICT,
                    },
                },
            },
            **STRICT,
        },
    },
    **STRICT,
}

GPU_CONFIG = {
    "type": "object",
    "required": ["apiVersion", "kind"],
    "properties": {
        "apiVersion": {"const": "resource.nvidia.com/v1beta1"},
        "kind": {"const": "GpuConfig"},
        "sharing": {
            "type": "object",
            "required": ["strategy"],
            "properties": {
                "strategy": {"enum": ["TimeSlicing", "MPS"]},
                "timeSlicingConfig": {
                    "type": "object",
                    "properties": {"interval": {"enum": ["Default", "Short", "Medium", "Long"]}},
                    **STRICT,
                },
                "mpsConfig": {
                    "type": "object",
                    "properties": {
                        "defaultActiveThreadPercentage": {
                            "type": "integer",
                            "minimum": 0,
                            "maximum": 100,
                        },
                        "defaultPinnedDeviceMemoryLimit": {"type": "string"},
                        "defaultPerDevicePinnedMemoryLimit": LABELS,
                    },
                    **STRICT,
                },
            },
            **STRICT,
        },
    },
    **STRICT,
}

DEVICE_PLUGIN_CONFIG = {
    "type": "object",
    "required": ["version"],
    "properties": {
        "version": {"const": "v1"},
        "flags": {
            "type": "object",
            "properties": {"migStrategy": {"enum": ["none", "single", "mixed"]}},
            **STRICT,
        },
    },
    **STRICT,
}

MIG_PROFILE = r"^[0-9]+g\.[0-9]+gb(\+me)?$"
MIG_PARTED = {
    "type": "object",
    "required": ["version", "mig-configs"],
    "properties": {
        "version": {"const": "v1"},
        "mig-configs": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["devices", "mig-enabled"],
                    "properties": {
                        "devices": {
                            "oneOf": [
                                {"const": "all"},
                                {"type": "array", "items": {"type": "integer", "minimum": 0}},
                            ]
                        },
                        "mig-enabled": {"type": "boolean"},
                        "mig-devices": {
                            "type": "object",
                            "propertyNames": {"pattern": MIG_PROFILE},
                            "additionalProperties": {"type": "integer", "minimum": 0},
                        },
                    },
                    **STRICT,
                },
            },
        },
    },
    **STRICT,
}


def check(schema, value, what):
    jsonschema.validators.Draft202012Validator(schema).validate(value)
    print(f"OK {what}")


def check_object(path, obj):
    what = f"{path}: {obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    if obj.get("kind") == "ServiceMonitor":
        check(SERVICE_MONITOR, obj, what + " (Prometheus Operator CRD fields)")
        return
    for version in K8S_VERSIONS:
        kv.validate(obj, version, strict=True)
        print(f"OK {what} (Kubernetes {version}, strict)")
    if obj.get("kind") == "ResourceClaimTemplate":
        for config in obj["spec"]["spec"]["devices"].get("config", []):
            params = config["opaque"]["parameters"]
            check(GPU_CONFIG, params, what + " opaque GpuConfig")
    if obj.get("kind") == "ConfigMap" and obj["metadata"]["name"].endswith("-device-plugin"):
        for key, text in obj["data"].items():
            check(DEVICE_PLUGIN_CONFIG, yaml.safe_load(text), f"{what} config {key}")


def main(paths):
    failed = 0
    for path in paths:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for doc in docs:
            try:
                if path.endswith("mig-parted.yaml"):
                    check(MIG_PARTED, doc, f"{path}: mig-parted config")
                elif "apiVersion" in doc:
                    check_object(path, doc)
                else:
                    print(f"ERROR {path}: not a Kubernetes object nor a known config")
                    failed += 1
            except (jsonschema.ValidationError, kv.ValidationError) as e:
                where = ".".join(str(p) for p in e.path) if hasattr(e, "path") else ""
                message = getattr(e, "message", str(e))
                print(f"ERROR {path}: {where}: {message}")
                failed += 1
            except kv.SchemaNotFoundError as e:
                print(f"ERROR {path}: {e.message}")
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
