"""A stand-in for a container runtime's CDI loader: what it rejects in a claim's spec file.

containerd and CRI-O load the spec files the plugin writes through the CDI library, which refuses a
spec with an unknown field, an unknown or too low ``cdiVersion``, a bad ``kind``, no device, a bad or
duplicate device name or malformed container edits; the pod's container then fails to start with
"unresolvable CDI devices". Tests run :func:`loader_problems` on the specs prepare writes, so a
change that would produce such a spec fails a unit test instead of a pod (the real runtime is the
judge in the e2e tests). The plugin itself does not run these checks: its specs are built by pure
code from fixed parts (:mod:`kubelet_plugin.cdi.cdi_spec`), and checking each one on the prepare path
cost about 0.2 ms (a whole GPU with 60 driver files).
"""

from __future__ import annotations

import re
from typing import Any

from kubelet_plugin.cdi.cdi_spec import minimum_version

KNOWN_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
HOOK_NAMES = ("createRuntime", "createContainer", "startContainer", "poststart", "poststop", "prestart")
_VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_EDIT_FIELDS = ("env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt", "netDevices")
_NODE_FIELDS = ("path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid")
_MOUNT_FIELDS = ("hostPath", "containerPath", "type", "options")
_HOOK_FIELDS = ("hookName", "path", "args", "env", "timeout")


def _validate_edits(edits: Any, path: str, errors: list[str], require_nonempty: bool) -> None:
    if not isinstance(edits, dict):
        errors.append(f"{path}: must be an object")
        return
    errors.extend(f"{path}.{k}: unknown field" for k in edits if k not in _EDIT_FIELDS)
    if require_nonempty and not any(edits.get(k) for k in _EDIT_FIELDS):
        errors.append(f"{path}: a device needs at least one container edit")
    for i, env in enumerate(edits.get("env", ())):
        if not isinstance(env, str) or "=" not in env or env.startswith("="):
            errors.append(f"{path}.env[{i}]: {env!r} is not NAME=value")
    for i, node in enumerate(edits.get("deviceNodes", ())):
        p = f"{path}.deviceNodes[{i}]"
        errors.extend(f"{p}.{k}: unknown field" for k in node if k not in _NODE_FIELDS)
        if not str(node.get("path", "")).startswith("/"):
            errors.append(f"{p}.path: required and absolute")
        if "hostPath" in node and not str(node["hostPath"]).startswith("/"):
            errors.append(f"{p}.hostPath: must be absolute")
        if not set(node.get("permissions", "rwm")) <= set("rwm") or node.get("permissions") == "":
            errors.append(f"{p}.permissions: must be a non-empty subset of 'rwm'")
        if node.get("type", "c") not in ("b", "c", "u", "p"):
            errors.append(f"{p}.type: must be b, c, u or p")
        for k in ("major", "minor", "fileMode", "uid", "gid"):
            if k in node and (not isinstance(node[k], int) or isinstance(node[k], bool) or node[k] < 0):
                errors.append(f"{p}.{k}: must be a non-negative integer")
    for i, mount in enumerate(edits.get("mounts", ())):
        p = f"{path}.mounts[{i}]"
        errors.extend(f"{p}.{k}: unknown field" for k in mount if k not in _MOUNT_FIELDS)
        for k in ("hostPath", "containerPath"):
            if not mount.get(k):
                errors.append(f"{p}.{k}: required")
        if not isinstance(mount.get("options", []), list):
            errors.append(f"{p}.options: must be a list of strings")
    for i, hook in enumerate(edits.get("hooks", ())):
        p = f"{path}.hooks[{i}]"
        errors.extend(f"{p}.{k}: unknown field" for k in hook if k not in _HOOK_FIELDS)
        if hook.get("hookName") not in HOOK_NAMES:
            errors.append(f"{p}.hookName: must be one of {', '.join(HOOK_NAMES)}")
        if not str(hook.get("path", "")).startswith("/"):
            errors.append(f"{p}.path: required and absolute")
        if "timeout" in hook and not (isinstance(hook["timeout"], int) and hook["timeout"] > 0):
            errors.append(f"{p}.timeout: must be a positive number of seconds")


def loader_problems(spec: Any) -> list[str]:
    """Check a spec against the CDI format rules (reference section 13); return the problems found.

    Checks what a CDI loader rejects: unknown fields, an unknown or too low ``cdiVersion``, a bad
    ``kind``, an empty device list, bad or duplicate device names, and malformed container edits.
    """
    if not isinstance(spec, dict):
        return ["spec: must be an object"]
    errors = [f"{k}: unknown field" for k in spec
              if k not in ("cdiVersion", "kind", "annotations", "devices", "containerEdits")]
    version = spec.get("cdiVersion")
    if version not in KNOWN_VERSIONS:
        errors.append(f"cdiVersion: {version!r} is not a known CDI version")
    elif _version_key(version) < _version_key(minimum_version(spec)):
        errors.append(f"cdiVersion: {version} is lower than {minimum_version(spec)} that the content needs")
    vendor, slash, cls = str(spec.get("kind", "")).partition("/")
    if not slash or not _VENDOR.match(vendor) or not _CLASS.match(cls) or len(cls) > 63:
        errors.append(f"kind: {spec.get('kind')!r} is not <vendor>/<class>")
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        errors.append("devices: must be a non-empty list")
        devices = []
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        name = dev.get("name", "") if isinstance(dev, dict) else ""
        if not isinstance(name, str) or not _DEVICE_NAME.match(name):
            errors.append(f"devices[{i}].name: {name!r} is not a valid CDI device name")
        elif name in seen:
            errors.append(f"devices[{i}].name: duplicate {name!r}")
        seen.add(str(name))
        if isinstance(dev, dict):
            errors.extend(f"devices[{i}].{k}: unknown field" for k in dev
                          if k not in ("name", "annotations", "containerEdits"))
            _validate_edits(dev.get("containerEdits"), f"devices[{i}].containerEdits", errors, True)
    if "containerEdits" in spec:
        _validate_edits(spec["containerEdits"], "containerEdits", errors, False)
    return errors


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))
