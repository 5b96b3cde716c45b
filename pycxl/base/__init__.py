"""Floor 0, the ground: what every other floor stands on and that stands on nothing of
pycxl's (errors, sizes and units, what people type and its checkers, sysfs reads and
writes, kernel-write plans with their undo, files written for other readers, waiting,
tracefs instances, the JSON type, the native libraries' bindings)."""
