"""node-feature-discovery's rules for a feature file, written down from its local source
(source/local/local.go) and its label validation (pkg/apis/nfd/validate), so a test can
read a file as nfd-worker reads it and judge its labels as nfd-master does.

A reader (nfd-worker, local source):
- skips files whose name starts with '.', and files over 64 KiB (MaxFeatureFileSize);
- splits on '\\n', strips each line, skips empty lines;
- '#' starts a comment; '# +expiry-time=<RFC 3339>' drops the lines after it once that
  time has passed; '# +no-label' / '# +no-feature' apply to the next line; any other
  '# +' directive is an error it logs;
- 'key=value' sets a label (split at the first '='), 'key' alone means 'true'.
A label (nfd-master) needs a qualified name with a prefix (namespace/name); the
kubernetes.io namespaces are denied except feature.node.kubernetes.io,
profile.node.kubernetes.io and their sub-namespaces; the value is a valid label value.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

MAX_FILE_SIZE = 65536
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")  # at most 63
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ALLOWED_NS = ("feature.node.kubernetes.io", "profile.node.kubernetes.io")


def read(path: Path, now: datetime.datetime) -> tuple[dict[str, str], list[str]]:
    """The labels nfd-worker takes from the feature file ``path`` at ``now``, and the
    errors it would log."""
    if path.name.startswith("."):
        return {}, ["hidden file: not read"]
    data = path.read_bytes()
    if len(data) > MAX_FILE_SIZE:
        return {}, [f"file size limit exceeded: {len(data)} bytes > {MAX_FILE_SIZE}"]
    labels: dict[str, str] = {}
    errors: list[str] = []
    expiry = now
    skip_label = False
    for raw in data.decode().split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if line.startswith("# +"):
                key, _, value = line[3:].partition("=")
                if key == "expiry-time":
                    try:
                        expiry = datetime.datetime.fromisoformat(value.strip())
                    except ValueError:
                        errors.append(f"failed to parse expiry-date directive: {line!r}")
                    if expiry.tzinfo is None:
                        errors.append(f"expiry-time without a time zone: {line!r}")
                        expiry = now
                elif key == "no-label":
                    skip_label = True
                elif key != "no-feature":
                    errors.append(f"unknown feature file directive {key!r}")
            continue
        if expiry < now:
            continue
        key, eq, value = line.partition("=")
        if not skip_label:
            labels[key] = value if eq else "true"
        skip_label = False
    return labels, errors


def label_problems(key: str, value: str) -> list[str]:
    """Why nfd-master would refuse the label ``key=value`` (empty: it is fine)."""
    out = []
    prefix, slash, name = key.rpartition("/")
    if not slash:
        out.append(f"{key}: unprefixed keys are not allowed")
    if not (0 < len(name) <= 63 and _NAME.match(name)):
        out.append(f"{key}: name {name!r} is not a qualified name")
    if slash and not (len(prefix) <= 253 and all(_DNS_LABEL.match(p) for p in prefix.split("."))):
        out.append(f"{key}: prefix {prefix!r} is not a DNS subdomain")
    denied = prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io")
    allowed = prefix in _ALLOWED_NS or prefix.endswith(tuple("." + ns for ns in _ALLOWED_NS))
    if denied and not allowed:
        out.append(f"{key}: namespace {prefix} is not allowed")
    if len(value) > 63 or not _VALUE.match(value):
        out.append(f"{key}: invalid value {value!r}")
    return out
