"""Floor 3, by name: the library's functions that take names and one ``System``
(``facade``: ``pycxl.allocate``, ``create_region``...), ``pycxl list`` (``listing``),
memdev health, tuning, and the JSON of the object model (``to_json``). Beside it on
this floor: ``bench/`` and ``ops/``."""
