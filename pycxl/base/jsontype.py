"""``Json``: a JSON object as pycxl builds it for --json and its library users (str keys;
bytes, nanoseconds and bytes per second as numbers), named once for every floor."""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]
